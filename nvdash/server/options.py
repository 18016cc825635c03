"""The server's command line: its options, and their checks turning them into :class:`Settings`.

Shared by ``nvdash [serve]`` and ``nvdash replay`` (parsed by :mod:`nvdash.cli`) and by the Jupyter proxy
(:mod:`nvdash.server.jupyter_proxy`), which starts the server with the same options. A bad option raises
:class:`UsageError` with a one-line message.
"""

from __future__ import annotations

import argparse
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from nvdash.cluster.access import PrometheusAccess
from nvdash.history.ranges import RangeError, parse_duration
from nvdash.metrics.accounting_families import DEFAULT_OWNERS
from nvdash.metrics.collector import GPU_LABELS, LABEL_FIELDS
from nvdash.metrics.compat import COMPAT_VERSIONS, DEFAULT_COMPAT
from nvdash.sampling.sampler import MIN_INTERVAL_S
from nvdash.server.access import host_of
from nvdash.server.config_file import ConfigError
from nvdash.server.config_sources import ENV_CONFIG, Merged, merge, option_tables
from nvdash.server.prometheus_options import PrometheusOptionError, add_prometheus_options, prometheus_access
from nvdash.settings import Settings

ENV_SIMULATE = "NVDASH_SIMULATE"
ENV_FAULTS = "NVDASH_FAKE_FAULTS"
ENV_PROCESS_FILE = "NVDASH_FAKE_PROCESS_FILE"
"""A process file for the simulated GPUs to follow (see ``nvdash.sampling.fake.process_file``)."""
ENV_HISTORY = "NVDASH_HISTORY"
"""A history file path, or ``off``: the default of ``--history`` / ``--no-history`` (for the Jupyter proxy)."""
ENV_METRICS_TOKEN = "NVDASH_METRICS_TOKEN"
ENV_JOB_MAPPING_DIR = "NVDASH_JOB_MAPPING_DIR"
"""The default of ``--job-mapping-dir`` (a node's setting, for servers the Jupyter proxy starts)."""
ENV_CONNECTION_TIMEOUT = "NVDASH_CONNECTION_TIMEOUT"
ENV_PRUNE_EVERY = "NVDASH_PRUNE_EVERY"
"""Seconds a connection may idle or take to send a request (default 60; tests use a short one)."""
ENV_TOKEN = "NVDASH_TOKEN"
"""The dashboards' token: the default of ``--token`` (for a token kept in a Kubernetes Secret)."""


class UsageError(Exception):
    """A bad command line; the message is one line for the user."""


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors raise :class:`UsageError` instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


GROUPS = ("server", "sampling", "history", "metrics", "cluster", "accounting")
"""The argument groups of ``nvdash --help``, in order; also the tables of a ``--config`` file."""

_DESCRIPTIONS = {
    "server": "where and how the dashboards are served, and who may open them",
    "sampling": "what is read from the GPUs and the machine, how often, and how much is kept in memory",
    "history": "the readings recorded on disk",
    "metrics": "the Prometheus exposition on /metrics",
    "cluster": "the cluster dashboards, read from a Prometheus-API endpoint",
    "accounting": "GPU-hours, energy and idle allocations per job, pod and user",
}

_Group = argparse._ArgumentGroup


def _group(parser: argparse.ArgumentParser, name: str) -> _Group:
    """The argument group ``name`` (one of :data:`GROUPS`); its title is the config file's table name."""
    return parser.add_argument_group(name, f"{_DESCRIPTIONS[name]} (table [{name}] of a --config file)")


def _add_config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, metavar="FILE",
                        help=f"read options from this TOML file (also ${ENV_CONFIG}); see the end of this help")


