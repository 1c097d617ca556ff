"""The transports that move KV bytes between two processes, and whether each one can run here.

Each transport has a receiver (owns the destination KV buffer) and a sender (owns the source).
They run inside :mod:`pdlab.transfer.peer` processes, never in the caller's process: NIXL's
UCX agents crash at interpreter exit and torch.distributed keeps global state, so every peer
reports and then leaves with ``os._exit``.

- ``shm``: the receiver's KV buffer is a POSIX shared-memory segment; the sender maps it and
  writes each layer into it (one memcpy, a one-sided write like CUDA IPC or NVLink).
- ``tcp``: a loopback TCP socket; ``sendall`` per layer, ``recv_into`` on the other side.
- ``gloo``: ``torch.distributed`` with the gloo backend, ``send``/``recv`` per layer.
- ``mooncake``: Mooncake Transfer Engine, protocol ``tcp``, metadata ``P2PHANDSHAKE`` (no etcd),
  ``batch_transfer_sync_write`` of one entry per layer into the receiver's registered buffer.
- ``nixl``: NIXL with the UCX backend, DRAM to DRAM, a ``WRITE`` of one descriptor per layer.
  UCX picks its fastest path on one host (shared memory / CMA); ``nixl-tcp`` forces
  ``UCX_TLS=tcp`` on loopback, the path two hosts without RDMA would take.

One-sided transports (shm, mooncake, nixl) tell the receiver with a 1-byte DONE on the side
channel after their write completed; two-sided ones (tcp, gloo) complete when the receiver
has received every layer. Both then answer with ACK, which is when the sender stops the clock.
"""

from __future__ import annotations

import base64
import importlib.util
import os
import socket
from dataclasses import dataclass

import numpy as np

from pdlab.process import free_port
from pdlab.transfer.kvbuffer import KVLayout

__all__ = ["TRANSPORTS", "PEER_TRANSPORTS", "DEFAULT_TRANSPORTS", "TransportInfo", "TransportUnavailable",
           "transport_status", "check_available", "expand_transports", "SideChannel", "Receiver", "Sender",
           "make_receiver", "make_sender", "peer_environment", "ShmReceiver", "ShmSender", "TcpReceiver",
           "TcpSender", "GlooReceiver", "GlooSender", "MooncakeReceiver", "MooncakeSender", "NixlReceiver",
           "NixlSender"]


class TransportUnavailable(RuntimeError):
    """A transport cannot run here; the message says why and how to install what it needs."""


@dataclass(frozen=True)
class TransportInfo:
    """What a transport is, whether it is one-sided, and how to install it."""

    name: str
    description: str
    one_sided: bool
    install: str


TRANSPORTS: dict[str, TransportInfo] = {
    "shm": TransportInfo("shm", "POSIX shared memory: sender writes into the receiver's mapped segment",
                         True, "part of Python (multiprocessing.shared_memory)"),
    "tcp": TransportInfo("tcp", "TCP socket on loopback (sendall / recv_into)", False, "part of Python"),
    "gloo": TransportInfo("gloo", "torch.distributed gloo send/recv", False,
                          "pip install torch (the course pins torch==2.13.0)"),
    "mooncake": TransportInfo("mooncake", "Mooncake Transfer Engine, tcp protocol, P2PHANDSHAKE", True,
                              "pip install mooncake-transfer-engine-non-cuda==0.3.13.post1 and "
                              "apt-get install libibverbs1 (scripts/install.sh does both)"),
    "nixl": TransportInfo("nixl", "NIXL, UCX backend, DRAM→DRAM WRITE (UCX shared memory on one host)", True,
                          "pip install --no-deps nixl==1.5.1 nixl-cu12==1.5.1 (scripts/install.sh)"),
    "nixl-tcp": TransportInfo("nixl-tcp", "NIXL, UCX backend forced to TCP on loopback (UCX_TLS=tcp)", True,
                              "pip install --no-deps nixl==1.5.1 nixl-cu12==1.5.1 (scripts/install.sh)"),
    "cuda": TransportInfo("cuda", "CUDA copies: device→device, pinned and pageable host↔device", True,
                          "a CUDA build of torch on a machine with an NVIDIA GPU (pip install torch)"),
}
#: Transports measured between two peer processes (``cuda`` runs in one process, see pdlab.transfer.cuda).
PEER_TRANSPORTS = ("shm", "tcp", "gloo", "mooncake", "nixl", "nixl-tcp")
#: What ``all`` means on the command line.
DEFAULT_TRANSPORTS = ("shm", "tcp", "gloo", "mooncake", "nixl", "cuda")


