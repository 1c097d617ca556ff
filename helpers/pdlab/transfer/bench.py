"""Measured KV transfers between two processes on this machine, verified, against memcpy.

:func:`benchmark` sweeps sizes over several transports (see :mod:`pdlab.transfer.transports`)
and measures this machine's memcpy in the same run, so every transport can be read as a
fraction of it. Each (transport, size) is repeated; latency is the median of the repeats (min
and max kept) and bandwidth is ``size / median latency`` in decimal B/s. The clock runs in the
sender from the first byte until the receiver acknowledges that every layer has arrived.

Every transfer is verified by the receiver's checksum; a mismatch raises
:class:`VerificationError` (a transfer that moved wrong bytes is a failure, not a number).
The peer processes are stopped on every path, also after an error.
"""

from __future__ import annotations

import statistics
import time
from contextlib import ExitStack
from dataclasses import dataclass, field

from pdlab.transfer.kvbuffer import KVLayout, layout_for_size, memcpy_bandwidth
from pdlab.transfer.measurement import Measurement, VerificationError
from pdlab.transfer.netns import ALL_INTERFACE_TRANSPORTS, NamespaceUnavailable, loopback_namespace
from pdlab.transfer.procs import PeerError, PeerProcess
from pdlab.transfer.sizes import format_size
from pdlab.transfer.transports import (
    PEER_TRANSPORTS,
    TransportUnavailable,
    check_available,
    peer_environment,
    transport_status,
)

__all__ = ["BenchReport", "run_trials", "measure_transport",
           "benchmark", "DRAM_REFERENCE_BYTES", "link_comparison"]

#: memcpy is quoted at this size (well beyond the last-level cache): the DRAM copy rate.
DRAM_REFERENCE_BYTES = 256 * 1024**2


@dataclass
class BenchReport:
    """A benchmark run: memcpy reference, measurements, and transports skipped (with why)."""

    memcpy_bytes_per_s: float
    memcpy: list[dict]
    results: list[Measurement]
    skipped: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    def as_dict(self) -> dict:
        """JSON-ready (the ``pdlab transfer bench --json`` payload)."""
        return {"memcpy_bytes_per_s": self.memcpy_bytes_per_s, "memcpy_reference_bytes": DRAM_REFERENCE_BYTES,
                "memcpy": self.memcpy, "results": [r.as_dict() for r in self.results],
                "best": self.best(), "skipped": self.skipped, "seconds": self.seconds}

    def best(self) -> list[dict]:
        """Each transport's best (highest median) bandwidth, and it as a fraction of memcpy."""
        out = []
        for name in dict.fromkeys(r.transport for r in self.results):
            top = max((r for r in self.results if r.transport == name), key=lambda r: r.bandwidth_bytes_per_s)
            out.append({"transport": name, "size_bytes": top.size_bytes,
                        "bandwidth_bytes_per_s": top.bandwidth_bytes_per_s,
                        "fraction_of_memcpy": top.bandwidth_bytes_per_s / self.memcpy_bytes_per_s})
        return out

    def to_frame(self):
        """The measurements as a pandas DataFrame (one row per transport and size)."""
        import pandas as pd

        rows = [r.as_dict() for r in self.results]
        return pd.DataFrame(rows).drop(columns=["layout"]) if rows else pd.DataFrame()

    def summary(self) -> str:
        """Text table: per transport and size, GB/s, median latency, fraction of memcpy."""
        lines = [f"memcpy (DRAM, {format_size(DRAM_REFERENCE_BYTES)}): {self.memcpy_bytes_per_s / 1e9:.2f} GB/s",
                 f"{'transport':<10} {'size':>9} {'GB/s':>8} {'min':>7} {'max':>7} {'latency':>11} "
                 f"{'of memcpy':>9} verified"]
        for r in self.results:
            frac = r.bandwidth_bytes_per_s / self.memcpy_bytes_per_s
            lines.append(f"{r.transport:<10} {format_size(r.size_bytes):>9} {r.bandwidth_bytes_per_s / 1e9:8.3f} "
                         f"{r.bandwidth_min_bytes_per_s / 1e9:7.3f} {r.bandwidth_max_bytes_per_s / 1e9:7.3f} "
                         f"{r.latency_s * 1e6:9.0f}µs {frac:9.1%} {'yes' if r.verified else 'NO'}")
        lines.append("best of each transport, as a fraction of memcpy (measured in this run):")
        for b in self.best():
            lines.append(f"  {b['transport']:<10} {b['bandwidth_bytes_per_s'] / 1e9:7.3f} GB/s at "
                         f"{format_size(b['size_bytes'])} = {b['fraction_of_memcpy']:.1%} of memcpy")
        for name, why in self.skipped.items():
            lines.append(f"  {name:<10} skipped: {why}")
        return "\n".join(lines)


