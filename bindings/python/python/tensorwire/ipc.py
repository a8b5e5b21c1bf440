"""Share tensors between processes on one host (the ``shared-tensor`` API, without pickle).

A server process owns tensors and models and serves endpoint functions over a Unix
socket; client processes call them and get tensors that view the server's memory:
CUDA tensors through CUDA IPC handles (opened once per process and cached), CPU
tensors and numpy arrays through memfd shared memory passed with ``SCM_RIGHTS``.
Nothing is pickled: values travel as CBOR trees, ``torch.nn`` modules as their
parameters, buffers and plain attributes, rebuilt on the client.

Server::

    from tensorwire.ipc import Provider, Server

    provider = Provider(execution_mode="server")

    @provider.share(execution="task", managed=True, concurrency="serialized",
                    cache_format_key="model:{hidden_size}")
    def load_model(hidden_size: int = 4):
        return torch.nn.Linear(hidden_size, hidden_size).cuda()

    Server(provider).start(blocking=True)

Client::

    from tensorwire.ipc import Client

    client = Client()
    with client.call("load_model", hidden_size=4) as handle:   # a SharedObjectHandle
        y = handle.value(x)

Or one file for both roles, switched by the environment: ``TENSORWIRE_IPC_ENABLED=1
TENSORWIRE_IPC_ROLE=server python app.py`` serves, ``TENSORWIRE_IPC_ENABLED=1 python
app.py`` calls, and with the gate unset the decorated functions run locally.

Beyond the reference: CPU tensors are shared too; a client that disconnects or dies
gives back everything it held; handles carry their server's id and fail with
:class:`StaleHandleError` when that server is gone; peers of other users are refused;
requests are size-capped and time-limited. See ``docs/ipc.md``.
"""

from __future__ import annotations

import atexit
import collections
import enum
import functools
import inspect
import math
import os
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

import numpy as np

from . import _native
from ._ipc_codec import Decoder, encode
from ._native import (
    CudaUnavailableError,
    IpcError,
    IpcTimeoutError,
    PeerRefusedError,
    ProtocolError,
    RemoteError,
    ServerGoneError,
    StaleHandleError,
)

ENV_ENABLED = "TENSORWIRE_IPC_ENABLED"
ENV_ROLE = "TENSORWIRE_IPC_ROLE"
ENV_SOCKET = "TENSORWIRE_IPC_SOCKET"

_TRUE = {"1", "true", "yes", "on"}


def default_socket_path(device: Optional[int] = None) -> str:
    """``$TENSORWIRE_IPC_SOCKET`` when set, else a per-user path (one per CUDA device
    when ``device`` is given): ``$XDG_RUNTIME_DIR/tensorwire/ipc[-N].sock`` or
    ``/tmp/tensorwire-<uid>/ipc[-N].sock``."""
    env = os.environ.get(ENV_SOCKET)
    if env:
        return env if device is None else f"{env}-{device}"
    return _native.default_socket_path("ipc" if device is None else f"ipc-{device}")


def cuda_available() -> bool:
    """True when a CUDA driver and a device are usable in this process."""
    return _native.cuda_available()


def cuda_import_stats() -> tuple:
    """``(opened, live)``: CUDA IPC handles this process opened so far, and mappings
    alive now (sharing an allocation again while a view of it lives opens nothing)."""
    return _native.cuda_import_stats()


def empty(shape, dtype="float32"):
    """A zero-filled numpy array in shared memory. Shared over ``tensorwire.ipc`` it is
    sent without a copy, and the processes that receive it see the server's writes and
    the server sees theirs (CPU values not allocated this way are copied into shared
    memory once, when first shared, and the receivers alias that copy)."""
    dtype = np.dtype(dtype)
    shape = tuple(int(d) for d in shape) if isinstance(shape, (tuple, list)) else (int(shape),)
    return _native.shared_buffer(math.prod(shape) * dtype.itemsize).view(dtype).reshape(shape)