def _add_server_options(group: _Group) -> None:
    group.add_argument("--host", default="127.0.0.1",
                       help="address to bind (default 127.0.0.1); any other, e.g. 0.0.0.0, requires a token")
    group.add_argument("--port", type=int, default=8000, help="port to serve on (default 8000)")
    group.add_argument(
        "--unix-socket",
        default=None,
        metavar="PATH",
        help="listen on this unix socket (mode 0600: only this user can connect) instead of --host/--port",
    )
    group.add_argument("--prefix", default="", help="URL prefix to serve under, e.g. /nvdash")
    group.add_argument("--token", default=None, metavar="TOKEN",
                       help=f"the token the dashboards require (also ${ENV_TOKEN}); default: none on 127.0.0.1, "
                       "a generated one, printed in the start URL, on any other address")
    group.add_argument("--no-token", action="store_true",
                       help="serve the dashboards without a token, even on a public address (logged as a warning)")
    group.add_argument("--certfile", default=None, metavar="FILE",
                       help="serve HTTPS with this PEM certificate (chain); the key too unless --keyfile")
    group.add_argument("--keyfile", default=None, metavar="FILE", help="the certificate's PEM private key")
    group.add_argument(
        "--allow-websocket-origin",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="a browser origin allowed to connect (repeatable; default: this server's own names and addresses)",
    )
    group.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a name the server answers to without a token besides this machine's own (repeatable; e.g. the name "
        "of a reverse proxy); a request for any other name is refused",
    )
    group.add_argument("--viewer-stall-timeout", type=float, default=60.0, metavar="SECONDS",
                       help="close a viewer's websocket once it has read none of the updates waiting for it for "
                       "this long (default 60; 0: never)")


def _add_live_samples(group: _Group) -> None:
    group.add_argument(
        "--live-samples",
        type=int,
        default=None,
        metavar="SAMPLES",
        help="samples kept in memory and streamed by the timelines in Live mode (default 1200)",
    )


def _profiles() -> list[str]:
    """The names ``--simulate`` accepts (the simulation's own list, imported only when a parser is built)."""
    from nvdash.sampling.fake.profiles import profile_names  # noqa: PLC0415

    return profile_names()


def _sampling_group(parser: argparse.ArgumentParser) -> None:
    group = _group(parser, "sampling")
    group.add_argument(
        "--interval",
        type=float,
        default=0.5,
        metavar="SECONDS",
        help=f"seconds between samples (default 0.5, minimum {MIN_INTERVAL_S})",
    )
    group.add_argument(
        "--simulate",
        metavar="PROFILE",
        help=f"show simulated GPUs instead of real ones (also ${ENV_SIMULATE}); profiles: {', '.join(_profiles())}",
    )
    group.add_argument("--seed", type=int, default=0, help="seed of the simulated workload (default 0)")
    _add_live_samples(group)
    group.add_argument(
        "--process-interval",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds between readings of the GPU processes, pods and MIG instances (default 2; 0: off)",
    )
    group.add_argument(
        "--jupyter-kernels",
        default=None,
        metavar="FILE",
        help="the kernels file of the Jupyter server that started nvdash (jupyter-server-proxy passes it)",
    )
    group.add_argument(
        "--kubelet-socket",
        default=None,
        metavar="PATH",
        help="the kubelet's pod-resources socket, for pod names "
        "(default /var/lib/kubelet/pod-resources/kubelet.sock)",
    )
    group.add_argument(
        "--pod-log-dir",
        default=None,
        metavar="PATH",
        help="the kubelet's pod log directory, whose <namespace>_<pod>_<uid> entries name the pods of processes "
        "(default /var/log/pods; where nvdash runs in a container, the host's directory as mounted there)",
    )


def _history_group(parser: argparse.ArgumentParser) -> None:
    group = _group(parser, "history")
    add_history_path(group)
    group.add_argument("--no-history", action="store_true", help="do not record readings on disk")
    group.add_argument(
        "--retention",
        default=None,
        metavar="DURATION",
        help="how long the history keeps readings, e.g. 12h, 7d, 30d (default 7d; units m, h, d)",
    )


