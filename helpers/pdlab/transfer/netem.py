"""Emulated links: two network namespaces joined by a veth pair, rate-limited with ``tc tbf``.

Replays a KV transfer over e.g. 1 vs 8 Gbit/s to check the napkin prediction
(:func:`pdlab.transfer.kv_transfer`). ``tbf`` shapes egress only, so both ends are shaped;
``netem`` (delay, loss) is not in every kernel (not in this course's CI kernel), so only the
rate is emulated. Needs root and iproute2; :func:`emulation_status` says why not otherwise.
The namespaces are always deleted (``finally``), also after an error.
"""

from __future__ import annotations

import itertools
import os
import shutil
import statistics
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from pdlab.transfer.bench import run_trials
from pdlab.transfer.kvbuffer import BLOCK_BYTES
from pdlab.transfer.measurement import VerificationError
from pdlab.transfer.netns import namespace_status

__all__ = ["EmulationUnavailable", "EmulatedLink", "emulation_status", "emulated_link", "replay_kv_transfer",
           "tbf_burst_bytes"]

_counter = itertools.count()


class EmulationUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, no iproute2, ...)."""


@dataclass(frozen=True)
class EmulatedLink:
    """Namespaces ``ns_a`` (sender side) and ``ns_b`` (receiver side), their addresses, the rate."""

    ns_a: str
    ns_b: str
    addr_a: str
    addr_b: str
    rate_gbit: float | None


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30)


def emulation_status() -> tuple[bool, str]:
    """``(possible, reason)``: what :func:`pdlab.transfer.netns.namespace_status` checks (root,
    ``ip``, a namespace can be created), and ``tc`` present."""
    ok, why = namespace_status()
    if not ok:
        return False, f"{why} (or skip this section)"
    if shutil.which("tc") is None:
        return False, "`tc` not found: apt-get install iproute2"
    return True, ""


def tbf_burst_bytes(rate_bytes_per_s: float) -> int:
    """tbf bucket: 1 ms of traffic, at least 128 KiB (veth hands tbf 64 KiB GSO packets)."""
    return int(max(rate_bytes_per_s / 1000, 128 * 1024))


@contextmanager
def emulated_link(rate_gbit: float | None) -> Iterator[EmulatedLink]:
    """Two fresh namespaces joined by a veth pair shaped to ``rate_gbit`` (None: unshaped)."""
    ok, why = emulation_status()
    if not ok:
        raise EmulationUnavailable(why)
    n = next(_counter)
    tag = f"{os.getpid() % 100000}x{n}"
    ns_a, ns_b = f"pdlab{tag}a", f"pdlab{tag}b"
    veth_a, veth_b = f"pd{tag}a"[:15], f"pd{tag}b"[:15]
    subnet = 16 + (os.getpid() * 7 + n) % 200
    addr_a, addr_b = f"10.213.{subnet}.1", f"10.213.{subnet}.2"
    created: list[str] = []
    try:
        for ns in (ns_a, ns_b):
            _check(_run("ip", "netns", "add", ns))
            created.append(ns)
        _check(_run("ip", "link", "add", veth_a, "netns", ns_a, "type", "veth", "peer", "name", veth_b,
                    "netns", ns_b))
        for ns, dev, addr in ((ns_a, veth_a, addr_a), (ns_b, veth_b, addr_b)):
            _check(_run("ip", "-n", ns, "addr", "add", f"{addr}/30", "dev", dev))
            _check(_run("ip", "-n", ns, "link", "set", dev, "up"))
            _check(_run("ip", "-n", ns, "link", "set", "lo", "up"))
            if rate_gbit is not None:
                rate_bits = int(rate_gbit * 1e9)
                _check(_run("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{rate_bits}bit",
                            "burst", str(tbf_burst_bytes(rate_bits / 8)), "latency", "100ms"))
        yield EmulatedLink(ns_a, ns_b, addr_a, addr_b, rate_gbit)
    finally:
        for ns in reversed(created):  # deleting a namespace deletes its end of the veth pair
            _run("ip", "netns", "del", ns)


def _check(res: subprocess.CompletedProcess) -> None:
    if res.returncode != 0:
        raise EmulationUnavailable(f"`{' '.join(res.args)}` failed: {res.stderr.strip()}")


def replay_kv_transfer(kv_bytes: int, layers: int, rates_gbit: list[float | None], *, repeats: int = 3,
                       transport: str = "tcp", timeout_s: float = 300.0) -> list[dict]:
    """Ship ``kv_bytes`` (``layers`` layers) from namespace A to B at each rate; median seconds.

    Returns per rate: ``rate_gbit`` (None = unshaped veth), ``seconds`` (median), ``min_s``,
    ``max_s``, ``bandwidth_bytes_per_s`` and ``verified``.
    """
    layer_bytes = kv_bytes // layers
    if layer_bytes * layers != kv_bytes:
        raise ValueError(f"kv_bytes {kv_bytes} is not a multiple of layers {layers}")
    blocks = layer_bytes // BLOCK_BYTES if layer_bytes % BLOCK_BYTES == 0 else 1
    trial = {"layers": layers, "blocks": blocks, "block_bytes": layer_bytes // blocks, "reps": repeats}
    out = []
    for rate in rates_gbit:
        with emulated_link(rate) as link:
            rows = run_trials(transport, [trial], host=link.addr_b, netns=(link.ns_b, link.ns_a),
                              timeout_s=timeout_s)
        if not all(r["verified"] for r in rows):
            raise VerificationError(f"transfer over the emulated {rate} Gbit/s link arrived corrupted")
        secs = [r["seconds"] for r in rows]
        med = statistics.median(secs)
        out.append({"rate_gbit": rate, "kv_bytes": kv_bytes, "seconds": med, "min_s": min(secs),
                    "max_s": max(secs), "bandwidth_bytes_per_s": kv_bytes / med, "verified": True})
    return out
