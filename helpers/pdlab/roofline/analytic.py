"""Analytic roofline of one forward step: FLOPs and HBM bytes per operator, for prefill and decode.

Units: FLOPs (a multiply-add counts 2), bytes (decimal), seconds, FLOP/byte for arithmetic intensity.
All figures are **per GPU**: with tensor parallelism of degree ``tp`` the heads, the FFN width,
the experts' width and the vocabulary are split ``tp`` ways (KV heads are replicated when
``tp`` exceeds them; MLA's latent cache is replicated on every rank), and each layer adds two ring
all-reduces of the hidden states, ``2 (tp-1)/tp × tokens × hidden × 2 B`` each, over the GPU's
NVLink (or its PCIe link when it has none).

Shapes. Prefill: ``batch`` sequences of ``tokens`` (S) new tokens each, after ``prefix`` (P) cached
tokens; new token *i* (1..S) attends to ``P + i`` tokens (causal), so the attention score count per
head is ``B (S·P + S(S+1)/2)``. Decode: ``batch`` sequences, one new token each, attending to
``context`` (C) tokens (C counts the new token, whose KV is written this step).

The bytes are the *ideal* traffic of fused kernels: every weight, activation and KV element is read
or written once per operator (FlashAttention-style attention keeps scores on chip). Real kernels
move more (FlashAttention re-reads K/V once per query block), so measured times sit above these.
Operators: ``embed``, then per layer ``attn_norm``, ``qkv_proj`` (MLA: ``q_proj``, ``kv_a_proj``,
``kv_b_proj`` in prefill or ``q_absorb``/``v_up`` in decode), ``attn_qk`` (QKᵀ), ``attn_av`` (AV),
``o_proj``, ``allreduce_attn``, ``mlp_norm``, ``mlp_up`` (gate+up), ``mlp_act``, ``mlp_down`` (MoE
layers: ``moe_router``, ``moe_experts``, ``shared_experts``), ``allreduce_mlp``; then
``final_norm`` and ``lm_head`` (logits for the last token of each sequence only).
Conventions: RMSNorm 4 FLOPs per element; SiLU·mul 4 FLOPs per element (ReLU 1); residual adds,
RoPE and softmax are left out (together well under 2% of the FLOPs). Norm, embedding and LM-head
weights stay in 16 bits when the body is fp8 (as in common fp8 checkpoints); activations are 16-bit
(32-bit for an fp32 run). MoE weights: under uniform routing, ``T`` tokens with top-``k`` of ``E``
experts touch ``E (1 - (1 - k/E)^T)`` distinct experts on average; only those are read.
MLA: prefill expands the latent into per-head K and V (``kv_b_proj``); decode uses the absorbed
form (attention over the cached latent of ``kv_lora_rank + qk_rope_head_dim`` values per token,
read once), as DeepSeek-V3's reference code and vLLM do.
Time per operator = ``max(FLOPs / peak, bytes / bandwidth)`` (+ link time for all-reduces); the
step time is the sum over operators (no overlap), MFU = FLOPs / (time × peak),
MBU = bytes / (time × bandwidth).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

from pdlab.hardware import GPU, dtype_bytes, get_gpu, get_link
from pdlab.models import ModelConfig, get_model

__all__ = [
    "Device",
    "OpCost",
    "RooflineResult",
    "layer_ops",
    "model_ops",
    "analyze",
    "attainable_flops",
    "critical_decode_batch",
    "link_bytes_per_s",
    "PHASES",
]

PHASES = ("prefill", "decode")


class Device(Protocol):
    """What the analysis needs from a device: a catalog :class:`~pdlab.hardware.GPU` or a measured profile."""

    name: str
    hbm_bytes_per_s: float

    def peak_flops(self, dtype: str = "bf16") -> float: ...


@dataclass(frozen=True)
class OpCost:
    """One operator's work per GPU: FLOPs, HBM bytes (with a breakdown) and link bytes.

    ``count`` is how many times it occurs (layers). ``time_s`` and ``bound`` are set by :func:`analyze`.
    """

    name: str
    flops: float
    bytes: float
    weight_bytes: float = 0.0
    kv_bytes: float = 0.0
    comm_bytes: float = 0.0
    count: int = 1
    time_s: float = 0.0
    bound: str = ""

    @property
    def activation_bytes(self) -> float:
        """HBM bytes that are neither weights nor KV cache."""
        return self.bytes - self.weight_bytes - self.kv_bytes

    @property
    def arithmetic_intensity(self) -> float:
        """FLOP per HBM byte (``inf`` for an operator that moves no HBM bytes)."""
        return self.flops / self.bytes if self.bytes else math.inf

    def scaled(self, count: int) -> OpCost:
        """The same operator repeated ``count`` times (all figures multiplied)."""
        return replace(self, flops=self.flops * count, bytes=self.bytes * count,
                       weight_bytes=self.weight_bytes * count, kv_bytes=self.kv_bytes * count,
                       comm_bytes=self.comm_bytes * count, count=self.count * count,
                       time_s=self.time_s * count)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["arithmetic_intensity"] = self.arithmetic_intensity
        d["activation_bytes"] = self.activation_bytes
        return d


def _op(name: str, flops: float, weight: float = 0.0, act: float = 0.0, kv: float = 0.0,
        comm: float = 0.0) -> OpCost:
    return OpCost(name, float(flops), float(weight + act + kv), weight_bytes=float(weight),
                  kv_bytes=float(kv), comm_bytes=float(comm))


@dataclass(frozen=True)
class _Shape:
    phase: str
    batch: int
    new_tokens: int  # per sequence: S (prefill) or 1 (decode)
    kv_len: int  # tokens whose KV attention reads per sequence: P + S (prefill) or C (decode)
    score_count: float  # attended (query, key) pairs per head, summed over the batch

    @property
    def tokens(self) -> int:
        return self.batch * self.new_tokens


def _shape(phase: str, batch: int, tokens: int, context: int, prefix: int) -> _Shape:
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
    for label, value, low in (("batch", batch, 1), ("tokens", tokens, 1), ("context", context, 1),
                              ("prefix", prefix, 0)):
        if int(value) != value or value < low:
            raise ValueError(f"{label} must be an integer >= {low}, got {value!r}")
    if phase == "prefill":
        s, p = int(tokens), int(prefix)
        return _Shape(phase, int(batch), s, p + s, batch * (s * p + s * (s + 1) / 2))
    return _Shape(phase, int(batch), 1, int(context), batch * context)


def _sizes(dtype: str, kv_dtype: str | None) -> tuple[float, float, float]:
    wb = dtype_bytes(dtype)
    ab = 4.0 if dtype.lower() == "fp32" else 2.0
    kb = dtype_bytes(kv_dtype or dtype)
    return wb, ab, kb


def _norm(name: str, t: float, h: int, ab: float) -> OpCost:
    return _op(name, 4 * t * h, weight=h * ab, act=2 * t * h * ab)


def _attention_ops(m: ModelConfig, sh: _Shape, tp: int, wb: float, ab: float, kb: float) -> list[OpCost]:
    t, b, h = sh.tokens, sh.batch, m.hidden_size
    nh = m.num_heads / tp
    if not m.is_mla:
        hd = m.head_dim
        nkv = max(m.num_kv_heads / tp, 1.0)
        qkv_out = (nh + 2 * nkv) * hd
        return [
            _op("qkv_proj", 2 * t * h * qkv_out, weight=h * qkv_out * wb,
                act=t * h * ab + t * nh * hd * ab, kv=t * 2 * nkv * hd * kb),
            _op("attn_qk", 2 * nh * hd * sh.score_count, act=t * nh * hd * ab, kv=b * sh.kv_len * nkv * hd * kb),
            _op("attn_av", 2 * nh * hd * sh.score_count, act=t * nh * hd * ab, kv=b * sh.kv_len * nkv * hd * kb),
            _op("o_proj", 2 * t * nh * hd * h, weight=nh * hd * h * wb, act=t * nh * hd * ab + t * h * ab),
        ]
    # Multi-head latent attention (DeepSeek-V2/V3).
    r, rope, nope, v = m.kv_lora_rank, m.qk_rope_head_dim, m.qk_nope_head_dim, m.v_head_dim
    qk = nope + rope
    latent = r + rope
    if m.q_lora_rank:
        qr = m.q_lora_rank
        q_proj = _op("q_proj", 2 * t * (h * qr + qr * nh * qk), weight=(h * qr + qr * nh * qk) * wb,
                     act=t * h * ab + t * nh * qk * ab)
    else:
        q_proj = _op("q_proj", 2 * t * h * nh * qk, weight=h * nh * qk * wb, act=t * h * ab + t * nh * qk * ab)
    ops = [q_proj, _op("kv_a_proj", 2 * t * h * latent, weight=h * latent * wb, act=t * h * ab,
                       kv=t * latent * kb)]
    if sh.phase == "prefill":
        n_kv = b * sh.kv_len
        ops += [
            _op("kv_b_proj", 2 * n_kv * r * nh * (nope + v), weight=r * nh * (nope + v) * wb,
                act=n_kv * nh * (nope + v) * ab, kv=n_kv * latent * kb),
            _op("attn_qk", 2 * nh * qk * sh.score_count, act=t * nh * qk * ab + n_kv * nh * qk * ab),
            _op("attn_av", 2 * nh * v * sh.score_count, act=n_kv * nh * v * ab + t * nh * v * ab),
        ]
    else:
        ops += [
            _op("q_absorb", 2 * t * nh * nope * r, weight=nh * nope * r * wb, act=t * nh * (nope + r) * ab),
            _op("attn_qk", 2 * nh * latent * sh.score_count, act=t * nh * latent * ab,
                kv=b * sh.kv_len * latent * kb),
            _op("attn_av", 2 * nh * r * sh.score_count, act=t * nh * r * ab),
            _op("v_up", 2 * t * nh * r * v, weight=nh * r * v * wb, act=t * nh * (r + v) * ab),
        ]
    ops.append(_op("o_proj", 2 * t * nh * v * h, weight=nh * v * h * wb, act=t * nh * v * ab + t * h * ab))
    return ops


def _mlp_ops(m: ModelConfig, t: float, ffn_local: float, wb: float, ab: float,
             prefix: str = "mlp") -> list[OpCost]:
    h = m.hidden_size
    g = 2 if m.gated_mlp else 1
    act_flops = 4 if m.gated_mlp else 1
    return [
        _op(f"{prefix}_up", 2 * t * h * g * ffn_local, weight=h * g * ffn_local * wb,
            act=t * h * ab + t * g * ffn_local * ab),
        _op(f"{prefix}_act", act_flops * t * ffn_local, act=t * g * ffn_local * ab + t * ffn_local * ab),
        _op(f"{prefix}_down", 2 * t * ffn_local * h, weight=ffn_local * h * wb, act=t * ffn_local * ab + t * h * ab),
    ]


def _moe_ops(m: ModelConfig, t: float, tp: int, wb: float, ab: float) -> list[OpCost]:
    h, e, k = m.hidden_size, m.num_experts, m.experts_per_token
    g = 2 if m.gated_mlp else 1
    f = m.moe_intermediate_size / tp
    routed = t * k
    touched = e * (1 - (1 - k / e) ** t) if e else 0.0
    per_expert_w = (g + 1) * h * f
    ops = [
        _op("moe_router", 2 * t * h * e, weight=h * e * ab, act=t * h * ab + t * e * ab),
        _op("moe_experts", routed * (2 * (g + 1) * h * f + (4 if m.gated_mlp else 1) * f),
            weight=touched * per_expert_w * wb, act=routed * (2 * h + (g + 1) * f) * ab),
    ]
    if m.num_shared_experts:
        fs = m.num_shared_experts * m.moe_intermediate_size / tp
        ops.append(_op("shared_experts", t * (2 * (g + 1) * h * fs + (4 if m.gated_mlp else 1) * fs),
                       weight=(g + 1) * h * fs * wb, act=t * (2 * h + (g + 1) * fs) * ab))
    return ops


def _allreduce(name: str, t: float, h: int, tp: int, ab: float) -> OpCost:
    return _op(name, 0.0, comm=2 * (tp - 1) / tp * t * h * ab)


def _check_tp(m: ModelConfig, tp: int) -> None:
    if int(tp) != tp or tp < 1:
        raise ValueError(f"tp must be an integer >= 1, got {tp!r}")
    if m.num_heads % tp:
        raise ValueError(f"tp={tp} does not divide the {m.num_heads} attention heads of {m.name}")


def layer_ops(model: ModelConfig, phase: str, *, batch: int = 1, tokens: int = 1, context: int = 1,
              prefix: int = 0, tp: int = 1, dtype: str = "bf16", kv_dtype: str | None = None,
              moe: bool | None = None) -> list[OpCost]:
    """Per-operator cost of **one** transformer layer, per GPU (no timing).

    ``moe`` picks the layer kind for MoE models (default: an MoE layer when the model has experts).
    """
    _check_tp(model, tp)
    sh = _shape(phase, batch, tokens, context, prefix)
    wb, ab, kb = _sizes(dtype, kv_dtype)
    t, h = sh.tokens, model.hidden_size
    use_moe = model.is_moe if moe is None else (moe and model.is_moe)
    ops = [_norm("attn_norm", t, h, ab), *_attention_ops(model, sh, tp, wb, ab, kb)]
    if tp > 1:
        ops.append(_allreduce("allreduce_attn", t, h, tp, ab))
    ops.append(_norm("mlp_norm", t, h, ab))
    ops += _moe_ops(model, t, tp, wb, ab) if use_moe else _mlp_ops(model, t, model.intermediate_size / tp, wb, ab)
    if tp > 1:
        ops.append(_allreduce("allreduce_mlp", t, h, tp, ab))
    return ops


def _merge(ops: list[OpCost]) -> list[OpCost]:
    merged: dict[str, OpCost] = {}
    for op in ops:
        if op.name in merged:
            a = merged[op.name]
            merged[op.name] = replace(a, flops=a.flops + op.flops, bytes=a.bytes + op.bytes,
                                      weight_bytes=a.weight_bytes + op.weight_bytes,
                                      kv_bytes=a.kv_bytes + op.kv_bytes, comm_bytes=a.comm_bytes + op.comm_bytes,
                                      count=a.count + op.count, time_s=a.time_s + op.time_s)
        else:
            merged[op.name] = op
    return list(merged.values())


def model_ops(model: ModelConfig, phase: str, *, batch: int = 1, tokens: int = 1, context: int = 1,
              prefix: int = 0, tp: int = 1, dtype: str = "bf16", kv_dtype: str | None = None,
              head: bool = True) -> list[OpCost]:
    """Per-operator cost of the whole model (layers summed per operator name), per GPU, no timing.

    ``head=False`` leaves out the embedding, final norm and LM head (just the layer stack).
    """
    kw = dict(batch=batch, tokens=tokens, context=context, prefix=prefix, tp=tp, dtype=dtype, kv_dtype=kv_dtype)
    _, ab, _ = _sizes(dtype, kv_dtype)
    sh = _shape(phase, batch, tokens, context, prefix)
    t, h = sh.tokens, model.hidden_size
    dense_layers = model.first_dense_layers if model.is_moe else model.num_layers
    moe_layers = model.num_layers - dense_layers
    ops: list[OpCost] = []
    if head:
        ops.append(_op("embed", 0.0, weight=t * h * ab, act=t * h * ab))
    if dense_layers:
        ops += [op.scaled(dense_layers) for op in layer_ops(model, phase, moe=False, **kw)]
    if moe_layers:
        ops += [op.scaled(moe_layers) for op in layer_ops(model, phase, moe=True, **kw)]
    if head:
        vocab = model.vocab_size / tp
        ops.append(_norm("final_norm", t, h, ab))
        ops.append(_op("lm_head", 2 * batch * h * vocab, weight=h * vocab * ab,
                       act=batch * h * ab + batch * vocab * ab))
    return _merge(ops)


def link_bytes_per_s(gpu: Any) -> float | None:
    """Per-direction bandwidth between GPUs for all-reduces: NVLink, else the PCIe link, else None."""
    nvlink = getattr(gpu, "nvlink_bytes_per_s", None)
    if nvlink:
        return float(nvlink)
    gen = getattr(gpu, "pcie_gen", None)
    if gen:
        try:
            return get_link(f"pcie-gen{gen}").bytes_per_s
        except KeyError:
            return None
    return None


def attainable_flops(arithmetic_intensity: float, peak_flops: float, bytes_per_s: float) -> float:
    """The roofline: ``min(peak, AI × bandwidth)`` in FLOP/s."""
    return min(peak_flops, arithmetic_intensity * bytes_per_s)


class _OpsTotal:
    """A read-only attribute of :class:`RooflineResult` named after an :class:`OpCost` field: that
    field summed over the result's ``ops`` (per GPU; FLOPs or bytes)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.field = name

    def __get__(self, result: RooflineResult | None, owner: type | None = None) -> float:
        if result is None:
            return self  # type: ignore[return-value]  # the descriptor itself, on the class
        return sum(getattr(op, self.field) for op in result.ops)


