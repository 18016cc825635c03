"""Who may see the dashboards: the token rules, the cookie that remembers a visitor, which hosts are local.

Plain functions over strings and numbers, with no web framework, so the command line, the server's handlers
(:mod:`nvdash.server.auth`) and the tests share one definition of each rule.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import secrets
import urllib.parse
from collections.abc import Callable

TOKEN_BYTES = 24
"""Random bytes in a generated token (48 hex characters, as Jupyter's)."""
COOKIE_MAX_AGE_S = 30 * 86400
"""How long the cookie set by a valid token is honoured: a bookmark keeps working for a month."""
COOKIE_CLOCK_SKEW_S = 300
"""How far in the future a cookie's issue time may lie (the clock was set back since it was issued)."""
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
_COOKIE_CONTEXT = b"nvdash dashboard cookie\0"


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` serves only this machine: 127.0.0.0/8, ::1 (also IPv4-mapped) or localhost.

    A wildcard (``0.0.0.0``, ``::``, the empty string) or any other name or address is not.
    """
    name = host.strip().removeprefix("[").removesuffix("]").rstrip(".").lower()
    if name in LOOPBACK_NAMES:
        return True
    try:
        address = ipaddress.ip_address(name.partition("%")[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def new_token() -> str:
    """A fresh random token (the ``secrets`` module, as Jupyter makes its own)."""
    return secrets.token_hex(TOKEN_BYTES)


def dashboard_token(given: str | None, no_token: bool, host: str,
                    generate: Callable[[], str] = new_token) -> str | None:
    """The token the dashboards require, or ``None`` when they are open.

    ``--no-token`` opens them; a given token is required wherever the server listens; otherwise a server
    bound to anything but loopback gets a generated token.
    """
    if no_token:
        return None
    if given:
        return given
    return None if is_loopback(host) else generate()


def token_from_authorization(header: str) -> str | None:
    """The token of an ``Authorization: token X`` or ``Authorization: Bearer X`` header, else ``None``."""
    scheme, _, value = header.strip().partition(" ")
    value = value.strip()
    if scheme.lower() in ("token", "bearer") and value:
        return value
    return None


def same_secret(given: str, expected: str) -> bool:
    """``given == expected``, in time that does not depend on where they first differ."""
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode("utf-8"))


def _cookie_mac(token: str, stamp: str) -> str:
    return hmac.new(token.encode("utf-8"), _COOKIE_CONTEXT + stamp.encode("ascii"), hashlib.sha256).hexdigest()


def sign_cookie(token: str, issued_s: float) -> str:
    """The cookie value that proves its holder gave ``token`` at ``issued_s``: ``<issued>.<HMAC>``.

    The token itself is not in it and cannot be recovered from it; a new token invalidates every cookie.
    """
    stamp = str(int(issued_s))
    return f"{stamp}.{_cookie_mac(token, stamp)}"


def cookie_valid(token: str, value: str, now_s: float, max_age_s: float = COOKIE_MAX_AGE_S) -> bool:
    """Whether ``value`` was made by :func:`sign_cookie` with ``token`` less than ``max_age_s`` ago."""
    stamp, _, mac = value.partition(".")
    if not (stamp.isascii() and stamp.isdigit()) or not same_secret(mac, _cookie_mac(token, stamp)):
        return False
    age_s = now_s - int(stamp)
    return -COOKIE_CLOCK_SKEW_S <= age_s < max_age_s


def cookie_name(port: int) -> str:
    """The cookie's name: browsers share cookies between the ports of one host, so the port is part of it."""
    return f"nvdash-auth-{port}"


def local_target(target: str, default: str) -> str:
    """``target`` when it is a path on this server (where a login may send the browser back to), else ``default``.

    Refuses absolute and scheme-relative URLs (``//evil.example``, ``/\\evil.example``), so the login form is
    not an open redirect.
    """
    if not target.startswith("/") or target.startswith(("//", "/\\")):
        return default
    parts = urllib.parse.urlsplit(target)
    if parts.scheme or parts.netloc or any(ord(char) < 32 for char in target):
        return default
    return target


def url_host(host: str) -> str:
    """``host`` as it appears in a URL: an IPv6 address in brackets."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]"
    return host


def start_url(scheme: str, host: str, port: int, prefix: str, token: str | None) -> str:
    """The URL printed at start: the index page, with the token when one is required."""
    query = f"?token={urllib.parse.quote(token, safe='')}" if token else ""
    return f"{scheme}://{url_host(host)}:{port}{prefix}/{query}"


def host_of(header: str) -> str:
    """The name or address a ``Host`` header names, lower case, without port, brackets or a final dot.

    ``""`` when the header cannot name a host (an unclosed bracket, a port that is not a number, spaces).
    """
    value = header.strip().lower()
    if value.startswith("["):
        name, bracket, rest = value[1:].partition("]")
        port = rest.removeprefix(":") if rest.startswith(":") else None
        if not bracket or not name or (rest and port is None):
            return ""
    else:
        name, _, port = value.partition(":")
        if ":" in port:
            return ""
    if port and not (port.isascii() and port.isdigit()):
        return ""
    name = name.rstrip(".")
    if not name.isascii() or any(char.isspace() or ord(char) < 32 for char in name):
        return ""
    return name


def host_allowed(header: str, names: frozenset[str]) -> bool:
    """Whether a request with this ``Host`` header is addressed to a loopback name or address or to ``names``.

    What a server without a token answers: a web page the user visits can point a name of its own at this
    machine (DNS rebinding), but its requests then carry that name, not one of these.
    """
    name = host_of(header)
    return bool(name) and (is_loopback(name) or name in names)


def without_token(uri: str) -> str:
    """``uri`` with its ``token=`` query arguments taken out, the others kept as they were written."""
    path, mark, query = uri.partition("?")
    if not mark:
        return uri
    kept = [part for part in query.split("&")
            if urllib.parse.unquote_plus(part.partition("=")[0]) != "token"]
    rest = "&".join(part for part in kept if part)
    return f"{path}?{rest}" if rest else path


_QUERY_PAIR = re.compile(r"(?<=[?&;])([^=&;?\s]*)=([^&;#\s'\"]*)")
REDACTED = "[redacted]"


def redact_tokens(text: str) -> str:
    """``text`` with the value of every query argument whose name ends in ``token`` replaced by ``[redacted]``."""

    def hide(match: re.Match[str]) -> str:
        name = urllib.parse.unquote_plus(match.group(1)).strip().lower()
        return f"{match.group(1)}={REDACTED}" if name.endswith("token") else match.group(0)

    return _QUERY_PAIR.sub(hide, text)
