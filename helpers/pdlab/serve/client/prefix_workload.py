"""Live workloads with shared prefixes: Mooncake requests whose ``hash_ids`` become prompt text.

:func:`shared_prefix_slice` picks the requests of a trace that come in conversations;
:func:`prefix_prompts` writes prompts that share exactly the blocks their hash ids share, so an
engine's prefix cache (Dynamo's KV router in lab 08) sees the trace's reuse.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pdlab.serve.client.bench import PromptSynthesizer
from pdlab.workloads import Request
from pdlab.workloads.synthetic import poisson_arrivals

__all__ = ["prefix_prompts", "shared_prefix_slice"]


def prefix_prompts(requests: Sequence[Any], tokenizer_path: str | Path, *, block_tokens: int,
                   seed: int = 0) -> list[str]:
    """Prompt texts whose shared prefixes follow the requests' ``hash_ids`` (Mooncake's prefix blocks).

    Block ``h`` becomes the same ``block_tokens`` one-token words in every prompt that holds it (words drawn
    with a generator seeded by ``(seed, h)``), so two prompts share exactly the blocks their hash ids
    share; the prompt is cut or padded to the request's ``prompt_tokens``. Each word is one token after a
    space (:class:`~pdlab.serve.client.bench.PromptSynthesizer`), so a prompt of ``n`` words is ``n`` tokens.
    """
    synth = PromptSynthesizer(tokenizer_path)
    words = synth.words
    out = []
    for r in requests:
        parts: list[str] = []
        for h in r.hash_ids:
            rng = np.random.default_rng([seed, int(h)])
            parts += [words[i] for i in rng.integers(0, len(words), size=block_tokens)]
        if len(parts) < r.prompt_tokens:
            rng = np.random.default_rng([seed, 1 << 40, int(r.request_id)])
            parts += [words[i] for i in rng.integers(0, len(words), size=r.prompt_tokens - len(parts))]
        out.append("".join(parts[:r.prompt_tokens]))
    return out


def shared_prefix_slice(trace: Sequence[Any], n: int, *, block_tokens: int, max_output_tokens: int,
                        rate_rps: float, prefix_blocks: int = 4, min_group: int = 3, seed: int = 0) -> list[Any]:
    """``n`` requests of a Mooncake trace that come in conversations: requests whose first ``prefix_blocks``
    hash ids are equal (in the conversation trace block 0 is in every request, a shared system prompt).

    Groups of at least ``min_group`` requests are taken whole, in trace order of their first request, until
    ``n`` requests are chosen; those keep their trace order, so a conversation's turns interleave with others'.
    Prompt lengths are scaled to ``block_tokens`` tokens per hash block (Mooncake's blocks are 512 tokens):
    a prompt is ``len(hash_ids) × block_tokens`` tokens. Outputs are clipped to ``max_output_tokens`` and
    arrivals are Poisson at ``rate_rps`` (the trace's own gaps are minutes apart).
    """
    groups: dict[tuple[int, ...], list[Any]] = {}
    for r in trace:
        if len(r.hash_ids) >= prefix_blocks:
            groups.setdefault(tuple(r.hash_ids[:prefix_blocks]), []).append(r)
    chosen: list[Any] = []
    for members in sorted((g for g in groups.values() if len(g) >= min_group), key=lambda g: g[0].arrival_s):
        chosen += members
        if len(chosen) >= n:
            break
    chosen = sorted(chosen, key=lambda r: r.arrival_s)[:n]
    if len(chosen) < n:
        raise ValueError(f"the trace has only {len(chosen)} requests in conversations of {min_group}+; asked for {n}")
    arrivals = poisson_arrivals(rate_rps, n, seed=seed)
    return [Request(i, float(t), len(r.hash_ids) * block_tokens, max(1, min(r.output_tokens, max_output_tokens)),
                    tuple(r.hash_ids)) for i, (r, t) in enumerate(zip(chosen, arrivals, strict=True))]