@dataclass
class RooflineResult:
    """The analytic roofline of one forward step on one device (all figures per GPU).

    ``flops``, ``bytes``, ``weight_bytes``, ``kv_bytes``, ``comm_bytes``: the step's totals, each
    the sum of that :class:`OpCost` field over ``ops``.
    """

    model: str
    device: str
    phase: str
    batch: int
    tokens: int
    context: int
    prefix: int
    tp: int
    dtype: str
    kv_dtype: str
    peak_flops_per_s: float
    bytes_per_s: float
    link_bytes_per_s: float | None
    ops: list[OpCost] = field(default_factory=list)

    flops = _OpsTotal()
    bytes = _OpsTotal()
    weight_bytes = _OpsTotal()
    kv_bytes = _OpsTotal()
    comm_bytes = _OpsTotal()

    @property
    def arithmetic_intensity(self) -> float:
        return self.flops / self.bytes

    @property
    def ridge_point(self) -> float:
        """FLOP/byte where this device's roofline turns from memory- to compute-bound."""
        return self.peak_flops_per_s / self.bytes_per_s

    @property
    def bound(self) -> str:
        """``"compute"`` when the step's total arithmetic intensity reaches the ridge point, else ``"memory"``."""
        return "compute" if self.arithmetic_intensity >= self.ridge_point else "memory"

    @property
    def time_s(self) -> float:
        """Predicted step time: the sum over operators of ``max(FLOPs/peak, bytes/bandwidth)`` + link time."""
        return sum(op.time_s for op in self.ops)

    @property
    def comm_time_s(self) -> float:
        return sum(op.time_s for op in self.ops if op.bound == "link")

    @property
    def roofline_time_s(self) -> float:
        """The whole-step bound ``max(FLOPs/peak, bytes/bandwidth)`` (≤ ``time_s``)."""
        return max(self.flops / self.peak_flops_per_s, self.bytes / self.bytes_per_s)

    @property
    def mfu(self) -> float:
        """Model FLOP utilisation: FLOPs / (time × peak)."""
        return self.flops / (self.time_s * self.peak_flops_per_s)

    @property
    def mbu(self) -> float:
        """Memory-bandwidth utilisation: bytes / (time × bandwidth)."""
        return self.bytes / (self.time_s * self.bytes_per_s)

    @property
    def new_tokens(self) -> int:
        return self.batch * (self.tokens if self.phase == "prefill" else 1)

    @property
    def tokens_per_s(self) -> float:
        """New tokens processed per second on this GPU group (prefill tokens or decoded tokens)."""
        return self.new_tokens / self.time_s

    def op(self, name: str) -> OpCost:
        """The operator called ``name`` (KeyError lists the names)."""
        for op in self.ops:
            if op.name == name:
                return op
        raise KeyError(f"no operator {name!r}; have {[o.name for o in self.ops]}")

    def summary(self) -> dict[str, Any]:
        """The headline figures (the CLI's JSON)."""
        return {
            "model": self.model, "device": self.device, "phase": self.phase, "batch": self.batch,
            "tokens": self.tokens, "context": self.context, "prefix": self.prefix, "tp": self.tp,
            "dtype": self.dtype, "kv_dtype": self.kv_dtype,
            "flops": self.flops, "bytes": self.bytes, "weight_bytes": self.weight_bytes,
            "kv_bytes": self.kv_bytes, "comm_bytes": self.comm_bytes,
            "arithmetic_intensity": self.arithmetic_intensity, "ridge_point": self.ridge_point,
            "bound": self.bound, "time_s": self.time_s, "roofline_time_s": self.roofline_time_s,
            "comm_time_s": self.comm_time_s, "mfu": self.mfu, "mbu": self.mbu,
            "tokens_per_s": self.tokens_per_s,
            "peak_flops_per_s": self.peak_flops_per_s, "bytes_per_s": self.bytes_per_s,
            "link_bytes_per_s": self.link_bytes_per_s,
        }

    def table(self) -> list[dict[str, Any]]:
        """One row per operator (for ``pandas.DataFrame``): FLOPs, bytes, AI, time, bound, share of time."""
        total = self.time_s
        return [{**op.as_dict(), "share_of_time": op.time_s / total if total else 0.0} for op in self.ops]


