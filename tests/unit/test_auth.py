"""The access rules without a server: loopback hosts, token choice, headers, cookies, redirects, TLS files,
the websocket origins, the command line, and the event-loop monitor's read-only window."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from nvdash.sampling.host_source import interface_addresses
from nvdash.server.access import (
    COOKIE_MAX_AGE_S,
    cookie_name,
    cookie_valid,
    dashboard_token,
    is_loopback,
    local_target,
    new_token,
    same_secret,
    sign_cookie,
    start_url,
    token_from_authorization,
)
from nvdash.server.app import websocket_origins
from nvdash.server.loop_monitor import LoopMonitor
from nvdash.server.options import UsageError, parse_replay, parse_settings
from nvdash.server.run import start_lines, with_token
from nvdash.server.tls import CertificateError, check_certificate
from nvdash.settings import Settings

NOW = 1_700_000_000.0


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost", "LOCALHOST.",
                                  "::ffff:127.0.0.1"])
def test_loopback_hosts(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "192.0.2.2", "fd00::2", "gpu-node-1", "localhost.example.org",
                                  "::ffff:192.0.2.2", "128.0.0.1"])
def test_other_hosts_are_not_loopback(host: str) -> None:
    assert not is_loopback(host)


def test_the_token_rules() -> None:
    def generate() -> str:
        return "generated"

    assert dashboard_token(None, False, "127.0.0.1", generate) is None
    assert dashboard_token(None, False, "0.0.0.0", generate) == "generated"
    assert dashboard_token(None, False, "192.0.2.2", generate) == "generated"
    assert dashboard_token("given", False, "127.0.0.1", generate) == "given"  # a given token applies on loopback
    assert dashboard_token("given", False, "0.0.0.0", generate) == "given"
    assert dashboard_token(None, True, "0.0.0.0", generate) is None
    assert dashboard_token("given", True, "0.0.0.0", generate) is None


def test_generated_tokens_are_long_random_and_url_safe() -> None:
    tokens = {new_token() for _ in range(20)}
    assert len(tokens) == 20
    assert all(len(token) == 48 and int(token, 16) >= 0 for token in tokens)


@pytest.mark.parametrize(("header", "token"), [
    ("token abc123", "abc123"),
    ("Token abc123", "abc123"),
    ("Bearer abc123", "abc123"),
    ("bearer   abc123  ", "abc123"),
    ("Basic YWJjOmRlZg==", None),
    ("Bearer", None),
    ("Bearer ", None),
    ("", None),
    ("abc123", None),
])
def test_authorization_header(header: str, token: str | None) -> None:
    assert token_from_authorization(header) == token


def test_secrets_compare_whole_values_and_survive_odd_input() -> None:
    assert same_secret("abc", "abc")
    assert not same_secret("abd", "abc")
    assert not same_secret("ab", "abc")
    assert not same_secret("\ud800", "abc")  # a lone surrogate from a query string is just wrong, not an error


def test_the_cookie_is_signed_not_the_token_and_expires() -> None:
    value = sign_cookie("s3cret", NOW)
    assert "s3cret" not in value
    assert value.startswith(f"{int(NOW)}.")
    assert cookie_valid("s3cret", value, NOW)
    assert cookie_valid("s3cret", value, NOW + COOKIE_MAX_AGE_S - 1)
    assert not cookie_valid("s3cret", value, NOW + COOKIE_MAX_AGE_S)
    assert not cookie_valid("other", value, NOW)  # a new token invalidates the cookies of the old one
    assert not cookie_valid("s3cret", value, NOW - 3600)  # issued an hour in the future: forged or wrong clock


@pytest.mark.parametrize("value", [
    "", ".", "abc", f"{int(NOW)}", f"{int(NOW)}.", f"{int(NOW) + 1}.{sign_cookie('s3cret', NOW).split('.')[1]}",
    f"-{int(NOW)}.00", f"{int(NOW)}.{'0' * 64}", "١٢٣." + "0" * 64,
])
def test_a_tampered_cookie_is_refused(value: str) -> None:
    assert not cookie_valid("s3cret", value, NOW)


def test_each_port_has_its_own_cookie() -> None:
    assert cookie_name(8000) != cookie_name(8001)


@pytest.mark.parametrize(("target", "expected"), [
    ("/GPU-Utilization", "/GPU-Utilization"),
    ("/GPU-Utilization?range=6h", "/GPU-Utilization?range=6h"),
    ("/", "/"),
    ("", "/home"),
    ("//evil.example/", "/home"),
    ("/\\evil.example", "/home"),
    ("https://evil.example/", "/home"),
    ("javascript:alert(1)", "/home"),
    ("/a\r\nSet-Cookie: x=1", "/home"),
])
def test_the_login_only_returns_to_local_paths(target: str, expected: str) -> None:
    assert local_target(target, "/home") == expected


def test_the_start_url() -> None:
    assert start_url("http", "localhost", 8000, "", None) == "http://localhost:8000/"
    assert start_url("https", "gpu-node", 8443, "/nvdash", "a b/c") == "https://gpu-node:8443/nvdash/?token=a%20b%2Fc"
    assert start_url("http", "fd00::2", 8000, "", "t") == "http://[fd00::2]:8000/?token=t"


def test_start_lines_print_the_token_and_https() -> None:
    lines = start_lines(Settings(host="0.0.0.0", port=8443, token="t0k", certfile="c.pem"))
    assert lines[0] == "nvdash: open https://localhost:8443/?token=t0k"
    assert all("?token=t0k" in line and line.count("https://") == 1 for line in lines)
    assert start_lines(Settings()) == ["nvdash: open http://localhost:8000/"]
    assert start_lines(Settings(host="192.0.2.2", token="x")) == ["nvdash: open http://192.0.2.2:8000/?token=x"]


def test_a_server_beyond_loopback_gets_a_token_unless_told_otherwise(caplog: pytest.LogCaptureFixture) -> None:
    assert with_token(Settings()).token is None
    assert with_token(Settings(token="given")).token == "given"
    generated = with_token(Settings(host="0.0.0.0")).token
    assert generated is not None
    assert len(generated) == 48
    assert with_token(Settings(host="0.0.0.0")).token != generated
    assert caplog.records == []
    assert with_token(Settings(host="0.0.0.0", no_token=True)).token is None
    assert "--no-token" in caplog.text
    assert "open to anyone" in caplog.text


# --- the command line ----------------------------------------------------------------------------------------------


def test_the_token_comes_from_the_command_line_or_the_environment() -> None:
    assert parse_settings([], {}).token is None
    assert parse_settings(["--token", "abc"], {}).token == "abc"
    assert parse_settings([], {"NVDASH_TOKEN": "env"}).token == "env"
    assert parse_settings(["--token", "abc"], {"NVDASH_TOKEN": "env"}).token == "abc"
    assert parse_settings([], {"NVDASH_TOKEN": "  "}).token is None
    no_token = parse_settings(["--host", "0.0.0.0", "--no-token"], {"NVDASH_TOKEN": "env"})
    assert (no_token.token, no_token.no_token) == (None, True)
    assert parse_replay(["rec.sqlite", "--token", "r"]).token == "r"
    assert parse_replay(["rec.sqlite"], {"NVDASH_TOKEN": "env"}).token == "env"


def test_a_unix_socket_is_local_and_takes_no_token(tmp_path: Path) -> None:
    socket_path = str(tmp_path / "nvdash.sock")
    settings = parse_settings(["--unix-socket", socket_path], {"NVDASH_TOKEN": "env"})
    assert settings.token is None  # the Jupyter proxy in front authenticates; the socket is this user's only
    assert with_token(settings).token is None
    with pytest.raises(UsageError, match="a unix socket is protected by its file mode"):
        parse_settings(["--unix-socket", socket_path, "--token", "abc"], {})


@pytest.mark.parametrize(("argv", "message"), [
    (["--token", ""], "--token must not be empty (use --no-token to serve without one)"),
    (["--token", "a", "--no-token"], "--token and --no-token contradict each other"),
    (["--keyfile", "key.pem"], "--keyfile needs --certfile"),
    (["--certfile", "/nonexistent/cert.pem"], "--certfile: cannot read /nonexistent/cert.pem: No such file"),
])
def test_bad_access_options_are_one_line(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_settings(argv, {})
    assert message in str(info.value)
    assert "\n" not in str(info.value)


# --- TLS files -----------------------------------------------------------------------------------------------------


def _openssl() -> str:
    path = shutil.which("openssl")
    if path is None:
        pytest.fail("the openssl command is missing: install it (Debian: apt-get install -y openssl)")
    return path


def make_certificate(directory: Path, name: str = "server") -> tuple[Path, Path]:
    """A self-signed certificate for localhost and 127.0.0.1, and its key, made with the openssl command."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run([_openssl(), "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return cert, key


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("tls")
    cert, key = make_certificate(directory)
    _other_cert, other_key = make_certificate(directory, "other")
    both = directory / "both.pem"
    both.write_text(cert.read_text() + key.read_text())
    encrypted = directory / "encrypted.key"
    subprocess.run([_openssl(), "pkey", "-in", str(key), "-aes256", "-passout", "pass:x", "-out", str(encrypted)],
                   check=True, capture_output=True, timeout=60)
    junk = directory / "junk.pem"
    junk.write_text("not a certificate\n")
    return {"cert": cert, "key": key, "other_key": other_key, "both": both, "encrypted": encrypted, "junk": junk}