def _metrics_group(parser: argparse.ArgumentParser) -> None:
    group = _group(parser, "metrics")
    group.add_argument("--hostname", default=None, help="the Hostname label of /metrics (default: this machine's)")
    group.add_argument("--metrics-counters", default=None, metavar="FILE",
                       help="the families /metrics exports, a counters file in dcgm-exporter's CSV format")
    group.add_argument("--metrics-labels", default=None, metavar="LABELS",
                       help=f"the labels /metrics keeps, comma-separated (default all: {', '.join(GPU_LABELS)})")
    group.add_argument("--metrics-token", default=None, metavar="TOKEN",
                       help=f"a bearer token /metrics accepts (also ${ENV_METRICS_TOKEN}); /metrics also "
                       "accepts the dashboards' token, and is open only when neither is set")
    group.add_argument("--metrics-token-file", default=None, metavar="FILE",
                       help="a file holding that token")
    group.add_argument("--metrics-pods", action="store_true",
                       help="label /metrics series with the namespace, pod and container using each GPU")
    group.add_argument("--metrics-processes", action="store_true",
                       help="export per-process families on /metrics (one series per GPU process)")
    group.add_argument("--metrics-compat", default=DEFAULT_COMPAT, choices=COMPAT_VERSIONS,
                       help="whose names /metrics uses: dcgm-exporter 4.8's (default) or 4.9's (renamed "
                       "families in DCGM 4.7's units, and the hostname label)")
    group.add_argument("--metrics-job-label", action="store_true",
                       help="label /metrics series with the Slurm job or pod that owns each GPU "
                       "(one more series per job: off by default)")
    group.add_argument("--metrics-accounting", action="store_true",
                       help="export the accounting's counters per job (GPU-seconds, busy, energy, throttling since "
                       "nvdash started) on /metrics, for Prometheus to add up across nodes")
    group.add_argument("--metrics-accounting-owners", default=None, type=int, metavar="N",
                       help=f"with --metrics-accounting, at most N jobs with series of their own; the ones with "
                       f'the least GPU time are summed into hpc_job="_other" (default {DEFAULT_OWNERS})')


def _cluster_group(parser: argparse.ArgumentParser) -> None:
    """The cluster dashboards' options: ``--prometheus`` and the options reaching it (every one of them belongs
    here, so that a config file's [cluster] table and ``--help`` both find it)."""
    group = _group(parser, "cluster")
    group.add_argument("--prometheus", default=None, metavar="URL",
                       help="a Prometheus-API endpoint (Prometheus, Thanos Query, Mimir): adds the cluster dashboards")
    add_prometheus_options(group)


def _accounting_group(parser: argparse.ArgumentParser) -> None:
    group = _group(parser, "accounting")
    group.add_argument("--job-mapping-dir", default=None, metavar="DIR",
                       help="a directory of per-GPU files (named by GPU index or UUID) holding the Slurm job "
                       f"on each GPU, as a prolog/epilog writes them for dcgm-exporter (also ${ENV_JOB_MAPPING_DIR})")
    group.add_argument("--accounting-retention", default=None, metavar="DURATION",
                       help="how long the accounting's hourly tallies per job, pod and user are kept "
                       "(default 365d; units h, d, w)")
    group.add_argument("--idle-after", default=None, metavar="DURATION",
                       help="how long an allocated GPU must be idle to count as waste (default 30m; units s, m, h)")


_EPILOG = (
    "Every option can also be set in the environment, as NVDASH_ and its name in capitals with underscores "
    "(NVDASH_PROCESS_INTERVAL=5; a flag: 1, true, yes or 0, false, no; a repeatable option: comma-separated), "
    "or in a TOML file named by --config, as the name without the dashes, at the top or in its group's table "
    "([sampling] process-interval = 5). The command line wins over the environment, which wins over the file."
)


def _serve_parser(prog: str = "nvdash") -> argparse.ArgumentParser:
    parser = Parser(
        prog=prog,
        usage=f"{prog} [serve] [options]",
        description="Live NVIDIA GPU and host dashboards, served by one Bokeh server. "
        "Other commands: nvdash export, nvdash import FILE, nvdash replay FILE, nvdash report (each with --help).",
        epilog=_EPILOG,
    )
    _add_config_option(parser)
    _add_server_options(_group(parser, "server"))
    _sampling_group(parser)
    _history_group(parser)
    _metrics_group(parser)
    _cluster_group(parser)
    _accounting_group(parser)
    return parser


def _jupyter_kernels(value: str | None) -> str | None:
    """The kernels file's absolute path (it need not exist yet: the Jupyter server writes it when it can)."""
    if value is None:
        return None
    if not value.strip():
        raise UsageError("--jupyter-kernels needs a file name")
    return str(Path(value).expanduser().absolute())


def _accounting_owners(enabled: bool, value: int | None) -> int | None:
    """``--metrics-accounting``'s bound (``None``: off); ``--metrics-accounting-owners`` alone is a usage error."""
    if value is None:
        return DEFAULT_OWNERS if enabled else None
    if not enabled:
        raise UsageError("--metrics-accounting-owners needs --metrics-accounting")
    if value < 0:
        raise UsageError(f"--metrics-accounting-owners must be 0 or more, not {value}")
    return value


