"""Several rates of one experiment in blocks, run in a mirrored order, so that a machine that drifts
over the minutes of an experiment does not pass its drift off as an effect of the rate.

Run in ascending order (rate A, then B, then C), a slow drift of the machine (a neighbour's load, a
CPU's clock, a cache warming) lands on the highest rate and looks like the rate's effect. Cut each
rate's requests in two blocks and run them A1 B1 C1 C2 B2 A2 (an ABBA design, as in crossover
trials): every rate's two blocks sit symmetrically around the middle of the experiment, so a
drift linear in time adds the same to every rate, and a comparison between rates cancels it.

- :func:`mirrored_order` — the order of (rate index, block) pairs;
- :func:`split_blocks` — one rate's requests cut into blocks of the same length mix, each with its
  own arrivals at the rate, the request ids kept (unique across blocks).

The blocks of one rate run at different times; their records, joined, are one run with an idle
gap in the middle: every record carries its absolute send time, so a replay of the joined records
sees both blocks, and the gap between them, as they happened.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from pdlab.workloads.synthetic import poisson_arrivals
from pdlab.workloads.traces import Request

__all__ = ["mirrored_order", "split_blocks"]


def mirrored_order(levels: int, blocks: int = 2) -> list[tuple[int, int]]:
    """(level, block) pairs: block 0 of every level in ascending order, block 1 in descending order,
    and so on alternately. With an even number of blocks every level's blocks have the same mean
    position, so a drift linear in time biases no level against another.

    >>> mirrored_order(3)
    [(0, 0), (1, 0), (2, 0), (2, 1), (1, 1), (0, 1)]
    """
    if levels < 1 or blocks < 1:
        raise ValueError(f"need at least one level and one block, got {levels} levels and {blocks} blocks")
    out = []
    for b in range(blocks):
        seq = range(levels) if b % 2 == 0 else range(levels - 1, -1, -1)
        out.extend((lvl, b) for lvl in seq)
    return out


def split_blocks(requests: Sequence[Request], blocks: int, rate_rps: float, *, seed: int = 0) -> list[list[Request]]:
    """``requests`` cut into ``blocks`` blocks with the same mix of prompt lengths: ranked by prompt
    length, the requests of rank k, k + blocks, k + 2·blocks, … form block k (a stratified draw stays
    stratified in each block). Each block keeps the requests' order and ids and gets its own
    Poisson arrivals at ``rate_rps`` (req/s), from 0, seeded ``seed + k``.
    """
    if not 1 <= blocks <= len(requests):
        raise ValueError(f"need 1 ≤ blocks ≤ {len(requests)} requests, got {blocks}")
    rank = np.empty(len(requests), dtype=np.int64)
    rank[np.argsort([r.prompt_tokens for r in requests], kind="stable")] = np.arange(len(requests))
    out = []
    for k in range(blocks):
        members = [r for r, q in zip(requests, rank, strict=True) if q % blocks == k]
        arrivals = poisson_arrivals(rate_rps, len(members), seed=seed + k)
        out.append([replace(r, arrival_s=float(a)) for r, a in zip(members, arrivals, strict=True)])
    return out