def share_memory(value):
    """A copy of a numpy array or CPU torch tensor in shared memory (see :func:`empty`)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        from ._torch import torch_dst_bytes

        # A conjugate or negative view holds its values lazily: resolve them first.
        src = value.detach().resolve_conj().resolve_neg().contiguous()
        raw = _native.shared_buffer(src.numel() * src.element_size())
        out = torch.from_numpy(raw).view(src.dtype).reshape(src.shape) if src.numel() else src.clone()
        if src.numel():
            torch_dst_bytes(out)[...] = torch_dst_bytes(src)
        return out
    arr = np.asarray(value)
    out = empty(arr.shape, arr.dtype)
    out[...] = arr
    return out


def _encode_args(args, kwargs):
    return encode({"args": tuple(args), "kwargs": dict(kwargs)})


def _split_args(tree_or_value):
    return tuple(tree_or_value.get("args", ())), dict(tree_or_value.get("kwargs", {}))


# ------------------------------------------------------------------ endpoints


@dataclass(frozen=True)
class EndpointDefinition:
    """An endpoint function and how it is served."""

    name: str
    func: Callable[..., Any]
    execution: str = "direct"
    managed: bool = False
    concurrency: str = "parallel"
    cache: bool = True
    cache_format_key: Optional[str] = None
    singleflight: bool = True

    def __post_init__(self):
        try:
            signature = inspect.signature(self.func)
        except (TypeError, ValueError):
            signature = None
        object.__setattr__(self, "_signature", signature)

    def cache_key(self, args, kwargs) -> Optional[str]:
        """The call's cache key: ``cache_format_key`` formatted with the bound
        arguments (defaults applied), else their canonical repr; ``None`` (not cached)
        when an argument is a tensor and there is no format key."""
        if self._signature is None:
            return None
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError:
            return None
        bound.apply_defaults()
        if self.cache_format_key is not None:
            return self.cache_format_key.format(**bound.arguments)
        if _has_tensor(bound.arguments):
            return None
        return repr(_canonical(bound.arguments))

    def options(self) -> Dict[str, Any]:
        return {
            "execution": self.execution,
            "managed": self.managed,
            "concurrency": self.concurrency,
            "cache": self.cache,
            "singleflight": self.singleflight,
            "cache_format_key": self.cache_format_key,
        }


def _has_tensor(value) -> bool:
    if isinstance(value, (_native.TensorRef, _native.Tagged, np.ndarray)):
        return True
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, (torch.Tensor, torch.nn.Module)):
        return True
    if isinstance(value, dict):
        return any(_has_tensor(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_tensor(v) for v in value)
    return False


def _canonical(value):
    if isinstance(value, dict):
        return tuple(sorted((k, _canonical(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_canonical(v) for v in value))
    return value


def _validate_options(execution, concurrency):
    if execution not in ("direct", "task"):
        raise ValueError(f"execution must be 'direct' or 'task', not {execution!r}")
    if concurrency not in ("parallel", "serialized"):
        raise ValueError(f"concurrency must be 'parallel' or 'serialized', not {concurrency!r}")


# ------------------------------------------------------------------ handles


class SharedObjectHandle:
    """A managed result: the value plus a lease on the server object that keeps it
    alive. Give it back with :meth:`release` (or use the handle as a context manager);
    a client that closes or dies gives back every lease it held."""

    def __init__(self, value, object_id: str, server_id: str, client: "Client"):
        self.value = value
        self.object_id = object_id
        self.server_id = server_id
        self._client = client
        self._released = False
        self._lock = threading.Lock()

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> bool:
        """Gives the lease back (once); True when the server took it. False when the
        server that issued it is gone: its lease went with it."""
        with self._lock:
            if self._released:
                return False
            self._released = True
        try:
            return bool(self._client.release(self.object_id))
        except ServerGoneError:
            return False

    def get_object_info(self, *, refresh: bool = False) -> Optional[dict]:
        """The server's bookkeeping for the object (None when it is gone)."""
        return self._client.get_object_info(self.object_id)

    def is_stale(self) -> bool:
        """True when the object's server no longer holds it (or was replaced)."""
        try:
            self._client.ensure_handle_live(self)
            return False
        except (StaleHandleError, ServerGoneError):
            return True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __repr__(self):
        state = "released" if self._released else "live"
        return f"<SharedObjectHandle {self.object_id} of server {self.server_id[:8]} ({state})>"


class _Lease:
    """Holds an unmanaged result's server object (CUDA memory) while tensors made from
    it live: every CUDA buffer of the value keeps it, and torch keeps the buffers for as
    long as any view of their storage lives. When the last goes, the release is queued
    and sent with the client's next request (or at close)."""

    def __init__(self, client: "Client", object_id: str):
        self._client = client
        self.object_id = object_id

    def __del__(self):
        client = self._client
        if client is not None:
            client._pending_releases.append(self.object_id)   # deque: thread-safe


