"""A client for the kubelet's pod-resources gRPC API: which pod and container holds which GPU.

It calls ``/v1.PodResourcesLister/List`` over the kubelet's unix socket with ``grpcio`` and builds the message
classes at run time from a descriptor that mirrors ``api.proto`` (next to this module), so no generated code
and no ``grpcio-tools`` are needed. ``grpc`` and ``google.protobuf`` are imported on the first call only.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import stat
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from nvdash.sampling.kubelet.dra import claim_devices
from nvdash.sampling.usage_records import ClaimDevice, PodDevice, PodResources

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD = "/v1.PodResourcesLister/List"
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""A node with many pods answers more than gRPC's default 4 MiB."""
NEED_EXTRA = "Kubernetes pod names need the optional extra: pip install nvdash[kubernetes]"

_Field = tuple[str, int, str, bool]
"""Name, number, type (a scalar's name or a message's), repeated."""
_MESSAGES: tuple[tuple[str, tuple[_Field, ...]], ...] = (
    ("ListPodResourcesRequest", ()),
    ("ListPodResourcesResponse", (("pod_resources", 1, "PodResources", True),)),
    (
        "PodResources",
        (
            ("name", 1, "string", False),
            ("namespace", 2, "string", False),
            ("containers", 3, "ContainerResources", True),
        ),
    ),
    (
        "ContainerResources",
        (
            ("name", 1, "string", False),
            ("devices", 2, "ContainerDevices", True),
            ("cpu_ids", 3, "int64", True),
            ("memory", 4, "ContainerMemory", True),
            ("dynamic_resources", 5, "DynamicResource", True),
        ),
    ),
    (
        "ContainerMemory",
        (("memory_type", 1, "string", False), ("size", 2, "uint64", False), ("topology", 3, "TopologyInfo", False)),
    ),
    (
        "ContainerDevices",
        (
            ("resource_name", 1, "string", False),
            ("device_ids", 2, "string", True),
            ("topology", 3, "TopologyInfo", False),
        ),
    ),
    ("TopologyInfo", (("nodes", 1, "NUMANode", True),)),
    ("NUMANode", (("ID", 1, "int64", False),)),
    (
        "DynamicResource",
        (
            ("class_name", 1, "string", False),
            ("claim_name", 2, "string", False),
            ("claim_namespace", 3, "string", False),
            ("claim_resources", 4, "ClaimResource", True),
        ),
    ),
    (
        "ClaimResource",
        (
            ("cdi_devices", 1, "CDIDevice", True),
            ("driver_name", 2, "string", False),
            ("pool_name", 3, "string", False),
            ("device_name", 4, "string", False),
            ("share_id", 5, "string", False),
        ),
    ),
    ("CDIDevice", (("name", 1, "string", False),)),
)
"""The messages ``List`` reaches, as ``api.proto`` declares them (package ``v1``)."""


def api_descriptor() -> Any:
    """A ``FileDescriptorProto`` for the messages of :data:`_MESSAGES` (imports ``google.protobuf``)."""
    from google.protobuf import descriptor_pb2  # noqa: PLC0415 - imported on demand, an optional extra

    field_proto = descriptor_pb2.FieldDescriptorProto
    scalars = {"string": field_proto.TYPE_STRING, "int64": field_proto.TYPE_INT64, "uint64": field_proto.TYPE_UINT64}
    file = descriptor_pb2.FileDescriptorProto(name="nvdash/kubelet/v1.proto", package="v1", syntax="proto3")
    for message_name, fields in _MESSAGES:
        message = file.message_type.add(name=message_name)
        for name, number, kind, repeated in fields:
            field = message.field.add(name=name, number=number)
            field.label = field_proto.LABEL_REPEATED if repeated else field_proto.LABEL_OPTIONAL
            if kind in scalars:
                field.type = scalars[kind]
            else:
                field.type = field_proto.TYPE_MESSAGE
                field.type_name = f".v1.{kind}"
    return file


@dataclass(frozen=True)
class _Api:
    """``grpc``, the ``List`` message classes, and protobuf's ``DecodeError``."""

    grpc: Any
    request: Any
    response: Any
    decode_error: type[Exception]


_api: _Api | None = None
_api_lock = threading.Lock()


def _load_api() -> _Api:
    """Import grpc and protobuf and build the message classes in a private pool, once; raises ImportError."""
    global _api
    with _api_lock:
        if _api is None:
            import grpc  # noqa: PLC0415 - imported on demand, an optional extra
            from google.protobuf import descriptor_pool, message, message_factory  # noqa: PLC0415 - same

            pool = descriptor_pool.DescriptorPool()
            pool.AddSerializedFile(api_descriptor().SerializeToString())
            request = message_factory.GetMessageClass(pool.FindMessageTypeByName("v1.ListPodResourcesRequest"))
            response = message_factory.GetMessageClass(pool.FindMessageTypeByName("v1.ListPodResourcesResponse"))
            _api = _Api(grpc, request, response, message.DecodeError)
        return _api


