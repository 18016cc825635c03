"""The routes the benchmarks open: the seven classic dashboards (the issue targets count in them)."""

CLASSIC = [
    "/GPU-Utilization",
    "/GPU-Memory",
    "/GPU-Resources",
    "/PCIe-Throughput",
    "/NVLink-Throughput",
    "/NVLink-Timeline",
    "/Machine-Resources",
]
