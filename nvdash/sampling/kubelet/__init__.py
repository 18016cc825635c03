"""Which pod and container holds which GPU, from the kubelet's pod-resources API.

Importing this package loads neither ``grpc`` nor ``google.protobuf``: the client imports them on its first
call and reports their absence as a status (``pip install nvdash[kubernetes]``).
"""

from nvdash.sampling.kubelet.podresources import DEFAULT_SOCKET, PodResourcesClient, sharing_of
from nvdash.sampling.kubelet.watcher import PodResourcesWatcher

__all__ = ["DEFAULT_SOCKET", "PodResourcesClient", "PodResourcesWatcher", "sharing_of"]
