"""CUDA copies on a GPU machine: device→device, pinned and pageable host↔device, GPU→GPU.

The same sweep as the two-process transports, for the copies a disaggregated server makes on
one node (KV offload to host DRAM, staging for a NIC without GPUDirect, NVLink peer copies).
Timed with CUDA events, verified by comparing the destination with the source. On a machine
without CUDA, :func:`cuda_status` says why and :func:`cuda_copy_benchmark` raises
:class:`pdlab.transfer.transports.TransportUnavailable`.
"""

from __future__ import annotations

import statistics

from pdlab.transfer.kvbuffer import layout_for_size
from pdlab.transfer.transports import TransportUnavailable, transport_status

__all__ = ["cuda_status", "cuda_copy_benchmark", "CUDA_KINDS"]

#: Copy kinds measured (``cuda-p2p`` only with two or more GPUs).
CUDA_KINDS = ("cuda-d2d", "cuda-h2d-pinned", "cuda-h2d-pageable", "cuda-d2h-pinned", "cuda-d2h-pageable",
              "cuda-p2p")


def cuda_status() -> tuple[bool, str]:
    """``(available, reason)``: a CUDA build of torch and at least one visible GPU."""
    return transport_status("cuda")


def cuda_copy_benchmark(sizes: list[int], repeats: int = 5):
    """Measure every CUDA copy kind at every size; returns :class:`pdlab.transfer.bench.Measurement` rows."""
    ok, why = cuda_status()
    if not ok:
        raise TransportUnavailable(f"transport 'cuda' is unavailable: {why}")
    import torch

    from pdlab.transfer.bench import Measurement, VerificationError

    n_gpus = torch.cuda.device_count()
    results = []
    # (kind, where the source lives, where the destination lives)
    plan = [("cuda-d2d", "cuda:0", "cuda:0"), ("cuda-h2d-pinned", "pinned", "cuda:0"),
            ("cuda-h2d-pageable", "pageable", "cuda:0"), ("cuda-d2h-pinned", "cuda:0", "pinned"),
            ("cuda-d2h-pageable", "cuda:0", "pageable")]
    if n_gpus >= 2:
        plan.append(("cuda-p2p", "cuda:0", "cuda:1"))

    def alloc(where: str, size: int, fill=None):
        t = torch.empty(size, dtype=torch.uint8, pin_memory=(where == "pinned"),
                        device="cpu" if where in ("pinned", "pageable") else where)
        if fill is not None:
            t.copy_(fill)
        return t

    for size in sizes:
        reference = torch.randint(0, 256, (size,), dtype=torch.uint8)
        for kind, src_at, dst_at in plan:
            src, dst = alloc(src_at, size, reference), alloc(dst_at, size)
            times = []
            for rep in range(repeats + 1):  # the first copy warms up
                dst.zero_()
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                dst.copy_(src, non_blocking=True)
                end.record()
                torch.cuda.synchronize()
                if rep:
                    times.append(start.elapsed_time(end) / 1e3)
                if not torch.equal(dst.cpu(), reference):
                    raise VerificationError(f"{kind}: copied bytes differ from the source at {size} B")
            med = statistics.median(times)
            results.append(Measurement(kind, size, med, min(times), max(times), size / med, size / max(times),
                                       size / min(times), len(times), True, layout_for_size(size).as_dict()))
            del src, dst
        torch.cuda.empty_cache()
    return results
