"""`MooncakeClient`: one Mooncake Store client per master and process, shared by the backends.

Every pool namespace gets its own `MooncakeBackend`, but they share one client: one
connection, one memory segment contributed to the store, one set of registered buffers.

Reachability is a small circuit breaker: a call that fails with an RPC error marks the
master down for ``retry_s``; meanwhile every call returns at once as a miss/failure
instead of waiting on Mooncake's own reconnect (about 4 s per call). After ``retry_s``
one TCP probe (``connect_timeout_s``) decides whether to try the store again.

    up --(RPC error)--> down --(retry_s passed, probe connects)--> up
                          ^---(retry_s passed, probe fails)---'
"""
from __future__ import annotations

import logging
import socket
import threading
import time

import torch

from hicache.config import parse_host_port
from hicache.storage.base import LogOnce, StorageUnavailableError
from hicache.storage.mooncake_master import port_open

log = logging.getLogger("hicache.storage")

RPC_FAIL = -900  # mooncake ErrorCode::RPC_FAIL: the master is unreachable
UNAVAILABLE = (-1010, -1011)  # UNAVAILABLE_IN_CURRENT_STATUS / _MODE
NOT_FOUND = (-704, -712)  # OBJECT_NOT_FOUND, REPLICA_IS_GONE
ALREADY_EXISTS = -705
NOT_READY = -703  # REPLICA_IS_NOT_READY: a put of the key is still in flight
TRANSFER_FAIL = -800
NO_SPACE = -200  # NO_AVAILABLE_HANDLE: the store is full
LOCAL_BUFFER_BYTES = 16 << 20  # Mooncake's bounce buffer for unregistered memory


def local_address_towards(host: str, port: int) -> str:
    """The local IP the kernel would use to reach ``host`` (UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, port))
        return s.getsockname()[0]


class MooncakeClient:
    """A connected `MooncakeDistributedStore` with a circuit breaker (thread-safe).

    Args:
        master: ``host:port`` of ``mooncake_master``.
        segment_bytes: memory this process contributes to the store (0 = none: the data
            lives in other clients' segments).
        protocol: ``"tcp"`` (any machine) or ``"rdma"``.
        connect_timeout_s: TCP probe timeout (start-up check and re-probes).
        retry_s: how long the master stays marked down after an RPC failure.

    Raises:
        StorageUnavailableError: client not installed, master unreachable, or set-up refused.
    """

    def __init__(self, master: str, segment_bytes: int, protocol: str = "tcp",
                 connect_timeout_s: float = 2.0, retry_s: float = 5.0) -> None:
        self.master, self.segment_bytes = master, int(segment_bytes)
        self.host, self.port = parse_host_port(master)
        self.connect_timeout_s, self.retry_s = connect_timeout_s, retry_s
        self.refs = 0
        self._registered: dict[int, tuple[int, int]] = {}  # address -> (bytes, registrations)
        self._lock = threading.Lock()
        self._down_until = 0.0
        self.log_once = LogOnce(log, f"mooncake storage [{master}]")
        self.store = self._connect(protocol)

    def _connect(self, protocol: str):
        try:
            from mooncake.store import MooncakeDistributedStore
        except ImportError as e:
            raise StorageUnavailableError(
                f"mooncake storage: the Mooncake client cannot be imported ({e}); install "
                "mooncake-transfer-engine-non-cuda (CPU) or mooncake-transfer-engine (CUDA) and Debian's "
                "libibverbs1 libnl-3-200 libnl-route-3-200 (scripts/setup.sh does)") from e
        if not port_open(self.host, self.port, self.connect_timeout_s):
            raise StorageUnavailableError(
                f"mooncake storage: no mooncake_master accepts connections at {self.master} "
                f"(--hicache-storage-master) within {self.connect_timeout_s} s")
        store = MooncakeDistributedStore()
        local = local_address_towards(self.host, self.port)
        rc = store.setup(local, "P2PHANDSHAKE", self.segment_bytes, LOCAL_BUFFER_BYTES, protocol, "", self.master)
        if rc != 0:
            raise StorageUnavailableError(f"mooncake storage: set-up against {self.master} failed "
                                          f"(code {rc}; see the Mooncake log above)")
        return store

    # ---- circuit breaker --------------------------------------------------------------
    def available(self) -> bool:
        """Whether to try the store now (re-probing once ``retry_s`` has passed)."""
        if self._down_until == 0.0:
            return True
        if time.monotonic() < self._down_until:
            return False
        if port_open(self.host, self.port, self.connect_timeout_s):
            self._down_until = 0.0
            log.warning("mooncake storage [%s]: master reachable again", self.master)
            return True
        self._down_until = time.monotonic() + self.retry_s
        return False

    def check_codes(self, codes: list[int]) -> bool:
        """Trip the breaker if any code says the master is gone; returns whether it tripped."""
        if any(c == RPC_FAIL or c in UNAVAILABLE for c in codes):
            self._down_until = time.monotonic() + self.retry_s
            self.log_once("down", f"master unreachable (RPC failure); storage calls return misses and "
                                  f"failures, re-probing every {self.retry_s} s")
            return True
        return False

    # ---- buffers ----------------------------------------------------------------------
    def register(self, buf: torch.Tensor) -> bool:
        """Register a host buffer for zero-copy transfers (counted per address; see `unregister`).

        The buffer must stay allocated until its last `unregister`. Returns whether the
        store accepted it; TCP still moves unregistered memory through a bounce buffer.
        """
        ptr, size = buf.data_ptr(), buf.numel() * buf.element_size()
        with self._lock:
            known = self._registered.get(ptr)
            if known is not None and known[0] >= size:
                self._registered[ptr] = (known[0], known[1] + 1)
                return True
            rc = self.store.register_buffer(ptr, size)
            if rc == 0:
                self._registered[ptr] = (size, 1)
        if rc != 0:
            self.log_once("register", f"register_buffer of {size} B failed (code {rc}); transfers "
                                      "from it go through Mooncake's bounce buffer")
        return rc == 0

    def unregister(self, buf: torch.Tensor) -> None:
        """Drop one registration of ``buf``; the last one unregisters it from the store."""
        ptr = buf.data_ptr()
        with self._lock:
            known = self._registered.get(ptr)
            if known is None:
                return
            if known[1] > 1:
                self._registered[ptr] = (known[0], known[1] - 1)
                return
            del self._registered[ptr]
            self.store.unregister_buffer(ptr)

    def close(self) -> None:
        """Disconnect (unmounts this process's segment: the objects in it are gone)."""
        with self._lock:
            self._registered.clear()
        self.store.close()


_CLIENTS: dict[str, MooncakeClient] = {}
_CLIENTS_LOCK = threading.Lock()


def acquire_client(master: str, segment_bytes: int, **kwargs) -> MooncakeClient:
    """The process's client for ``master`` (connected on first use); pair with `release_client`.

    The first caller's ``segment_bytes`` sizes the contribution; later callers share it.
    """
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(master)
        if client is None:
            client = MooncakeClient(master, segment_bytes, **kwargs)
            _CLIENTS[master] = client
        client.refs += 1
        return client


def release_client(client: MooncakeClient) -> None:
    """Drop one reference; the last one disconnects."""
    with _CLIENTS_LOCK:
        client.refs -= 1
        if client.refs > 0:
            return
        _CLIENTS.pop(client.master, None)
    client.close()