def _module_missing(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):
        return True


def transport_status(name: str) -> tuple[bool, str]:
    """``(available, reason)`` for a transport name; cheap (no library is initialised)."""
    if name not in TRANSPORTS:
        raise ValueError(f"unknown transport {name!r}; known: {', '.join(TRANSPORTS)}")
    info = TRANSPORTS[name]
    if name in ("gloo", "cuda"):
        if _module_missing("torch"):
            return False, f"torch is not installed: {info.install}"
        if name == "gloo":
            import torch.distributed as dist

            return (True, "") if dist.is_available() and dist.is_gloo_available() else \
                (False, "this torch build has no gloo backend")
        import torch

        if not torch.cuda.is_available():
            return False, ("no CUDA device here (torch.cuda.is_available() is False, torch "
                           f"{torch.__version__}); needs {info.install}")
        return True, ""
    if name == "mooncake":
        if _module_missing("mooncake"):
            return False, f"mooncake is not installed: {info.install}"
        try:
            from mooncake.engine import TransferEngine  # noqa: F401  (loads libibverbs)
        except ImportError as exc:
            return False, f"mooncake does not load ({exc}): {info.install}"
        from pdlab.transfer.netns import ALL_INTERFACE_TRANSPORTS, namespace_status

        contained, why = namespace_status()
        if not contained:
            return False, (f"{ALL_INTERFACE_TRANSPORTS['mooncake']}; the course runs it only inside a "
                           f"loopback-only network namespace, and {why}")
        return True, ""
    if name.startswith("nixl"):
        if _module_missing("nixl") or (_module_missing("nixl_cu12") and _module_missing("nixl_cu13")):
            return False, f"nixl is not installed: {info.install}"
        return True, ""
    return True, ""


def check_available(name: str) -> None:
    """Raise :class:`TransportUnavailable` (with how to install) unless ``name`` can run here."""
    ok, reason = transport_status(name)
    if not ok:
        raise TransportUnavailable(f"transport {name!r} is unavailable: {reason}")


def expand_transports(spec: str | list[str]) -> list[str]:
    """``"shm,tcp"`` or ``["all"]`` → transport names, in order, validated."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    names: list[str] = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        for n in (DEFAULT_TRANSPORTS if item == "all" else (item,)):
            if n not in TRANSPORTS:
                raise ValueError(f"unknown transport {n!r}; known: {', '.join(TRANSPORTS)}, all")
            if n not in names:
                names.append(n)
    if not names:
        raise ValueError("no transport given")
    return names


# --------------------------------------------------------------------------- side channel
class SideChannel:
    """A 1-byte control channel between sender and receiver (READY, DONE, ACK) over TCP."""

    READY, DONE, ACK = b"R", b"D", b"A"

    def __init__(self, sock: socket.socket):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock

    def send(self, code: bytes) -> None:
        self.sock.sendall(code)

    def expect(self, code: bytes) -> None:
        got = self.sock.recv(1)
        if got != code:
            raise ConnectionError(f"side channel: expected {code!r}, got {got!r} (peer gone?)")

    def close(self) -> None:
        self.sock.close()


def _recv_exact_into(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:], len(view) - got)
        if n == 0:
            raise ConnectionError("peer closed the data socket mid-transfer")
        got += n


def _touch(buf: np.ndarray) -> np.ndarray:
    buf.fill(0)  # fault in every page now, not during the first timed transfer
    return buf


# --------------------------------------------------------------------------- receivers
class Receiver:
    """Owns the destination buffer; ``receive`` returns when a layout's bytes have arrived."""

    name = "base"

    def __init__(self, capacity: int, host: str):
        self.capacity, self.host = capacity, host
        self.buf = _touch(np.empty(capacity, dtype=np.uint8))

    def endpoint(self) -> dict:
        return {}

    def accept(self) -> None:
        """Finish connecting once the sender has the endpoint (two-sided transports)."""

    def receive(self, layout: KVLayout, side: SideChannel) -> None:
        side.expect(SideChannel.DONE)  # one-sided: the sender wrote, then said DONE

    def close(self) -> None:
        pass