def _resolve(model: ModelConfig | str, gpu: Device | str) -> tuple[ModelConfig, Any]:
    m = get_model(model) if isinstance(model, str) else model
    g = get_gpu(gpu) if isinstance(gpu, str) else gpu
    return m, g


def analyze(model: ModelConfig | str, gpu: GPU | Device | str, phase: str, *, batch: int = 1,
            tokens: int = 1, context: int = 1, prefix: int = 0, tp: int = 1, dtype: str = "bf16",
            kv_dtype: str | None = None, head: bool = True) -> RooflineResult:
    """The roofline of one step of ``model`` on ``gpu`` (a catalog name, GPU or measured profile).

    Prefill: ``batch`` × ``tokens`` new tokens after ``prefix`` cached ones. Decode: ``batch``
    sequences at ``context`` tokens (``tokens`` is ignored). See the module docstring for conventions.
    """
    m, g = _resolve(model, gpu)
    peak = g.peak_flops(dtype)
    bw = float(g.hbm_bytes_per_s)
    link = link_bytes_per_s(g) if tp > 1 else None
    if tp > 1 and not link:
        raise ValueError(f"{g.name} has no GPU-to-GPU link in the catalog; cannot model tp={tp}")
    timed = []
    for op in model_ops(m, phase, batch=batch, tokens=tokens, context=context, prefix=prefix, tp=tp,
                        dtype=dtype, kv_dtype=kv_dtype, head=head):
        if op.comm_bytes:
            t, bound = op.comm_bytes / link, "link"
        else:
            tc, tm = op.flops / peak, op.bytes / bw
            t, bound = max(tc, tm), ("compute" if tc >= tm else "memory")
        # identical layers: max() of the totals equals the per-layer max() times the count
        timed.append(replace(op, time_s=t, bound=bound))
    return RooflineResult(model=m.name, device=getattr(g, "key", None) or g.name, phase=phase,
                          batch=int(batch), tokens=int(tokens) if phase == "prefill" else 1,
                          context=int(context) if phase == "decode" else int(prefix) + int(tokens),
                          prefix=int(prefix) if phase == "prefill" else 0, tp=int(tp), dtype=dtype,
                          kv_dtype=kv_dtype or dtype, peak_flops_per_s=peak, bytes_per_s=bw,
                          link_bytes_per_s=link, ops=timed)


