"""The hardware layer: plain records, the NVML and host sources, the fake NVML, and the sampler thread.

Submodules are imported on demand; importing this package loads neither pynvml nor psutil.
"""
