"""Wrong-answer battery for every exercise check, and the answer-not-on-the-page test.

For every ``check_*`` function in ``pdlab.exercises``: the reference answer passes, and each
plausible wrong answer (GiB vs GB, n vs n − 1, forgetting the prefix or the transfer, a bare
``True``, the unfiltered choice, ...) is rejected. A test makes sure no check is left out.

The answer-not-on-the-page matcher (:func:`expected_values_on_the_page`) runs inside
``tests/test_notebooks.py::test_student_copy_runs_and_exercises_raise``, which executes every student
copy, the live labs' included (profile ``smoke``), with ``PDLAB_EXPECTED_LOG`` set, so that every
check records its expected value, and asserts that no expected value is printed in the copy's
markdown or outputs.
"""

from __future__ import annotations

import importlib
import inspect
import json
import math
import pkgutil
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import nbformat
import numpy as np
import pandas as pd
import pdlab.exercises as ex
import pytest
from pdlab.exercises import FAILED, PASSED
from pdlab.router.policies import RoutingPolicy


@dataclass
class Case:
    """One check with its inputs bound: ``call(value)`` returns a CheckResult."""

    name: str                      # "module.function"
    call: Callable[[Any], Any]
    reference: Any                 # the right answer, computed independently where possible
    wrong: dict[str, Any]          # slip description → wrong answer


def _records(seed: int = 0, n: int = 12):
    """A small, varied record set (seconds): some miss the TTFT SLO, some the TPOT SLO, one failed."""
    import random

    from pdlab.metrics import RequestRecord

    rng = random.Random(seed)
    out = []
    for i in range(n):
        arrival = i * 0.5
        first = arrival + rng.uniform(0.05, 0.6)
        out_tokens = rng.choice([2, 5, 17, 40])
        finish = first + (out_tokens - 1) * rng.uniform(0.01, 0.12)
        out.append(RequestRecord(i, arrival, rng.choice([100, 800, 2000]), out_tokens, first, finish))
    out.append(RequestRecord(n, n * 0.5, 500, 10, None, None, ok=False, error="timeout"))
    return out


def _sched(name: str):
    """``pdlab.sched.<name>``, or ``pdlab.<name>`` in a tree where the scheduling modules have not moved."""
    try:
        return importlib.import_module(f"pdlab.sched.{name}")
    except ModuleNotFoundError:
        return importlib.import_module(f"pdlab.{name}")


class _LongApart(RoutingPolicy):
    """Prompts of at least ``cut`` tokens to the P/D pair, short ones colocated unless the estimates say the
    pair is better (``flip``: the reverse, long prompts colocated)."""

    name, needs_estimates = "long-apart", True

    def __init__(self, slo, flip: bool = False, cut: int = 2048):
        self.slo, self.flip, self.cut = slo, flip, cut

    def decide(self, req, estimates=None):
        long = req.prompt_tokens >= self.cut
        if long != self.flip:
            return "disaggregated"
        here, pair = estimates["colocated"].score(self.slo), estimates["disaggregated"].score(self.slo)
        return "colocated" if here <= 1 or here <= pair else "disaggregated"


class _CoinFlip(RoutingPolicy):
    """A random target per request (seeded)."""

    name = "coin-flip"

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def decide(self, req, estimates=None):
        return "colocated" if self.rng.random() < 0.5 else "disaggregated"