# ------------------------------------------------------------------ client


class TaskStatus(str, enum.Enum):
    """A task's state."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass
class TaskInfo:
    """A task's state and times (seconds since the epoch)."""

    task_id: str
    endpoint: str
    status: TaskStatus
    created_at: float
    started_at: Optional[float] = None
    completed_at: Optional[float] = None
    error: Optional[str] = None

    @classmethod
    def from_dict(cls, d: dict) -> "TaskInfo":
        return cls(d["task_id"], d["endpoint"], TaskStatus(d["status"]), d["created_at"],
                   d.get("started_at"), d.get("completed_at"), d.get("error"))

    def to_dict(self) -> dict:
        return {"task_id": self.task_id, "endpoint": self.endpoint, "status": self.status.value,
                "created_at": self.created_at, "started_at": self.started_at,
                "completed_at": self.completed_at, "error": self.error}


class Client:
    """A connection to a :class:`Server`.

    ``call`` returns what the endpoint returned: tensors as views of the server's
    memory (CUDA or shared CPU memory; numpy arrays stay numpy arrays), modules
    rebuilt around them, and for managed endpoints a :class:`SharedObjectHandle`.
    Module classes outside ``torch.nn`` are rebuilt only when their module is named in
    ``allowed_modules``.
    """

    def __init__(self, socket_path: Optional[str] = None, *, timeout: float = 600.0,
                 allowed_modules=(), device: Optional[int] = None):
        self.socket_path = socket_path or default_socket_path(device)
        self.allowed_modules = tuple(allowed_modules)
        self._native = _native.IpcClient(self.socket_path, timeout)
        self._timeout = timeout
        self._pending_releases = collections.deque()
        self._closed = False
        self._reconnecting = threading.Lock()

    def _request(self, method: str, *args):
        """Calls a native client method; when the server is gone, connects again once
        (a restarted server on the same socket) and retries. Handles from the old
        server stay stale. So too when the connection broke (a request cut off by its
        timeout mid-way): that connection's handles are given back. Threads that find
        the connection gone together connect once: the first replaces it, the others
        retry on the new one (a connection replaced again would be closed, and the
        leases it took with it)."""
        native = self._native
        try:
            return getattr(native, method)(*args)
        except (ServerGoneError, ProtocolError) as gone:
            if self._closed or (isinstance(gone, ProtocolError) and not native.broken):
                raise
            with self._reconnecting:
                if self._native is native:
                    try:
                        fresh = _native.IpcClient(self.socket_path, self.timeout)
                    except ServerGoneError:
                        raise gone from None   # no new server: report the one that went away
                    self._native = fresh
                    self._pending_releases.clear()   # the old server's objects are gone
                current = self._native
            return getattr(current, method)(*args)

    @property
    def timeout(self) -> float:
        """Seconds each request waits for its answer (sending included). Setting it
        applies to the requests that follow, on this connection and on any it
        reconnects with."""
        return self._timeout

    @timeout.setter
    def timeout(self, seconds: float):
        self._native.timeout = seconds   # checked there: positive seconds
        self._timeout = seconds

    @property
    def server_id(self) -> str:
        return self._native.server_id

    def _flush_releases(self):
        ids = []
        while self._pending_releases:
            ids.append(self._pending_releases.popleft())
        if ids:
            try:
                self._native.release(ids)
            except IpcError:
                pass

    def _result(self, received):
        decoder = Decoder(received, self.allowed_modules)
        if received.object_id is not None and not received.managed:
            decoder.lease = _Lease(self, received.object_id)
        try:
            value = decoder.decode()
        except BaseException:
            # No handle will hold a managed result's lease: give it back (an unmanaged
            # one's lease goes with the decoder).
            if received.object_id is not None and received.managed:
                self._pending_releases.append(received.object_id)
            raise
        if received.object_id is not None and received.managed:
            return SharedObjectHandle(value, received.object_id, received.server_id, self)
        return value

    def call(self, endpoint: str, *args, **kwargs):
        """Calls ``endpoint(*args, **kwargs)`` on the server and returns its result."""
        self._flush_releases()
        return self._result(self._request("call", endpoint, _encode_args(args, kwargs)))

    def submit(self, endpoint: str, *args, **kwargs) -> str:
        """Queues ``endpoint(*args, **kwargs)`` as a task; returns its id."""
        self._flush_releases()
        return self._request("submit", endpoint, _encode_args(args, kwargs))

    def get_task_status(self, task_id: str) -> dict:
        return self._native.task_status(task_id)

    def get_task_result(self, task_id: str):
        """A finished task's result (``RemoteError`` when it failed or was cancelled)."""
        return self._result(self._native.task_result(task_id))

    def wait_task(self, task_id: str, timeout: Optional[float] = None) -> dict:
        """Waits until the task finishes (or ``timeout`` seconds pass); its status."""
        return self._native.wait_task(task_id, timeout)

    def cancel_task(self, task_id: str) -> bool:
        """Cancels a task that has not started."""
        return self._native.cancel_task(task_id)

    def list_tasks(self, status: Optional[str] = None) -> Dict[str, dict]:
        status = status.value if isinstance(status, TaskStatus) else status
        return {t["task_id"]: t for t in self._native.list_tasks(status)}

    def release(self, object_id: str) -> bool:
        """Gives back one lease on an object."""
        return self._request("release", [object_id])[0]

    def release_many(self, object_ids) -> Dict[str, bool]:
        ids = list(object_ids)
        return dict(zip(ids, self._request("release", ids)))

    def get_object_info(self, object_id: str) -> Optional[dict]:
        return self._request("object_info", object_id)

    def ensure_handle_live(self, handle: SharedObjectHandle, *, refresh: bool = True) -> dict:
        """The object's info; :class:`StaleHandleError` when its server was replaced or
        no longer holds it (a server restarted on the socket is found by connecting
        again; ``ServerGoneError`` when no server is there)."""
        return self._request("ensure_live", handle.object_id, handle.server_id)

    def ping(self) -> bool:
        try:
            self._request("ping")
            return True
        except (ServerGoneError, IpcTimeoutError):
            return False

    def get_server_info(self) -> dict:
        return self._request("server_info")

    def list_endpoints(self) -> Dict[str, dict]:
        return self._request("list_endpoints")

    def invalidate_call_cache(self, endpoint: str, *args, **kwargs) -> bool:
        """Drops the cached result of ``endpoint(*args, **kwargs)``."""
        return self._native.invalidate_call(endpoint, _encode_args(args, kwargs)) > 0

    def invalidate_endpoint_cache(self, endpoint: str) -> int:
        """Drops every cached result of an endpoint; returns how many."""
        return self._native.invalidate_endpoint(endpoint)

    def close(self):
        """Gives back queued releases and closes the connection; the server then gives
        back every lease it still holds for this client (managed handles become stale)."""
        if self._native.connected:
            self._flush_releases()
            self._native.close()
        self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class AsyncClient(Client):
    """A client with the task-oriented interface of shared-tensor's
    ``AsyncSharedTensorClient``: ``submit``, then ``wait``/``result``/``cancel``."""

    def status(self, task_id: str) -> TaskInfo:
        return TaskInfo.from_dict(self.get_task_status(task_id))

    def result(self, task_id: str):
        return self.get_task_result(task_id)

    def wait(self, task_id: str, timeout: Optional[float] = None):
        """Waits for the task and returns its result; ``IpcTimeoutError`` when it has not
        finished within ``timeout`` seconds, ``RemoteError`` when it failed."""
        info = self.wait_task(task_id, timeout)
        if info["status"] in ("pending", "running"):
            raise IpcTimeoutError(f"task {task_id} still {info['status']} after {timeout} s")
        return self.get_task_result(task_id)

    wait_for_task = wait

    def cancel(self, task_id: str) -> bool:
        return self.cancel_task(task_id)

    def list_tasks(self, status: Optional[str] = None) -> Dict[str, TaskInfo]:
        return {k: TaskInfo.from_dict(v) for k, v in super().list_tasks(status).items()}


