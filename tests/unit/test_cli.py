"""Command-line parsing: defaults, environment, and one-line errors."""

from __future__ import annotations

import pytest

from nvdash.server.options import UsageError, parse_replay, parse_settings
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
            "--live-samples",
            "600",
            "--history",
            "/data/nvdash.sqlite",
            "--retention",
            "30d",
            "--process-interval",
            "5",
            "--kubelet-socket",
            "/run/kubelet/pod-resources.sock",
            "--pod-log-dir",
            "/host/var/log/pods",
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
        live_samples=600,
        history_path="/data/nvdash.sqlite",
        retention_s=30 * 86400.0,
        process_interval_s=5.0,
        kubelet_socket="/run/kubelet/pod-resources.sock",
        pod_log_dir="/host/var/log/pods",
    )


def test_process_collection_defaults_and_off() -> None:
    assert parse_settings([], {}).process_interval_s == 2.0
    assert parse_settings([], {}).kubelet_socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert parse_settings([], {}).pod_log_dir == "/var/log/pods"
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
        (["--live-samples", "1"], "--live-samples must be at least 2"),
        (["--history", "600"], "--history now names the history file, not a sample count; use --live-samples 600"),
        (["--retention", "7x"], "--retention: '7x' is not a duration"),
        (["--retention", "5s"], "--retention: '5s' is not a duration"),
        (["--retention", "5m"], "--retention must be at least 10m"),
        (["--history", "a.sqlite", "--no-history"], "--history and --no-history contradict each other"),
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


def test_history_is_on_by_default_and_can_be_turned_off() -> None:
    settings = parse_settings([], {})
    assert settings.history is True
    assert settings.history_path is None
    assert settings.retention_s == 7 * 86400.0
    assert parse_settings(["--no-history"], {}).history is False
    assert parse_settings([], {"NVDASH_HISTORY": "off"}).history is False
    assert parse_settings([], {"NVDASH_HISTORY": "/srv/h.sqlite"}).history_path == "/srv/h.sqlite"
    assert parse_settings(["--retention", "12h"], {}).retention_s == 12 * 3600.0
    assert parse_settings(["--retention", "90m"], {}).retention_s == 90 * 60.0


def test_replay_takes_a_file_and_server_options() -> None:
    settings = parse_replay(["rec.sqlite", "--port", "9100", "--prefix", "x"])
    assert settings.replay == "rec.sqlite"
    assert settings.port == 9100
    assert settings.prefix == "/x"
    assert settings.history is False
    with pytest.raises(UsageError) as info:
        parse_replay([])
    assert "FILE" in str(info.value)


@pytest.mark.parametrize(("value", "expected"), [("2", 2.0), ("0.5", 0.5), ("0", 60.0), ("-3", 60.0), ("inf", 60.0),
                                                 ("nan", 60.0), ("soon", 60.0)])
def test_the_prune_period_comes_from_the_environment_when_it_is_a_positive_number(value: str, expected: float) -> None:
    assert parse_settings([], {"NVDASH_PRUNE_EVERY": value}).prune_every_s == expected
    assert parse_settings([], {}).prune_every_s == 60.0