def _cases() -> list[Case]:  # noqa: PLR0915 — one flat list is easier to audit than many helpers
    from pdlab.exercises import (
        lab01,
        lab02,
        lab03,
        lab04,
        lab05,
        lab06,
        lab07,
        lab08,
        nb00,
        nb01,
        nb02,
        nb03,
        nb04,
        nb05,
        nb06,
        nb07,
        nb08,
        nb09,
    )
    from pdlab.hardware import detect_device, get_gpu, get_link
    from pdlab.kvcache import cache_hit_ratio
    from pdlab.metrics import SLO, slo_attainment
    from pdlab.models import get_model, weight_bytes
    from pdlab.roofline.analytic import analyze, critical_decode_batch
    from pdlab.roofline.measure import DeviceProfile, LayerPoint, LayerShape
    from pdlab.router.policies import (
        AllColocated,
        AllDisaggregated,
        LoadEstimator,
        RouteRequest,
        SLOAware,
        TargetLoad,
        Threshold,
    )
    from pdlab.sched.queueing import avg_ttft_inter_op, avg_ttft_intra_op
    from pdlab.serve.measure.evidence import KVTransferEvidence
    from pdlab.sim import roofline_latency
    from pdlab.sim.latency import FittedLatency
    from pdlab.transfer import kv_transfer
    from pdlab.transfer.overlap import predicted_exposed_s
    from pdlab.workloads import mooncake_trace_path, read_mooncake_jsonl, synthetic_requests
    from pdlab.workloads.agentic import generate_agentic

    mooncake_cluster = _sched("conductor").mooncake_cluster
    nexus_gpu = _sched("pools").nexus_gpu
    avg_ttft_single, crossover_rate = _sched("queueing").avg_ttft_single, _sched("queueing").crossover_rate
    cases: list[Case] = []

    def add(fn, args, reference, wrong, **kw):
        cases.append(Case(f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}",
                          lambda v, fn=fn, args=args, kw=kw: fn(v, *args, **kw), reference, wrong))

    # ---- nb00
    kind = detect_device()["kind"]
    add(nb00.check_device_kind, (), kind, {"the other device": "cuda" if kind == "cpu" else "cpu", "bare True": True})
    h100 = get_gpu("h100-sxm")
    add(nb00.check_ridge_h100, (), h100.bf16_flops / h100.hbm_bytes_per_s,
        {"sparse FLOP/s (2×)": 2 * h100.bf16_flops / h100.hbm_bytes_per_s,
         "A100 instead of H100": get_gpu("a100-80gb").ridge_point("bf16")})

    # ---- nb01
    a10g = get_gpu("a10g")  # Exercise 1: Llama-3-8B with 4-bit weights (W4A16) on an A10G
    add(nb01.check_weight_only_critical_batch, ("a10g", 0.5), a10g.bf16_flops / a10g.hbm_bytes_per_s / 4,
        {"bf16 weights (the one call)": critical_decode_batch("llama-3-8b", "a10g", dtype="bf16", linear_only=True),
         "bytes per weight multiplied, not divided": a10g.ridge_point("bf16") * 4,
         "H100 ridge point": h100.ridge_point("bf16") / 4, "8-bit weights": a10g.ridge_point("bf16") / 2})
    m70 = get_model("llama-3-70b")  # Exercise 2: the context where batch-32 KV reads equal the weight reads
    kv_ctx = weight_bytes(m70, "bf16") / (32 * 2 * 80 * 8 * 128 * 2)
    add(nb01.check_kv_equals_weights_context, ("llama-3-70b", 32), kv_ctx,
        {"forgot the batch": 32 * kv_ctx, "K only (no factor 2)": 2 * kv_ctx,
         "weights split by TP-8, KV not": kv_ctx / 8})
    layer = {"hidden": 256, "heads": 4, "kv_heads": 2, "head_dim": 64, "ffn": 512, "dtype": "fp32"}
    profile = DeviceProfile(kind="cpu", name="battery", torch="-", date="-", size="-",
                            matmul_flops_per_s={"fp32": 5e10}, memory_bytes_per_s=1e10, layer=layer)
    point = LayerPoint(phase="prefill", batch=1, tokens=256, context=0, flops=1.0, bytes=1.0,
                       arithmetic_intensity=1.0, time_s=0.01, median_time_s=0.01, achieved_flops_per_s=1.0)
    shape = LayerShape(**{k: v for k, v in layer.items() if k != "dtype"})
    pred = analyze(shape.to_model(), profile, "prefill", batch=1, tokens=256, dtype="fp32", head=False).time_s
    add(nb01.check_predicted_prefill_s, (profile, point), pred,
        {"ms instead of s": pred * 1e3, "the catalog H100 instead of the measured roofline":
         analyze(shape.to_model(), "h100-sxm", "prefill", batch=1, tokens=256, dtype="fp32", head=False).time_s})

    # ---- nb02 (the exercises' own parameters: Mistral-7B fp8, 6,000 tokens, RoCE 200, DeepSeek-V2-Lite)
    mistral_fp8 = 2 * 32 * 8 * 128 * 1
    add(nb02.check_request_kv_gib, ("mistral-7b", 6_000, "fp8"), mistral_fp8 * 6_000 / 2**30,
        {"GB instead of GiB": mistral_fp8 * 6_000 / 1e9, "bf16 instead of fp8": 2 * mistral_fp8 * 6_000 / 2**30,
         "forgot the factor 2 (K and V)": mistral_fp8 * 3_000 / 2**30})
    add(nb02.check_transfer_ms, ("mistral-7b", 6_000, "fp8", "roce-200"), mistral_fp8 * 6_000 / 25e9 * 1e3,
        {"GiB of bytes at GB/s": mistral_fp8 * 6_000 / 2**30 * 1e9 / 25e9 * 1e3,
         "Gbit/s taken as GB/s": mistral_fp8 * 6_000 / 200e9 * 1e3, "seconds instead of ms": mistral_fp8 * 6_000 / 25e9})
    add(nb02.check_mla_bytes, (27, 512, 64, "bf16"), 27 * 576 * 2,
        {"factor 2 as for K and V": 2 * 27 * 576 * 2, "forgot the RoPE key": 27 * 512 * 2, "fp8 bytes": 27 * 576})
    add(nb02.check_kv_bytes_70b_fp8, (), 163_840, {"bf16": 327_680, "MHA (64 heads)": 2 * 80 * 64 * 128})
    add(nb02.check_transfer_ms_ndr, (), 32.768, {"seconds": 0.032768, "GiB at GB/s": 1.6384e9 / 2**30 / 50 * 1e3})
    add(nb02.check_mla_bytes_fp8, (), 35_136, {"factor 2": 70_272, "bf16": 70_272})

    # ---- nb03
    class _Report:
        def best(self):
            return [{"bandwidth_bytes_per_s": 2.0e9}, {"bandwidth_bytes_per_s": 1.2e9}]

    kv8 = kv_transfer(get_model("llama-3-8b"), 4096, "bf16").kv_bytes
    add(nb03.check_loopback_transfer_s, (_Report(),), kv8 / 2.0e9,
        {"GiB/s taken for GB/s": kv8 / (2.0 * 2**30), "the slower transport": kv8 / 1.2e9, "ms": kv8 / 2.0e9 * 1e3})
    m70 = get_model("llama-3-70b")
    per_layer = kv_transfer(m70, 8192, "bf16").kv_bytes / m70.num_layers / get_link("ib-ndr").bytes_per_s
    add(nb03.check_min_compute_per_layer_s, (), per_layer,
        {"all layers, not one": per_layer * m70.num_layers, "Gbit/s as GB/s": per_layer / 8})
    lo, hi = 1e-9, 1.0  # Exercise 3's reference, independently: bisection on the overlap model
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if predicted_exposed_s(32, 0.001, mid, "layerwise") <= 0.005 else (lo, mid)
    layer_bytes = 4 * 2**20
    add(nb03.check_layerwise_min_bandwidth_gbs, (32, 0.001, layer_bytes, 0.005), layer_bytes / lo / 1e9,
        {"send after prefill (L·x ≤ budget)": layer_bytes / (0.005 / 32) / 1e9,
         "link keeps up with compute (x ≤ c)": layer_bytes / 0.001 / 1e9,
         "GiB/s": layer_bytes / lo / 2**30, "Gbit/s": 8 * layer_bytes / lo / 1e9})

    # ---- nb04
    # Exercise 1: a stream sent at 2.0 s whose 4 chunks carry 1, 3, 2 and 4 tokens (10 tokens, 3 gaps)
    sent, chunks = 2.0, [(2.3, 1), (2.36, 3), (2.4, 2), (2.51, 4)]
    add(nb04.check_stream_tpot, (sent, chunks), (2.51 - 2.3) / 9,
        {"chunks counted as tokens (mean ITL)": (2.51 - 2.3) / 3, "n instead of n − 1": (2.51 - 2.3) / 10,
         "E2E over tokens": (2.51 - 2.0) / 10, "E2E over n − 1": (2.51 - 2.0) / 9,
         "first chunk's tokens left out": (2.51 - 2.3) / 8, "milliseconds": (2.51 - 2.3) / 9 * 1e3})
    with pytest.raises(ValueError, match="one output token"):
        nb04.check_stream_tpot(0.1, 0.0, [(0.2, 1)])
    with pytest.raises(ValueError, match="at least one token"):
        nb04.check_stream_tpot(0.1, 0.0, [(0.2, 1), (0.3, 0)])
    with pytest.raises(ValueError, match="chunk times"):
        nb04.check_stream_tpot(0.1, 0.0, [(0.3, 1), (0.2, 2)])
    recs = _records()
    meets = [r for r in recs if r.ok and r.ttft_s <= 0.3 and (r.tpot_s or 0) <= 0.06]
    ttft_only = [r for r in recs if r.ok and r.ttft_s <= 0.3]
    assert 0 < len(meets) < len(ttft_only), "battery records must separate the two SLOs"
    # Exercise 2: the tightest TTFT SLO that half of all 13 requests meet with TPOT ≤ 80 ms, by brute force
    tight = min(t for t in (r.ttft_s for r in recs if r.ok)
                if slo_attainment(recs, SLO(ttft_s=t, tpot_s=0.08)) >= 0.5)
    ok_ttfts = sorted(r.ttft_s for r in recs if r.ok)
    add(nb04.check_tightest_ttft_slo, (recs, 0.08, 0.5), tight,
        {"TPOT SLO ignored": ok_ttfts[math.ceil(0.5 * len(recs)) - 1],
         "failed request left out of the total": sorted(r.ttft_s for r in recs if r.ok and (r.tpot_s or 0) <= 0.08)[
             math.ceil(0.5 * (len(recs) - 1)) - 1],
         "interpolated percentile of all TTFTs": float(np.percentile([r.ttft_s for r in recs if r.ok], 50))})
    # Exercise 3: the rate at the 90% goal between swept rates (attainment 0.97 at 2 req/s, 0.73 at 3 req/s)
    rates, att = [0.5, 1.0, 2.0, 3.0, 4.0], [0.998, 0.99, 0.97, 0.73, 0.2]
    add(nb04.check_interpolated_goodput, (rates, att, 0.9), 2.0 + (0.97 - 0.9) / (0.97 - 0.73),
        {"highest swept rate at the goal (no interpolation)": 2.0, "first rate below the goal": 3.0,
         "interpolated from the wrong end": 3.0 - (0.97 - 0.9) / (0.97 - 0.73)})
    assert nb04.check_interpolated_goodput(0.0, [1.0, 2.0], [0.5, 0.4], 0.9).passed  # no rate reaches the goal
    assert nb04.check_interpolated_goodput(2.0, [1.0, 2.0], [0.99, 0.95], 0.9).passed  # every rate does

    # ---- nb05 (Ex1 R = 0.8, D = 0.6; Ex2 D = 2, K = 1.6)
    # (Ex1 R = 0.8, stages 0.35 + 0.25 s; Ex2 D = 2, K = 1.6)
    add(nb05.check_uneven_pipeline_ttft, (0.8, (0.35, 0.25)), 0.6 + 0.8 * 0.35**2 / (2 * (1 - 0.8 * 0.35)),
        {"balanced stages (the one call)": avg_ttft_inter_op(0.8, 0.6), "single-GPU M/D/1": avg_ttft_single(0.8, 0.6),
         "latency of the slowest stage only": 0.35 + 0.8 * 0.35**2 / (2 * (1 - 0.8 * 0.35))})
    grid = np.linspace(1e-6, 1.6 / 2.0 - 1e-6, 400_001)  # replicas (R/2 each) against intra-op, on a fine grid
    worse = [avg_ttft_intra_op(r, 2.0, 1.6) > avg_ttft_single(r / 2, 2.0) for r in grid]
    x = float(grid[int(np.argmax(worse))])
    add(nb05.check_replicas_vs_intra_op, (2.0, 1.6), x,
        {"R·D instead of R": x * 2.0, "inter-op instead of replicas (the one call)": crossover_rate(2.0, 1.6),
         "replicas at the full rate R": float(grid[int(np.argmax([avg_ttft_intra_op(r, 2.0, 1.6) > avg_ttft_single(
             r, 2.0) for r in grid[:1000]]))])})
    add(nb05.check_2p1d_per_gpu, (5.6, 10.0), min(2 * 5.6, 10.0) / 3,
        {"per unit, not per GPU": min(2 * 5.6, 10.0), "one prefill GPU": min(5.6, 10.0) / 3})

    # ---- nb06 (Ex1 3,000 tokens; Ex2 3,000 tokens, budget 512, 24 decodes)
    lat = roofline_latency("a100-80gb", "opt-13b")
    add(nb06.check_stall, (lat, 3000), lat.step_time_s(3000, 3000.0**2, 0, 0),
        {"one decode step": lat.decode_time_s([3000]), "one 256-token chunk": lat.prefill_time_s([256])})
    add(nb06.check_chunks, (3000, 512, 24), math.ceil(3000 / (512 - 24)),
        {"ignored the decodes' share": math.ceil(3000 / 512), "floor instead of ceil": 3000 // (512 - 24)})
    budgets = pd.DataFrame({"token_budget": [128, 256, 512, 1024, 2048],
                            "ttft_p99_s": [0.40, 0.30, 0.22, 0.20, 0.35],
                            "tpot_p99_s": [0.020, 0.025, 0.030, 0.040, 0.060]})
    add(nb06.check_best_budget, (budgets, 0.25), 512,
        {"ignored the TTFT SLO": 128, "lowest TTFT instead": 1024, "bare True": True})
    add(nb06.check_best_budget, (budgets, 0.10), 1024,
        {"no budget meets the SLO, lowest TPOT": 128, "None": "none"})

    # ---- nb07 (Ex1 1,024-token blocks over the first 400 requests; Ex2 the prefix that a 6 GB/s tier pays for)
    reqs = read_mooncake_jsonl(mooncake_trace_path("conversation"), limit=400)
    ratio = cache_hit_ratio(reqs).ratio  # 512-token blocks (lab04 uses it too)
    seen, hit, total = set(), 0, 0
    for r in reqs:  # reference, written out: runs of two keys, leading runs already seen
        runs = [tuple(r.hash_ids[i:i + 2]) for i in range(0, len(r.hash_ids), 2)]
        lead = next((i for i, k in enumerate(runs) if k not in seen), len(runs))
        hit += min(1024 * lead, r.prompt_tokens)
        total += r.prompt_tokens
        seen.update(runs)
    coarse = hit / total
    add(nb07.check_coarse_block_hit_ratio, (400, 2), coarse,
        {"512-token blocks": ratio, "miss ratio": 1 - coarse, "1,024 tokens per 512-token key": min(1.0, 2 * ratio)})

    def p_star(bw, g, gqa=8):
        return (2 * 2 * 8 * get_gpu(g).peak_flops("bf16") / (gqa * bw) - 22 * 8192) / 4

    add(nb07.check_reuse_prefix_tokens, (6e9, "h800"), p_star(6e9, "h800"),
        {"forgot gqa": p_star(6e9, "h800", gqa=1), "A800 FLOP/s": p_star(6e9, "a800"), "the 8k prefix": 8192,
         "Gbit/s instead of GB/s": p_star(6e9 / 8, "h800")})
    c = mooncake_cluster()
    ref3 = c.transfer_s(8192) + c.prefill.time_s(4096, 8192)
    add(nb07.check_remote_prefix_ttft_s, (12_288, 8_192), ref3,
        {"forgot the transfer": c.prefill.time_s(4096, 8192), "recomputed everything": c.prefill.time_s(12_288),
         "forgot the prefix in prefill": c.transfer_s(8192) + c.prefill.time_s(4096)})

    # ---- nb08
    p_h, p_a = get_gpu("h100-sxm").price_per_hour, get_gpu("a100-80gb").price_per_hour
    saving = 8 * (7 * p_h - 12 * p_a)  # 7 × 700 W = 4,900 W buys 12 whole 400 W A100 machines
    add(nb08.check_iso_power_saving, (5, 7), saving,
        {"per-GPU prices, no ×8": saving / 8, "12.25 machines, not whole": 8 * (7 * p_h - 12.25 * p_a),
         "one A100 per H100": 8 * 7 * (p_h - p_a), "the HA cost itself": 8 * (5 * p_h + 12 * p_a)})
    lat08 = roofline_latency(get_gpu("a100-80gb"), get_model("llama-2-70b"), tp=8)
    e2e_ref = lat08.step_time_s(4000, 4000.0**2, 0, 0) + sum(lat08.step_time_s(0, 0.0, 1, 4000 + k) for k in range(199))
    add(nb08.check_e2e_p90_limit_s, ("llama-2-70b", 4000, 200), 1.5 * e2e_ref,
        {"P50 multiple (1.25×)": 1.25 * e2e_ref, "the idle E2E itself": e2e_ref,
         "a decode step for the first token too": 1.5 * (e2e_ref + lat08.step_time_s(0, 0.0, 1, 4199)),
         "TTFT limit (3 × TTFT)": 3 * lat08.step_time_s(4000, 4000.0**2, 0, 0)})

    # ---- nb09
    add(nb09.check_balanced_per_gpu_goodput, (10, 1.6, 4.5, 4), 10 / ((7 + 3) * 4),
        {"no ceil": 10 / ((10 / 1.6 + 10 / 4.5) * 4), "per instance, not per GPU": 10 / (7 + 3)})
    nx = nexus_gpu("h100-sxm", "llama-3-8b")
    xgrid, _ = nx.best_split(4000, 250, 0.04)
    x0 = nb09.nexus_contended_split("h100-sxm", "llama-3-8b", 4000, 250, 0.04, 0.0)
    xbest = nb09.nexus_contended_split("h100-sxm", "llama-3-8b", 4000, 250, 0.04, 0.3)
    assert abs(x0 - xgrid) <= 0.01  # without contention the bisection agrees with the model's own grid
    add(nb09.check_nexus_best_split, ("h100-sxm", "llama-3-8b", 4000, 250, 0.04, 0.3), xbest,
        {"decode's share instead of prefill's": 1 - xbest, "no contention (best_split's model)": x0,
         "best_split's grid without contention": xgrid, "the printed long-prompt row": 0.81,
         "a static 50/50 split": 0.5})

    # ---- lab01
    ev = KVTransferEvidence(requests=4, prompt_tokens=4000, external_kv_tokens=3936, local_compute_tokens=64,
                            local_cache_hit_tokens=0, nixl_transfers=4, nixl_bytes=1e6, nixl_xfer_time_s=0.01,
                            nixl_failed_transfers=0)
    ev2 = KVTransferEvidence(requests=8, prompt_tokens=2000, external_kv_tokens=1992, local_compute_tokens=8,
                             local_cache_hit_tokens=0, nixl_transfers=8, nixl_bytes=3e6, nixl_xfer_time_s=0.002,
                             nixl_failed_transfers=0)
    pooled = ((1e6 + 3e6) / (3936 + 1992), (1e6 + 3e6) / 0.012 / 1e9)   # Exercise 2: both rates added up, then divided
    add(lab01.check_kv_transfer_totals, ({1.0: ev, 2.0: ev2},), pooled,
        {"the last rate's figures alone": (ev2.nixl_bytes / ev2.external_kv_tokens, ev2.bandwidth_bytes_per_s / 1e9),
         "the mean of the rates' figures": ((ev.nixl_bytes / ev.external_kv_tokens + ev2.nixl_bytes / ev2.external_kv_tokens)
                                            / 2, (ev.bandwidth_bytes_per_s + ev2.bandwidth_bytes_per_s) / 2e9),
         "bytes per request (a property)": ((ev.nixl_bytes + ev2.nixl_bytes) / 12, pooled[1]),
         "bytes/s instead of GB/s": (pooled[0], pooled[1] * 1e9), "the pair swapped": pooled[::-1],
         "one number": pooled[0], "only the first half": (pooled[0], None)})
    ok2 = [r for r in recs if r.ok and r.output_tokens > 1]
    short = [r for r in ok2 if r.prompt_tokens < 2000]

    def mean_us(rs, minus_one=1):
        return 1e6 * sum((r.finish_s - r.first_token_s) / (r.output_tokens - minus_one) for r in rs) / len(rs)

    add(lab01.check_short_request_tpot_us, (recs, 2000), mean_us(short),
        {"milliseconds": mean_us(short) / 1e3, "seconds": mean_us(short) / 1e6, "n instead of n − 1": mean_us(short, 0),
         "every request, long ones included": mean_us(ok2)})

    # ---- lab07 (overload)
    # prefill 20 ms short, 180 ms long, one in two long: mean 100 ms → 10 req/s
    add(lab07.check_prefill_bound_rps, (0.020, 0.180, 2), 10.0,
        {"the long prompt only": 1 / 0.180, "the short prompt only": 1 / 0.020,
         "one in three long": 1 / ((0.180 + 2 * 0.020) / 3), "the mean time, not a rate": 0.100})

    # ---- lab06: graded on the mechanism, never on a run's outcomes
    from pdlab.serve.experiments.faults import FAULTS

    mech = dict(zip(FAULTS, ("nobody to answer", "stream cut", "stream cut", "policy decides", "KV kept by the stop"),
                    strict=True))
    policy_answers = {"fail": False, "recompute": True}

    def fault_case(m, a=policy_answers):
        return (m, a)

    cases.append(Case(
        "lab06.check_fault_mechanisms", lambda v: lab06.check_fault_mechanisms(*(v if v is not None else (None, None))),
        fault_case(mech),
        {"the proxy's kill read as the client leaving": fault_case({**mech, FAULTS[1]: "nobody to answer"}),
         "the killed prefill read as a cut stream": fault_case({**mech, FAULTS[3]: "stream cut"}),
         "the frozen prefill read as a dead one": fault_case({**mech, FAULTS[4]: "policy decides"}),
         "the killed decode left to the policy": fault_case({**mech, FAULTS[2]: "policy decides"}),
         "this run's outcome, not the mechanism": fault_case({**mech, FAULTS[4]: "stream cut"}),
         "recompute gives no answer either": fault_case(mech, {"fail": False, "recompute": False}),
         "fail answers too": fault_case(mech, {"fail": True, "recompute": True}),
         "the policies swapped": fault_case(mech, {"fail": True, "recompute": False}),
         "a fault left out": fault_case({f: m for f, m in mech.items() if f != FAULTS[0]}),
         "a mechanism that is not a key": fault_case({**mech, FAULTS[0]: "the client left"}),
         "one policy only": fault_case(mech, {"recompute": True})},
    ))

    # ---- lab08
    from pdlab.workloads import Request

    convo = [Request(0, 0.0, 96, 4, (0, 1, 2)), Request(1, 0.1, 96, 4, (0, 5, 6)), Request(2, 0.2, 128, 4, (0, 1, 2, 3)),
             Request(3, 0.3, 128, 4, (0, 5, 6, 7)), Request(4, 0.4, 96, 4, (0, 1, 9)), Request(5, 0.5, 96, 4, (8, 5, 6))]
    # round-robin over 2 workers: prefix blocks found 0, 0, 3, 3, 2, 0 of 20 (request 5 holds blocks 5 and 6
    # of its worker, but not as a prefix); one worker for all would find 9; any block anywhere 10
    add(lab08.check_round_robin_hit_share, (convo, 2), 8 / 20,
        {"any block, not the prefix": 10 / 20, "one worker for all": 9 / 20, "percent": 40.0, "a count": 8})
    by_id = {r.request_id: r for r in recs}
    assert all(by_id[i].ok for i in range(6))

    def mean_ttft_ms(ids):
        return 1e3 * sum(by_id[i].ttft_s for i in ids) / len(ids)

    rr_recs = [replace(r, first_token_s=r.first_token_s + 0.01 * (k + 1)) if r.ok else r for k, r in enumerate(recs)]

    def turns(rs):
        by = {r.request_id: r for r in rs}
        return {kind: 1e3 * sum(by[i].ttft_s for i in ids) / len(ids)
                for kind, ids in (("first", [0, 1, 5]), ("follow-up", [2, 3, 4]))}

    both = {"kv": turns(recs), "round-robin": turns(rr_recs)}
    add(lab08.check_turn_ttft_ms, ({"kv": recs, "round-robin": rr_recs}, convo, 2), both,
        {"routers swapped": {"kv": both["round-robin"], "round-robin": both["kv"]},
         "kinds swapped": {m: {"first": v["follow-up"], "follow-up": v["first"]} for m, v in both.items()},
         "seconds": {m: {k: x / 1e3 for k, x in v.items()} for m, v in both.items()},
         "every request as one mean": {m: dict.fromkeys(("first", "follow-up"), mean_ttft_ms(range(6)))
                                       for m in both},
         "one router only": {"kv": both["kv"]}})

    # ---- lab02
    rooms_p, rooms_d = [11, 42, 7, 99], [42, 7, 99, 11]
    add(lab02.check_bootstrap_room_shared, (rooms_p, rooms_d), [7, 11, 42, 99],
        {"bare True": True, "the count": 4, "one room missing": [7, 11, 42]})
    add(lab02.check_bootstrap_room_shared, ([11, 42, 7], [42, 7, 99]), [7, 42],
        {"every prefill room": [7, 11, 42], "bare True": True})
    logp = [{"t": 10.000, "body": {"bootstrap_room": 7}}, {"t": 10.050, "body": {"bootstrap_room": 9}}]
    logd = [{"t": 10.003, "body": {"bootstrap_room": 7}}, {"t": 10.045, "body": {"bootstrap_room": 9}}]
    add(lab02.check_dispatch_gap_ms, (logp, logd), 5.0,
        {"seconds": 0.005, "mean gap": 4.0, "signed (decode − prefill)": 3.0, "gap between requests": 50.0})

    # ---- lab03
    # Exercise 1 with the lab's own parameters: Llama-3-70B TP-4 on H100, TPOT SLO 50 ms, a 16,000-token
    # prompt behind one 4,000-token prompt, 16 decodes of 16,000 tokens. Reference: bisection on the
    # router's own estimator; each slip of the issue-23 list moves the answer ≥ 1.8% (tolerance 0.1%).
    lm = roofline_latency("h100-sxm", "llama-3-70b", tp=4)
    load = TargetLoad(queued_prefill_tokens=4000, queued_prefill_sq_tokens=4000.0**2, decode_batch=16,
                      decode_ctx_tokens=16 * 16000)
    p, slo_s, est = 16000, 0.05, LoadEstimator(lm, lm, lm)
    lo, hi = 1.0 + 1e-9, 1e6
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if est.colocated(RouteRequest(p, mid), load).tpot_s <= slo_s else (mid, hi)
    step = lm.step_time_s(0, 0.0, 17, 16 * 16000 + p)
    queue_and_prompt = lm.step_time_s(4000 + p, 4000.0**2 + p * p, 0, 0)
    add(lab03.check_colocated_break_even_output, (lm, load, p, slo_s), hi,
        {"o instead of o − 1": queue_and_prompt / (slo_s - step),
         "left out the +1 batch and the +p context": 1 + queue_and_prompt / (
             slo_s - lm.step_time_s(0, 0.0, 16, 16 * 16000)),
         "(queue + prompt)² instead of Σl²": 1 + lm.step_time_s(4000 + p, float(4000 + p) ** 2, 0, 0) / (slo_s - step),
         "rounded up to whole tokens": math.ceil(hi), "the TPOT at the example's 182 tokens":
             est.colocated(RouteRequest(p, 182), load).tpot_s})

    # Exercise 2 on the lab's harness (ci sizes): the mix workload on the 1C2P1D cluster. A policy that
    # sends every request to one pool (the do-nothing choice) and a coin flip must fail, and so must a copy
    # of a shipped policy (the best one ties, it does not beat itself) and a rule that decides as one does
    # (long prompts apart at the shipped threshold's 2,048 tokens). Keeping prompts of 5,000 tokens or more
    # apart, so that the two-instance prefill pool is not past its knee first, passes on both seeds.
    agentic = generate_agentic(seed=0, sessions=150).requests()[:300]
    chat = [replace(r, hash_ids=(10**9 + i % 8,)) for i, r in enumerate(synthetic_requests(300, 1.0, lengths="sharegpt",
                                                                                            seed=0))]
    mix = [replace(r, request_id=i) for i, r in enumerate(x for pair in zip(agentic[:150], chat[:150], strict=True)
                                                          for x in pair)]
    sim_slo = SLO(ttft_s=2.0, tpot_s=0.05)
    cluster = dict(gpu="h100-sxm", model="llama-3-70b", tp=4, link="ib-ndr", prefix_caching=True,
                   colocated=1, prefill=2, decode=1)
    shipped = {"all-colocated": AllColocated(), "all-disaggregated": AllDisaggregated(),
               "threshold 2048": Threshold(2048), "slo-aware": SLOAware(sim_slo)}
    add(lab03.check_routing_policy, (mix, list(range(2, 34, 2)), sim_slo, cluster, shipped),
        _LongApart(sim_slo, cut=5000),
        {"do-nothing (everything colocated)": AllColocated(), "a coin flip per request": _CoinFlip(seed=1),
         "everything disaggregated": AllDisaggregated(), "long prompts kept colocated": _LongApart(sim_slo, flip=True),
         "the best shipped policy copied": shipped["threshold 2048"], "a fresh threshold 2048": Threshold(2048),
         "the shipped SLO-aware policy": SLOAware(sim_slo),
         "the shipped threshold's decisions under another name": _LongApart(sim_slo)})

    # ---- lab04
    add(lab04.check_lru_hit_ratio, (reqs, 300), cache_hit_ratio(reqs, 300).ratio,
        {"unlimited cache": ratio, "GB-sized capacity typo (3000 blocks)": cache_hit_ratio(reqs, 3000).ratio})

    # ---- lab05
    from pdlab.simreal import Calibration, replay
    from pdlab.simreal.replay import Deployment
    from pdlab.workloads import Request

    fl = FittedLatency(prefill=(0.01, 2e-5, 1e-9), decode=(0.008, 3e-7, 2e-4))
    # the live engines: prefill 30 % slower than the calibration says, so the prediction misses
    truth = Calibration(fl.derive(prefill=(0.013, 2.6e-5, 1.3e-9)))
    cal = Calibration(fl)
    replicas = Deployment("colocated", instances=2, dispatch="round_robin")
    rng = np.random.default_rng(0)

    def planned(first: int, n: int = 30, rate: float = 20.0):
        arrivals = np.cumsum(rng.exponential(1 / rate, n))
        return [Request(first + i, float(t), int(rng.integers(32, 1024)), int(rng.integers(16, 64)))
                for i, t in enumerate(arrivals)]

    block, other = planned(0), planned(30)
    live_blocks = [replay(block, replicas, truth), replay(other, replicas, truth)]
    predicted = lab05.block_ttft_prediction(cal, block, replicas)
    add(lab05.check_block_prediction, (cal, block, replicas), predicted,
        {"one engine, not two replicas": lab05.block_ttft_prediction(cal, block, Deployment("colocated")),
         "1P1D, not two replicas": lab05.block_ttft_prediction(cal, block, Deployment("disaggregated")),
         "the live median, not a prediction": float(np.median([r.ttft_s for r in live_blocks[0]])),
         "milliseconds": 1e3 * predicted})
    err, floor = lab05.one_block_judgement(cal, block, replicas, live_blocks)
    m0, m1 = (float(np.median([r.ttft_s for r in b])) for b in live_blocks)
    one_engine = lab05.block_ttft_prediction(cal, block, Deployment("colocated"))
    assert abs(err) > 0.05 and floor > 0
    add(lab05.check_one_block_judgement, (cal, block, replicas, live_blocks), (err, floor),
        {"a wrong prediction (one engine's)": (one_engine / m0 - 1, floor),
         "a wrong floor (the TPOT blocks')": (err, abs(float(np.median([r.tpot_s for r in live_blocks[1]]))
                                                    / float(np.median([r.tpot_s for r in live_blocks[0]])) - 1)),
         "a wrong floor (log ratio over √2)": (err, abs(math.log(m1 / m0)) / math.sqrt(2)),
         "the error unsigned": (abs(err), floor) if err < 0 else (-err, floor),
         "a guess": (0.0, 0.1),
         "a verdict, not the numbers": True})
    return cases


CASES = _cases()


@pytest.fixture(autouse=True)
def _lenient(monkeypatch):
    monkeypatch.setenv("PDLAB_STRICT_CHECKS", "0")
    monkeypatch.delenv("PDLAB_EXPECTED_LOG", raising=False)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_reference_answer_passes(case):
    result = case.call(case.reference)
    assert result.status == PASSED, f"{case.name}: reference {case.reference!r} → {result}"


WRONG = [(c, slip, value) for c in CASES for slip, value in c.wrong.items()]


@pytest.mark.parametrize("case,slip,value", WRONG, ids=[f"{c.name}[{slip}]" for c, slip, _ in WRONG])
def test_plausible_wrong_answer_is_rejected(case, slip, value):
    result = case.call(value)
    assert result.status == FAILED, f"{case.name}: the slip '{slip}' ({value!r}) passed: {result}"


def test_none_is_not_attempted_and_every_check_is_in_the_battery():
    covered = {c.name for c in CASES}
    missing = []
    for info in pkgutil.iter_modules(ex.__path__):
        mod = importlib.import_module(f"pdlab.exercises.{info.name}")
        for name, fn in inspect.getmembers(mod, inspect.isfunction):
            if name.startswith("check_") and fn.__module__ == mod.__name__:
                if f"{info.name}.{name}" not in covered:
                    missing.append(f"{info.name}.{name}")
    assert not missing, f"checks without a wrong-answer battery entry: {missing}"
    for c in CASES:
        assert c.call(None).status == "not attempted", c.name
        assert c.wrong, f"{c.name}: no wrong answer"


def test_expected_values_are_recorded(tmp_path, monkeypatch):
    log = tmp_path / "expected.jsonl"
    monkeypatch.setenv("PDLAB_EXPECTED_LOG", str(log))
    for c in CASES:
        c.call(None)
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(rows) >= len(CASES) - 1  # lab02's real-SGLang path has no value to record


# ------------------------------------------------------------------ answer not on the page


def number_spellings(value: float) -> set[str]:
    """How a notebook would print ``value``: rounded to 3–4 significant digits, with or without
    thousands separators, as a percentage for fractions. Values too round or too small to be
    distinctive (integers below 100, one significant digit) give no spellings."""
    v = float(value)
    if not math.isfinite(v) or v == 0:
        return set()
    out: set[str] = set()
    for digits in (3, 4):
        s = f"{v:.{digits}g}"
        if "e" in s:
            continue
        if len(s.replace("-", "").replace(".", "").lstrip("0")) < 3:
            continue
        out.add(s)
        if abs(v) >= 1000:
            out.add(f"{v:,.{max(0, digits - len(str(int(abs(v)))))}f}")
    if abs(v) >= 100 and v == int(v):
        out |= {f"{int(v)}", f"{int(v):,}"}
    if 0 < abs(v) < 1:
        out.add(f"{v * 100:.1f}%")
    return {s for s in out if len(s.replace(",", "").replace(".", "").lstrip("-0")) >= 3}


def _significant_digits(spelling: str) -> int:
    return len(spelling.replace(",", "").replace("%", "").replace("-", "").replace(".", "").lstrip("0"))


def _page_text(nb) -> str:
    parts = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            parts.append(cell.source)
        for out in cell.get("outputs", []):
            if isinstance(out.get("text"), str):
                parts.append(out["text"])
            # text/html is left out: plotly figures embed their data and plotly.js there (noise), and
            # a DataFrame's HTML has the same numbers as its text/plain
            for mime in ("text/plain", "text/markdown"):
                data = out.get("data", {}).get(mime)
                if isinstance(data, str):
                    parts.append(data)
    return "\n".join(parts)


def test_number_spellings():
    assert "0.366" in number_spellings(0.36621)
    assert "15.73" in number_spellings(15.7286)
    assert "31,104" in number_spellings(31104)
    assert number_spellings(7) == set()
    assert _significant_digits("48.3") == 3 and _significant_digits("47.77") == 4
    assert _significant_digits("0.2298") == 4 and _significant_digits("31,104") == 5


def test_a_measured_answer_leaks_only_at_four_digits(tmp_path):
    """lab 08's Exercise 2 is a mean TTFT in ms, the unit the lab's tables print at one decimal: a
    12-request run's subset mean matched a table figure by chance in CI. A "measured" answer is
    read at 4 significant digits; a "value" answer still at 3."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("print('table')", outputs=[
        nbformat.v4.new_output("stream", name="stdout", text="TTFT p90 48.3 ms\nfirst turns 13.71 ms\n")])]
    path = tmp_path / "page.ipynb"
    nbformat.write(nb, path)
    log = tmp_path / "expected.jsonl"
    log.write_text("\n".join(json.dumps(r) for r in [
        {"exercise": "chance", "expected": 48.3012, "kind": "measured"},
        {"exercise": "leak", "expected": 13.7061, "kind": "measured"},
        {"exercise": "value", "expected": 48.3012, "kind": "value"}]))
    assert expected_values_on_the_page(path, log) == ["leak: 13.71", "value: 48.3"]


def expected_values_on_the_page(executed_nb_path, expected_log) -> list[str]:
    """The expected exercise answers recorded in ``expected_log`` (``PDLAB_EXPECTED_LOG``) that an
    executed student copy prints in its markdown or outputs. Used by
    ``tests/test_notebooks.py::test_student_copy_runs_and_exercises_raise``, which runs every
    student copy, live labs included, once with the log switched on."""
    expected = [json.loads(line) for line in expected_log.read_text().splitlines()] if expected_log.exists() else []
    assert expected, f"{executed_nb_path.name}: no check recorded an expected value"
    page = _page_text(nbformat.read(executed_nb_path, as_version=4))
    leaks = []
    for row in expected:
        if row.get("kind") == "choice" or isinstance(row["expected"], bool) \
                or not isinstance(row["expected"], int | float):
            continue
        spellings = number_spellings(row["expected"])
        if row.get("kind") == "measured":
            spellings = {s for s in spellings if _significant_digits(s) >= 4}
        for s in spellings:
            if re.search(rf"(?<![\d.,]){re.escape(s)}(?![\d])", page):
                leaks.append(f"{row['exercise']}: {s}")
    return leaks


def test_routing_harness_names_a_bad_decision():
    """lab03 Exercise 2's harness: a policy that returns neither target fails with a clear error."""
    from pdlab.exercises.lab03 import routing_goodput
    from pdlab.metrics import SLO
    from pdlab.workloads import synthetic_requests

    class Undecided(RoutingPolicy):
        def decide(self, req, estimates=None):
            return "both"

    cluster = dict(gpu="h100-sxm", model="llama-3-8b", colocated=1, prefill=1, decode=1)
    with pytest.raises(ValueError, match="must return one of"):
        routing_goodput(Undecided(), synthetic_requests(5, 1.0, lengths="sharegpt", seed=0), [1.0], SLO(ttft_s=1.0, tpot_s=0.1), cluster)
    with pytest.raises(TypeError, match="RoutingPolicy"):
        routing_goodput(lambda r: "colocated", synthetic_requests(5, 1.0, lengths="sharegpt", seed=0), [1.0], SLO(ttft_s=1.0), cluster)


def test_live_labs_record_their_run_statistics_as_measured(tmp_path, monkeypatch):
    """A check whose answer is a statistic of the live run records it as "measured" (lab 05's block
    scatter, 0.243, met an unrelated 0.243 on the page in one CI run); a computed one as "value"."""
    from pdlab.exercises import EXPECTED_LOG_ENV, check_close
    from pdlab.exercises.lab07 import check_prefill_bound_rps

    log = tmp_path / "expected.jsonl"
    monkeypatch.setenv(EXPECTED_LOG_ENV, str(log))
    check_prefill_bound_rps(None, 0.05, 0.3, 4)
    check_close("computed", None, 1.2345)
    kinds = {row["exercise"]: row["kind"] for row in map(json.loads, log.read_text().splitlines())}
    assert kinds == {"Exercise 1": "measured", "computed": "value"}