def test_a_matching_certificate_and_key_pass(certificates: dict[str, Path]) -> None:
    check_certificate(str(certificates["cert"]), str(certificates["key"]))
    check_certificate(str(certificates["both"]))
    settings = parse_settings(["--certfile", str(certificates["cert"]), "--keyfile", str(certificates["key"])], {})
    assert (settings.certfile, settings.keyfile) == (str(certificates["cert"]), str(certificates["key"]))


@pytest.mark.parametrize(("cert", "key", "message"), [
    ("cert", "other_key", "the key in {other_key} does not belong to the certificate in {cert}"),
    ("junk", "key", "--certfile: {junk} holds no PEM certificate"),
    ("cert", "junk", "--keyfile: {junk} holds no PEM private key"),
    ("cert", None, "--certfile: {cert} holds no PEM private key; name the key with --keyfile"),
    ("key", "key", "--certfile: {key} holds no PEM certificate"),
    ("cert", "encrypted", "--keyfile: the key in {encrypted} is encrypted; give an unencrypted key"),
    ("cert", "missing", "--keyfile: cannot read {missing}: No such file or directory"),
])
def test_an_unusable_certificate_or_key_is_named_in_one_line(
    certificates: dict[str, Path], cert: str, key: str | None, message: str
) -> None:
    paths = {**{name: str(path) for name, path in certificates.items()}, "missing": "/nonexistent/missing.key"}
    with pytest.raises(CertificateError) as info:
        check_certificate(paths[cert], None if key is None else paths[key])
    assert str(info.value).startswith(message.format(**paths))
    assert "\n" not in str(info.value)