def run_trials(transport: str, trials: list[dict], *, host: str = "127.0.0.1", seed: int = 0,
               corrupt: bool = False, netns: tuple[str, str] | None = None, timeout_s: float = 300.0,
               env: dict[str, str] | None = None) -> list[dict]:
    """Run a plan of trials between a receiver and a sender process; one dict per (trial, rep).

    ``trials``: dicts with ``layers``, ``blocks``, ``block_bytes``, ``reps``, ``warmup`` and
    optionally ``mode`` (``bulk``/``serial``/``layerwise``) and ``compute_s``. ``netns`` puts
    (receiver, sender) into those network namespaces. A transport that listens on every
    interface (:data:`~pdlab.transfer.netns.ALL_INTERFACE_TRANSPORTS`) and is given no namespaces
    runs both peers in one loopback-only namespace; where none can be made it is unavailable.
    Rows carry the sender's ``seconds``, ``compute_s``, ``exposed_s``, both checksums and
    ``verified``; warm-up rows are dropped. Both processes are stopped before this returns or raises.
    """
    if transport not in PEER_TRANSPORTS:
        raise ValueError(f"{transport!r} is not a two-process transport ({', '.join(PEER_TRANSPORTS)})")
    check_available(transport)
    if netns is None and transport in ALL_INTERFACE_TRANSPORTS:
        with ExitStack() as stack:
            try:
                ns = stack.enter_context(loopback_namespace())
            except NamespaceUnavailable as exc:
                raise TransportUnavailable(f"transport {transport!r} is unavailable: "
                                           f"{ALL_INTERFACE_TRANSPORTS[transport]}, so it runs in a loopback-only "
                                           f"network namespace, and {exc}") from exc
            return run_trials(transport, trials, host=host, seed=seed, corrupt=corrupt, netns=(ns, ns),
                              timeout_s=timeout_s, env=env)
    trials = [{"warmup": 1, "mode": "bulk", "compute_s": 0.0, **t} for t in trials]
    capacity = max(KVLayout(t["layers"], t["blocks"], t["block_bytes"]).total_bytes for t in trials)
    plan = {"capacity": capacity, "seed": seed, "trials": trials}
    penv = {**peer_environment(transport), **(env or {})}
    stamp = f"{transport}-{time.strftime('%H%M%S')}-{id(plan) % 10000}"
    deadline = time.monotonic() + timeout_s
    recv_ns, send_ns = netns or (None, None)
    recv = send = None
    try:
        recv = PeerProcess("recv", transport, host=host, netns=recv_ns, corrupt=corrupt, env=penv,
                           log_name=f"{stamp}-recv")
        recv.send_line(plan)
        msg = recv.next_report(deadline)  # hello
        while msg.get("type") != "endpoint":
            msg = recv.next_report(deadline)
        send = PeerProcess("send", transport, host=host, netns=send_ns, env=penv, log_name=f"{stamp}-send")
        send.send_line(plan)
        send.send_line(msg["endpoint"])
        got: dict[tuple[int, int], dict] = {}
        for peer in (send, recv):  # the sender finishes first; the receiver's last report follows
            while True:
                msg = peer.next_report(deadline)
                kind = msg.get("type")
                if kind == "done":
                    break
                if kind in ("send", "recv"):
                    got.setdefault((msg["trial"], msg["rep"]), {})[kind] = msg
        rows = []
        for (t_index, rep), pair in sorted(got.items()):
            trial = trials[t_index]
            if rep < trial["warmup"]:
                continue
            if "send" not in pair or "recv" not in pair:
                raise PeerError(f"{transport}: trial {t_index} rep {rep} lacks a report from one side")
            s, r = pair["send"], pair["recv"]
            rows.append({"trial": t_index, "rep": rep - trial["warmup"], "mode": trial["mode"],
                         "compute_per_layer_s": trial["compute_s"], "layers": trial["layers"],
                         "size_bytes": trial["layers"] * trial["blocks"] * trial["block_bytes"],
                         "seconds": s["seconds"], "compute_s": s["compute_s"], "exposed_s": s["exposed_s"],
                         "crc_sent": s["crc"], "crc_received": r["crc"], "verified": s["crc"] == r["crc"]})
        return rows
    finally:
        for peer in (send, recv):
            if peer is not None:
                peer.stop()


