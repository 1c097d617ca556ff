"""KV-shaped host buffers: layout (layers × blocks × block bytes), payloads, checksums, memcpy.

A paged KV cache is stored layer by layer; within a layer a request owns some blocks of
``block_bytes`` each (for Llama-3-8B in bf16 a 16-token block holds K and V of 8 KV heads ×
128 dims: 16 · 2 · 8 · 128 · 2 B = 64 KiB per layer). Transports in :mod:`pdlab.transfer.bench`
move one descriptor per layer (that layer's blocks, contiguous here), which is how the
transfer engines are driven by serving systems (one entry per layer in a batch transfer).

Every transfer is verified: the receiver computes :func:`checksum` of what arrived and it must
equal the sender's. The payload stamps each 4 KiB page with its index, so a misplaced page
changes the checksum even where the random filler repeats.
"""

from __future__ import annotations

import statistics
import time
import zlib
from dataclasses import asdict, dataclass

import numpy as np

__all__ = ["KVLayout", "layout_for_size", "make_payload", "checksum", "memcpy_bandwidth",
           "BLOCK_BYTES", "MAX_LAYERS"]

#: Default block size: one 16-token block of Llama-3-8B (bf16, K and V) in one layer, bytes.
BLOCK_BYTES = 64 * 1024
#: Default number of layers a swept size is split into (Llama-3-8B has 32).
MAX_LAYERS = 32
_PAGE = 4096


@dataclass(frozen=True)
class KVLayout:
    """``layers`` × ``blocks`` × ``block_bytes``: one request's KV cache, layer-major."""

    layers: int
    blocks: int
    block_bytes: int

    def __post_init__(self) -> None:
        if min(self.layers, self.blocks, self.block_bytes) <= 0:
            raise ValueError(f"layout dimensions must be positive: {self}")

    @property
    def layer_bytes(self) -> int:
        """Bytes of one layer's KV (all of its blocks)."""
        return self.blocks * self.block_bytes

    @property
    def total_bytes(self) -> int:
        """Bytes of the whole KV cache."""
        return self.layers * self.layer_bytes

    def layer_span(self, layer: int) -> tuple[int, int]:
        """``(offset, length)`` in bytes of one layer inside the buffer."""
        if not 0 <= layer < self.layers:
            raise IndexError(f"layer {layer} outside 0..{self.layers - 1}")
        return layer * self.layer_bytes, self.layer_bytes

    def as_dict(self) -> dict:
        return asdict(self)


def layout_for_size(size_bytes: int, max_layers: int = MAX_LAYERS, block_bytes: int = BLOCK_BYTES) -> KVLayout:
    """A KV layout of exactly ``size_bytes``: up to ``max_layers`` layers of ≥ 4 KiB each.

    Small sizes get fewer layers (4 KiB is one layer of one 4 KiB block); blocks are
    ``block_bytes`` when a layer holds a whole number of them, else one block per layer.
    """
    if size_bytes <= 0:
        raise ValueError(f"size must be positive, got {size_bytes}")
    layers = max(1, min(max_layers, size_bytes // _PAGE))
    while size_bytes % layers:
        layers -= 1
    layer_bytes = size_bytes // layers
    if layer_bytes % block_bytes == 0:
        return KVLayout(layers, layer_bytes // block_bytes, block_bytes)
    return KVLayout(layers, 1, layer_bytes)


def make_payload(size_bytes: int, seed: int = 0) -> np.ndarray:
    """A deterministic uint8 buffer of ``size_bytes``: random filler, each 4 KiB page stamped."""
    rng = np.random.default_rng(seed)
    tile = rng.integers(0, 256, size=min(size_bytes, 1 << 20), dtype=np.uint8)
    reps = -(-size_bytes // tile.size)
    buf = np.tile(tile, reps)[:size_bytes].copy()
    n_pages = size_bytes // _PAGE
    if n_pages:
        pages = buf[: n_pages * _PAGE].view(np.uint64).reshape(n_pages, _PAGE // 8)
        pages[:, 0] = np.arange(n_pages, dtype=np.uint64) + (np.uint64(seed) << np.uint64(40))
    return buf


def checksum(buf: np.ndarray | memoryview | bytes) -> int:
    """CRC-32 of a buffer (≈1.5 GB/s here); what both ends of a transfer compare."""
    return zlib.crc32(memoryview(buf).cast("B")) & 0xFFFFFFFF


def memcpy_bandwidth(sizes: list[int], repeats: int = 5, *, verify: bool = False) -> list[dict]:
    """This machine's memcpy (``numpy.copyto`` of uint8, pages pre-faulted), per size.

    Returns one dict per size: ``size_bytes``, ``bandwidth_bytes_per_s`` (size / median time),
    ``latency_s`` (median), ``latency_min_s``, ``latency_max_s``, ``repeats``. Decimal units.
    ``verify``: copy a :func:`make_payload` buffer and add ``verified`` (CRC-32 of both ends equal).
    """
    rows = []
    for size in sizes:
        src = make_payload(size) if verify else np.ones(size, dtype=np.uint8)
        dst = np.zeros(size, dtype=np.uint8)
        np.copyto(dst, src)  # fault in the pages of both buffers
        reps = max(repeats, 3 if size > 64 << 20 else 2 * repeats if size < 1 << 20 else repeats)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            np.copyto(dst, src)
            times.append(time.perf_counter() - t0)
        med = statistics.median(times)
        rows.append({"size_bytes": size, "bandwidth_bytes_per_s": size / med, "latency_s": med,
                     "latency_min_s": min(times), "latency_max_s": max(times), "repeats": reps}
                    | ({"verified": checksum(dst) == checksum(src)} if verify else {}))
        del src, dst
    return rows
