"""CUDA copies on a GPU machine: device→device, pinned and pageable host↔device, GPU→GPU.

The same sweep as the two-process transports, for the copies a disaggregated server makes on
one node (KV offload to host DRAM, staging for a NIC without GPUDirect, NVLink peer copies).
Timed with CUDA events, verified by comparing the destination with the source. On a machine
without CUDA, :func:`cuda_status` says why and :func:`cuda_copy_benchmark` raises
:class:`pdlab.transfer.transports.TransportUnavailable`.

:func:`cuda_ipc_benchmark` is the hand-off of a 1P1D pair on one GPU: a second process (the
"decode instance") opens the "prefill instance's" KV buffer through CUDA IPC (torch shares a
CUDA tensor through a ``torch.multiprocessing`` queue as an IPC memory handle) and copies it into
its own buffer; the copy is timed with CUDA events in the receiving process and verified by the
CRC-32 (:func:`pdlab.transfer.kvbuffer.checksum`) of what arrived against the sender's.
"""

from __future__ import annotations

import statistics
from typing import Any

from pdlab.transfer.kvbuffer import checksum, layout_for_size, make_payload
from pdlab.transfer.measurement import Measurement, VerificationError
from pdlab.transfer.transports import TransportUnavailable, transport_status

__all__ = ["cuda_status", "cuda_copy_benchmark", "cuda_ipc_benchmark", "CUDA_KINDS"]

#: Copy kinds measured (``cuda-p2p`` only with two or more GPUs; ``cuda-ipc`` by :func:`cuda_ipc_benchmark`).
CUDA_KINDS = ("cuda-d2d", "cuda-h2d-pinned", "cuda-h2d-pageable", "cuda-d2h-pinned", "cuda-d2h-pageable",
              "cuda-p2p", "cuda-ipc")


def cuda_status() -> tuple[bool, str]:
    """``(available, reason)``: a CUDA build of torch and at least one visible GPU."""
    return transport_status("cuda")


def cuda_copy_benchmark(sizes: list[int], repeats: int = 5):
    """Measure every CUDA copy kind at every size; returns :class:`pdlab.transfer.measurement.Measurement` rows."""
    ok, why = cuda_status()
    if not ok:
        raise TransportUnavailable(f"transport 'cuda' is unavailable: {why}")
    import torch

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


def _ipc_receiver(inbox: Any, outbox: Any) -> None:
    """Child process of :func:`cuda_ipc_benchmark`: copy each shared tensor, report times and CRC."""
    import torch

    torch.cuda.set_device(0)
    while True:
        msg = inbox.get()
        if msg is None:
            break
        try:
            src = msg["tensor"]  # mapped from the other process through cudaIpcOpenMemHandle
            dst = torch.empty(msg["size"], dtype=torch.uint8, device="cuda:0")
            times = []
            for rep in range(msg["repeats"] + 1):  # the first copy warms up
                dst.zero_()
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                dst.copy_(src)
                end.record()
                torch.cuda.synchronize()
                if rep:
                    times.append(start.elapsed_time(end) / 1e3)
            crc = checksum(dst.cpu().numpy())
            del src, dst
            torch.cuda.synchronize()
            outbox.put({"times": times, "crc": crc})
        except Exception as exc:  # reported to the parent, which raises
            outbox.put({"error": f"{type(exc).__name__}: {exc}"})


def cuda_ipc_benchmark(sizes: list[int], repeats: int = 5, *, timeout_s: float = 300.0):
    """Copy a KV buffer from this process's GPU memory into a second process's, through CUDA IPC.

    Returns :class:`pdlab.transfer.measurement.Measurement` rows (transport ``cuda-ipc``); raises
    :class:`pdlab.transfer.measurement.VerificationError` when the CRC of what arrived differs. The
    child process is started here and stopped (by its PID) on every path.
    """
    ok, why = cuda_status()
    if not ok:
        raise TransportUnavailable(f"transport 'cuda' is unavailable: {why}")
    import queue

    import torch
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_ipc_receiver, args=(inbox, outbox), daemon=True)
    child.start()
    results = []
    try:
        for size in sizes:
            payload = make_payload(size)
            crc = checksum(payload)
            src = torch.from_numpy(payload).to("cuda:0")
            torch.cuda.synchronize()
            inbox.put({"tensor": src, "size": size, "repeats": repeats})
            try:
                reply = outbox.get(timeout=timeout_s)
            except queue.Empty:
                raise TimeoutError(f"cuda-ipc: no reply from the receiving process within {timeout_s:.0f} s") from None
            if "error" in reply:
                raise RuntimeError(f"cuda-ipc receiver failed at {size} B: {reply['error']}")
            if reply["crc"] != crc:
                raise VerificationError(f"cuda-ipc: CRC {reply['crc']:#010x} arrived, {crc:#010x} sent at {size} B")
            times = reply["times"]
            med = statistics.median(times)
            results.append(Measurement("cuda-ipc", size, med, min(times), max(times), size / med, size / max(times),
                                       size / min(times), len(times), True, layout_for_size(size).as_dict()))
            del src, payload
            torch.cuda.empty_cache()
    finally:
        inbox.put(None)
        child.join(timeout=30)
        if child.is_alive():
            child.terminate()
            child.join(timeout=10)
    return results
