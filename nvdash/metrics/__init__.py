"""The Prometheus exposition: dcgm-exporter's metric names over the shared store (a scrape never calls NVML)."""
