"""The options that say how the cluster views reach their Prometheus (``--prometheus-*`` besides the URL): a login,
the CA, a tenant's headers, and which series are nvdash's. Each bad value is a one-line error; the credential files
are read once here so that a missing or empty one stops nvdash at start, not at the first page.

Errors are :class:`PrometheusOptionError`, which the command line's parser turns into its usage error.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping, Sequence
from typing import Any

from nvdash.cluster.access import (
    DEFAULT_TIMEOUT_S,
    MAX_TIMEOUT_S,
    CredentialsError,
    PrometheusAccess,
    read_basic_auth,
    read_bearer_token,
    tls_context,
)
from nvdash.cluster.selectors import (
    HOST_LABEL,
    HOST_LABELS,
    SelectorError,
    SeriesScope,
    check_label_name,
    parse_matchers,
)

TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
"""An HTTP header name (RFC 9110's token)."""
RESERVED_HEADERS = frozenset({"host", "content-length", "content-type", "transfer-encoding", "connection"})
"""Headers nvdash's HTTP client writes itself."""


class PrometheusOptionError(ValueError):
    """A bad ``--prometheus-*`` option; the message is one line."""


NEEDS_URL = ("prometheus_bearer_token_file", "prometheus_basic_auth_file", "prometheus_ca_file",
             "prometheus_insecure_skip_verify", "prometheus_header", "prometheus_selector", "prometheus_timeout",
             "prometheus_group_label")


def add_prometheus_options(group: Any) -> None:
    """Add the ``--prometheus-*`` access options to ``group`` (an argparse parser or argument group)."""
    group.add_argument("--prometheus-bearer-token-file", default=None, metavar="FILE",
                       help="a file holding the token sent as 'Authorization: Bearer' to Prometheus (re-read when it "
                       "changes)")
    group.add_argument("--prometheus-basic-auth-file", default=None, metavar="FILE",
                       help="a file holding one line user:password for Prometheus's basic authentication (re-read "
                       "when it changes)")
    group.add_argument("--prometheus-ca-file", default=None, metavar="FILE",
                       help="the CA certificates (PEM) that verify an https Prometheus")
    group.add_argument("--prometheus-insecure-skip-verify", action="store_true", default=False,
                       help="do not verify an https Prometheus's certificate (logged as a warning)")
    group.add_argument("--prometheus-header", action="append", default=None, metavar="'NAME: VALUE'",
                       help="a header sent with every query, e.g. 'X-Scope-OrgID: team-a' for a Mimir tenant "
                       "(repeatable)")
    group.add_argument("--prometheus-host-label", default=None, metavar="NAME",
                       help=f"the label naming a series' node (default {HOST_LABEL}; dcgm-exporter 4.9's hostname is "
                       "read too with the default)")
    group.add_argument("--prometheus-selector", default=None, metavar="MATCHERS",
                       help="label matchers every series of the cluster views must carry, e.g. 'job=\"nvdash\"' "
                       "(leaves out a dcgm-exporter scraped beside nvdash)")
    group.add_argument("--prometheus-group-label", default=None, metavar="NAME",
                       help="a label grouping the nodes, e.g. rack, zone or a node pool (on the nodes' series, from "
                       "relabelling): the cluster pages show each node's group, put a group's nodes together and "
                       "filter by it (?group=VALUE)")
    group.add_argument("--prometheus-timeout", default=None, type=float, metavar="SECONDS",
                       help=f"how long one query to Prometheus may take (default {DEFAULT_TIMEOUT_S:g}, at most "
                       f"{MAX_TIMEOUT_S:g}); raise it for a slow Prometheus or Thanos: at 1,000 nodes a refresh asks "
                       "for tens of thousands of series")


def parse_header(text: str) -> tuple[str, str]:
    """``Name: value`` as (name, value); raises :class:`PrometheusOptionError`."""
    name, colon, value = text.partition(":")
    name, value = name.strip(), value.strip()
    if not colon or not TOKEN.match(name):
        raise PrometheusOptionError(f"--prometheus-header must be 'Name: value' with a header name before the colon, "
                         f"not {text!r}")
    if name.lower() in RESERVED_HEADERS:
        raise PrometheusOptionError(f"--prometheus-header: nvdash writes {name} itself")
    if not value or any(char < " " or char == "\x7f" for char in value):
        raise PrometheusOptionError(f"--prometheus-header {name}: the value must be non-empty, on one line, "
                                    "without control characters")
    return name, value


def _headers(given: Sequence[str] | None) -> tuple[tuple[str, str], ...]:
    headers = tuple(parse_header(text) for text in given or ())
    names = [name.lower() for name, _value in headers]
    twice = next((name for name in names if names.count(name) > 1), None)
    if twice is not None:
        raise PrometheusOptionError(f"--prometheus-header {twice} is given twice")
    return headers


def _scope(host_label: str | None, selector: str | None, group_label: str | None = None) -> SeriesScope:
    try:
        label = check_label_name(host_label.strip()) if host_label is not None else HOST_LABEL
    except SelectorError as error:
        raise PrometheusOptionError(f"--prometheus-host-label: {error}") from None
    try:
        group = check_label_name(group_label.strip()) if group_label is not None else ""
    except SelectorError as error:
        raise PrometheusOptionError(f"--prometheus-group-label: {error}") from None
    if group and group in (label, *HOST_LABELS, "gpu", "UUID", "modelName", "__name__"):
        raise PrometheusOptionError(f"--prometheus-group-label {group} names a node or a GPU, not a group of nodes")
    try:
        matchers = parse_matchers(selector) if selector is not None else ()
    except SelectorError as error:
        raise PrometheusOptionError(f"--prometheus-selector: {error}") from None
    if selector is not None and not matchers:
        raise PrometheusOptionError("--prometheus-selector is empty (leave it out to select every series)")
    return SeriesScope(host_label=label, matchers=matchers, group_label=group)


def parse_timeout(value: float | None) -> float:
    """``--prometheus-timeout``'s seconds (the default when not given); raises :class:`PrometheusOptionError`."""
    if value is None:
        return DEFAULT_TIMEOUT_S
    if not 0 < value <= MAX_TIMEOUT_S:
        raise PrometheusOptionError(f"--prometheus-timeout must be a number of seconds above 0 and at most "
                                    f"{MAX_TIMEOUT_S:g}, not {value:g}")
    return value


def prometheus_access(args: argparse.Namespace, environ: Mapping[str, str]) -> PrometheusAccess:
    """The access settings from the parsed options; raises :class:`PrometheusOptionError` (one line). ``environ`` is
    accepted like the other settings builders' (nothing is read from it here: secrets come from files)."""
    del environ
    if getattr(args, "prometheus", None) is None:
        given = next((name for name in NEEDS_URL if getattr(args, name, None)), None)
        if given is not None:
            raise PrometheusOptionError(f"--{given.replace('_', '-')} needs --prometheus")
    if args.prometheus_bearer_token_file and args.prometheus_basic_auth_file:
        raise PrometheusOptionError("give --prometheus-bearer-token-file or --prometheus-basic-auth-file, not both")
    if args.prometheus_ca_file and args.prometheus_insecure_skip_verify:
        raise PrometheusOptionError("--prometheus-ca-file and --prometheus-insecure-skip-verify contradict each other")
    headers = _headers(args.prometheus_header)
    credentials = args.prometheus_bearer_token_file or args.prometheus_basic_auth_file
    if credentials and any(name.lower() == "authorization" for name, _value in headers):
        raise PrometheusOptionError("--prometheus-header Authorization contradicts the credentials file")
    access = PrometheusAccess(
        bearer_token_file=args.prometheus_bearer_token_file or None,
        basic_auth_file=args.prometheus_basic_auth_file or None,
        ca_file=args.prometheus_ca_file or None,
        insecure_skip_verify=bool(args.prometheus_insecure_skip_verify),
        headers=headers,
        scope=_scope(args.prometheus_host_label, args.prometheus_selector,
                     getattr(args, "prometheus_group_label", None)),
        timeout_s=parse_timeout(getattr(args, "prometheus_timeout", None)),
    )
    try:
        if access.bearer_token_file is not None:
            read_bearer_token(access.bearer_token_file)
        if access.basic_auth_file is not None:
            read_basic_auth(access.basic_auth_file)
        tls_context(access)
    except CredentialsError as error:
        raise PrometheusOptionError(str(error)) from None
    return access
