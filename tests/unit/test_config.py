"""Options from a ``--config`` TOML file and from ``$NVDASH_<OPTION>``: the grouped ``--help``, one precedence rule
(flag > environment > file > default), the flags' own checks for every source, and one-line errors that say
where a bad value came from; hostile files (a FIFO, a huge file, bad TOML) are refused at once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nvdash.server.config_file import MAX_BYTES
from nvdash.server.config_sources import env_name, option_tables, settable_options
from nvdash.server.options import GROUPS, UsageError, _serve_parser, parse_replay, parse_settings
from nvdash.settings import Settings
from tests.conftest import free_port, get_json, nvdash_env, nvdash_server


def _file(tmp_path: Path, text: str, name: str = "nvdash.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _error(argv: list[str], environ: dict[str, str] | None = None) -> str:
    with pytest.raises(UsageError) as info:
        parse_settings(argv, environ or {})
    message = str(info.value)
    assert "\n" not in message
    return message


def test_help_shows_every_option_in_exactly_one_group_in_order() -> None:
    parser = _serve_parser()
    tables = option_tables(parser, GROUPS)
    assert sorted(tables) == sorted(settable_options(parser)), "an option outside the groups"
    assert tables["--port"] == "server"
    assert tables["--no-token"] == "server"
    assert tables["--process-interval"] == "sampling"
    assert tables["--live-samples"] == "sampling"
    assert tables["--retention"] == "history"
    assert tables["--metrics-pods"] == "metrics"
    assert tables["--prometheus"] == "cluster"
    assert tables["--idle-after"] == "accounting"
    text = parser.format_help()
    headings = [line[:-1] for line in text.splitlines() if line.rstrip(":") in GROUPS and line.endswith(":")]
    assert headings == list(GROUPS)
    assert text.startswith("usage: nvdash [serve] [options]\n")
    assert "The command line wins over the environment, which wins over the file." in " ".join(text.split())


def test_the_file_sets_options_at_the_top_or_in_their_table_with_dashes_or_underscores(tmp_path: Path) -> None:
    config = _file(tmp_path, """
