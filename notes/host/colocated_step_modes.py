"""Why does the colocated decode step jump between two levels within one run?

Lab 05's colocated server (the tiny course model, vLLM's CPU engine with its OpenMP threads bound
to both cores, ``VLLM_CPU_OMP_THREADS_BIND=0-1``) shares those two cores with its own API server
and with the benchmark client. In lab 05 runs its token gaps, cut into 5-s
windows, sat at one level in some windows and at about twice it in others (``step_ratio_windows``:
highest ÷ lowest window 1.5–1.9× within one run; the disaggregated decode role, alone on its
core, 1.03–1.09×). This benchmark runs lab 05's ShareGPT workload at one rate in two layouts
that differ in where the engine's threads run, and samples, every ``--sample`` seconds, the CPU
seconds of the engine, of the API server and of this client (``/proc``, psutil):

- ``A, both cores``: lab 05's colocated layout (engine threads on cores 0-1; API server and client
  float over both);
- ``B, engine alone on core 0``: the engine bound to core 0 (one thread), the API server and this
  client pinned to core 1 (``pdlab.process.pinned``).

For each layout it prints the token gaps per 1-s window (median, and how many windows sit above
1.5× the run's fastest-quartile window), and the mean CPU of each process in the slow and the fast
windows. If A's slow windows are where the API server and the client take CPU and B's steps are
one level, the two levels are the engine's threads waiting for cores its co-runners hold.

    .venv/bin/python notes/host/colocated_step_modes.py [--rate 3.0] [--requests 60]

Prints figures; not a test. Starts and stops its own servers (nothing is left running).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import threading
import time

import numpy as np
import psutil
from pdlab.process import free_port, pinned
from pdlab.serve.client.bench import build_workload, run_bench
from pdlab.serve.engines import colocated
from pdlab.serve.engines.modelbuild import tiny_model_dir
from pdlab.serve.measure.cpucost import machine_cpu_seconds, tree_processes


class Sampler(threading.Thread):
    """Cumulative CPU seconds of labelled process sets every ``period_s`` (monotonic clock)."""

    def __init__(self, roles: dict[str, list[psutil.Process]], period_s: float):
        super().__init__(daemon=True)
        self.roles, self.period_s = roles, period_s
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._halt = threading.Event()

    def _read(self) -> dict[str, float]:
        """CPU seconds (user + system, all threads) of each role's own processes, not their trees."""
        out = {}
        for role, procs in self.roles.items():
            total = 0.0
            for proc in procs:
                with contextlib.suppress(psutil.NoSuchProcess):
                    t = proc.cpu_times()
                    total += t.user + t.system
            out[role] = total
        # the whole machine (/proc/stat, all cores): busy time, and time the hypervisor gave our vCPUs to others
        out["machine busy"], out["steal"] = machine_cpu_seconds()
        return out

    def run(self) -> None:
        while not self._halt.is_set():
            self.samples.append((time.perf_counter(), self._read()))
            self._halt.wait(self.period_s)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def _gap_windows(records, t0: float, t1: float, window_s: float = 1.0) -> list[tuple[float, float, int]]:
    """(window start, median token gap in s, gaps) of every 1-s window with at least 10 gaps."""
    mids, gaps = [], []
    for r in records:
        if r.ok and r.token_times_s and len(r.token_times_s) > 1:
            t = np.asarray(r.token_times_s, dtype=float)
            mids.append(0.5 * (t[1:] + t[:-1]))
            gaps.append(np.diff(t))
    mids, gaps = np.concatenate(mids), np.concatenate(gaps)
    out = []
    for a in np.arange(t0, t1, window_s):
        sel = (mids >= a) & (mids < a + window_s)
        if sel.sum() >= 10:
            out.append((float(a), float(np.median(gaps[sel])), int(sel.sum())))
    return out


def _cpu_in(samples, a: float, b: float) -> dict[str, float]:
    """Cores used by each role between times a and b (from the nearest samples inside)."""
    inside = [(t, s) for t, s in samples if a <= t <= b]
    if len(inside) < 2:
        return {}
    (ta, sa), (tb, sb) = inside[0], inside[-1]
    return {role: (sb[role] - sa[role]) / (tb - ta) for role in sa}


def run_layout(model_dir, label: str, rate: float, n: int, period_s: float, engine_alone: bool) -> None:
    kw = dict(max_model_len=2048 + 80, max_num_seqs=128, max_num_batched_tokens=2048)
    with colocated(model_dir, port=free_port(), cores="0" if engine_alone else None, **kw) as dep:
        api, *engine = tree_processes(dep.servers[0].process.pid)
        roles = {"engine": engine, "API server": [api], "client": [psutil.Process()]}
        layout = pinned([api.pid, os.getpid()], {1}) if engine_alone else contextlib.nullcontext()
        reqs = build_workload("sharegpt", rate_rps=rate, n=n, seed=0, max_prompt_tokens=1024, max_output_tokens=64)
        with layout:
            run_bench(dep.url, reqs[:8], progress=False, seed=99)   # warm-up, not measured
            sampler = Sampler(roles, period_s)
            sampler.start()
            try:
                res = run_bench(dep.url, reqs, progress=False, seed=0)
            finally:
                sampler.stop()
    recs = res.records
    t0 = min(r.arrival_s for r in recs)
    t1 = max(r.finish_s for r in recs if r.finish_s is not None)
    wins = _gap_windows(recs, t0, t1)
    med = np.array([g for _, g, _ in wins])
    fast = float(np.percentile(med, 25))
    slow = med > 1.5 * fast
    print(f"\n{label}: {sum(r.ok for r in recs)}/{len(recs)} ok, {len(wins)} one-second windows; median token gap "
          f"per window {med.min() * 1e3:.1f}–{med.max() * 1e3:.1f} ms (fastest quartile {fast * 1e3:.1f} ms); "
          f"{int(slow.sum())} windows above 1.5× it")
    print("  gaps per window (ms): " + " ".join(f"{g * 1e3:.0f}" for g in med))
    for name, sel in (("slow windows", slow), ("fast windows", ~slow)):
        cpus = [_cpu_in(sampler.samples, a, a + 1.0) for (a, _, _), s in zip(wins, sel, strict=True) if s]
        cpus = [c for c in cpus if c]
        if cpus:
            mean = {role: float(np.mean([c[role] for c in cpus])) for role in cpus[0]}
            print(f"  {name:<12} ({len(cpus):2d}): " + ", ".join(f"{role} {v:.2f} cores" for role, v in mean.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=3.0, help="requests per second (lab 05's middle rate)")
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--sample", type=float, default=0.25, help="CPU sampling period (s)")
    ap.add_argument("--layouts", default="AB", help="which layouts to run: A, B or AB")
    args = ap.parse_args()
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("this benchmark needs two cores")
    model_dir = tiny_model_dir()
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    if "A" in args.layouts.upper():
        run_layout(model_dir, "A, both cores (lab 05)", args.rate, args.requests, args.sample, engine_alone=False)
    if "B" in args.layouts.upper():
        run_layout(model_dir, "B, engine alone on core 0", args.rate, args.requests, args.sample, engine_alone=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
