"""Prefix KV-cache blocks: the hash chain, LRU caches per instance, a tiered global pool, hit ratios.

Mooncake (FAST'25 §3, arXiv 2407.00079v3 §4) stores the KV cache in paged blocks. A block's key is
the hash of the previous block's key and the block's own tokens (A = H(a), B = H(A + b), ...), so two
requests share block *i* only if they share every token before it: a prefix matches up to the first
mismatch. The released traces carry exactly such chained ids (``hash_ids``) of 512-token blocks.

Units: blocks (``block_tokens`` tokens each, 512 by default), tokens, bytes (decimal), seconds.

Eviction order inside one LRU: when a request is served its blocks are touched from the last to the
first, so the *first* block of a prefix is the most recently used. Evicting from the least recent end
then drops the tails of old prefixes before their heads — a prefix cache never keeps a block whose
parent is gone (vLLM frees a request's blocks in the same reverse order for the same reason).
"""

from __future__ import annotations

import hashlib
import random
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

__all__ = [
    "BLOCK_TOKENS",
    "HasPrefix",
    "chain_hashes",
    "leading_hits",
    "prefix_hit_tokens",
    "LRUBlockCache",
    "Tier",
    "TieredBlockPool",
    "mooncake_tiers",
    "HitStats",
    "cache_hit_ratio",
    "local_vs_global_hit_ratio",
    "hit_ratio_curve",
]

BLOCK_TOKENS = 512
"""Tokens per block in the Mooncake traces (FAST'25 App. A)."""


class HasPrefix(Protocol):
    """Anything with ``prompt_tokens`` and chained ``hash_ids`` (one per block), e.g.
    :class:`pdlab.workloads.Request` from :func:`pdlab.workloads.read_mooncake_jsonl`."""

    prompt_tokens: int
    hash_ids: Sequence[int]


def chain_hashes(tokens: Sequence[int], block_tokens: int = BLOCK_TOKENS, *,
                 include_partial: bool = True) -> list[int]:
    """Chained block keys of a token sequence: key_i = H(key_{i-1}, tokens of block i).

    A 64-bit BLAKE2b digest is used (stable across processes, unlike Python's ``hash``). The last,
    partial block gets a key too when ``include_partial`` (the traces do this: ``len(hash_ids) ==
    ceil(input_length / 512)``); engines that cache only full blocks pass ``include_partial=False``.
    """
    if block_tokens <= 0:
        raise ValueError(f"block_tokens must be > 0, got {block_tokens}")
    keys: list[int] = []
    prev = b""
    for start in range(0, len(tokens), block_tokens):
        block = tokens[start:start + block_tokens]
        if len(block) < block_tokens and not include_partial:
            break
        h = hashlib.blake2b(prev, digest_size=8)
        h.update(b"|".join(str(int(t)).encode() for t in block))
        prev = h.digest()
        keys.append(int.from_bytes(prev, "big"))
    return keys


def leading_hits(hash_ids: Sequence[int], contains) -> int:
    """How many leading blocks of ``hash_ids`` satisfy ``contains(block)`` (stops at the first miss)."""
    n = 0
    for h in hash_ids:
        if not contains(h):
            break
        n += 1
    return n


def prefix_hit_tokens(hit_blocks: int, input_length: int, block_tokens: int = BLOCK_TOKENS) -> int:
    """Reusable tokens for ``hit_blocks`` leading cached blocks: ``min(block_tokens·hits, input_length)``."""
    return min(block_tokens * hit_blocks, input_length)


