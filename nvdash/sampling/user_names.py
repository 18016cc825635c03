"""User and group names looked up off the caller's thread, cached: the sampler never waits for NSS.

``pwd.getpwuid`` and ``grp.getgrgid`` go through NSS, which on a cluster node often means LDAP or SSSD: a lookup
can take seconds, or hang while the directory server is away. :class:`NameResolver` answers from its cache at
once; a name it has not resolved yet answers ``None`` (the caller shows ``uid 1234``) and is queued for its
resolver thread, which runs under a :class:`~nvdash.supervision.Supervisor` (a lookup that hangs shows as an
overdue thread on ``/health``) and is started on the first miss.
"""

from __future__ import annotations

import contextlib
import grp
import pwd
import queue
import threading
from collections.abc import Callable

from nvdash.supervision import Supervisor

THREAD_NAME = "nvdash-names"
MAX_ENTRIES = 65_536
"""Cached answers kept (users and groups together); the cache starts over when full."""
ROUND_S = 1.0
"""The resolver thread beats at least this often while idle."""


def system_user(uid: int) -> str | None:
    """The password database's name for ``uid`` (may block: NSS); ``None`` when it has none."""
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return None


def system_group_of(user: str) -> str | None:
    """The name of ``user``'s primary group (may block: NSS); ``None`` when unknown."""
    try:
        return grp.getgrgid(pwd.getpwnam(user).pw_gid).gr_name
    except (KeyError, OverflowError, ValueError):
        return None


_Key = tuple[str, int | str]


class NameResolver:
    """Cached user names and primary groups; :meth:`user` and :meth:`group_of` never block.

    Implements the accounting's ``Names``; safe to call from any thread.
    """

    def __init__(
        self,
        *,
        user_of: Callable[[int], str | None] = system_user,
        group_of: Callable[[str], str | None] = system_group_of,
        supervisor: Supervisor | None = None,
        max_entries: int = MAX_ENTRIES,
    ) -> None:
        self._user_of = user_of
        self._group_of = group_of
        self._supervisor = supervisor if supervisor is not None else Supervisor()
        self._max_entries = max_entries
        self._lock = threading.Lock()
        self._cache: dict[_Key, str | None] = {}
        self._pending: set[_Key] = set()
        self._queue: queue.SimpleQueue[_Key] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._started = False

    def user(self, uid: int) -> str | None:
        """The name of ``uid`` if already resolved; ``None`` while it is looked up, or when there is none."""
        return self._get(("user", uid))

    def group_of(self, user: str) -> str | None:
        """The name of ``user``'s primary group if already resolved, else ``None``."""
        return self._get(("group", user))

    def pending(self) -> int:
        """Lookups queued or under way."""
        with self._lock:
            return len(self._pending)

    def start(self) -> None:
        """Start the resolver thread now rather than on the first miss (a server's thread count stays put)."""
        with self._lock:
            if self._started or self._stop.is_set():
                return
            self._started = True
        self._supervisor.spawn(THREAD_NAME, self._run, self._stop, expect_every_s=ROUND_S)

    def stop(self) -> None:
        """End the resolver thread (a lookup under way is left to finish; the thread is a daemon)."""
        self._stop.set()

    def _get(self, key: _Key) -> str | None:
        with self._lock:
            if key in self._cache:
                return self._cache[key]
            if key in self._pending or self._stop.is_set():
                return None
            self._pending.add(key)
        self._queue.put(key)
        self.start()
        return None

    def _run(self) -> None:
        while not self._stop.is_set():
            key: _Key | None = None
            with contextlib.suppress(queue.Empty):
                key = self._queue.get(timeout=ROUND_S)
            if key is not None:
                self._resolve(key)
            self._supervisor.beat(THREAD_NAME)

    def _resolve(self, key: _Key) -> None:
        kind, value = key
        try:
            name = self._user_of(int(value)) if kind == "user" else self._group_of(str(value))
        finally:
            with self._lock:
                self._pending.discard(key)
        with self._lock:
            if len(self._cache) >= self._max_entries:
                self._cache.clear()
            self._cache[key] = name