# ------------------------------------------------------------------ server


def _serve(endpoint: EndpointDefinition, allowed_modules, received):
    args, kwargs = _split_args(Decoder(received, allowed_modules).decode())
    return encode(endpoint.func(*args, **kwargs))


def _stop_if_alive(ref):
    server = ref()
    if server is not None:
        server.stop()


def _call_key(endpoint: EndpointDefinition, tree):
    args, kwargs = _split_args(tree)
    return endpoint.cache_key(args, kwargs)


class Server:
    """Serves a :class:`Provider`'s endpoints on a Unix socket (mode 0600; only this
    user's processes by default, ``allowed_uids`` to widen)."""

    def __init__(self, provider: "Provider", socket_path: Optional[str] = None, *,
                 allowed_uids=None, max_connections: int = 256, task_workers: int = 4,
                 max_tasks: int = 1024, task_retention: float = 600.0,
                 frame_timeout: float = 10.0, max_request_bytes: int = 16 << 20,
                 allowed_modules=()):
        self.provider = provider
        self.socket_path = socket_path or provider.socket_path
        self.allowed_modules = tuple(allowed_modules) or provider.allowed_modules
        self._native = _native.IpcServer(
            self.socket_path, allowed_uids, max_connections, frame_timeout,
            max_request_bytes, task_workers, max_tasks, task_retention)
        for endpoint in provider._endpoints.values():
            self._register(endpoint)
        provider._servers.append(self)

    def _register(self, endpoint: EndpointDefinition):
        self._native.register(
            endpoint.name,
            functools.partial(_serve, endpoint, self.allowed_modules),
            cache_key=functools.partial(_call_key, endpoint),
            **endpoint.options(),
        )

    @property
    def server_id(self) -> str:
        return self._native.server_id

    @property
    def running(self) -> bool:
        return self._native.running

    def start(self, blocking: bool = False):
        """Binds the socket and serves in background threads; with ``blocking=True``
        returns only when the server stops (Ctrl-C stops it)."""
        self._native.start()
        # Stop before the interpreter shuts down, while endpoint threads can still run.
        atexit.register(_stop_if_alive, weakref.ref(self))
        if blocking:
            try:
                while self._native.running:
                    time.sleep(0.2)
            except KeyboardInterrupt:
                self.stop()
        return self

    def stop(self):
        """Stops serving; every client's leases are given back."""
        self._native.stop()

    close = stop

    def info(self) -> dict:
        return self._native.info()

    def live(self) -> tuple:
        """``(objects, leases)`` alive now."""
        return self._native.live()

    def __enter__(self):
        if not self._native.running:
            self.start()
        return self

    def __exit__(self, *exc):
        self.stop()


