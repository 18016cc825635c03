"""The name resolver: answers from its cache at once, looks names up on its own supervised thread."""

from __future__ import annotations

import os
import pwd
import threading

from nvdash.sampling.user_names import THREAD_NAME, NameResolver, system_group_of, system_user
from nvdash.supervision import Supervisor
from tests.conftest import wait_for


def _in_thread(call: object) -> list[object]:
    """``call()``'s result from a daemon thread; empty when it did not return (it blocked)."""
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(call()), daemon=True)  # type: ignore[operator]
    thread.start()
    thread.join(30.0)
    return result


def test_a_lookup_that_blocks_never_blocks_the_caller() -> None:
    release = threading.Event()
    asked: list[int] = []

    def directory(uid: int) -> str | None:
        asked.append(uid)
        release.wait()
        return f"user{uid}"

    supervisor = Supervisor()
    names = NameResolver(user_of=directory, supervisor=supervisor)
    assert _in_thread(lambda: [names.user(1234) for _ in range(100)] + [names.user(5)]) == [[None] * 101]
    wait_for(lambda: list(asked), lambda uids: uids == [1234])  # asked once, however often the caller asked
    assert names.pending() == 2
    release.set()
    wait_for(lambda: (names.user(1234), names.user(5)), lambda got: got == ("user1234", "user5"))
    assert asked == [1234, 5]
    assert names.pending() == 0
    assert supervisor.report()[THREAD_NAME]["running"] is True
    names.stop()
    wait_for(supervisor.report, lambda report: report[THREAD_NAME]["running"] is False)


def test_a_hung_lookup_shows_as_an_overdue_thread() -> None:
    release = threading.Event()
    clock = [0.0]
    supervisor = Supervisor(monotonic=lambda: clock[0])

    def directory(uid: int) -> str | None:
        release.wait()
        return None

    names = NameResolver(user_of=directory, supervisor=supervisor)
    assert names.user(7) is None
    wait_for(names.pending, lambda pending: pending == 1)
    clock[0] = 60.0
    assert [item.name for item in supervisor.overdue()] == [THREAD_NAME]
    release.set()
    wait_for(names.pending, lambda pending: pending == 0)
    assert names.user(7) is None, "no name: the caller shows the UID"
    names.stop()


def test_a_lookup_that_raises_is_retried_by_a_restarted_thread() -> None:
    calls: list[str] = []

    def group_of(user: str) -> str | None:
        calls.append(user)
        if len(calls) == 1:
            raise OSError("the directory server went away")
        return "ml"

    supervisor = Supervisor(first_backoff_s=0.01)
    names = NameResolver(group_of=group_of, supervisor=supervisor)
    assert names.group_of("alice") is None
    wait_for(lambda: names.group_of("alice"), lambda group: group == "ml")
    assert supervisor.report()[THREAD_NAME]["deaths"] == 1
    names.stop()


def test_the_system_lookups() -> None:
    me = pwd.getpwuid(os.getuid())
    assert system_user(os.getuid()) == me.pw_name
    assert system_user(3_999_999_999) is None
    assert system_user(2**40) is None
    assert system_group_of("no-such-user-here") is None
    assert system_group_of(me.pw_name) is not None
