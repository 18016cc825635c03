"""How nvdash reaches a Prometheus that wants a login or a tenant: the settings (``--prometheus-*``), and the
credentials they name, read from files at start and again whenever a file changes (a rotated token is picked up
without a restart) or Prometheus answers 401.

Secrets never leave this module except in the ``Authorization`` header: not in logs, messages or /health.
"""

from __future__ import annotations

import base64
import logging
import os
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from nvdash.cluster.selectors import SeriesScope

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 5.0
"""How long one query may take, by default (``--prometheus-timeout``)."""
MAX_TIMEOUT_S = 120.0
"""The longest ``--prometheus-timeout``: a page's refresh waits no longer than this for one query."""


class CredentialsError(Exception):
    """A credentials file that cannot be used; the message is one line (never the secret)."""


@dataclass(frozen=True)
class PrometheusAccess:
    """How the cluster views reach Prometheus, besides its URL."""

    bearer_token_file: str | None = None
    """A file holding the bearer token sent as ``Authorization: Bearer``; ``None``: none."""
    basic_auth_file: str | None = None
    """A file holding one line ``user:password`` for HTTP basic authentication; ``None``: none."""
    ca_file: str | None = None
    """The CA certificates (PEM) that verify an https Prometheus; ``None``: the system's."""
    insecure_skip_verify: bool = False
    """Whether an https Prometheus's certificate goes unchecked (logged as a warning at start)."""
    headers: tuple[tuple[str, str], ...] = ()
    """Headers sent with every query (``X-Scope-OrgID`` for Mimir, Cortex or Thanos tenants)."""
    scope: SeriesScope = field(default_factory=SeriesScope)
    """The host label and the matchers every series the cluster views select carries."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    """How long one query may take before it fails as unanswered (``--prometheus-timeout``)."""


def _read(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as stream:
            return stream.read(64 * 1024 + 1)
    except OSError as error:
        raise CredentialsError(f"{what}: cannot read {path}: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise CredentialsError(f"{what}: {path} is not UTF-8 text") from None


def _printable(text: str) -> bool:
    return all(" " <= char != "\x7f" for char in text)


def read_bearer_token(path: str) -> str:
    """The token in ``path`` (surrounding whitespace dropped); raises :class:`CredentialsError`."""
    what = "--prometheus-bearer-token-file"
    token = _read(path, what).strip()
    if not token:
        raise CredentialsError(f"{what}: {path} is empty")
    if not _printable(token) or " " in token:
        raise CredentialsError(f"{what}: {path} holds more than one token (spaces, line breaks or control "
                               "characters inside)")
    return token


def read_basic_auth(path: str) -> str:
    """``user:password`` from the first line of ``path``; raises :class:`CredentialsError`."""
    what = "--prometheus-basic-auth-file"
    text = _read(path, what)
    line = text.rstrip("\r\n")
    if not line.strip():
        raise CredentialsError(f"{what}: {path} is empty")
    if "\n" in line or "\r" in line:
        raise CredentialsError(f"{what}: {path} must hold one line user:password")
    user, colon, _password = line.partition(":")
    if not colon or not user:
        raise CredentialsError(f"{what}: {path} must hold user:password (no colon after a user name found)")
    if not _printable(line):
        raise CredentialsError(f"{what}: {path} holds control characters")
    return line


def _stamp(path: str) -> tuple[int, int, int] | None:
    """What changes when a file is replaced or rewritten (a Kubernetes secret's update swaps a symlink)."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_ino, status.st_mtime_ns, status.st_size


class SecretFile:
    """A secret read from a file now, and again when the file changes; an unreadable new version keeps the last
    good secret (and is logged once, without the secret)."""

    def __init__(self, path: str, read: Callable[[str], str]) -> None:
        self.path = path
        self._read = read
        self._lock = threading.Lock()
        self._stamp = _stamp(path)
        self._value = read(path)
        self._failure: str | None = None

    def value(self) -> str:
        """The secret, re-read first if the file changed since the last read."""
        if _stamp(self.path) != self._stamp:
            self.reload()
        return self._value

    def reload(self) -> bool:
        """Read the file now; whether the secret changed."""
        with self._lock:
            stamp = _stamp(self.path)
            try:
                value = self._read(self.path)
            except CredentialsError as error:
                if self._failure != str(error):
                    log.warning("cluster view: keeping the last credentials: %s", error)
                    self._failure = str(error)
                self._stamp = stamp
                return False
            self._failure = None
            self._stamp = stamp
            changed = value != self._value
            self._value = value
            return changed


class Credentials:
    """The ``Authorization`` header for each request, from a bearer token file or a basic-auth file."""

    def __init__(self, access: PrometheusAccess) -> None:
        self._token = (SecretFile(access.bearer_token_file, read_bearer_token)
                       if access.bearer_token_file is not None else None)
        self._basic = (SecretFile(access.basic_auth_file, read_basic_auth)
                       if access.basic_auth_file is not None else None)

    @property
    def given(self) -> bool:
        """Whether any credentials are configured."""
        return self._token is not None or self._basic is not None

    def headers(self) -> dict[str, str]:
        """The ``Authorization`` header (none without credentials), from the files' current contents."""
        if self._token is not None:
            return {"Authorization": f"Bearer {self._token.value()}"}
        if self._basic is not None:
            encoded = base64.b64encode(self._basic.value().encode("utf-8")).decode("ascii")
            return {"Authorization": f"Basic {encoded}"}
        return {}

    def renew(self) -> bool:
        """After a refusal: re-read the files; whether a credential changed (then the request is worth a retry)."""
        return any(secret.reload() for secret in (self._token, self._basic) if secret is not None)


def tls_context(access: PrometheusAccess) -> ssl.SSLContext | None:
    """The TLS context for an https Prometheus: its CA file's, or none checking anything; ``None``: the system's.
    Raises :class:`CredentialsError` for a CA file that is not PEM certificates."""
    if access.insecure_skip_verify:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    if access.ca_file is not None:
        try:
            return ssl.create_default_context(cafile=access.ca_file)
        except ssl.SSLError:
            raise CredentialsError(f"--prometheus-ca-file: {access.ca_file} holds no PEM certificate") from None
        except OSError as error:
            raise CredentialsError(f"--prometheus-ca-file: cannot read {access.ca_file}: "
                                   f"{error.strerror or error}") from None
    return None
