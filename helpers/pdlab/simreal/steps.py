"""Measured step times of a whole (random-weight) Llama-shaped model, fitted to the simulator's format.

A "step" is one forward pass over a batch, as a serving engine runs it: every decoder layer
(:class:`pdlab.roofline.measure` builds one in plain torch: RMSNorm, fused QKV, SDPA attention with
GQA and a KV cache, output projection, SiLU-gated MLP), then the final norm and the LM head on
the last token of each sequence. The input is random hidden states (the embedding is a lookup).

- Prefill point ``(batch, tokens)``: ``batch`` prompts of ``tokens`` new tokens, no cached prefix,
  causal attention.
- Decode point ``(batch, context)``: one new token per sequence against a KV cache of ``context``
  tokens (random values) in every layer.

Each point is timed like :func:`pdlab.roofline.measure.time_fn` (CUDA events after warm-up on a
GPU, ``perf_counter`` on the CPU); the step time is the best of the repeats (the least disturbed
run, the statistic of the roofline measurement; on a shared CPU the median moves with the
neighbours' load), and the median is kept beside it. :func:`step_fit_points` turns the rows into the points
:func:`pdlab.sim.latency.fit_latency` takes (``prefill_tokens`` = Σl, ``prefill_sq_tokens`` = Σl²,
``decode_batch``, ``decode_ctx_tokens`` = Σctx), so the measurement becomes a latency profile
that ``pdlab simulate --profile FILE`` reads.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from pdlab.models import ModelConfig
from pdlab.roofline.measure import LayerShape, TorchLayer, time_fn, torch_dtype

__all__ = ["MeasuredStep", "measure_steps", "step_fit_points", "fit_step_profile"]


@dataclass
class MeasuredStep:
    """One measured forward step of the whole model (seconds); :func:`step_fit_points` turns it into a
    fit row (the live probes' counterpart is :class:`pdlab.simreal.calibration.StepPoint`)."""

    phase: str
    batch: int
    tokens: int  # new tokens per sequence (1 in decode)
    context: int  # tokens attended per sequence (prefill: = tokens)
    time_s: float  # best of the repeats
    median_time_s: float
    repeats: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class _StepModel:
    """``model.num_layers`` decoder layers, the final norm and the LM head, random weights."""

    def __init__(self, model: ModelConfig, device: str, dtype: str):
        import torch

        if model.is_mla or model.is_moe or not model.gated_mlp:
            raise ValueError(f"{model.name}: step timing builds dense Llama-shaped layers only")
        shape = LayerShape(model.hidden_size, model.num_heads, model.num_kv_heads, model.head_dim,
                           model.intermediate_size, model.name)
        self.model, self.device, self.shape = model, device, shape
        self.layers = [TorchLayer(shape, device, dtype) for _ in range(model.num_layers)]
        self.dtype = torch_dtype(dtype)
        gen = torch.Generator(device=device).manual_seed(2)
        h = model.hidden_size
        self.final_norm = torch.ones(h, device=device, dtype=self.dtype)
        self.lm_head = (torch.randn(h, model.vocab_size, device=device, generator=gen) * h ** -0.5).to(self.dtype)

    def caches(self, batch: int, length: int) -> list[tuple[Any, Any]]:
        import torch

        gen = torch.Generator(device=self.device).manual_seed(3)
        shape = (batch, self.shape.kv_heads, length, self.shape.head_dim)
        return [(torch.randn(shape, device=self.device, generator=gen).to(self.dtype),
                 torch.randn(shape, device=self.device, generator=gen).to(self.dtype)) for _ in self.layers]

    def forward(self, x, caches, start: int, causal: bool):
        import torch

        with torch.inference_mode():
            for layer, (k, v) in zip(self.layers, caches, strict=True):
                x = layer.forward(x, k, v, start, causal)
            last = x[:, -1]
            last = last * torch.rsqrt(last.pow(2).mean(-1, keepdim=True) + 1e-6) * self.final_norm
            return last @ self.lm_head


def measure_steps(model: ModelConfig, device: str, *, prefill: Iterable[tuple[int, int]],
                  decode: Iterable[tuple[int, int]], dtype: str = "bf16", repeats: int = 5,
                  min_seconds: float = 0.0, max_repeats: int = 100,
                  progress: Callable[[str], None] | None = None) -> list[MeasuredStep]:
    """Time whole-model forward steps: ``prefill`` as ``(batch, tokens)``, ``decode`` as ``(batch, context)``.

    Each point runs ``repeats`` times, and again in rounds of ``repeats`` while the timed total is
    under ``min_seconds`` (at most ``max_repeats``): on a shared CPU a millisecond step then gets
    enough tries for its best to be undisturbed.
    """
    import torch

    say = progress or (lambda msg: None)
    net = _StepModel(model, device, dtype)
    gen = torch.Generator(device=device).manual_seed(4)
    warmup = 2 if device == "cuda" else 1
    out: list[MeasuredStep] = []
    plan = [("prefill", b, s) for b, s in prefill] + [("decode", b, c) for b, c in decode]
    oom = getattr(torch, "OutOfMemoryError", RuntimeError)
    for phase, batch, length in plan:
        new = length if phase == "prefill" else 1
        start = 0 if phase == "prefill" else length - 1
        try:
            caches = net.caches(batch, length)
            x = torch.randn(batch, new, model.hidden_size, device=device, generator=gen).to(net.dtype)

            def run(x=x, caches=caches, start=start, causal=phase == "prefill"):
                return net.forward(x, caches, start, causal)

            times = time_fn(run, device, warmup=warmup, repeats=repeats)
            while sum(times) < min_seconds and len(times) < max_repeats:  # short steps: more tries at a quiet moment
                times += time_fn(run, device, warmup=0, repeats=repeats)
        except oom:  # a point too large for this device is left out; the others still count
            say(f"  {phase:<7} B={batch:<4} length {length}: out of memory, left out")
            caches = x = run = None
            if device == "cuda":
                torch.cuda.empty_cache()
            continue
        out.append(MeasuredStep(phase, batch, new, length, min(times), statistics.median(times), len(times)))
        say(f"  {phase:<7} B={batch:<4} {'S' if phase == 'prefill' else 'C'}={length:<6} "
            f"{out[-1].time_s * 1e3:9.3f} ms")
        caches = x = run = None
        if device == "cuda":
            torch.cuda.empty_cache()
    return out


def step_fit_points(points: Iterable[MeasuredStep | Mapping[str, Any]]) -> list[dict[str, float]]:
    """Rows for :func:`pdlab.sim.latency.fit_latency` (prefill: Σl and Σl²; decode: batch and Σctx)."""
    rows = []
    for p in points:
        d = p.as_dict() if isinstance(p, MeasuredStep) else dict(p)
        b = int(d["batch"])
        if d["phase"] == "prefill":
            s = int(d["tokens"])
            rows.append({"prefill_tokens": b * s, "prefill_sq_tokens": float(b * s * s), "decode_batch": 0,
                         "decode_ctx_tokens": 0, "time_s": float(d["time_s"])})
        else:
            rows.append({"prefill_tokens": 0, "prefill_sq_tokens": 0.0, "decode_batch": b,
                         "decode_ctx_tokens": b * int(d["context"]), "time_s": float(d["time_s"])})
    return rows


def fit_step_profile(points: Iterable[MeasuredStep | Mapping[str, Any]], meta: dict[str, Any] | None = None):
    """Fit measured steps to DistServe's form: a :class:`pdlab.sim.latency.FittedLatency`
    (:func:`pdlab.sim.latency.fit_latency`, which fits with numpy alone where scipy is missing)."""
    from pdlab.sim.latency import fit_latency

    return fit_latency(step_fit_points(points), meta=meta)