class LRUBlockCache:
    """A prefix-block cache holding at most ``capacity_blocks`` blocks (``None`` = unlimited), LRU.

    :meth:`access` is one request: count the leading blocks present, then touch/insert all of the
    request's blocks (last to first, see the module docstring), evicting the least recently used.
    """

    def __init__(self, capacity_blocks: int | None = None) -> None:
        if capacity_blocks is not None and capacity_blocks < 0:
            raise ValueError(f"capacity_blocks must be >= 0 or None, got {capacity_blocks}")
        self.capacity_blocks = capacity_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block: object) -> bool:
        return block in self._blocks

    def match(self, hash_ids: Sequence[int]) -> int:
        """Leading blocks of ``hash_ids`` present now (no side effects)."""
        return leading_hits(hash_ids, self._blocks.__contains__)

    def insert(self, hash_ids: Sequence[int]) -> list[int]:
        """Touch/insert blocks (last to first); return the evicted block ids."""
        if self.capacity_blocks == 0:
            return []
        blocks = self._blocks
        for h in reversed(hash_ids):
            if h in blocks:
                blocks.move_to_end(h)
            else:
                blocks[h] = None
        evicted: list[int] = []
        if self.capacity_blocks is not None:
            while len(blocks) > self.capacity_blocks:
                evicted.append(blocks.popitem(last=False)[0])
        self.evictions += len(evicted)
        return evicted

    def access(self, hash_ids: Sequence[int]) -> int:
        """One request: return the leading hits, then cache all of its blocks."""
        hits = self.match(hash_ids)
        self.insert(hash_ids)
        return hits

    def blocks(self) -> list[int]:
        """Cached block ids, least recently used first."""
        return list(self._blocks)

    def discard(self, hash_ids: Sequence[int]) -> None:
        """Remove these blocks where present (not an eviction: ``evictions`` is unchanged)."""
        blocks = self._blocks
        for h in hash_ids:
            blocks.pop(h, None)


@dataclass(frozen=True)
class Tier:
    """One storage tier of a KV pool: its capacity (blocks, None = unlimited) and its load bandwidth.

    ``load_bytes_per_s`` is the rate at which a block in this tier reaches the prefill GPU
    (HBM: effectively free; DRAM: PCIe or RDMA; SSD: NVMe), decimal bytes per second.
    """

    name: str
    capacity_blocks: int | None
    load_bytes_per_s: float


class TieredBlockPool:
    """A global KV pool over tiers (e.g. GPU HBM → CPU DRAM → SSD), LRU inside each tier.

    New and re-used blocks go to the first tier; a block evicted from tier *k* is demoted to tier
    *k+1*; one evicted from the last tier is dropped. :meth:`access` returns, for each leading hit
    block, the tier it was found in, and promotes those blocks to the first tier.
    """

    def __init__(self, tiers: Sequence[Tier]) -> None:
        if not tiers:
            raise ValueError("a pool needs at least one tier")
        self.tiers = list(tiers)
        self._lrus = [LRUBlockCache(t.capacity_blocks) for t in self.tiers]

    def where(self, block: int) -> int | None:
        """Index of the tier holding ``block``, or None."""
        for i, lru in enumerate(self._lrus):
            if block in lru:
                return i
        return None

    def match(self, hash_ids: Sequence[int]) -> list[int]:
        """Tier index of each leading cached block (stops at the first miss; no side effects)."""
        found: list[int] = []
        for h in hash_ids:
            tier = self.where(h)
            if tier is None:
                break
            found.append(tier)
        return found

    def insert(self, hash_ids: Sequence[int]) -> None:
        """Put blocks into the first tier (removing them from lower ones), cascading evictions down."""
        for lru in self._lrus[1:]:
            lru.discard(hash_ids)
        spill = self._lrus[0].insert(hash_ids)
        for lru in self._lrus[1:]:
            if not spill:
                break
            # demoted blocks enter the next tier oldest first, keeping their relative recency
            spill = lru.insert(list(reversed(spill)))

    def access(self, hash_ids: Sequence[int]) -> list[int]:
        """One request: tiers of the leading hits, then all its blocks promoted to the first tier."""
        found = self.match(hash_ids)
        self.insert(hash_ids)
        return found

    def load_time_s(self, tiers_found: Iterable[int], bytes_per_block: float) -> float:
        """Seconds to bring the found blocks to the GPU, one tier's bandwidth per block (serial)."""
        return sum(bytes_per_block / self.tiers[t].load_bytes_per_s for t in tiers_found)

    def occupancy(self) -> dict[str, int]:
        """Blocks held per tier name."""
        return {t.name: len(lru) for t, lru in zip(self.tiers, self._lrus, strict=True)}