# ------------------------------------------------------------------ provider


def _env_enabled() -> bool:
    return os.environ.get(ENV_ENABLED, "").strip().lower() in _TRUE


class Provider:
    """Registers endpoint functions and decides, per process, whether they run locally,
    are served, or are called remotely.

    ``execution_mode``: ``"local"`` (call the function), ``"server"`` (serve it with
    ``Server(provider).start()``), ``"client"`` (calls go to the server), or ``"auto"``:
    local unless ``enabled`` (default: ``TENSORWIRE_IPC_ENABLED``), then server when
    ``TENSORWIRE_IPC_ROLE=server`` and client otherwise. A server chosen by the
    environment starts by itself in a background thread with the first endpoint
    (``autostart``; default true only then).
    """

    def __init__(self, *, enabled: Optional[bool] = None, execution_mode: str = "auto",
                 socket_path: Optional[str] = None, device: Optional[int] = None,
                 timeout: float = 600.0, autostart: Optional[bool] = None, allowed_modules=()):
        if execution_mode not in ("auto", "local", "server", "client"):
            raise ValueError(f"execution_mode must be auto, local, server or client, not {execution_mode!r}")
        self.enabled = _env_enabled() if enabled is None else bool(enabled)
        resolved = execution_mode == "auto"
        if execution_mode == "auto":
            if not self.enabled:
                execution_mode = "local"
            elif os.environ.get(ENV_ROLE, "").strip().lower() == "server":
                execution_mode = "server"
            else:
                execution_mode = "client"
        self.execution_mode = execution_mode
        self.socket_path = socket_path or default_socket_path(device)
        self.timeout = timeout
        # A server the environment asked for starts by itself; an explicit
        # execution_mode="server" waits for Server(provider).start().
        self.autostart = resolved if autostart is None else bool(autostart)
        self.allowed_modules = tuple(allowed_modules)
        self._endpoints: Dict[str, EndpointDefinition] = {}
        self._servers = []
        self._client = None
        self._lock = threading.Lock()

    # -- registration

    def register(self, func: Callable[..., Any], *, name: Optional[str] = None,
                 execution: str = "direct", managed: bool = False,
                 concurrency: str = "parallel", cache: bool = True,
                 cache_format_key: Optional[str] = None, singleflight: bool = True):
        """Registers ``func`` as an endpoint; returns the callable to use in this process."""
        _validate_options(execution, concurrency)
        endpoint = EndpointDefinition(name or func.__name__, func, execution, managed,
                                      concurrency, cache, cache_format_key, singleflight)
        if endpoint.name in self._endpoints:
            raise ValueError(f"endpoint {endpoint.name!r} is already registered")
        self._endpoints[endpoint.name] = endpoint
        for server in self._servers:
            server._register(endpoint)
        if self.execution_mode == "server" and self.autostart:
            self._ensure_server()

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            return self.call(endpoint.name, *args, **kwargs)

        wrapper.endpoint = endpoint
        return wrapper

    def share(self, func: Optional[Callable[..., Any]] = None, **options):
        """Decorator form of :meth:`register`: ``@provider.share(execution="task", ...)``."""
        if func is not None:
            return self.register(func, **options)
        return lambda f: self.register(f, **options)

    def get_endpoint(self, name: str) -> EndpointDefinition:
        try:
            return self._endpoints[name]
        except KeyError:
            raise KeyError(f"no endpoint named {name!r}") from None

    def list_endpoints(self) -> Dict[str, dict]:
        return {name: e.options() for name, e in self._endpoints.items()}

    # -- running

    def _ensure_server(self):
        with self._lock:
            if not any(s.running for s in self._servers):
                Server(self).start()

    def _get_client(self) -> Client:
        with self._lock:
            if self._client is None:
                self._client = AsyncClient(self.socket_path, timeout=self.timeout,
                                           allowed_modules=self.allowed_modules)
            return self._client

    def invoke_local(self, name: str, *args, **kwargs):
        return self.get_endpoint(name).func(*args, **kwargs)

    def call(self, name: str, *args, **kwargs):
        """Runs the endpoint: remotely in client mode, locally otherwise."""
        if self.execution_mode == "client":
            return self._get_client().call(name, *args, **kwargs)
        return self.invoke_local(name, *args, **kwargs)

    def submit(self, name: str, *args, **kwargs) -> str:
        return self._get_client().submit(name, *args, **kwargs)

    def get_task_status(self, task_id: str) -> dict:
        return self._get_client().get_task_status(task_id)

    def get_task_result(self, task_id: str):
        return self._get_client().get_task_result(task_id)

    def wait_for_task(self, task_id: str, timeout: Optional[float] = None):
        return self._get_client().wait(task_id, timeout)

    def cancel_task(self, task_id: str) -> bool:
        return self._get_client().cancel_task(task_id)

    def list_tasks(self, status: Optional[str] = None):
        return self._get_client().list_tasks(status)

    def invalidate_call_cache(self, name: str, *args, **kwargs) -> bool:
        """Drops the cached result of one call (on the servers of this process, or
        remotely in client mode)."""
        if self.execution_mode == "client":
            return self._get_client().invalidate_call_cache(name, *args, **kwargs)
        key = self.get_endpoint(name).cache_key(args, kwargs)
        return key is not None and any(s._native.invalidate_key(name, key) for s in self._servers)

    def invalidate_endpoint_cache(self, name: str) -> int:
        if self.execution_mode == "client":
            return self._get_client().invalidate_endpoint_cache(name)
        self.get_endpoint(name)
        return sum(s._native.invalidate_endpoint(name) for s in self._servers)

    def get_runtime_info(self) -> dict:
        info = {
            "execution_mode": self.execution_mode,
            "enabled": self.enabled,
            "socket_path": self.socket_path,
            "endpoints": sorted(self._endpoints),
        }
        if self.execution_mode == "client":
            info["server"] = self._get_client().get_server_info()
        elif self._servers:
            info["server"] = self._servers[-1].info()
        return info

    def close(self):
        """Stops the servers this provider started and closes its client."""
        for server in self._servers:
            server.stop()
        if self._client is not None:
            self._client.close()
            self._client = None


__all__ = [
    "AsyncClient",
    "Client",
    "CudaUnavailableError",
    "EndpointDefinition",
    "IpcError",
    "IpcTimeoutError",
    "PeerRefusedError",
    "ProtocolError",
    "Provider",
    "RemoteError",
    "Server",
    "ServerGoneError",
    "SharedObjectHandle",
    "StaleHandleError",
    "TaskInfo",
    "TaskStatus",
    "cuda_available",
    "cuda_import_stats",
    "default_socket_path",
    "empty",
    "share_memory",
]