class Sender:
    """Owns the source buffer; ``send_layers`` ships some layers of a layout."""

    name = "base"
    one_sided = True

    def __init__(self, payload: np.ndarray, host: str):
        self.src, self.host = payload, host

    def connect(self, endpoint: dict) -> None:
        pass

    def send_layers(self, layout: KVLayout, layers: list[int]) -> None:
        raise NotImplementedError

    def finish(self, side: SideChannel) -> None:
        if self.one_sided:
            side.send(SideChannel.DONE)

    def close(self) -> None:
        pass


class ShmReceiver(Receiver):
    name = "shm"

    def __init__(self, capacity: int, host: str):
        from multiprocessing import shared_memory

        self.capacity, self.host = capacity, host
        self.shm = shared_memory.SharedMemory(create=True, size=capacity)
        self.buf = _touch(np.ndarray((capacity,), dtype=np.uint8, buffer=self.shm.buf))

    def endpoint(self) -> dict:
        return {"shm_name": self.shm.name}

    def close(self) -> None:
        del self.buf
        self.shm.close()
        self.shm.unlink()


class ShmSender(Sender):
    name = "shm"

    def connect(self, endpoint: dict) -> None:
        from multiprocessing import resource_tracker, shared_memory

        self.shm = shared_memory.SharedMemory(name=endpoint["shm_name"])
        # Python < 3.13 registers attached segments too and would unlink the receiver's at exit. The
        # tracker holds the POSIX name, which is the public ``name`` with a leading slash.
        if os.name == "posix":
            try:
                resource_tracker.unregister("/" + self.shm.name, "shared_memory")
            except Exception:
                pass
        self.dst = np.ndarray((self.shm.size,), dtype=np.uint8, buffer=self.shm.buf)

    def send_layers(self, layout: KVLayout, layers: list[int]) -> None:
        for layer in layers:
            off, n = layout.layer_span(layer)
            np.copyto(self.dst[off:off + n], self.src[off:off + n])

    def close(self) -> None:
        if hasattr(self, "dst"):
            del self.dst
            self.shm.close()


class TcpReceiver(Receiver):
    name = "tcp"

    def __init__(self, capacity: int, host: str):
        super().__init__(capacity, host)
        self.listener = socket.create_server((host, 0))
        self.conn: socket.socket | None = None

    def endpoint(self) -> dict:
        return {"data_port": self.listener.getsockname()[1]}

    def accept(self) -> None:
        self.listener.settimeout(60)
        self.conn, _ = self.listener.accept()
        self.conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.listener.close()

    def receive(self, layout: KVLayout, side: SideChannel) -> None:
        view = memoryview(self.buf)
        for layer in range(layout.layers):
            off, n = layout.layer_span(layer)
            _recv_exact_into(self.conn, view[off:off + n])

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


