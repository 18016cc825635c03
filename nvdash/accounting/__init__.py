"""GPU-hours, energy and waste per job, pod and user: what nvdash's readings add up to over time."""
