"""Mooncake Store as a KV block store: a master on 127.0.0.1, clients that put and get blocks.

Mooncake keys KV blocks by a chained prefix hash (block B's key hashes A's key and B's tokens),
so two requests sharing a prefix share their leading keys and a lookup matches up to the
first differing block (Mooncake FAST'25 §3; :func:`prefix_block_keys`).

Reusable pieces:

- :class:`MooncakeMaster` — ``with MooncakeMaster() as master:`` starts ``mooncake_master`` on
  127.0.0.1 (RPC and metrics ports), waits until it answers, stops it on exit (by PID).
- :class:`StoreClient` — ``with StoreClient(master.address) as client:`` a
  ``MooncakeDistributedStore`` client (metadata ``P2PHANDSHAKE``, protocol ``tcp``, no etcd)
  with ``put``/``get``/``exists``/``remove`` and zero-copy ``put_blocks``/``get_blocks`` from/into
  a registered numpy buffer.
- :func:`store_benchmark` — a *prefill* client process puts a request's KV blocks, a *decode*
  client process gets them (pulled from the prefill client's memory segment) and verifies.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import statistics
import sys
import time
from collections.abc import Sequence

import numpy as np

from pdlab.process import ManagedProcess, free_port, spawn
from pdlab.transfer.netns import loopback_namespace, namespace_listening, namespace_status
from pdlab.transfer.procs import PeerError, ReportingProcess, log_dir

__all__ = ["store_status", "master_binary", "MooncakeMaster", "StoreClient", "prefix_block_keys",
           "store_benchmark", "StoreError"]


class StoreError(RuntimeError):
    """A Mooncake Store call failed (the message has the return code)."""


def store_status() -> tuple[bool, str]:
    """``(available, reason)`` for :func:`store_benchmark`: the client library, ``mooncake_master``
    and a loopback-only network namespace (the store clients' transfer engines listen on every
    interface, so the benchmark runs master and clients inside one; :mod:`pdlab.transfer.netns`)."""
    ok, why = _library_status()
    if not ok:
        return ok, why
    contained, reason = namespace_status()
    if not contained:
        return False, (f"the store clients' transfer engines listen on every interface; the course runs them "
                       f"only inside a loopback-only network namespace, and {reason}")
    return True, ""


def _library_status() -> tuple[bool, str]:
    try:
        from mooncake.store import MooncakeDistributedStore  # noqa: F401
    except ImportError as exc:
        return False, (f"mooncake store does not load ({exc}): pip install "
                       "mooncake-transfer-engine-non-cuda==0.3.13.post1 and apt-get install libibverbs1")
    if not os.path.exists(master_binary()):
        return False, "mooncake_master binary missing from the mooncake package"
    return True, ""


def master_binary() -> str:
    """Path of the ``mooncake_master`` executable shipped in the mooncake wheel."""
    import importlib.util

    spec = importlib.util.find_spec("mooncake")
    if spec is None or spec.origin is None:
        return "mooncake_master"
    return os.path.join(os.path.dirname(spec.origin), "mooncake_master")


class MooncakeMaster:
    """``mooncake_master`` on ``host`` (127.0.0.1): start on enter, stop (by PID) on exit.

    ``netns``: run it inside that network namespace (``ip netns exec``); readiness is then read
    from the namespace's own socket table.
    """

    def __init__(self, *, host: str = "127.0.0.1", rpc_port: int | None = None, metrics_port: int | None = None,
                 threads: int = 2, extra_args: Sequence[str] = (), start_timeout_s: float = 30.0,
                 netns: str | None = None):
        self.host, self.netns = host, netns
        self.rpc_port = rpc_port or free_port(host)
        self.metrics_port = metrics_port or free_port(host)
        self.threads, self.extra_args, self.start_timeout_s = threads, list(extra_args), start_timeout_s
        self.process: ManagedProcess | None = None

    @property
    def address(self) -> str:
        """``host:rpc_port``, what clients pass as the master server address."""
        return f"{self.host}:{self.rpc_port}"

    def start(self) -> MooncakeMaster:
        ok, why = _library_status()
        if not ok:
            raise StoreError(why)
        cmd = [master_binary(), f"-rpc_port={self.rpc_port}", f"-rpc_address={self.host}",
               f"-metrics_port={self.metrics_port}", f"-metrics_host={self.host}",
               f"-rpc_thread_num={self.threads}", "-enable_http_metadata_server=false", *self.extra_args]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns, *cmd]
        self.process = spawn("mooncake-master", cmd, log_dir() / f"mooncake-master-{self.rpc_port}.log")
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if not self.process.alive():
                tail = self.process.log_tail()
                self.stop()
                raise StoreError(f"mooncake_master exited at start:\n{tail}")
            if self._listening():
                return self
            time.sleep(0.1)
        self.stop()
        raise StoreError(f"mooncake_master did not listen on {self.address} within {self.start_timeout_s} s")

    def _listening(self) -> bool:
        if self.netns:
            return (self.host, self.rpc_port) in namespace_listening(self.process.pid)
        try:
            with socket.create_connection((self.host, self.rpc_port), timeout=1):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None

    def __enter__(self) -> MooncakeMaster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class StoreClient:
    """A Mooncake Store client in this process (context manager; ``close`` on exit).

    ``segment_bytes`` is the memory this client contributes to the store (where puts can land);
    ``buffer_bytes`` its local transfer buffer. Zero-copy block I/O goes through
    :meth:`register` (a numpy uint8 buffer) and :meth:`put_blocks` / :meth:`get_blocks`.
    """

    def __init__(self, master_address: str, *, host: str = "127.0.0.1", segment_bytes: int = 256 << 20,
                 buffer_bytes: int = 64 << 20, protocol: str = "tcp"):
        from mooncake.store import MooncakeDistributedStore

        self.store = MooncakeDistributedStore()
        rc = self.store.setup(host, "P2PHANDSHAKE", segment_bytes, buffer_bytes, protocol, "", master_address)
        if rc != 0:
            raise StoreError(f"MooncakeDistributedStore.setup failed ({rc}); is the master at {master_address}?")
        self._registered: list[np.ndarray] = []
        self._closed = False

    def put(self, key: str, data: bytes | np.ndarray) -> None:
        rc = self.store.put(key, bytes(memoryview(data).cast("B")) if isinstance(data, np.ndarray) else data)
        if rc != 0:
            raise StoreError(f"put {key!r} failed ({rc})")

    def get(self, key: str) -> bytes:
        """The value of ``key`` (``b""`` when absent)."""
        return self.store.get(key)

    def exists(self, key: str) -> bool:
        return self.store.is_exist(key) == 1

    def remove(self, key: str) -> None:
        self.store.remove(key)

    def register(self, buf: np.ndarray) -> np.ndarray:
        """Register a contiguous uint8 numpy buffer for zero-copy put/get; returns it."""
        if buf.dtype != np.uint8 or not buf.flags.c_contiguous:
            raise ValueError("register a contiguous uint8 numpy array")
        if self.store.register_buffer(buf.ctypes.data, buf.nbytes) != 0:
            raise StoreError("register_buffer failed")
        self._registered.append(buf)
        return buf

    def put_blocks(self, keys: Sequence[str], buf: np.ndarray, block_bytes: int) -> None:
        """Put block i of the registered ``buf`` (``block_bytes`` each) under ``keys[i]``."""
        base = buf.ctypes.data
        rcs = self.store.batch_put_from(list(keys), [base + i * block_bytes for i in range(len(keys))],
                                        [block_bytes] * len(keys))
        bad = [(k, rc) for k, rc in zip(keys, rcs, strict=True) if rc != 0]
        if bad:
            raise StoreError(f"{len(bad)} of {len(keys)} puts failed, first {bad[0]}")

    def get_blocks(self, keys: Sequence[str], buf: np.ndarray, block_bytes: int) -> None:
        """Get ``keys[i]`` into block i of the registered ``buf``."""
        base = buf.ctypes.data
        got = self.store.batch_get_into(list(keys), [base + i * block_bytes for i in range(len(keys))],
                                        [block_bytes] * len(keys))
        bad = [(k, n) for k, n in zip(keys, got, strict=True) if n != block_bytes]
        if bad:
            raise StoreError(f"{len(bad)} of {len(keys)} gets failed, first {bad[0]}")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            for buf in self._registered:
                self.store.unregister_buffer(buf.ctypes.data)
            self.store.close()

    def __enter__(self) -> StoreClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def prefix_block_keys(token_ids: Sequence[int], block_tokens: int = 256, namespace: str = "kv") -> list[str]:
    """Mooncake-style chained keys of the full blocks of a token sequence: A=H(a), B=H(A+b), ...

    Only whole blocks get keys (a partial last block is not cacheable). Keys are hex SHA-256
    prefixed with ``namespace`` (e.g. the model and KV dtype).
    """
    keys, prev = [], b""
    for start in range(0, len(token_ids) - block_tokens + 1, block_tokens):
        block = np.asarray(token_ids[start:start + block_tokens], dtype=np.int64).tobytes()
        prev = hashlib.sha256(prev + block).digest()
        keys.append(f"{namespace}:{prev.hex()}")
    return keys


# --------------------------------------------------------------------------- two-process benchmark
def _client_main(argv: list[str] | None = None) -> None:
    """A store client process (``python -m pdlab.transfer.store``): writer puts, reader gets."""
    from pdlab.transfer.kvbuffer import checksum, make_payload
    from pdlab.transfer.peer import Reporter, run_reporting

    p = argparse.ArgumentParser()
    p.add_argument("--role", choices=["writer", "reader"], required=True)
    p.add_argument("--master", required=True)
    p.add_argument("--report-fd", type=int, required=True)
    p.add_argument("--corrupt", action="store_true")
    args = p.parse_args(argv)

    def body(report: Reporter) -> None:
        plan = json.loads(sys.stdin.readline())
        n, bb = plan["blocks"], plan["block_bytes"]
        total = n * bb
        seg = plan["rounds"] * total + (64 << 20) if args.role == "writer" else 16 << 20
        with StoreClient(args.master, segment_bytes=seg, buffer_bytes=16 << 20) as client:
            buf = make_payload(total, plan.get("seed", 0)) if args.role == "writer" else np.zeros(total, np.uint8)
            client.register(buf)
            report(type="ready", pid=os.getpid())
            for line in sys.stdin:
                cmd = json.loads(line)
                if cmd["op"] == "exit":
                    break
                keys = cmd["keys"]
                if args.role == "writer":
                    t0 = time.perf_counter()
                    client.put_blocks(keys, buf, bb)
                    report(type="put", seconds=time.perf_counter() - t0, crc=checksum(buf))
                else:
                    buf.fill(0)
                    t0 = time.perf_counter()
                    client.get_blocks(keys, buf, bb)
                    dt = time.perf_counter() - t0
                    if args.corrupt:
                        buf[0] ^= 0xFF
                    report(type="get", seconds=dt, crc=checksum(buf))

    run_reporting(args.report_fd, body)


def _store_client_process(role: str, master: str, corrupt: bool = False, netns: str | None = None
                          ) -> ReportingProcess:
    argv = [sys.executable, "-m", "pdlab.transfer.store", "--role", role, "--master", master]
    return ReportingProcess(role, argv + (["--corrupt"] if corrupt else []),
                            f"store-{role}-{os.getpid()}-{time.strftime('%H%M%S')}", netns=netns)


def store_benchmark(blocks: int = 64, block_bytes: int = 1 << 20, *, repeats: int = 3, block_tokens: int = 256,
                    corrupt: bool = False, timeout_s: float = 180.0) -> dict:
    """Master + a prefill client (puts a request's KV blocks) + a decode client (gets them).

    Keys are :func:`prefix_block_keys` of a synthetic prompt of ``blocks × block_tokens`` tokens.
    All three run in one loopback-only network namespace (their sockets reach nothing else).
    Returns medians over ``repeats``: ``put_s``, ``get_s``, ``put_bytes_per_s``,
    ``get_bytes_per_s`` (decimal) plus min/max, and ``verified``. All three processes are stopped
    before it returns or raises; a corrupted get raises :class:`pdlab.transfer.measurement.VerificationError`.
    """
    from pdlab.transfer.measurement import VerificationError

    ok, why = store_status()
    if not ok:
        raise StoreError(why)
    tokens = np.random.default_rng(0).integers(0, 32000, size=blocks * block_tokens).tolist()
    keys = prefix_block_keys(tokens, block_tokens, namespace="pdlab-bench")
    plan = {"blocks": blocks, "block_bytes": block_bytes, "seed": 0, "rounds": repeats + 1}
    deadline = time.monotonic() + timeout_s
    puts, gets, verified = [], [], True
    writer = reader = None
    with loopback_namespace() as ns, MooncakeMaster(netns=ns) as master:
        try:
            writer = _store_client_process("writer", master.address, netns=ns)
            reader = _store_client_process("reader", master.address, corrupt=corrupt, netns=ns)
            for peer in (writer, reader):
                peer.send_line(plan)
                while peer.next_report(deadline).get("type") != "ready":
                    pass
            for r in range(repeats + 1):  # the first round warms up connections
                # fresh keys per round (a removed key may still hold a lease): "r<round>/<prefix key>"
                round_keys = [f"r{r}/{k}" for k in keys]
                writer.send_line({"op": "put", "keys": round_keys})
                put = writer.next_report(deadline)
                reader.send_line({"op": "get", "keys": round_keys})
                get = reader.next_report(deadline)
                puts.append(put["seconds"])
                gets.append(get["seconds"])
                verified = verified and put["crc"] == get["crc"]
            for peer in (writer, reader):
                peer.send_line({"op": "exit"})
            for peer in (reader, writer):
                while peer.next_report(deadline).get("type") != "done":
                    pass
        except PeerError as exc:
            raise StoreError(str(exc)) from exc
        finally:
            for peer in (reader, writer):
                if peer is not None:
                    peer.stop()
    if not verified:
        raise VerificationError("Mooncake Store: a block read back differs from what was put")
    puts, gets = puts[1:], gets[1:]
    total = blocks * block_bytes
    return {"blocks": blocks, "block_bytes": block_bytes, "kv_bytes": total, "repeats": repeats,
            "put_s": statistics.median(puts), "put_min_s": min(puts), "put_max_s": max(puts),
            "get_s": statistics.median(gets), "get_min_s": min(gets), "get_max_s": max(gets),
            "put_bytes_per_s": total / statistics.median(puts), "get_bytes_per_s": total / statistics.median(gets),
            "verified": True, "first_keys": keys[:2]}


if __name__ == "__main__":
    _client_main()