class TcpSender(Sender):
    name = "tcp"
    one_sided = False

    def connect(self, endpoint: dict) -> None:
        self.conn = socket.create_connection((self.host, endpoint["data_port"]), timeout=60)
        self.conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        self.conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.view = memoryview(self.src)

    def send_layers(self, layout: KVLayout, layers: list[int]) -> None:
        for layer in layers:
            off, n = layout.layer_span(layer)
            self.conn.sendall(self.view[off:off + n])

    def close(self) -> None:
        if hasattr(self, "conn"):
            self.conn.close()


def _gloo_join(host: str, port: int, rank: int, array: np.ndarray):
    """Join the two-rank gloo group whose store rank 0 hosts at ``host:port`` (60 s time-out); return
    ``array`` as a torch tensor sharing its memory."""
    import datetime

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    return torch.from_numpy(array)


def _gloo_layers(tensor, layout: KVLayout, layers, *, send: bool) -> None:
    """Move ``layers`` of ``tensor`` from rank 1 to rank 0, one point-to-point message per layer:
    rank 1 calls this with ``send``, rank 0 without."""
    import torch.distributed as dist

    for layer in layers:
        off, n = layout.layer_span(layer)
        if send:
            dist.send(tensor[off:off + n], dst=0)
        else:
            dist.recv(tensor[off:off + n], src=1)


def _gloo_leave() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


class GlooReceiver(Receiver):
    """Rank 0 (it hosts the rendezvous store); data flows from rank 1 to rank 0."""

    name = "gloo"

    def __init__(self, capacity: int, host: str):
        super().__init__(capacity, host)
        self.port = free_port(host)

    def endpoint(self) -> dict:
        return {"gloo_port": self.port}

    def accept(self) -> None:
        self.tensor = _gloo_join(self.host, self.port, 0, self.buf)

    def receive(self, layout: KVLayout, side: SideChannel) -> None:
        _gloo_layers(self.tensor, layout, range(layout.layers), send=False)

    def close(self) -> None:
        _gloo_leave()


class GlooSender(Sender):
    name = "gloo"
    one_sided = False

    def connect(self, endpoint: dict) -> None:
        self.tensor = _gloo_join(self.host, endpoint["gloo_port"], 1, self.src)

    def send_layers(self, layout: KVLayout, layers: list[int]) -> None:
        _gloo_layers(self.tensor, layout, layers, send=True)

    def close(self) -> None:
        _gloo_leave()


class MooncakeReceiver(Receiver):
    name = "mooncake"

    def __init__(self, capacity: int, host: str):
        from mooncake.engine import TransferEngine

        super().__init__(capacity, host)
        self.engine = TransferEngine()
        rc = self.engine.initialize(host, "P2PHANDSHAKE", "tcp", "")
        if rc != 0:
            raise RuntimeError(f"Mooncake TransferEngine.initialize failed ({rc})")
        self.ptr = self.buf.ctypes.data
        if self.engine.register_memory(self.ptr, capacity) != 0:
            raise RuntimeError("Mooncake register_memory failed")

    def endpoint(self) -> dict:
        return {"session": f"{self.host}:{self.engine.get_rpc_port()}", "ptr": self.ptr}

    def close(self) -> None:
        self.engine.unregister_memory(self.ptr)


class MooncakeSender(Sender):
    name = "mooncake"

    def __init__(self, payload: np.ndarray, host: str):
        from mooncake.engine import TransferEngine

        super().__init__(payload, host)
        self.engine = TransferEngine()
        rc = self.engine.initialize(host, "P2PHANDSHAKE", "tcp", "")
        if rc != 0:
            raise RuntimeError(f"Mooncake TransferEngine.initialize failed ({rc})")
        self.ptr = payload.ctypes.data
        if self.engine.register_memory(self.ptr, payload.nbytes) != 0:
            raise RuntimeError("Mooncake register_memory failed")

    def connect(self, endpoint: dict) -> None:
        self.session, self.remote = endpoint["session"], endpoint["ptr"]

    def send_layers(self, layout: KVLayout, layers: list[int]) -> None:
        spans = [layout.layer_span(i) for i in layers]
        rc = self.engine.batch_transfer_sync_write(
            self.session, [self.ptr + o for o, _ in spans], [self.remote + o for o, _ in spans],
            [n for _, n in spans])
        if rc != 0:
            raise RuntimeError(f"Mooncake batch_transfer_sync_write failed ({rc})")

    def close(self) -> None:
        self.engine.unregister_memory(self.ptr)