def _aggregate(transport: str, size: int, layout: KVLayout, rows: list[dict]) -> Measurement:
    times = [r["seconds"] for r in rows]
    med = statistics.median(times)
    return Measurement(transport, size, med, min(times), max(times), size / med, size / max(times),
                       size / min(times), len(times), all(r["verified"] for r in rows), layout.as_dict())


def _repeats_for(size: int, repeats: int) -> int:
    return max(3, min(repeats, 3 if size >= 256 << 20 else repeats))


def measure_transport(transport: str, sizes: list[int], repeats: int = 5, *, corrupt: bool = False,
                      timeout_s: float | None = None, strict: bool = True) -> list[Measurement]:
    """Sweep ``sizes`` (bytes) over one two-process transport: one pair of processes, every size.

    Raises :class:`VerificationError` when any transfer arrived with a wrong checksum
    (``strict=False`` returns the rows marked ``verified=False`` instead).
    """
    layouts = [layout_for_size(s) for s in sizes]
    trials = [{**lay.as_dict(), "reps": _repeats_for(s, repeats)} for s, lay in zip(sizes, layouts, strict=True)]
    budget = timeout_s or 120.0 + sum(s * (t["reps"] + 1) for s, t in zip(sizes, trials, strict=True)) / 50e6
    rows = run_trials(transport, trials, corrupt=corrupt, timeout_s=budget)
    results = []
    for t_index, (size, lay) in enumerate(zip(sizes, layouts, strict=True)):
        results.append(_aggregate(transport, size, lay, [r for r in rows if r["trial"] == t_index]))
    bad = [r for r in rows if not r["verified"]]
    if bad and strict:
        first = bad[0]
        raise VerificationError(
            f"{transport}: {len(bad)} of {len(rows)} transfers arrived corrupted (first: "
            f"{format_size(first['size_bytes'])}, crc sent {first['crc_sent']:#010x}, "
            f"received {first['crc_received']:#010x})")
    return results


def benchmark(transports: list[str], sizes: list[int], repeats: int = 5, *, skip_unavailable: bool = True,
              progress: bool = False) -> BenchReport:
    """Measure memcpy, then every transport over ``sizes``; fractions of memcpy filled in.

    Unavailable transports are listed in ``skipped`` with the reason (or raise
    :class:`TransportUnavailable` when ``skip_unavailable`` is False).
    """
    start = time.perf_counter()
    memcpy_sizes = sorted(set(sizes) | {DRAM_REFERENCE_BYTES})
    memcpy = memcpy_bandwidth(memcpy_sizes, repeats=max(3, repeats))
    by_size = {m["size_bytes"]: m["bandwidth_bytes_per_s"] for m in memcpy}
    report = BenchReport(by_size[DRAM_REFERENCE_BYTES], [m for m in memcpy if m["size_bytes"] in sizes]
                         or memcpy, [])
    for name in transports:
        ok, why = transport_status(name)
        if not ok:
            if not skip_unavailable:
                raise TransportUnavailable(f"transport {name!r} is unavailable: {why}")
            report.skipped[name] = why
            continue
        if progress:
            print(f"measuring {name} ...", flush=True)
        if name == "cuda":
            from pdlab.transfer.cuda import cuda_copy_benchmark

            measured = cuda_copy_benchmark(sizes, repeats)
        else:
            measured = measure_transport(name, sizes, repeats)
        for m in measured:
            m.fraction_of_memcpy = m.bandwidth_bytes_per_s / by_size.get(m.size_bytes, report.memcpy_bytes_per_s)
        report.results.extend(measured)
    report.seconds = time.perf_counter() - start
    return report


def link_comparison(report: BenchReport) -> list[dict]:
    """Each transport's best measured bandwidth beside every catalog link (pdlab.hardware.list_links).

    ``ratio`` = link bandwidth / measured bandwidth: how many times faster the link is.
    """
    from pdlab.hardware import list_links

    rows = []
    for best in report.best():
        for link in list_links():
            rows.append({"transport": best["transport"], "measured_bytes_per_s": best["bandwidth_bytes_per_s"],
                         "link": link.key, "link_bytes_per_s": link.bytes_per_s,
                         "ratio": link.bytes_per_s / best["bandwidth_bytes_per_s"]})
    return rows



