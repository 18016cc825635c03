"""The server's settings, built by the command line (or the Jupyter proxy) and read by the server."""

from __future__ import annotations

from dataclasses import dataclass, field

from nvdash.accounting.idle import DEFAULT_IDLE_AFTER_S
from nvdash.cluster.access import PrometheusAccess
from nvdash.history.tiers import DEFAULT_RETENTION_S
from nvdash.sampling.kubelet.podresources import DEFAULT_SOCKET
from nvdash.sampling.usage import DEFAULT_INTERVAL_S
from nvdash.store import DEFAULT_CAPACITY


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything ``python -m nvdash`` can be told."""

    host: str = "127.0.0.1"
    port: int = 8000
    unix_socket: str | None = None
    """A unix socket to listen on (mode 0600: this user only) instead of ``host``:``port``; no TCP port then."""
    interval_s: float = 0.5
    simulate: str | None = None
    seed: int = 0
    allow_websocket_origin: tuple[str, ...] = ()
    allow_hosts: tuple[str, ...] = ()
    """``--allow-host``: names besides this machine's own that a server without a token answers to (the ``Host``
    of a request; ``*``: any)."""
    connection_timeout_s: float = 60.0
    """How long a connection may sit idle or take to send a request before it is closed."""
    prune_every_s: float = 60.0
    """How often the history writer applies the retention (``$NVDASH_PRUNE_EVERY``; tests use a short one)."""
    token: str | None = None
    """The token the dashboards require (``--token`` / ``NVDASH_TOKEN``); the server generates one when it listens
    beyond loopback without one. ``None``: none given."""
    no_token: bool = False
    """``--no-token``: the dashboards stay open wherever the server listens."""
    certfile: str | None = None
    """A PEM certificate (chain) to serve HTTPS with; ``None``: plain HTTP."""
    keyfile: str | None = None
    """The certificate's private key, when not in ``certfile``."""
    prefix: str = ""
    live_samples: int = DEFAULT_CAPACITY
    """Samples kept in memory and streamed by the timelines in Live mode."""
    faults: str | None = None
    """Fault injection for the simulated GPUs (tests and demos), e.g. ``lose:3@10``."""
    fake_process_file: str | None = None
    """A process file the simulated GPUs list processes from while they run (tests and demos)."""
    process_interval_s: float = DEFAULT_INTERVAL_S
    """Seconds between readings of the GPU processes, pods and MIG instances; 0 turns them off."""
    kubelet_socket: str = DEFAULT_SOCKET
    """The kubelet's pod-resources socket, for pod and container names."""
    pod_log_dir: str = "/var/log/pods"
    """The kubelet's pod log directory: its ``<namespace>_<pod>_<uid>`` entries name the pods of processes."""
    jupyter_kernels: str | None = None
    """The kernels file of the Jupyter server that started nvdash (``--jupyter-kernels``; see
    :mod:`nvdash.sampling.jupyter_kernels`); ``None``: not started by Jupyter, no notebook views."""
    history: bool = True
    """Whether readings are recorded on disk (``--no-history`` turns it off)."""
    history_path: str | None = None
    """The history file; ``None``: the per-user default (``$XDG_DATA_HOME/nvdash/history.sqlite``)."""
    retention_s: float = DEFAULT_RETENTION_S
    """How long the history keeps readings."""
    replay: str | None = None
    """A recording to serve instead of live readings (``nvdash replay FILE``); NVML is not touched."""
    hostname: str | None = None
    """The ``Hostname`` label of ``/metrics`` (default: this machine's name)."""
    metrics_counters: str | None = None
    """A counters file in dcgm-exporter's CSV format choosing the exported families; ``None``: the default file."""
    metrics_labels: tuple[str, ...] | None = None
    """The labels ``/metrics`` keeps on each series; ``None``: all of dcgm-exporter's."""
    metrics_token: str | None = None
    """A bearer token ``/metrics`` requires; ``None``: open, like the dashboards."""
    metrics_pods: bool = False
    """Whether ``/metrics`` labels series with the ``namespace``, ``pod`` and ``container`` using each GPU."""
    metrics_processes: bool = False
    """Whether ``/metrics`` exports per-process families (one series per GPU process: high cardinality)."""
    metrics_compat: str = "4.8"
    """Whose family and label names ``/metrics`` uses: dcgm-exporter ``"4.8"``'s or ``"4.9"``'s."""
    prometheus_url: str | None = None
    """A Prometheus-API endpoint (Prometheus, Thanos Query, Mimir) for the cluster dashboards; ``None``: none."""
    prometheus_access: PrometheusAccess = field(default_factory=PrometheusAccess)
    """How the cluster dashboards reach it: credentials files, CA, headers, host label and series selector."""
    job_mapping_dir: str | None = None
    """A directory of per-GPU files naming the Slurm job on each GPU (written by a prolog/epilog); ``None``: none."""
    accounting_retention_s: float = 365 * 86_400.0
    """How long the accounting's hourly tallies are kept in the history (``--accounting-retention``)."""
    idle_after_s: float = DEFAULT_IDLE_AFTER_S
    """How long an allocation must be idle to be flagged as waste (``--idle-after``)."""
    metrics_job_label: bool = False
    metrics_accounting_owners: int | None = None
    """With ``--metrics-accounting``: the accountant's counters per owner on ``/metrics``, at most this many owners
    with a series of their own (the rest summed into ``hpc_job="_other"``); ``None``: not exported."""
    """Whether ``/metrics`` labels each GPU's series with the Slurm job (or pod) that owns it."""
    viewer_stall_timeout_s: float = 60.0
    """A viewer's websocket is closed once it has taken none of what waits for it for this long; 0: never."""
