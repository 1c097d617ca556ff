"""Measure this device's roofline with torch: matmul FLOP/s, memory bandwidth, a real layer forward.

On a GPU every timing uses ``torch.cuda.Event`` pairs after warm-up runs, with
``torch.cuda.synchronize()`` before reading them; on the CPU ``time.perf_counter``. Each figure is
the best of a few repeats (the least disturbed run, the usual practice for peaks), and the layer
points use the same statistic so they are comparable with the peaks.

- Matmul: square ``n × n`` products, ``2 n³`` FLOPs, for each dtype the device runs fast
  (CPU: fp32, plus bf16 at a small size — CPUs without AVX-512-BF16 emulate it very slowly;
  GPU: bf16, fp16, fp32 and fp8 through ``torch._scaled_mm`` where the GPU supports it).
- Memory: a large ``copy_`` (counted as read + write, 2 × size) and a read-only reduction; the
  bandwidth is the larger of the two. Sizes exceed the last-level cache.
- Layer: one Llama-shaped decoder layer (RMSNorm, fused QKV, SDPA attention with GQA and a KV
  cache, output projection, SiLU-gated MLP) at prefill and decode shapes. Each point is placed at
  the analytic arithmetic intensity of :func:`pdlab.roofline.analytic.layer_ops` for the same shape.

A profile is a JSON file (device kind and name, torch version, date, figures — no host names)
under ``data/profiles/``; :func:`load_device_profile` reads it back as a :class:`DeviceProfile`, which the
analytic model accepts in place of a catalog GPU.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pdlab.hardware import detect_device, resolve_device
from pdlab.models import ModelConfig
from pdlab.paths import data_dir

__all__ = [
    "LayerShape",
    "LayerPoint",
    "DeviceProfile",
    "SIZES",
    "time_fn",
    "torch_dtype",
    "TorchLayer",
    "measure_matmul",
    "with_layer_sized_bandwidth",
    "measure_bandwidth",
    "measure_layer",
    "measure_device",
    "match_catalog_gpu",
    "save_device_profile",
    "load_device_profile",
    "list_profiles",
    "profiles_dir",
]

SCHEMA = 1


@dataclass(frozen=True)
class LayerShape:
    """A Llama-shaped decoder layer (sizes in elements)."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    name: str = "layer"

    def to_model(self) -> ModelConfig:
        """A one-layer :class:`ModelConfig` of this shape (for the analytic costs)."""
        return ModelConfig(name=self.name, hidden_size=self.hidden, num_layers=1, num_heads=self.heads,
                           num_kv_heads=self.kv_heads, head_dim=self.head_dim,
                           intermediate_size=self.ffn, vocab_size=1)

    @property
    def params(self) -> int:
        """Weights of the layer (norms left out)."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        return h * (q + 2 * kv) + q * h + 3 * h * self.ffn


# Sizes per run profile and device kind. Points: (phase, batch, tokens, context).
SIZES: dict[str, dict[str, dict[str, Any]]] = {
    "cpu": {
        "smoke": dict(matmul={"fp32": [256, 512], "bf16": [64]}, bandwidth_mib=48, repeats=2,
                      layer=LayerShape(1024, 8, 2, 128, 2816, "llama-shaped-1k"),
                      points=[("prefill", 1, 32, 32), ("decode", 1, 1, 128), ("decode", 4, 1, 128)],
                      dtype="fp32"),
        "ci": dict(matmul={"fp32": [512, 1024, 1536], "bf16": [128]}, bandwidth_mib=128, repeats=3,
                   layer=LayerShape(1024, 8, 2, 128, 4096, "llama-shaped-1k"),
                   points=[("prefill", 1, 64, 64), ("prefill", 1, 256, 256), ("decode", 1, 1, 256),
                           ("decode", 8, 1, 256)],
                   dtype="fp32"),
        "full": dict(matmul={"fp32": [1024, 2048, 3072], "bf16": [256]}, bandwidth_mib=512, repeats=5,
                     layer=LayerShape(2048, 16, 4, 128, 5632, "llama-shaped-2k"),
                     points=[("prefill", 1, 128, 128), ("prefill", 1, 512, 512), ("prefill", 1, 1024, 1024),
                             ("decode", 1, 1, 512), ("decode", 8, 1, 512), ("decode", 32, 1, 512)],
                     dtype="fp32"),
    },
    "cuda": {
        "smoke": dict(matmul={"bf16": [2048], "fp16": [2048], "fp32": [2048], "fp8": [2048]},
                      bandwidth_mib=256, repeats=5,
                      layer=LayerShape(2048, 16, 4, 128, 5632, "llama-shaped-2k"),
                      points=[("prefill", 1, 512, 512), ("decode", 1, 1, 512), ("decode", 32, 1, 512)],
                      dtype="bf16"),
        "ci": dict(matmul={"bf16": [4096], "fp16": [4096], "fp32": [4096], "fp8": [4096]},
                   bandwidth_mib=1024, repeats=10,
                   layer=LayerShape(4096, 32, 8, 128, 14336, "llama-3-8b-layer"),
                   points=[("prefill", 1, 512, 512), ("prefill", 1, 2048, 2048), ("decode", 1, 1, 1024),
                           ("decode", 64, 1, 1024)],
                   dtype="bf16"),
        "full": dict(matmul={"bf16": [4096, 8192], "fp16": [4096, 8192], "fp32": [4096, 8192],
                             "fp8": [4096, 8192]},
                     bandwidth_mib=2048, repeats=20,
                     layer=LayerShape(4096, 32, 8, 128, 14336, "llama-3-8b-layer"),
                     points=[("prefill", 1, 256, 256), ("prefill", 1, 1024, 1024), ("prefill", 1, 4096, 4096),
                             ("prefill", 4, 2048, 2048), ("decode", 1, 1, 1024), ("decode", 16, 1, 1024),
                             ("decode", 64, 1, 1024), ("decode", 256, 1, 1024), ("decode", 256, 1, 128)],
                     dtype="bf16"),
    },
}


def time_fn(fn: Callable[[], Any], device: str, *, warmup: int = 1, repeats: int = 3) -> list[float]:
    """Seconds per call of ``fn``, one entry per repeat, after ``warmup`` untimed calls.

    CUDA: a ``torch.cuda.Event`` pair around each call, synchronised before reading; CPU: perf_counter.
    """
    import torch

    for _ in range(warmup):
        fn()
    times = []
    if device == "cuda":
        torch.cuda.synchronize()
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return times


_TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def torch_dtype(name: str):
    """The torch dtype of a catalog dtype name (``fp32``, ``bf16``, ``fp16``)."""
    import torch

    return getattr(torch, _TORCH_DTYPES[name])


def _matmul_fn(n: int, dtype: str, device: str) -> Callable[[], Any] | None:
    import torch

    gen = torch.Generator(device=device).manual_seed(0)
    if dtype == "fp8":
        if device != "cuda" or not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
            return None
        if torch.cuda.get_device_capability() < (8, 9):
            return None
        a = torch.randn(n, n, device=device, generator=gen).to(torch.float8_e4m3fn)
        b = torch.randn(n, n, device=device, generator=gen).to(torch.float8_e4m3fn).t()  # column-major
        one = torch.ones((), device=device)
        fn = lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
        try:
            fn()
        except (RuntimeError, TypeError):
            return None
        return fn
    td = torch_dtype(dtype)
    a = torch.randn(n, n, device=device, generator=gen, dtype=torch.float32).to(td)
    b = torch.randn(n, n, device=device, generator=gen, dtype=torch.float32).to(td)
    return lambda: a @ b


def measure_matmul(device: str, sizes: dict[str, list[int]], repeats: int = 3) -> dict[str, Any]:
    """Best matmul FLOP/s per dtype: ``{"flops_per_s": {dtype: F}, "detail": [{dtype, n, flops_per_s}]}``."""
    import torch

    best: dict[str, float] = {}
    detail = []
    old_tf32 = torch.backends.cuda.matmul.allow_tf32 if device == "cuda" else None
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32, not TF32
    try:
        for dtype, ns in sizes.items():
            for n in ns:
                fn = _matmul_fn(n, dtype, device)
                if fn is None:
                    continue
                times = time_fn(fn, device, warmup=2 if device == "cuda" else 1, repeats=repeats)
                rate = 2 * n ** 3 / min(times)
                detail.append({"dtype": dtype, "n": n, "flops_per_s": rate,
                               "median_flops_per_s": 2 * n ** 3 / statistics.median(times)})
                best[dtype] = max(best.get(dtype, 0.0), rate)
    finally:
        if device == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = old_tf32
    return {"flops_per_s": best, "detail": detail}


def measure_bandwidth(device: str, mib: int = 256, repeats: int = 3) -> dict[str, float]:
    """Memory bandwidth in bytes/s: ``copy`` (2 × size per copy), ``read`` (a sum) and ``best``."""
    import torch

    n = mib * 2 ** 20 // 4
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    warm = 2 if device == "cuda" else 1
    t_copy = min(time_fn(lambda: dst.copy_(src), device, warmup=warm, repeats=repeats))
    t_read = min(time_fn(lambda: src.sum(), device, warmup=warm, repeats=repeats))
    copy_bw, read_bw = 2 * n * 4 / t_copy, n * 4 / t_read
    return {"copy": copy_bw, "read": read_bw, "best": max(copy_bw, read_bw), "size_bytes": float(n * 4)}


def with_layer_sized_bandwidth(device: str, bw: dict[str, float], points: list[LayerPoint],
                               repeats: int = 3) -> dict[str, float]:
    """``bw`` (:func:`measure_bandwidth` of a large buffer) plus the bandwidth of a buffer the size of
    the layer's largest decode step (``at_layer_size``, bytes/s; ``layer_size_bytes``); ``best``
    becomes the faster of the two and ``large_buffer_best`` keeps the large buffer's.

    The memory roof is what the layer's own bytes can stream at. Where the last-level cache holds
    the layer, that is the cache's bandwidth, not DRAM's: on a 2-vCPU Xeon with a 300 MiB L3
    (2026-12-05) the ci layer's 59 MiB decode step ran at 41 GB/s against 23 GB/s for a 128 MiB
    read, above a roof drawn from the large buffer. Where it does not fit (GPU L2, a small L3), the
    two numbers agree."""
    decode_bytes = max((p.bytes for p in points if p.phase == "decode"), default=0.0)
    if not decode_bytes:
        return dict(bw)
    at_layer = measure_bandwidth(device, max(1, round(decode_bytes / 2 ** 20)), max(repeats, 10))  # cheap: best of 10
    return {**bw, "large_buffer_best": bw["best"], "at_layer_size": at_layer["best"],
            "layer_size_bytes": at_layer["size_bytes"], "best": max(bw["best"], at_layer["best"])}


class TorchLayer:
    """One Llama-shaped decoder layer in plain torch (weights random, no RoPE)."""

    def __init__(self, shape: LayerShape, device: str, dtype: str):
        import torch

        gen = torch.Generator(device=device).manual_seed(0)
        td = torch_dtype(dtype)
        h, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
        scale = h ** -0.5

        def w(i: int, o: int):
            return (torch.randn(i, o, device=device, generator=gen) * scale).to(td)

        self.shape, self.device, self.dtype = shape, device, td
        self.w_qkv, self.w_o = w(h, q + 2 * kv), w(q, h)
        self.w_gate_up, self.w_down = w(h, 2 * shape.ffn), w(shape.ffn, h)
        self.n1 = torch.ones(h, device=device, dtype=td)
        self.n2 = torch.ones(h, device=device, dtype=td)

    def _norm(self, x, weight):
        import torch

        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight

    def forward(self, x, k_cache, v_cache, start: int, causal: bool):
        """``x``: [B, S, h]; caches [B, kv_heads, max_len, head_dim]; writes positions start..start+S."""
        import torch
        import torch.nn.functional as F

        s = self.shape
        b, t, _ = x.shape
        q_dim, kv_dim = s.heads * s.head_dim, s.kv_heads * s.head_dim
        qkv = self._norm(x, self.n1) @ self.w_qkv
        q = qkv[..., :q_dim].view(b, t, s.heads, s.head_dim).transpose(1, 2)
        k = qkv[..., q_dim:q_dim + kv_dim].view(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
        v = qkv[..., q_dim + kv_dim:].view(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
        k_cache[:, :, start:start + t] = k
        v_cache[:, :, start:start + t] = v
        keys, values = k_cache[:, :, :start + t], v_cache[:, :, :start + t]
        attn = F.scaled_dot_product_attention(q, keys, values, is_causal=causal, enable_gqa=True)
        x = x + attn.transpose(1, 2).reshape(b, t, q_dim) @ self.w_o
        gate, up = (self._norm(x, self.n2) @ self.w_gate_up).chunk(2, dim=-1)
        return x + (torch.nn.functional.silu(gate) * up) @ self.w_down


@dataclass
class LayerPoint:
    """One measured layer forward placed on the roofline (per layer, one device)."""

    phase: str
    batch: int
    tokens: int
    context: int
    flops: float
    bytes: float
    arithmetic_intensity: float
    time_s: float
    median_time_s: float
    achieved_flops_per_s: float
    roofline_flops_per_s: float = 0.0
    predicted_time_s: float = 0.0

    @property
    def fraction_of_roofline(self) -> float:
        """Achieved FLOP/s over the attainable FLOP/s at this AI (≤ 1 when under the roof)."""
        return self.achieved_flops_per_s / self.roofline_flops_per_s if self.roofline_flops_per_s else math.nan


def measure_layer(device: str, shape: LayerShape, points: list[tuple[str, int, int, int]], *,
                  dtype: str = "fp32", repeats: int = 3) -> list[LayerPoint]:
    """Time one layer forward at each ``(phase, batch, tokens, context)``; analytic FLOPs/bytes beside it.

    Prefill points run ``tokens`` new tokens with no cached prefix (``context`` = ``tokens``); decode
    points run one token per sequence against ``context`` tokens (KV cache filled with random values).
    """
    import torch

    from pdlab.roofline.analytic import layer_ops

    layer = TorchLayer(shape, device, dtype)
    model = shape.to_model()
    out = []
    gen = torch.Generator(device=device).manual_seed(1)
    for phase, batch, tokens, context in points:
        new = tokens if phase == "prefill" else 1
        total = tokens if phase == "prefill" else context
        cache_shape = (batch, shape.kv_heads, total, shape.head_dim)
        k_cache = torch.randn(cache_shape, device=device, generator=gen).to(layer.dtype)
        v_cache = torch.randn(cache_shape, device=device, generator=gen).to(layer.dtype)
        x = torch.randn(batch, new, shape.hidden, device=device, generator=gen).to(layer.dtype)
        start = 0 if phase == "prefill" else context - 1

        def run(x=x, k=k_cache, v=v_cache, start=start, causal=phase == "prefill"):
            with torch.inference_mode():
                return layer.forward(x, k, v, start, causal)

        times = time_fn(run, device, warmup=2 if device == "cuda" else 1, repeats=repeats)
        ops = layer_ops(model, phase, batch=batch, tokens=tokens, context=context, dtype=dtype)
        flops, nbytes = sum(o.flops for o in ops), sum(o.bytes for o in ops)
        best = min(times)
        out.append(LayerPoint(phase, batch, tokens if phase == "prefill" else 1, context, flops, nbytes,
                              flops / nbytes, best, statistics.median(times), flops / best))
        del k_cache, v_cache, x
    return out


_CATALOG_PATTERNS = [("h200", "h200"), ("b200", "b200"), ("h800", "h800"), ("h100 pcie", "h100-pcie"),
                     ("h100", "h100-sxm"), ("a800", "a800"), ("a100-sxm4-40gb", "a100-40gb"),
                     ("a100 40gb", "a100-40gb"), ("a100", "a100-80gb"), ("l40s", "l40s"), ("a10g", "a10g"),
                     ("l4", "l4")]


def match_catalog_gpu(device_name: str) -> str | None:
    """The catalog key for a CUDA device name (``"NVIDIA H100 80GB HBM3"`` → ``"h100-sxm"``), or None."""
    name = device_name.lower().replace("_", " ")
    for pattern, key in _CATALOG_PATTERNS:
        if pattern in name or pattern.replace(" ", "-") in name:
            if key == "l4" and "l40" in name:
                continue
            return key
    return None


@dataclass
class DeviceProfile:
    """The measured roofline of one device; usable wherever the analysis takes a GPU."""

    kind: str
    name: str
    torch: str
    date: str
    size: str
    matmul_flops_per_s: dict[str, float]
    memory_bytes_per_s: float
    memory: dict[str, float] = field(default_factory=dict)
    matmul_detail: list[dict[str, Any]] = field(default_factory=list)
    layer: dict[str, Any] = field(default_factory=dict)
    layer_points: list[LayerPoint] = field(default_factory=list)
    catalog_gpu: str | None = None
    count: int = 1
    seconds: float = 0.0
    schema: int = SCHEMA

    # --- the interface pdlab.roofline.analytic expects from a device ---
    @property
    def key(self) -> str:
        return f"measured:{self.name}"

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.memory_bytes_per_s

    nvlink_bytes_per_s = None
    pcie_gen = None

    def peak_flops(self, dtype: str = "bf16") -> float:
        """Measured matmul FLOP/s for ``dtype``; ValueError when it was not measured."""
        try:
            return self.matmul_flops_per_s[dtype.lower()]
        except KeyError:
            raise ValueError(f"profile of {self.name} has no {dtype} matmul figure; "
                             f"measured: {', '.join(self.matmul_flops_per_s)}") from None

    def ridge_point(self, dtype: str = "bf16") -> float:
        return self.peak_flops(dtype) / self.memory_bytes_per_s

    @property
    def layer_dtype(self) -> str:
        return self.layer.get("dtype", "bf16")

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["layer_points"] = [asdict(p) for p in self.layer_points]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DeviceProfile:
        d = dict(d)
        d["layer_points"] = [LayerPoint(**p) for p in d.get("layer_points", [])]
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})


def measure_device(device: str = "auto", size: str | None = None, *,
                   progress: Callable[[str], None] | None = None) -> DeviceProfile:
    """Measure matmul peaks, memory bandwidth and layer points on ``device``; return a profile.

    ``size``: ``"smoke"`` (seconds), ``"ci"`` (CPU: well under a minute on 2 cores) or ``"full"``;
    default ``"full"`` on a GPU and ``"ci"`` on the CPU.
    """
    import torch

    from pdlab.roofline.analytic import analyze, attainable_flops

    t0 = time.perf_counter()
    device = resolve_device(device)
    size = size or ("full" if device == "cuda" else "ci")
    if size not in SIZES[device]:
        raise ValueError(f"size must be one of {', '.join(SIZES[device])}, got {size!r}")
    cfg = SIZES[device][size]
    say = progress or (lambda msg: None)
    info = detect_device()
    name = torch.cuda.get_device_name(0) if device == "cuda" else str(info["name"])
    say(f"matmul peaks on {name} ...")
    mm = measure_matmul(device, cfg["matmul"], cfg["repeats"])
    say("memory bandwidth ...")
    bw = measure_bandwidth(device, cfg["bandwidth_mib"], cfg["repeats"])
    say(f"layer {cfg['layer'].name} at {len(cfg['points'])} shapes ...")
    points = measure_layer(device, cfg["layer"], cfg["points"], dtype=cfg["dtype"], repeats=cfg["repeats"])
    bw = with_layer_sized_bandwidth(device, bw, points, cfg["repeats"])
    profile = DeviceProfile(
        kind=device, name=name, torch=torch.__version__,
        date=_dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), size=size,
        matmul_flops_per_s=mm["flops_per_s"], memory_bytes_per_s=bw["best"], memory=bw,
        matmul_detail=mm["detail"], layer={**asdict(cfg["layer"]), "dtype": cfg["dtype"]},
        layer_points=points, catalog_gpu=match_catalog_gpu(name) if device == "cuda" else None,
        count=torch.cuda.device_count() if device == "cuda" else int(info.get("count") or 1),
    )
    model = cfg["layer"].to_model()
    peak = profile.peak_flops(cfg["dtype"])
    for p in points:
        p.roofline_flops_per_s = attainable_flops(p.arithmetic_intensity, peak, profile.memory_bytes_per_s)
        p.predicted_time_s = analyze(model, profile, p.phase, batch=p.batch, tokens=p.tokens,
                                     context=p.context, dtype=cfg["dtype"], head=False).time_s
    profile.seconds = time.perf_counter() - t0
    return profile


def profiles_dir() -> Path:
    """``data/profiles/`` of this repository."""
    return data_dir() / "profiles"


def save_device_profile(profile: DeviceProfile, path: str | Path) -> Path:
    """Write a profile as JSON (creates the folder); return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile.as_dict(), indent=2) + "\n")
    return path


def load_device_profile(path: str | Path) -> DeviceProfile:
    """Read a profile JSON written by :func:`save_device_profile` (``pdlab roofline measure --out``)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no profile at {path}")
    d = json.loads(path.read_text())
    if d.get("schema") != SCHEMA:
        raise ValueError(f"{path}: profile schema {d.get('schema')!r}, expected {SCHEMA}")
    return DeviceProfile.from_dict(d)


def _is_roofline_profile(path: Path) -> bool:
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(d, dict) and d.get("schema") == SCHEMA and "matmul_flops_per_s" in d


def list_profiles(directory: str | Path | None = None) -> list[Path]:
    """Roofline profile JSON files under ``data/profiles/`` (or ``directory``), sorted; empty when none.

    Other JSON files there (latency profiles, ``*-gpu-profile.json``) are left out.
    """
    directory = Path(directory) if directory else profiles_dir()
    return sorted(p for p in directory.glob("*.json") if _is_roofline_profile(p)) if directory.is_dir() else []