interval = 1
metrics_compat = "4.9"
[server]
port = 9001
allow-host = ["a.example", "b.example"]
no_token = true
host = "0.0.0.0"
[sampling]
process-interval = 3.5
simulate = "t4"
[history]
retention = "12h"
[metrics]
metrics-pods = true
metrics-processes = false
[accounting]
idle-after = "10m"
""")
    settings = parse_settings(["--config", str(config)], {})
    assert (settings.port, settings.host, settings.interval_s, settings.process_interval_s) == (
        9001, "0.0.0.0", 1.0, 3.5)
    assert settings.allow_hosts == ("a.example", "b.example")
    assert (settings.no_token, settings.token) == (True, None)
    assert (settings.simulate, settings.retention_s, settings.idle_after_s) == ("t4", 12 * 3600.0, 600.0)
    assert (settings.metrics_pods, settings.metrics_processes, settings.metrics_compat) == (True, False, "4.9")


@pytest.mark.parametrize(
    ("file_value", "env_value", "flag", "expected"),
    [
        (None, None, None, Settings().port),
        ("9001", None, None, 9001),
        ("9001", "9002", None, 9002),
        ("9001", "9002", "9003", 9003),
        (None, None, "9003", 9003),
        (None, "9002", None, 9002),
    ],
)
def test_precedence_of_a_value(tmp_path: Path, file_value: str | None, env_value: str | None, flag: str | None,
                               expected: int) -> None:
    config = _file(tmp_path, f"[server]\nport = {file_value}\n" if file_value else "")
    argv = ["--config", str(config)] + (["--port", flag] if flag else [])
    assert parse_settings(argv, {"NVDASH_PORT": env_value} if env_value else {}).port == expected


@pytest.mark.parametrize(
    ("file_value", "env_value", "flag", "expected"),
    [
        (None, None, False, False),
        ("true", None, False, True),
        ("true", "0", False, False),
        ("true", "no", False, False),
        ("false", "yes", False, True),
        ("false", "TRUE", False, True),
        ("false", "false", True, True),
        (None, "1", False, True),
    ],
)
def test_precedence_of_a_flag(tmp_path: Path, file_value: str | None, env_value: str | None, flag: bool,
                              expected: bool) -> None:
    config = _file(tmp_path, f"metrics-pods = {file_value}\n" if file_value else "")
    argv = ["--config", str(config)] + (["--metrics-pods"] if flag else [])
    environ = {"NVDASH_METRICS_PODS": env_value} if env_value else {}
    assert parse_settings(argv, environ).metrics_pods is expected


@pytest.mark.parametrize(
    ("env_value", "flags", "expected"),
    [
        (None, [], ("file.example", "file2.example")),
        ("env.example, env2.example", [], ("env.example", "env2.example")),
        ("env.example", ["--allow-host", "flag.example"], ("flag.example",)),
        (None, ["--allow-host", "flag.example", "--allow-host", "flag2.example"], ("flag.example", "flag2.example")),
    ],
)
def test_precedence_of_a_repeatable_option_replaces_the_whole_list(tmp_path: Path, env_value: str | None,
                                                                   flags: list[str],
                                                                   expected: tuple[str, ...]) -> None:
    config = _file(tmp_path, '[server]\nallow_host = ["file.example", "file2.example"]\n')
    environ = {"NVDASH_ALLOW_HOST": env_value} if env_value else {}
    assert parse_settings(["--config", str(config), *flags], environ).allow_hosts == expected


def test_every_option_has_its_variable() -> None:
    options = settable_options(_serve_parser())
    assert env_name("--process-interval") == "NVDASH_PROCESS_INTERVAL"
    assert parse_settings([], {"NVDASH_PROCESS_INTERVAL": "5"}).process_interval_s == 5.0
    assert parse_settings([], {"NVDASH_RETENTION": "2d"}).retention_s == 2 * 86400.0
    assert parse_settings([], {"NVDASH_PREFIX": "dash"}).prefix == "/dash"
    assert parse_settings([], {"NVDASH_NO_HISTORY": "yes"}).history is False
    assert parse_settings([], {"NVDASH_PORT": " "}).port == Settings().port, "a blank variable is unset"
    assert len(options) > 30
    assert all(env_name(option).startswith("NVDASH_") for option in options)


def test_a_kubernetes_service_link_is_not_a_port(tmp_path: Path) -> None:
    # A Service named nvdash gives each pod in its namespace NVDASH_PORT=tcp://ADDRESS:PORT (and NVDASH_SERVICE_*).
    config = _file(tmp_path, "[server]\nport = 9009\n")
    links = {"NVDASH_PORT": "tcp://10.96.0.12:8000", "NVDASH_SERVICE_HOST": "10.96.0.12",
             "NVDASH_SERVICE_PORT": "8000", "NVDASH_PORT_8000_TCP": "tcp://10.96.0.12:8000"}
    assert parse_settings(["--config", str(config)], links).port == 9009
    assert parse_settings([], links).port == Settings().port


def test_the_older_variables_keep_their_meaning_and_outrank_the_file(tmp_path: Path) -> None:
    config = _file(tmp_path, """