def _nixl_agent(name: str):
    from nixl._api import nixl_agent, nixl_agent_config

    return nixl_agent(name, nixl_agent_config(backends=["UCX"]))


class NixlReceiver(Receiver):
    name = "nixl"

    def __init__(self, capacity: int, host: str):
        super().__init__(capacity, host)
        self.agent = _nixl_agent(f"pdlab-recv-{os.getpid()}")
        self.ptr = self.buf.ctypes.data
        self.reg = self.agent.register_memory([(self.ptr, capacity, 0, "")], "DRAM")

    def endpoint(self) -> dict:
        return {"metadata": base64.b64encode(self.agent.get_agent_metadata()).decode(), "ptr": self.ptr}


class NixlSender(Sender):
    name = "nixl"

    def __init__(self, payload: np.ndarray, host: str):
        super().__init__(payload, host)
        self.agent = _nixl_agent(f"pdlab-send-{os.getpid()}")
        self.ptr = payload.ctypes.data
        self.reg = self.agent.register_memory([(self.ptr, payload.nbytes, 0, "")], "DRAM")
        self.handles: dict = {}

    def connect(self, endpoint: dict) -> None:
        self.remote_name = self.agent.add_remote_agent(base64.b64decode(endpoint["metadata"]))
        self.remote = endpoint["ptr"]

    def _handle(self, layout: KVLayout, layers: list[int]):
        key = (layout, tuple(layers))
        if key not in self.handles:
            spans = [layout.layer_span(i) for i in layers]
            local = self.agent.get_xfer_descs([(self.ptr + o, n, 0) for o, n in spans], "DRAM")
            remote = self.agent.get_xfer_descs([(self.remote + o, n, 0) for o, n in spans], "DRAM")
            self.handles[key] = self.agent.initialize_xfer("WRITE", local, remote, self.remote_name)
        return self.handles[key]

    def send_layers(self, layout: KVLayout, layers: list[int]) -> None:
        handle = self._handle(layout, layers)
        state = self.agent.transfer(handle)
        while state == "PROC":
            state = self.agent.check_xfer_state(handle)
        if state != "DONE":
            raise RuntimeError(f"NIXL transfer ended in state {state}")


_RECEIVERS = {"shm": ShmReceiver, "tcp": TcpReceiver, "gloo": GlooReceiver, "mooncake": MooncakeReceiver,
              "nixl": NixlReceiver, "nixl-tcp": NixlReceiver}
_SENDERS = {"shm": ShmSender, "tcp": TcpSender, "gloo": GlooSender, "mooncake": MooncakeSender,
            "nixl": NixlSender, "nixl-tcp": NixlSender}


def make_receiver(name: str, capacity: int, host: str) -> Receiver:
    """The receiver of transport ``name`` with a ``capacity``-byte destination buffer."""
    return _RECEIVERS[name](capacity, host)


def make_sender(name: str, payload: np.ndarray, host: str) -> Sender:
    """The sender of transport ``name`` shipping from ``payload``."""
    return _SENDERS[name](payload, host)


def peer_environment(name: str) -> dict[str, str]:
    """Extra environment variables for a transport's peer processes."""
    if name == "nixl-tcp":
        return {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo"}
    if name == "nixl":
        return {"UCX_NET_DEVICES": "lo"}
    if name == "gloo":
        return {"GLOO_SOCKET_IFNAME": "lo"}
    return {}
