"""The NVML caller's close: no call reaches NVML once it is being shut down, and none is under way when it is."""

from __future__ import annotations

import threading

import pynvml
import pytest

from nvdash.sampling.nvml_device import NvmlCaller


def test_quiesce_waits_for_a_call_under_way_and_refuses_other_threads_calls() -> None:
    caller = NvmlCaller(pynvml)
    entered, release = threading.Event(), threading.Event()
    returned: list[str] = []

    def slow_read() -> str:
        entered.set()
        release.wait(30)
        return "read"

    reader = threading.Thread(target=lambda: returned.append(caller.call(slow_read)))
    reader.start()
    assert entered.wait(30)
    quiesced: list[bool] = []
    closer = threading.Thread(target=lambda: quiesced.append(caller.quiesce(30.0)))
    closer.start()
    closer.join(0.2)
    assert closer.is_alive(), "quiesce returned while a call was inside NVML"
    refused: list[BaseException] = []

    def another_read() -> None:
        try:
            caller.call(lambda: "late")
        except pynvml.NVMLError as error:
            refused.append(error)

    late = threading.Thread(target=another_read)
    late.start()
    late.join(30)
    assert [type(error) for error in refused] == [pynvml.NVMLError_Uninitialized]
    release.set()
    closer.join(30)
    reader.join(30)
    assert quiesced == [True]
    assert returned == ["read"]


def test_quiesce_gives_up_on_a_hung_call_and_the_closing_thread_may_still_call() -> None:
    caller = NvmlCaller(pynvml)
    entered, release = threading.Event(), threading.Event()
    reader = threading.Thread(target=lambda: caller.call(lambda: (entered.set(), release.wait(30))))
    reader.start()
    assert entered.wait(30)
    try:
        assert caller.quiesce(0.05) is False
        assert caller.call(lambda: "shutdown") == "shutdown"  # the closing thread frees buffers, shuts NVML down
        caller.close()
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            caller.call(lambda: "after close")
    finally:
        release.set()
        reader.join(30)
    assert caller.calls == 2