def test_an_unreadable_certificate_file(certificates: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(CertificateError, match=r"cannot read .*: Is a directory"):
        check_certificate(str(tmp_path), str(certificates["key"]))


# --- websocket origins ----------------------------------------------------------------------------------------------


def test_a_wildcard_server_accepts_its_names_and_every_interface_address() -> None:
    origins = websocket_origins(Settings(host="0.0.0.0", port=8000),
                                addresses=lambda: ["127.0.0.1", "192.0.2.2", "::1", "fd00::2"])
    assert origins[:2] == ["localhost:8000", "127.0.0.1:8000"]
    assert f"{socket.gethostname()}:8000" in origins
    for origin in ("192.0.2.2:8000", "[::1]:8000", "[fd00::2]:8000"):
        assert origin in origins
    assert len(origins) == len(set(origins))


def test_a_server_on_one_address_accepts_that_address() -> None:
    assert websocket_origins(Settings(host="192.0.2.2", port=8000), addresses=list) == [
        "localhost:8000", "127.0.0.1:8000", "192.0.2.2:8000"]
    assert websocket_origins(Settings(host="fd00::2", port=8000), addresses=list)[-1] == "[fd00::2]:8000"
    given = Settings(host="0.0.0.0", allow_websocket_origin=("proxy.example:443",))
    assert websocket_origins(given, addresses=lambda: ["192.0.2.2"]) == ["proxy.example:443"]


def test_interface_addresses_leave_out_link_local_ipv6() -> None:
    def entry(family: int, address: str) -> SimpleNamespace:
        return SimpleNamespace(family=family, address=address)

    fake = SimpleNamespace(net_if_addrs=lambda: {
        "lo": [entry(socket.AF_INET, "127.0.0.1"), entry(socket.AF_INET6, "::1")],
        "eth0": [entry(socket.AF_INET, "192.0.2.2"), entry(socket.AF_INET6, "fd00::2"),
                 entry(socket.AF_INET6, "fe80::1%eth0"), entry(getattr(socket, "AF_PACKET", 17), "00:11:22:33:44:55")],
        "eth1": [entry(socket.AF_INET, "192.0.2.2")],
    })
    assert interface_addresses(fake) == ["127.0.0.1", "::1", "192.0.2.2", "fd00::2"]  # type: ignore[arg-type]


def test_this_machines_interface_addresses_include_loopback() -> None:
    assert "127.0.0.1" in interface_addresses()


# --- the event-loop monitor ----------------------------------------------------------------------------------------


def test_the_loop_monitor_reports_the_longest_stall_after_a_moment_without_a_reset() -> None:
    clock = [100.0]
    monitor = LoopMonitor(clock=lambda: clock[0])
    for ran_at, lag_s in [(100.1, 0.002), (100.2, 0.300), (100.3, 0.001), (100.4, 0.050), (100.5, 0.004)]:
        monitor.record(ran_at, lag_s)
    clock[0] = 100.5
    first = monitor.report()
    assert first["at"] == 100.5
    assert first["ticks"] == 5
    assert first["max_lag_ms"] == 300.0
    assert "max_lag_since_ms" not in first
    assert monitor.report(since=100.0)["max_lag_since_ms"] == 300.0
    assert monitor.report(since=100.2)["max_lag_since_ms"] == 50.0
    assert monitor.report(since=100.45)["max_lag_since_ms"] == 4.0
    assert monitor.report(since=first["at"])["max_lag_since_ms"] == 0.0
    monitor.record(100.6, 0.010)
    again = monitor.report(since=first["at"])
    assert again["max_lag_since_ms"] == 10.0
    assert again["since"] == 100.5
    assert monitor.report(since=100.0)["max_lag_since_ms"] == 300.0  # reading changed nothing


def test_the_loop_monitor_keeps_a_bounded_list() -> None:
    monitor = LoopMonitor(clock=lambda: 0.0, max_kept=8)
    for tick in range(1000):
        monitor.record(float(tick), 1.0 - tick / 1000)  # every stall shorter than the one before: all kept
    report = monitor.report(since=995.5)
    assert report["max_lag_since_ms"] == pytest.approx(4.0)
    assert report["kept_since"] == 991.0  # answers are exact from there on
    assert monitor.report(since=10.0)["max_lag_since_ms"] == pytest.approx(8.0)  # older: the oldest kept
