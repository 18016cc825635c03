"""Real servers on unix sockets for the pod-resources client tests.

:func:`compile_api` compiles ``nvdash/sampling/kubelet/api.proto`` with ``grpc_tools.protoc``;
:func:`serve_pods` serves its ``PodResourcesLister`` with the pods a test hands in (device-plugin devices and DRA
claims);
:func:`serve_garbage` answers ``List`` with bytes that decode as nothing; :func:`serve_no_service` offers no
service at all; :func:`serve_junk` is a plain socket that writes junk and hangs up.
"""

from __future__ import annotations

import contextlib
import importlib
import socket
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
from grpc_tools import protoc

import nvdash.sampling.kubelet

API_PROTO = Path(nvdash.sampling.kubelet.__file__).parent / "api.proto"
GARBAGE = b"\xff\xff\xff\xff\x0f"
"""Not a protobuf message: a field tag with wire type 7 (there is none)."""

_compiled: tuple[ModuleType, ModuleType] | None = None


def compile_api(out_dir: Path) -> tuple[ModuleType, ModuleType]:
    """``api_pb2`` and ``api_pb2_grpc`` compiled from ``api.proto`` into ``out_dir`` (once per process)."""
    global _compiled
    if _compiled is None:
        args = [
            "grpc_tools.protoc",
            f"-I{API_PROTO.parent}",
            f"--python_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            str(API_PROTO),
        ]
        assert protoc.main(args) == 0, "protoc could not compile api.proto"
        sys.path.insert(0, str(out_dir))
        try:
            _compiled = (importlib.import_module("api_pb2"), importlib.import_module("api_pb2_grpc"))
        finally:
            sys.path.remove(str(out_dir))
    return _compiled


@dataclass(frozen=True)
class ClaimResource:
    """One device of a DRA claim, as ``ClaimResource`` names it."""

    driver: str
    pool: str
    device: str
    cdi_devices: Sequence[str] = ()
    share_id: str | None = None


@dataclass(frozen=True)
class Claim:
    """A ResourceClaim prepared for a container (``DynamicResource``); ``class_name`` as kubelets 1.27-1.30 send."""

    namespace: str
    name: str
    resources: Sequence[ClaimResource]
    class_name: str = ""


@dataclass(frozen=True)
class Container:
    name: str
    devices: Mapping[str, Sequence[str]]
    """Resource name to device ids."""
    claims: Sequence[Claim] = ()
    """What the container got through DRA (``dynamic_resources``)."""


@dataclass(frozen=True)
class Pod:
    namespace: str
    name: str
    containers: Sequence[Container]


@dataclass
class Lister:
    """What the servicer answers: ``pods``, after waiting ``delay_s`` (cut short by ``release``)."""

    pods: Sequence[Pod] = ()
    delay_s: float = 0.0
    calls: int = 0
    release: threading.Event = field(default_factory=threading.Event)


def _dynamic(api_pb2: ModuleType, claims: Sequence[Claim]) -> list[Any]:
    return [
        api_pb2.DynamicResource(
            class_name=claim.class_name,
            claim_name=claim.name,
            claim_namespace=claim.namespace,
            claim_resources=[
                api_pb2.ClaimResource(
                    cdi_devices=[api_pb2.CDIDevice(name=name) for name in resource.cdi_devices],
                    driver_name=resource.driver,
                    pool_name=resource.pool,
                    device_name=resource.device,
                    **({} if resource.share_id is None else {"share_id": resource.share_id}),
                )
                for resource in claim.resources
            ],
        )
        for claim in claims
    ]


def _servicer(api_pb2: ModuleType, api_pb2_grpc: ModuleType, lister: Lister) -> Any:
    class Servicer(api_pb2_grpc.PodResourcesListerServicer):
        def List(self, request: Any, context: Any) -> Any:
            lister.calls += 1
            if lister.delay_s:
                lister.release.wait(lister.delay_s)
            return api_pb2.ListPodResourcesResponse(
                pod_resources=[
                    api_pb2.PodResources(
                        name=pod.name,
                        namespace=pod.namespace,
                        containers=[
                            api_pb2.ContainerResources(
                                name=container.name,
                                devices=[
                                    api_pb2.ContainerDevices(resource_name=resource, device_ids=list(ids))
                                    for resource, ids in container.devices.items()
                                ],
                                cpu_ids=[2, 3],
                                dynamic_resources=_dynamic(api_pb2, container.claims),
                            )
                            for container in pod.containers
                        ],
                    )
                    for pod in lister.pods
                ]
            )

    return Servicer()


@contextlib.contextmanager
def _grpc_server(path: Path, add: Any) -> Iterator[None]:
    path.unlink(missing_ok=True)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    add(server)
    assert server.add_insecure_port(f"unix://{path}") != 0, f"cannot listen on {path}"
    server.start()
    try:
        yield
    finally:
        server.stop(grace=None).wait(10)


@contextlib.contextmanager
def serve_pods(path: Path, out_dir: Path, lister: Lister) -> Iterator[Lister]:
    """A ``PodResourcesLister`` on ``path`` answering what ``lister`` holds (change it at will)."""
    api_pb2, api_pb2_grpc = compile_api(out_dir)
    lister.release.clear()
    servicer = _servicer(api_pb2, api_pb2_grpc, lister)
    try:
        with _grpc_server(path, lambda server: api_pb2_grpc.add_PodResourcesListerServicer_to_server(servicer, server)):
            yield lister
    finally:
        lister.release.set()


@contextlib.contextmanager
def serve_garbage(path: Path) -> Iterator[None]:
    """A gRPC server whose ``List`` answers :data:`GARBAGE`."""
    handler = grpc.method_handlers_generic_handler(
        "v1.PodResourcesLister", {"List": grpc.unary_unary_rpc_method_handler(lambda request, context: GARBAGE)}
    )
    with _grpc_server(path, lambda server: server.add_generic_rpc_handlers((handler,))):
        yield


@contextlib.contextmanager
def serve_no_service(path: Path) -> Iterator[None]:
    """A gRPC server that offers no service (every call is UNIMPLEMENTED)."""
    with _grpc_server(path, lambda server: None):
        yield


@contextlib.contextmanager
def serve_junk(path: Path) -> Iterator[list[int]]:
    """A plain unix socket that writes junk to each caller and hangs up; yields the count of callers so far."""
    callers = [0]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(8)
    listener.settimeout(0.1)
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            callers[0] += 1
            with connection, contextlib.suppress(OSError):
                connection.sendall(b"HTTP/1.1 418 I'm a teapot\r\n\r\nnot grpc at all")

    thread = threading.Thread(target=run, name="junk-listener", daemon=True)
    thread.start()
    try:
        yield callers
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def stale_socket(path: Path) -> None:
    """Leave a socket file at ``path`` that nobody listens on (a kubelet that died)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(path))