def sharing_of(resource_name: str, device_id: str) -> str:
    """How a device is shared, one of :data:`~nvdash.sampling.usage_records.SHARING_KINDS`.

    The NVIDIA device plugin advertises a time-sliced or MPS GPU as replicas whose ids carry a ``::N`` suffix
    (``GPU-...::3``), under ``<resource>.shared`` when ``renameByDefault`` is set: both mean ``"shared"`` (a
    shared MIG slice too). With the mixed MIG strategy a MIG device is an ``nvidia.com/mig-<profile>``
    resource, and its id (with the single strategy as well) is a ``MIG-`` UUID: ``"mig"``. The GPU Operator's
    sandbox device plugin for KubeVirt names vGPU types ``nvidia.com/GRID_<type>`` (e.g. ``GRID_T4-1Q``);
    those and names containing ``vgpu`` are ``"vgpu"``, as are HAMi's shares of a GPU (``GPU-<uuid>-<n>``: its
    device plugin splits each GPU into ``deviceSplitCount`` ids under ``nvidia.com/gpu``).
    Anything else is a ``"whole"`` GPU.
    """
    name = resource_name.lower()
    if name.endswith(".shared") or "::" in device_id:
        return "shared"
    if name.startswith("nvidia.com/mig-") or device_id.startswith("MIG-"):
        return "mig"
    if name.startswith("nvidia.com/grid_") or "vgpu" in name or PodDevice(
            "", "", "", resource_name, device_id, "").uuid != device_id:
        return "vgpu"
    return "whole"


GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-", "nvidia.com/grid_")
"""The device plugin's GPU, MIG and shared resources, and KubeVirt's vGPU types (lower-cased). Other
``nvidia.com/`` resources (e.g. the network operator's RDMA devices) are not GPUs."""


def is_gpu(resource_name: str, device_id: str) -> bool:
    """True for a GPU, MIG or vGPU resource, or any device whose id is a GPU or MIG UUID."""
    return resource_name.lower().startswith(GPU_RESOURCE_PREFIXES) or device_id.startswith(("GPU-", "MIG-"))


QUOTA_RESOURCES = ("tencent.com/vcuda-core", "tencent.com/vcuda-memory")
"""GPU-Manager's resources: its device plugin advertises one device per unit (``tencent.com/vcuda-core-<i>``, 100
per GPU; ``tencent.com/vcuda-memory-268435456-<i>``, one per 256 MiB), so a container's count of ids is its amount."""


def quota_devices(response: Any) -> tuple[PodDevice, ...]:
    """The GPU-Manager quota units of a ``ListPodResourcesResponse``, one per (pod, container, device id)."""
    return _devices(response, lambda name, _id: name in QUOTA_RESOURCES, "vgpu")


def gpu_devices(response: Any) -> tuple[PodDevice, ...]:
    """The GPU devices of a ``ListPodResourcesResponse``, one per (pod, container, device id), in its order."""
    return _devices(response, is_gpu, None)


def _devices(response: Any, keep: Callable[[str, str], bool], sharing: str | None) -> tuple[PodDevice, ...]:
    """The devices ``keep`` accepts, one per (pod, container, device id); ``sharing`` (or each one's own) as kind."""
    seen: set[tuple[str, str, str, str]] = set()
    found: list[PodDevice] = []
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                for device_id in devices.device_ids:
                    key = (pod.namespace, pod.name, container.name, device_id)
                    if key in seen or not keep(devices.resource_name, device_id):
                        continue
                    seen.add(key)
                    kind = sharing or sharing_of(devices.resource_name, device_id)
                    found.append(PodDevice(*key[:3], devices.resource_name, device_id, kind))
    return tuple(found)


def summary(devices: Iterable[PodDevice], claims: Iterable[ClaimDevice] = ()) -> str:
    """E.g. ``"kubelet pod-resources: 3 pods hold 5 GPU devices"``, and ``"; DRA claims give 2 pods 2 devices"``
    when containers got devices through DRA claims."""
    held = tuple(devices)
    claimed = tuple(claims)
    pods = len({(device.namespace, device.pod) for device in held})
    if not held:
        text = "kubelet pod-resources: no pod holds a GPU device"
    else:
        pods_text = "1 pod holds" if pods == 1 else f"{pods} pods hold"
        devices_text = "1 GPU device" if len(held) == 1 else f"{len(held)} GPU devices"
        text = f"kubelet pod-resources: {pods_text} {devices_text}"
    if not claimed:
        return text
    if not held:
        text = "kubelet pod-resources: no pod holds a device-plugin GPU"
    claim_pods = len({(claim.namespace, claim.pod) for claim in claimed})
    return (f"{text}; DRA claims give {claim_pods} pod{'s' if claim_pods != 1 else ''} {len(claimed)} "
            f"device{'s' if len(claimed) != 1 else ''}")


