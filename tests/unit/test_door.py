"""The pure rules of the server's door: the Host a request names, which hosts a server answers, the token taken
out of a URL and out of log lines, the allowed hosts from the settings, ``--allow-host``."""

from __future__ import annotations

import socket

import pytest

from nvdash.history.ranges import RangeError, parse_duration
from nvdash.server.access import host_allowed, host_of, redact_tokens, without_token
from nvdash.server.app import allowed_hosts
from nvdash.server.options import UsageError, parse_settings
from nvdash.settings import Settings


@pytest.mark.parametrize(("header", "name"), [
    ("127.0.0.1:8000", "127.0.0.1"), ("LocalHost", "localhost"), ("localhost.:8000", "localhost"),
    ("[::1]:8000", "::1"), ("[fd00::2]", "fd00::2"), ("gpu-node.example.org", "gpu-node.example.org"),
    ("", ""), ("[::1", ""), ("[::1]x", ""), ("::1", ""), ("a b", ""), ("host:80a", ""), ("h:\u0661", ""),
    ("\u00e9.example", ""), ("evil.example:8000", "evil.example"),
])
def test_host_of_reads_the_name_or_address_a_host_header_gives(header: str, name: str) -> None:
    assert host_of(header) == name


def test_only_loopback_and_the_given_names_are_answered() -> None:
    names = frozenset({"gpu-node", "10.0.0.5"})
    for header in ("127.0.0.1:8000", "127.1.2.3", "localhost:8000", "[::1]:8000", "[::ffff:127.0.0.1]:1",
                   "gpu-node:8000", "10.0.0.5:8000", "GPU-NODE"):
        assert host_allowed(header, names), header
    for header in ("evil.example:8000", "gpu-node.evil.example", "10.0.0.6:8000", "", "[::1", "localhost.evil",
                   "127.0.0.1.evil.example"):
        assert not host_allowed(header, names), header


def test_without_token_keeps_every_other_argument_as_written() -> None:
    assert without_token("/GPU-Utilization?token=abc") == "/GPU-Utilization"
    assert without_token("/p/GPU-Memory?theme=dark&token=abc&gpu=%31") == "/p/GPU-Memory?theme=dark&gpu=%31"
    assert without_token("/?%74oken=abc&token=def&x=a+b") == "/?x=a+b"
    assert without_token("/index.json") == "/index.json"
    assert without_token("/?bokeh-token=x") == "/?bokeh-token=x"


def test_redact_tokens_hides_every_token_value_in_a_log_line() -> None:
    line = "404 GET /nothing?x=1&token=s3cret&%74oken=s3cret2&Token=s3cret3 (127.0.0.1) 0.5ms"
    redacted = redact_tokens(line)
    assert "s3cret" not in redacted
    assert redacted.startswith("404 GET /nothing?x=1&token=[redacted]&")
    assert redacted.endswith(" (127.0.0.1) 0.5ms")
    logged_request = "uri='/x?a=1&token=abc', version='HTTP/1.1'"
    assert redact_tokens(logged_request) == "uri='/x?a=1&token=[redacted]', version='HTTP/1.1'"
    assert redact_tokens("GET /GPU-Memory?theme=dark") == "GET /GPU-Memory?theme=dark"


def test_allowed_hosts_follow_the_bound_address_the_flags_and_the_token() -> None:
    def addresses() -> list[str]:
        return ["10.0.0.5", "fd00::2"]

    local = allowed_hosts(Settings(host="127.0.0.1"), addresses)
    assert local == frozenset({"127.0.0.1"})
    named = allowed_hosts(Settings(host="192.168.1.7", no_token=True, allow_hosts=("dash.example",),
                                   allow_websocket_origin=("proxy.example:443",)), addresses)
    assert named >= frozenset({"192.168.1.7", "dash.example", "proxy.example", host_of(socket.gethostname())})
    assert "10.0.0.5" not in named
    wildcard = allowed_hosts(Settings(host="0.0.0.0", no_token=True), addresses)
    assert wildcard is not None
    assert {"10.0.0.5", "fd00::2"} <= wildcard
    assert "evil.example" not in wildcard
    assert allowed_hosts(Settings(host="0.0.0.0", token="t"), addresses) is None
    assert allowed_hosts(Settings(unix_socket="/run/x.sock"), addresses) is None
    assert allowed_hosts(Settings(allow_hosts=("*",)), addresses) is None


def test_allow_host_is_read_and_checked() -> None:
    settings = parse_settings(["--allow-host", "Dash.Example.", "--allow-host", "[fd00::2]:8000"], {})
    assert settings.allow_hosts == ("dash.example", "fd00::2")
    with pytest.raises(UsageError, match="--allow-host must be a host name or address"):
        parse_settings(["--allow-host", "a b"], {})
    assert parse_settings([], {"NVDASH_CONNECTION_TIMEOUT": "2.5"}).connection_timeout_s == 2.5
    assert parse_settings([], {"NVDASH_CONNECTION_TIMEOUT": "nan"}).connection_timeout_s == 60.0


@pytest.mark.parametrize("text", ["1\x0bh", "1\x0ch", "\u0661h", "1\u00a0h", "1\nh", "1h\n"])
def test_a_duration_holds_ascii_digits_and_plain_spaces_only(text: str) -> None:
    with pytest.raises(RangeError):
        parse_duration(text)
    assert parse_duration(" 1 h ") == 3600.0