def _job_mapping_dir(value: str | None, environ: Mapping[str, str]) -> str | None:
    given = value or (environ.get(ENV_JOB_MAPPING_DIR) or "").strip() or None
    if given is None:
        return None
    path = Path(given).expanduser()
    if not path.is_dir():
        source = "--job-mapping-dir" if value else f"${ENV_JOB_MAPPING_DIR}"
        raise UsageError(f"{source}: {given} is not a directory")
    return str(path)


def _duration_option(name: str, value: str | None, default: float, units: str, minimum_s: float) -> float:
    if value is None:
        return default
    try:
        seconds = parse_duration(value, units=units)
    except RangeError as error:
        raise UsageError(f"{name}: {error}") from None
    if seconds < minimum_s:
        raise UsageError(f"{name} must be at least {minimum_s:g} s, not {value}")
    return seconds


def add_history_path(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument(
        "--history",
        default=None,
        metavar="PATH",
        help=f"the history file (also ${ENV_HISTORY}; default $XDG_DATA_HOME/nvdash/history.sqlite)",
    )


def history_path(value: str | None, environ: Mapping[str, str]) -> tuple[bool, str | None]:
    """``(enabled, path)`` from ``--history`` and ``$NVDASH_HISTORY``."""
    if value is not None and value.strip().isdigit():
        raise UsageError(
            f"--history now names the history file, not a sample count; use --live-samples {value.strip()}"
        )
    if value:
        return True, value
    from_env = (environ.get(ENV_HISTORY) or "").strip()
    if from_env.lower() in ("off", "no", "0", "false"):
        return False, None
    return True, from_env or None


def _live_samples(value: int | None) -> int:
    samples = Settings().live_samples if value is None else value
    if samples < 2:
        raise UsageError(f"--live-samples must be at least 2, not {samples}")
    return samples


def _prefix(value: str) -> str:
    prefix = value.strip()
    if prefix and not prefix.startswith("/"):
        prefix = "/" + prefix
    return prefix.rstrip("/")


def _unix_socket(value: str | None) -> str | None:
    if value is None:
        return None
    if not value.strip() or value.startswith("\0"):
        raise UsageError("--unix-socket needs a file path (not an abstract socket, which no file permission protects)")
    return str(Path(value).expanduser())


def _stall_timeout(value: float) -> float:
    if not 0 <= value < float("inf"):
        raise UsageError(f"--viewer-stall-timeout must be 0 (never) or a number of seconds, not {value}")
    return value


def _port(value: int) -> int:
    if not 0 <= value <= 65535:
        raise UsageError(f"--port must be between 0 and 65535, not {value}")
    return value


def _metrics_labels(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    labels = tuple(part.strip() for part in text.split(",") if part.strip())
    known = (*GPU_LABELS, *LABEL_FIELDS)
    unknown = [label for label in labels if label not in known]
    if unknown:
        raise UsageError(f"--metrics-labels: unknown label {unknown[0]!r}; choose from {', '.join(known)}")
    if "gpu" not in labels and "UUID" not in labels:
        raise UsageError("--metrics-labels must keep gpu or UUID, or the GPUs' series would collide")
    return labels


def _metrics_token(token: str | None, path: str | None, environ: Mapping[str, str]) -> str | None:
    if token and path:
        raise UsageError("give --metrics-token or --metrics-token-file, not both")
    if path:
        try:
            token = Path(path).expanduser().read_text(encoding="utf-8").strip()
        except OSError as error:
            raise UsageError(f"--metrics-token-file: cannot read {path}: {error.strerror}") from None
        if not token:
            raise UsageError(f"--metrics-token-file: {path} is empty")
    return token or environ.get(ENV_METRICS_TOKEN) or None


def _access(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, Any]:
    """The token and TLS settings; a certificate that cannot be used is a usage error (one line)."""
    if args.token is not None and not args.token.strip():
        raise UsageError("--token must not be empty (use --no-token to serve without one)")
    if args.token and args.no_token:
        raise UsageError("--token and --no-token contradict each other")
    if args.token and args.unix_socket is not None:
        raise UsageError("--token applies to --host/--port; a unix socket is protected by its file mode")
    if args.keyfile is not None and args.certfile is None:
        raise UsageError("--keyfile needs --certfile")
    if args.certfile is not None:
        from nvdash.server.tls import CertificateError, check_certificate  # noqa: PLC0415 - only with TLS

        try:
            check_certificate(args.certfile, args.keyfile)
        except CertificateError as error:
            raise UsageError(str(error)) from None
    local = args.no_token or args.unix_socket is not None
    token = None if local else (args.token or environ.get(ENV_TOKEN, "").strip() or None)
    return {"token": token, "no_token": bool(args.no_token), "certfile": args.certfile, "keyfile": args.keyfile}


def _allow_hosts(names: Sequence[str]) -> tuple[str, ...]:
    """``--allow-host`` values as the ``Host`` headers name them; a value that names no host is a usage error."""
    hosts = []
    for name in names:
        host = "*" if name.strip() == "*" else host_of(name)
        if not host:
            raise UsageError(f"--allow-host must be a host name or address, not {name!r}")
        hosts.append(host)
    return tuple(hosts)


def _env_seconds(environ: Mapping[str, str] | None, name: str, default: float) -> float:
    """``$name`` seconds (tests use short ones) when a positive finite number, else ``default``."""
    try:
        value = float((environ or {}).get(name, ""))
    except ValueError:
        return default
    return value if 0 < value < float("inf") else default


def _connection_timeout(environ: Mapping[str, str] | None) -> float:
    """``$NVDASH_CONNECTION_TIMEOUT`` seconds when a positive number, else the default."""
    return _env_seconds(environ, ENV_CONNECTION_TIMEOUT, Settings().connection_timeout_s)


def prometheus_url(value: str | None) -> str | None:
    """``--prometheus``'s URL without a trailing slash; raises :class:`UsageError` for one that is not http(s)."""
    if value is None:
        return None
    url = value.strip().rstrip("/")
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise UsageError(f"--prometheus must be an http:// or https:// URL, not {value!r}")
    return url


READ_BY_CHECKS: dict[str, tuple[str, ...]] = {
    "--token": ("--token",),
    "--history": ("--history", "--no-history"),
    "--simulate": ("--simulate",),
    "--job-mapping-dir": ("--job-mapping-dir",),
    "--metrics-token": ("--metrics-token",),
}
"""The variables older than the ``$NVDASH_<OPTION>`` rule, read by their options' own checks with the meaning they
had (e.g. ``NVDASH_HISTORY=off``, a blank ``NVDASH_TOKEN``); each outranks the file for the options it names."""


def _merged(factory: Callable[[], argparse.ArgumentParser], argv: Sequence[str], environ: Mapping[str, str]) -> Merged:
    """The command line under which the ``--config`` file and ``$NVDASH_<OPTION>`` values are put (one rule:
    flag > environment > file > default); a file or variable that cannot be used is a :class:`UsageError`."""
    try:
        return merge(factory, argv, environ, tables=option_tables(_serve_parser(), GROUPS), groups=GROUPS,
                     read_by_checks=READ_BY_CHECKS)
    except ConfigError as error:
        raise UsageError(str(error)) from None


def _prometheus_access(args: argparse.Namespace, environ: Mapping[str, str]) -> PrometheusAccess:
    try:
        return prometheus_access(args, environ)
    except PrometheusOptionError as error:
        raise UsageError(str(error)) from None


def parse_settings(argv: Sequence[str], environ: Mapping[str, str]) -> Settings:
    """Validate the serve command line, the environment and the ``--config`` file; raises :class:`UsageError`
    with a one-line message (naming the file and key, or the variable, that gave a bad value)."""
    merged = _merged(_serve_parser, argv, environ)
    try:
        return _settings(_serve_parser().parse_args(merged.argv), environ, merged)
    except UsageError as error:
        raise UsageError(merged.attribute(str(error))) from None


def _settings(args: argparse.Namespace, environ: Mapping[str, str], merged: Merged) -> Settings:
    if not args.interval >= MIN_INTERVAL_S:
        raise UsageError(f"--interval must be at least {MIN_INTERVAL_S} seconds, not {args.interval}")
    simulate = args.simulate or environ.get(ENV_SIMULATE) or None
    if simulate is not None and simulate not in _profiles():
        message = f"unknown profile {simulate!r}; choose one of: {', '.join(_profiles())}"
        where = merged.sources.get("--simulate")
        raise UsageError(f"{message} ({where})" if where else message)
    defaults = Settings()
    process_interval = defaults.process_interval_s if args.process_interval is None else args.process_interval
    if process_interval != 0 and not process_interval >= args.interval:
        raise UsageError(
            f"--process-interval must be 0 (off) or at least --interval ({args.interval} s), not {process_interval}"
        )
    enabled, path = history_path(args.history, environ)
    if args.no_history:
        if args.history:
            raise UsageError("--history and --no-history contradict each other")
        enabled, path = False, None
    retention = defaults.retention_s
    if args.retention is not None:
        try:
            retention = parse_duration(args.retention, units="mhd")
        except RangeError as error:
            raise UsageError(f"--retention: {error}") from None
        if retention < 600:
            raise UsageError(f"--retention must be at least 10m, not {args.retention}")
    return Settings(
        hostname=args.hostname,
        metrics_counters=args.metrics_counters,
        metrics_labels=_metrics_labels(args.metrics_labels),
        metrics_token=_metrics_token(args.metrics_token, args.metrics_token_file, environ),
        metrics_pods=args.metrics_pods,
        metrics_processes=args.metrics_processes,
        metrics_compat=args.metrics_compat,
        prometheus_url=prometheus_url(args.prometheus),
        prometheus_access=_prometheus_access(args, environ),
        host=args.host,
        port=_port(args.port),
        unix_socket=_unix_socket(args.unix_socket),
        interval_s=args.interval,
        simulate=simulate,
        seed=args.seed,
        allow_websocket_origin=tuple(args.allow_websocket_origin),
        allow_hosts=_allow_hosts(args.allow_host),
        connection_timeout_s=_connection_timeout(environ),
        prune_every_s=_env_seconds(environ, ENV_PRUNE_EVERY, Settings().prune_every_s),
        viewer_stall_timeout_s=_stall_timeout(args.viewer_stall_timeout),
        **_access(args, environ),
        prefix=_prefix(args.prefix),
        live_samples=_live_samples(args.live_samples),
        faults=environ.get(ENV_FAULTS) or None,
        fake_process_file=environ.get(ENV_PROCESS_FILE) or None,
        process_interval_s=process_interval,
        kubelet_socket=args.kubelet_socket or defaults.kubelet_socket,
        jupyter_kernels=_jupyter_kernels(args.jupyter_kernels),
        pod_log_dir=args.pod_log_dir or defaults.pod_log_dir,
        history=enabled,
        history_path=path,
        retention_s=retention,
        job_mapping_dir=_job_mapping_dir(args.job_mapping_dir, environ),
        accounting_retention_s=_duration_option("--accounting-retention", args.accounting_retention,
                                                defaults.accounting_retention_s, "hdw", 86_400.0),
        idle_after_s=_duration_option("--idle-after", args.idle_after, defaults.idle_after_s, "smh", 1.0),
        metrics_job_label=args.metrics_job_label,
        metrics_accounting_owners=_accounting_owners(args.metrics_accounting, args.metrics_accounting_owners),
    )


def _replay_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="nvdash replay", usage="nvdash replay FILE [options]",
                    description="Serve the dashboards from a history file (a recording), with no GPU needed.",
                    epilog=_EPILOG + " A --config file's options that replay does not take are ignored.")
    parser.add_argument("file", metavar="FILE", help="the history file to replay")
    _add_config_option(parser)
    _add_server_options(_group(parser, "server"))
    _add_live_samples(_group(parser, "sampling"))
    return parser


def parse_replay(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> Settings:
    """``nvdash replay FILE [server options]``: serve a recording without touching NVML."""
    merged = _merged(_replay_parser, argv, environ or {})
    try:
        return _replay_settings(_replay_parser().parse_args(merged.argv), environ or {})
    except UsageError as error:
        raise UsageError(merged.attribute(str(error))) from None


def _replay_settings(args: argparse.Namespace, environ: Mapping[str, str]) -> Settings:
    return Settings(
        host=args.host,
        port=_port(args.port),
        unix_socket=_unix_socket(args.unix_socket),
        allow_websocket_origin=tuple(args.allow_websocket_origin),
        allow_hosts=_allow_hosts(args.allow_host),
        connection_timeout_s=_connection_timeout(environ),
        viewer_stall_timeout_s=_stall_timeout(args.viewer_stall_timeout),
        **_access(args, environ),
        prefix=_prefix(args.prefix),
        live_samples=_live_samples(args.live_samples),
        process_interval_s=0.0,
        history=False,
        replay=args.file,
    )