def _path_problem(path: str) -> str | None:
    """Why ``path`` cannot be the kubelet's socket, judged from the file alone; ``None`` when it may be."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return f"No kubelet pod-resources socket at {path}: not a Kubernetes node, or the socket is not mounted"
    except OSError as error:
        return f"Cannot look at the kubelet pod-resources socket {path}: {error.strerror or error}"
    if not stat.S_ISSOCK(mode):
        return f"{path} is not a socket, so it cannot be the kubelet pod-resources socket"
    return None


def _connect_problem(path: str) -> str | None:
    """Why a plain connection to ``path`` fails (stale socket, permission); ``None`` when it connects."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except PermissionError:
            return f"Permission denied on the kubelet pod-resources socket {path}: nvdash needs to read it"
        except ConnectionRefusedError:
            return f"Nobody listens on the kubelet pod-resources socket {path}: it is stale, or the kubelet is down"
        except OSError as error:
            if error.errno == errno.ENOENT:
                return _path_problem(path)
            return f"Cannot connect to the kubelet pod-resources socket {path}: {error.strerror or error}"
    return None


def _garbage(path: str) -> str:
    return f"The server at {path} answered List with bytes that are not a pod-resources response"


def _rpc_problem(grpc: Any, error: Any, path: str, timeout_s: float) -> str:
    """One sentence for a failed ``List`` call (a ``grpc.RpcError``)."""
    code = error.code() if callable(getattr(error, "code", None)) else None
    details = str(error.details() if callable(getattr(error, "details", None)) else error)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"The kubelet pod-resources socket {path} gave no answer within {timeout_s:g} s"
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return f"The server at {path} does not offer the kubelet v1 pod-resources List call"
    if code == grpc.StatusCode.INTERNAL and "deserializ" in details.lower():
        return _garbage(path)
    if code == grpc.StatusCode.UNAVAILABLE:
        problem = _path_problem(path) or _connect_problem(path)
        log.debug("pod-resources List on %s: UNAVAILABLE: %s", path, details)
        return problem or f"The server at {path} does not answer as a gRPC server"
    name = code.name if code is not None else type(error).__name__
    return f"The kubelet pod-resources List call failed: {name}: {details}"


class PodResourcesClient:
    """Asks the kubelet which devices it allocated to which pod and container; one channel kept between calls.

    Safe to call from several threads (calls take turns).
    """

    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout_s: float = 2.0) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._channel: Any = None
        self._call: Any = None

    def list(self) -> PodResources:
        """The GPU devices allocated to containers on this node, or why they are unknown; never raises."""
        with self._lock:
            problem = _path_problem(self.socket_path)
            if problem is not None:
                self._close()
                return PodResources(available=False, status=problem)
            try:
                api = _load_api()
            except ImportError:
                return PodResources(available=False, status=NEED_EXTRA)
            try:
                response = self._list_call(api)(api.request(), timeout=self.timeout_s)
            except api.grpc.RpcError as error:
                self._close()
                status = _rpc_problem(api.grpc, error, self.socket_path, self.timeout_s)
                return PodResources(available=False, status=status)
            except api.decode_error:
                self._close()
                return PodResources(available=False, status=_garbage(self.socket_path))
            except Exception as error:
                self._close()
                status = f"The kubelet pod-resources List call failed: {type(error).__name__}: {error}"
                return PodResources(available=False, status=status)
            devices = gpu_devices(response)
            claims = claim_devices(response)
            return PodResources(devices=devices, available=True, status=summary(devices, claims),
                                quota_devices=quota_devices(response), claim_devices=claims)

    def close(self) -> None:
        """Close the channel (a later :meth:`list` opens a new one)."""
        with self._lock:
            self._close()

    def _list_call(self, api: _Api) -> Any:
        if self._call is None:
            options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES), ("grpc.enable_http_proxy", 0)]
            self._channel = api.grpc.insecure_channel(f"unix://{os.path.abspath(self.socket_path)}", options=options)
            self._call = self._channel.unary_unary(
                LIST_METHOD,
                request_serializer=lambda message: message.SerializeToString(),
                response_deserializer=api.response.FromString,
            )
        return self._call

    def _close(self) -> None:
        channel, self._channel, self._call = self._channel, None, None
        if channel is not None:
            with contextlib.suppress(Exception):
                channel.close()