[server]
token = "from-the-file"
[sampling]
simulate = "t4"
[history]
history = "/srv/file.sqlite"
[metrics]
metrics-token = "metrics-file"
""")
    argv = ["--config", str(config)]
    from_file = parse_settings(argv, {})
    assert (from_file.token, from_file.simulate, from_file.history_path) == ("from-the-file", "t4", "/srv/file.sqlite")
    assert from_file.metrics_token == "metrics-file"
    environ = {"NVDASH_TOKEN": "env", "NVDASH_SIMULATE": "dgx-h100", "NVDASH_HISTORY": "off",
               "NVDASH_METRICS_TOKEN": "metrics-env"}
    from_env = parse_settings(argv, environ)
    assert (from_env.token, from_env.simulate, from_env.history, from_env.metrics_token) == (
        "env", "dgx-h100", False, "metrics-env")
    assert parse_settings([*argv, "--history", "/srv/flag.sqlite"], environ).history_path == "/srv/flag.sqlite"
    assert parse_settings([*argv, "--token", "flag"], environ).token == "flag"
    # As before: a token from the environment is not one for a unix socket; one from the file or flag is.
    assert parse_settings(["--unix-socket", str(tmp_path / "s")], {"NVDASH_TOKEN": "env"}).token is None
    assert "(in " in _error([*argv, "--unix-socket", str(tmp_path / "s")])
    job_dir = tmp_path / "jobs"
    job_dir.mkdir()
    jobs = _file(tmp_path, f'[accounting]\njob-mapping-dir = "{tmp_path / "nowhere"}"\n', "jobs.toml")
    assert parse_settings(["--config", str(jobs)], {"NVDASH_JOB_MAPPING_DIR": str(job_dir)}).job_mapping_dir == str(
        job_dir)


def test_the_config_file_can_come_from_the_environment(tmp_path: Path) -> None:
    config = _file(tmp_path, "[server]\nport = 9005\n")
    assert parse_settings([], {"NVDASH_CONFIG": str(config)}).port == 9005
    other = _file(tmp_path, "[server]\nport = 9006\n", "other.toml")
    assert parse_settings(["--config", str(other)], {"NVDASH_CONFIG": str(config)}).port == 9006
    assert _error([], {"NVDASH_CONFIG": str(tmp_path / "none.toml")}) == (
        f"cannot read configuration file {tmp_path / 'none.toml'}: No such file or directory (from $NVDASH_CONFIG)")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("prot = 1", "{file}: unknown key prot (did you mean port?)"),
        ("[sampling]\nport = 1", "{file}: key sampling.port: --port belongs in [server], not [sampling]"),
        ("[servr]\nport = 1", "{file}: unknown table [servr] (did you mean [server]?)"),
        ("[frobs]\nx = 1", "{file}: unknown table [frobs] (tables: server, sampling, history, metrics, cluster, "
         "accounting)"),
        ("server = 1", "{file}: key server must be a table ([server]), not an integer"),
        ("port = 1\n[server]\nport = 2", "{file}: key server.port: --port is already set by key port"),
        ("config = 'other.toml'", "{file}: key config: a configuration file cannot name another"),
        ('port = "8000"', "--port takes an integer, not a string (in {file}, key port)"),
        ("port = 80.5", "--port takes an integer, not a decimal number (in {file}, key port)"),
        ("interval = true", "--interval takes a number, not true or false (in {file}, key interval)"),
        ('[server]\nno-token = "yes"', "--no-token takes true or false, not a string (in {file}, key server.no-token)"),
        ('allow-host = "a.example"',
         "--allow-host takes a list (it is repeatable), not a string (in {file}, key allow-host)"),
        ("allow-host = [1]", "--allow-host takes a list of strings, not a list holding an integer "
         "(in {file}, key allow-host)"),
        ("retention = 7", "--retention takes a string, not an integer (in {file}, key retention)"),
        # The flags' own checks, with where the value came from:
        ("port = 70000", "--port must be between 0 and 65535, not 70000 (in {file}, key port)"),
        ("interval = 0.01", "--interval must be at least 0.1 seconds, not 0.01 (in {file}, key interval)"),
        ("[history]\nretention = '5m'", "--retention must be at least 10m, not 5m (in {file}, key history.retention)"),
        ("[sampling]\nprocess-interval = 0.2", "--process-interval must be 0 (off) or at least --interval (0.5 s), "
         "not 0.2 (in {file}, key sampling.process-interval)"),
        ("[sampling]\nsimulate = 'gtx-9000'", "unknown profile 'gtx-9000'; choose one of: "),
        ("port = [", "{file}: not valid TOML: Invalid value (at end of document)"),
        ("a = 1\na = 2", "{file}: not valid TOML: Cannot overwrite a value (at line 2, column 6)"),
    ],
)
def test_a_bad_file_is_one_line_naming_the_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    config = _file(tmp_path, text + "\n")
    error = _error(["--config", str(config)])
    expected = message.format(file=config)
    if expected.endswith(": "):
        assert error.startswith(expected)
        assert error.endswith(f"(in {config}, key sampling.simulate)")
    else:
        assert error == expected


@pytest.mark.parametrize(
    ("key", "toml_value", "flag_value"),
    [("metrics-compat", "'5'", "5"), ("port", "-1", "-1"), ("metrics-labels", "'gpu,bogus'", "gpu,bogus"),
     ("allow-host", "['a b']", "a b"), ("unix-socket", "''", ""), ("idle-after", "'0s'", "0s")],
)
def test_a_value_from_the_file_or_the_environment_gets_the_flags_own_message(tmp_path: Path, key: str,
                                                                             toml_value: str,
                                                                             flag_value: str) -> None:
    from_flag = _error([f"--{key}={flag_value}"])
    config = _file(tmp_path, f"{key} = {toml_value}\n")
    assert _error(["--config", str(config)]) == f"{from_flag} (in {config}, key {key})"
    name = env_name(f"--{key}")
    if flag_value.strip():  # a blank variable is unset
        assert _error([], {name: flag_value}) == f"{from_flag} (from ${name})"


def test_a_flag_given_on_the_command_line_is_not_blamed_on_the_file(tmp_path: Path) -> None:
    config = _file(tmp_path, "interval = 1\n")
    assert _error(["--config", str(config), "--port", "70000"]) == "--port must be between 0 and 65535, not 70000"


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"NVDASH_PORT": "abc"}, "argument --port: invalid int value: 'abc' (from $NVDASH_PORT)"),
        ({"NVDASH_PORT": "70000"}, "--port must be between 0 and 65535, not 70000 (from $NVDASH_PORT)"),
        ({"NVDASH_NO_TOKEN": "maybe"}, "$NVDASH_NO_TOKEN must be 1, true or yes, or 0, false or no, not 'maybe'"),
        ({"NVDASH_RETENTION": "5m"}, "--retention must be at least 10m, not 5m (from $NVDASH_RETENTION)"),
        ({"NVDASH_INTERVAL": "0"}, "--interval must be at least 0.1 seconds, not 0.0 (from $NVDASH_INTERVAL)"),
    ],
)
def test_a_bad_variable_is_one_line_naming_it(environ: dict[str, str], message: str) -> None:
    assert _error([], environ) == message


def test_an_unknown_profile_from_the_environment_names_the_variable() -> None:
    error = _error([], {"NVDASH_SIMULATE": "nope"})
    assert error.startswith("unknown profile 'nope'; choose one of: ")
    assert error.endswith(" (from $NVDASH_SIMULATE)")


def test_replay_takes_the_server_options_of_the_same_file_and_ignores_the_others(tmp_path: Path) -> None:
    config = _file(tmp_path, "[server]\nport = 9007\n[sampling]\ninterval = 2\nlive-samples = 50\n")
    settings = parse_replay(["rec.sqlite", "--config", str(config)], {"NVDASH_PREFIX": "r"})
    assert (settings.replay, settings.port, settings.live_samples, settings.prefix) == ("rec.sqlite", 9007, 50, "/r")
    typo = _file(tmp_path, "[server]\nprot = 1\n", "typo.toml")
    with pytest.raises(UsageError, match=r"typo\.toml: unknown key server\.prot \(did you mean port\?\)$"):
        parse_replay(["rec.sqlite", "--config", str(typo)], {})


def test_hostile_files_are_refused_at_once_in_one_line(tmp_path: Path) -> None:
    assert _error(["--config", str(tmp_path)]) == f"configuration file {tmp_path} is not a regular file"
    assert _error(["--config", "/dev/zero"]) == "configuration file /dev/zero is not a regular file"
    huge = tmp_path / "huge.toml"
    huge.write_bytes(b"# padding\n" * (MAX_BYTES // 10 + 1))
    assert _error(["--config", str(huge)]) == f"configuration file {huge} is larger than 1 MiB"
    just_fits = _file(tmp_path, "port = 9008\n" + "#" * (MAX_BYTES - 13) + "\n", "fits.toml")
    assert just_fits.stat().st_size == MAX_BYTES
    assert parse_settings(["--config", str(just_fits)], {}).port == 9008
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"port = 1\n\xff\xfe")
    assert _error(["--config", str(binary)]) == f"{binary}: not UTF-8 text (byte 9)"
    unreadable = _file(tmp_path, "port = 1\n", "secret.toml")
    unreadable.chmod(0)
    if not os.access(unreadable, os.R_OK):  # root reads any file
        assert _error(["--config", str(unreadable)]) == (
            f"cannot read configuration file {unreadable}: Permission denied")


def test_a_fifo_as_config_file_does_not_hang_the_command(tmp_path: Path) -> None:
    fifo = tmp_path / "config.fifo"
    os.mkfifo(fifo)
    result = subprocess.run([sys.executable, "-m", "nvdash", "--config", str(fifo), "--port", str(free_port())],
                            env=nvdash_env(), capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"nvdash: error: configuration file {fifo} is not a regular file"]


def test_invalid_toml_from_the_command_is_one_line(tmp_path: Path) -> None:
    config = _file(tmp_path, "[server\nport = 1\n")
    result = subprocess.run([sys.executable, "-m", "nvdash", "--config", str(config)],
                            env=nvdash_env(), capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"nvdash: error: {config}: not valid TOML: Expected ']' at the end of a table declaration "
        "(at line 1, column 8)"]


def test_a_server_serves_with_the_values_of_its_config_file(tmp_path: Path) -> None:
    # The file's port is outranked by the --port the test harness gives; its simulation and history are used.
    config = _file(tmp_path, f"""
[server]
port = {free_port()}
[sampling]
simulate = "a100-pcie-2"
[history]
no-history = true
""")
    with nvdash_server(args=["--config", str(config)]) as server:
        info = get_json(server.url + "/info.json")
        assert info["simulated"] == "a100-pcie-2"
        assert len(info["gpus"]) == 2
        assert info["history"]["status"] == "off (--no-history)"
        assert server.health()["history"]["status"] == "off (--no-history)"
