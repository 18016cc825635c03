"""Command-line parsing only: turns arguments and environment into :class:`Settings` and starts the server."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from typing import NoReturn

from nvdash.sampling.sampler import MIN_INTERVAL_S
from nvdash.settings import Settings

ENV_SIMULATE = "NVDASH_SIMULATE"
ENV_FAULTS = "NVDASH_FAKE_FAULTS"


class UsageError(Exception):
    """A bad command line; the message is one line for the user."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="nvdash",
        description="Live NVIDIA GPU and host dashboards, served by one Bokeh server.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to serve on (default 8000)")
    parser.add_argument(
        "--interval",
        type=float,
        default=0.5,
        metavar="SECONDS",
        help=f"seconds between samples (default 0.5, minimum {MIN_INTERVAL_S})",
    )
    parser.add_argument(
        "--simulate",
        metavar="PROFILE",
        help=f"show simulated GPUs instead of real ones (also ${ENV_SIMULATE}); "
        "profiles: dgx-h100, dgx-a100, dgx-b200, a100-pcie-2, a100-mig, t4, none",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the simulated workload (default 0)")
    parser.add_argument(
        "--allow-websocket-origin",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="a browser origin allowed to connect (repeatable; default: this server's own address)",
    )
    parser.add_argument("--prefix", default="", help="URL prefix to serve under, e.g. /nvdash")
    parser.add_argument(
        "--process-interval",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds between readings of the GPU processes, pods and MIG instances (default 2; 0: off)",
    )
    parser.add_argument(
        "--kubelet-socket",
        default=None,
        metavar="PATH",
        help="the kubelet's pod-resources socket, for pod names "
        "(default /var/lib/kubelet/pod-resources/kubelet.sock)",
    )
    parser.add_argument(
        "--history",
        type=int,
        default=None,
        metavar="SAMPLES",
        help="samples kept in memory and shown by the timelines (default 1200)",
    )
    return parser


def parse_settings(argv: Sequence[str], environ: Mapping[str, str]) -> Settings:
    """Validate the command line; raises :class:`UsageError` with a one-line message."""
    args = _parser().parse_args(list(argv))
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be between 0 and 65535, not {args.port}")
    if not args.interval >= MIN_INTERVAL_S:
        raise UsageError(f"--interval must be at least {MIN_INTERVAL_S} seconds, not {args.interval}")
    simulate = args.simulate or environ.get(ENV_SIMULATE) or None
    if simulate is not None:
        from nvdash.sampling.fake import profile_names  # noqa: PLC0415 - only when simulating

        if simulate not in profile_names():
            raise UsageError(f"unknown profile {simulate!r}; choose one of: {', '.join(profile_names())}")
    defaults = Settings()
    history = defaults.history if args.history is None else args.history
    if history < 2:
        raise UsageError(f"--history must be at least 2 samples, not {history}")
    process_interval = defaults.process_interval_s if args.process_interval is None else args.process_interval
    if process_interval != 0 and not process_interval >= args.interval:
        raise UsageError(
            f"--process-interval must be 0 (off) or at least --interval ({args.interval} s), not {process_interval}"
        )
    prefix = args.prefix.strip()
    if prefix and not prefix.startswith("/"):
        prefix = "/" + prefix
    return Settings(
        host=args.host,
        port=args.port,
        interval_s=args.interval,
        simulate=simulate,
        seed=args.seed,
        allow_websocket_origin=tuple(args.allow_websocket_origin),
        prefix=prefix.rstrip("/"),
        history=history,
        faults=environ.get(ENV_FAULTS) or None,
        process_interval_s=process_interval,
        kubelet_socket=args.kubelet_socket or defaults.kubelet_socket,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``nvdash`` and ``python -m nvdash``; returns the exit status."""
    from nvdash.server.run import StartupError, serve  # noqa: PLC0415 - keep --help fast

    try:
        settings = parse_settings(sys.argv[1:] if argv is None else argv, os.environ)
        return serve(settings)
    except (UsageError, StartupError) as error:
        print(f"nvdash: error: {error}", file=sys.stderr)
        return 2 if isinstance(error, UsageError) else 1
