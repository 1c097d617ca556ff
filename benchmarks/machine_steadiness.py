"""Does this machine run the same work at the same speed from one window to the next? (issue 26)

Lab 05 cuts a run's quiet decode steps into windows of a few seconds (``step_ratio_windows``) and
finds the live ÷ fitted step moving by 10–15% from one 10-s window to the next, with no trend,
on a machine whose steal time stays near zero. Before any model is blamed, this benchmark asks
whether the bare machine does the same: with no server running, one process pinned to one core
repeats two fixed kernels for ``--seconds`` seconds per core and prints, per window of
``--window`` seconds, the median time of each kernel relative to the run's median:

- ``matmul``: a float32 matrix product, single-threaded (compute- and cache-bound, like a decode
  step of the course's tiny model, whose weights fit in the caches);
- ``copy``: copying a 64 MiB array (memory-bandwidth-bound, like a decode step of a large model).

It also prints the machine's busy and stolen CPU over each core's run (``/proc/stat``), so that a
slow window can be told from a busy machine. If the bare kernels move by as much as lab 05's
windows, that movement is the host's, and no fit of the engine can predict a run more closely.

    .venv/bin/python benchmarks/machine_steadiness.py [--seconds 60] [--window 5] [--cores 0,1]

Prints figures; not a test. Run it on a quiet machine (no lab, no server): it starts nothing.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one thread per kernel: the pinned core alone
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

import numpy as np  # noqa: E402
from pdlab.serve.cpucost import machine_cpu_seconds  # noqa: E402


def kernels(seed: int = 0) -> dict[str, Callable[[], None]]:
    """The two fixed kernels, each taking a few milliseconds."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((64, 1024), dtype=np.float32)
    w = rng.standard_normal((1024, 1024), dtype=np.float32)
    src = np.ones(16 * 1024 * 1024, dtype=np.float32)  # 64 MiB
    dst = np.empty_like(src)

    def matmul() -> None:
        for _ in range(8):
            a @ w

    def copy() -> None:
        np.copyto(dst, src)

    return {"matmul": matmul, "copy": copy}


def run_on_core(core: int, seconds: float, window_s: float) -> dict[str, object]:
    """Alternate the kernels on ``core`` for ``seconds``; per-window medians (s) of each kernel."""
    os.sched_setaffinity(0, {core})
    ks = kernels()
    for fn in ks.values():  # first touches, page faults
        fn()
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in ks}
    busy0, steal0 = machine_cpu_seconds()
    t0 = time.perf_counter()
    while (now := time.perf_counter()) - t0 < seconds:
        for name, fn in ks.items():
            s = time.perf_counter()
            fn()
            samples[name].append((s - t0, time.perf_counter() - s))
    busy1, steal1 = machine_cpu_seconds()
    span = now - t0
    out: dict[str, object] = {"core": core, "span_s": span, "busy_cores": (busy1 - busy0) / span,
                              "steal_cores": (steal1 - steal0) / span}
    for name, rows in samples.items():
        at = np.array([r[0] for r in rows])
        dt = np.array([r[1] for r in rows])
        n_win = int(span // window_s)
        meds = [float(np.median(dt[(at >= k * window_s) & (at < (k + 1) * window_s)])) for k in range(n_win)
                if np.any((at >= k * window_s) & (at < (k + 1) * window_s))]
        out[name] = {"run_median_s": float(np.median(dt)), "window_medians_s": meds, "calls": int(dt.size)}
    return out


def report(res: dict[str, object]) -> None:
    print(f"core {res['core']}: {res['span_s']:.0f} s; machine busy {res['busy_cores']:.2f} cores "
          f"(this process ≈ 1), stolen {res['steal_cores']:.3f} cores")
    for name in ("matmul", "copy"):
        r = res[name]
        rel = np.array(r["window_medians_s"]) / r["run_median_s"]
        print(f"  {name:<6} median {r['run_median_s'] * 1e3:7.2f} ms over {r['calls']} calls; window ÷ run median: "
              f"{rel.min():.2f}–{rel.max():.2f} (highest ÷ lowest window {rel.max() / rel.min():.2f}×, "
              f"std {rel.std():.3f})")
        print("         windows: " + " ".join(f"{x:.2f}" for x in rel))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="run time per core (s)")
    ap.add_argument("--window", type=float, default=5.0, help="window length (s)")
    ap.add_argument("--cores", default=",".join(str(c) for c in sorted(os.sched_getaffinity(0))),
                    help="cores to run on, one after the other (comma-separated)")
    args = ap.parse_args()
    if args.window <= 0 or args.seconds < 2 * args.window:
        raise SystemExit(f"need a positive window and at least two windows, got --seconds {args.seconds} "
                         f"--window {args.window}")
    cores = [int(c) for c in args.cores.split(",")]
    unknown = sorted(set(cores) - os.sched_getaffinity(0))
    if unknown:
        raise SystemExit(f"cores {unknown} are not available to this process ({sorted(os.sched_getaffinity(0))})")
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    for core in cores:
        report(run_on_core(core, args.seconds, args.window))


if __name__ == "__main__":
    main()