def critical_decode_batch(model: ModelConfig | str, gpu: GPU | Device | str, *, context: int = 1,
                          tp: int = 1, dtype: str = "bf16", kv_dtype: str | None = None,
                          linear_only: bool = False, max_batch: int = 1 << 20) -> int | None:
    """Smallest decode batch whose step turns compute-bound (total AI ≥ ridge point), or None.

    ``linear_only=True`` counts only the weight matmuls (projections, MLP/experts, LM head) — the
    napkin question "when do the weights stop being the bottleneck". With the KV reads included the
    answer grows with ``context`` and is None when attention's low intensity keeps the step
    memory-bound at every batch (GQA decode attention: QKᵀ and AV do 4·heads·head_dim FLOPs per
    cached token for 2·KV-heads·head_dim·bytes-per-element bytes of K and V, so AI ≈
    2·heads / (KV-heads · bytes-per-element): 4 for Llama-3-8B in bf16, whatever the batch).
    """
    m, g = _resolve(model, gpu)
    ridge = g.peak_flops(dtype) / g.hbm_bytes_per_s
    linear = {"qkv_proj", "o_proj", "q_proj", "kv_a_proj", "q_absorb", "v_up", "mlp_up", "mlp_down",
              "moe_router", "moe_experts", "shared_experts", "lm_head"}

    def is_compute(b: int) -> bool:
        ops = model_ops(m, "decode", batch=b, context=context, tp=tp, dtype=dtype, kv_dtype=kv_dtype)
        if linear_only:
            ops = [o for o in ops if o.name in linear]
        return sum(o.flops for o in ops) / sum(o.bytes for o in ops) >= ridge

    hi = 1
    while not is_compute(hi):
        hi *= 2
        if hi > max_batch:
            return None
    lo = hi // 2  # is_compute(lo) is False (or lo == 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if is_compute(mid):
            hi = mid
        else:
            lo = mid
    return hi
