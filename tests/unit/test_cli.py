"""Command-line parsing: defaults, environment, and one-line errors."""

from __future__ import annotations

import pytest

from nvdash.cli import UsageError, parse_settings
from nvdash.settings import Settings


def test_defaults_are_secure_and_match_settings() -> None:
    settings = parse_settings([], {})
    assert settings == Settings()
    assert settings.host == "127.0.0.1"
    assert settings.port == 8000
    assert settings.interval_s == 0.5


def test_all_options() -> None:
    settings = parse_settings(
        [
            "--host",
            "0.0.0.0",
            "--port",
            "9001",
            "--interval",
            "0.25",
            "--simulate",
            "t4",
            "--seed",
            "7",
            "--allow-websocket-origin",
            "gpu-node:9001",
            "--allow-websocket-origin",
            "proxy:443",
            "--prefix",
            "nvdash/",
            "--history",
            "600",
            "--process-interval",
            "5",
            "--kubelet-socket",
            "/run/kubelet/pod-resources.sock",
        ],
        {},
    )
    assert settings == Settings(
        host="0.0.0.0",
        port=9001,
        interval_s=0.25,
        simulate="t4",
        seed=7,
        allow_websocket_origin=("gpu-node:9001", "proxy:443"),
        prefix="/nvdash",
        history=600,
        process_interval_s=5.0,
        kubelet_socket="/run/kubelet/pod-resources.sock",
    )


def test_process_collection_defaults_and_off() -> None:
    assert parse_settings([], {}).process_interval_s == 2.0
    assert parse_settings([], {}).kubelet_socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert parse_settings(["--process-interval", "0"], {}).process_interval_s == 0.0


def test_environment_selects_simulation_and_faults() -> None:
    settings = parse_settings([], {"NVDASH_SIMULATE": "a100-pcie-2", "NVDASH_FAKE_FAULTS": "lose:1@3"})
    assert settings.simulate == "a100-pcie-2"
    assert settings.faults == "lose:1@3"
    assert parse_settings(["--simulate", "t4"], {"NVDASH_SIMULATE": "dgx-h100"}).simulate == "t4"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--interval", "0.01"], "--interval must be at least 0.1 seconds"),
        (["--interval", "fast"], "invalid float value: 'fast'"),
        (["--port", "70000"], "--port must be between 0 and 65535"),
        (["--simulate", "gtx-9000"], "unknown profile 'gtx-9000'; choose one of: "),
        (["--history", "1"], "--history must be at least 2"),
        (["--process-interval", "0.2"], "--process-interval must be 0 (off) or at least --interval (0.5 s)"),
        (["--process-interval", "-1"], "--process-interval must be 0 (off) or at least --interval"),
        (["--frobnicate"], "unrecognized arguments: --frobnicate"),
    ],
)
def test_bad_input_is_one_clear_line(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_settings(argv, {})
    assert message in str(info.value)
    assert "\n" not in str(info.value)