def mooncake_tiers(bytes_per_block: float, *, hbm_bytes: float, dram_bytes: float, ssd_bytes: float,
                   hbm_bytes_per_s: float, dram_bytes_per_s: float, ssd_bytes_per_s: float) -> list[Tier]:
    """The three tiers of Mooncake's pool from byte capacities and load bandwidths (bytes, bytes/s)."""
    if bytes_per_block <= 0:
        raise ValueError("bytes_per_block must be > 0")
    return [Tier("GPU HBM", int(hbm_bytes // bytes_per_block), hbm_bytes_per_s),
            Tier("CPU DRAM", int(dram_bytes // bytes_per_block), dram_bytes_per_s),
            Tier("SSD", int(ssd_bytes // bytes_per_block), ssd_bytes_per_s)]


@dataclass(frozen=True)
class HitStats:
    """Prefix-cache hits over a request stream (tokens)."""

    hit_tokens: int
    input_tokens: int
    requests: int
    per_request_hit_tokens: list[int] = field(default_factory=list, repr=False, compare=False)

    @property
    def ratio(self) -> float:
        """Σ reusable prefix tokens ÷ Σ input tokens (0 for an empty stream)."""
        return self.hit_tokens / self.input_tokens if self.input_tokens else 0.0


def cache_hit_ratio(requests: Iterable[HasPrefix], capacity_blocks: int | None = None,
                    block_tokens: int = BLOCK_TOKENS) -> HitStats:
    """Prefix-cache hits of a trace replayed in order through one LRU cache of ``capacity_blocks``.

    Per request: reusable = min(block_tokens × leading blocks already cached, prompt_tokens). With
    ``capacity_blocks=None`` (unlimited) this is the trace's theoretical hit ratio.
    """
    cache = LRUBlockCache(capacity_blocks)
    hit = total = n = 0
    per: list[int] = []
    for r in requests:
        tokens = prefix_hit_tokens(cache.access(r.hash_ids), r.prompt_tokens, block_tokens)
        per.append(tokens)
        hit += tokens
        total += r.prompt_tokens
        n += 1
    return HitStats(hit, total, n, per)


def local_vs_global_hit_ratio(requests: Sequence[HasPrefix], n_instances: int,
                              capacity_blocks_per_instance: int | None, *,
                              assignment: str | Sequence[int] = "round_robin", seed: int = 0,
                              block_tokens: int = BLOCK_TOKENS) -> tuple[HitStats, HitStats]:
    """(local, global) hit statistics for a cluster of ``n_instances`` prefill instances.

    Local: each instance has its own LRU of ``capacity_blocks_per_instance`` and sees only the
    requests sent to it (``assignment``: ``round_robin`` or ``random`` — cache-unaware spreading —
    ``best_match``, each request to the instance with the longest cached prefix, ties to the
    least used, or one instance index per request, as a real router chose them). Global: one
    pooled LRU with the sum of the capacities sees every request.
    """
    if n_instances < 1:
        raise ValueError(f"n_instances must be >= 1, got {n_instances}")
    chosen: list[int] | None = None
    if not isinstance(assignment, str):
        chosen = [int(k) for k in assignment]
        if len(chosen) != len(requests) or any(not 0 <= k < n_instances for k in chosen):
            raise ValueError(f"an assignment needs one instance in 0..{n_instances - 1} per request "
                             f"({len(requests)}), got {len(chosen)}: {chosen[:8]}")
    elif assignment not in ("round_robin", "random", "best_match"):
        raise ValueError(f"unknown assignment {assignment!r}; use round_robin, random, best_match or "
                         "a list of instance indices")
    rng = random.Random(seed)
    caches = [LRUBlockCache(capacity_blocks_per_instance) for _ in range(n_instances)]
    served = [0] * n_instances
    hit = total = 0
    per: list[int] = []
    for i, r in enumerate(requests):
        if chosen is not None:
            k = chosen[i]
        elif assignment == "round_robin":
            k = i % n_instances
        elif assignment == "random":
            k = rng.randrange(n_instances)
        else:
            k = max(range(n_instances), key=lambda j: (caches[j].match(r.hash_ids), -served[j]))
        served[k] += 1
        tokens = prefix_hit_tokens(caches[k].access(r.hash_ids), r.prompt_tokens, block_tokens)
        per.append(tokens)
        hit += tokens
        total += r.prompt_tokens
    pooled = None if capacity_blocks_per_instance is None else capacity_blocks_per_instance * n_instances
    return HitStats(hit, total, len(requests), per), cache_hit_ratio(requests, pooled, block_tokens)


def hit_ratio_curve(requests: Sequence[HasPrefix], capacities_blocks: Iterable[int],
                    block_tokens: int = BLOCK_TOKENS) -> list[tuple[int, float]]:
    """(capacity in blocks, hit ratio) for each capacity: the LRU hit ratio against cache size."""
    return [(c, cache_hit_ratio(requests, c, block_tokens).ratio) for c in capacities_blocks]
