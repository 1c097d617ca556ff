"""How much of a vLLM CPU worker's "busy" core is waiting, not working?

vLLM's engine core hands each step to its worker through a shared-memory ring buffer
(``vllm/distributed/device_communicators/shm_broadcast.py``, ``SpinCondition``). After every read
the worker polls that buffer in a loop of ``sched_yield()`` for ``busy_loop_s`` = 1 s before it
falls back to sleeping on a socket; vLLM reads no setting for it. On a GPU host the spin costs a
spare host core; on the course's 2-core VM it is a core per role. With Poisson arrivals at λ
req/s the worker has read something within the last second with probability 1 − e^(−λ·1 s), so a
worker with almost nothing to compute still shows that share of a core busy.

This starts lab 05's colocated server (the engine alone on core 0, its API server and this client
on core 1), sends requests of 32 prompt tokens and 1 output token (a few ms of work each) at each
``--rates`` value for ``--seconds``, and prints the worker's and the engine core's CPU (``/proc``,
all threads), the work the requests needed (the median TTFT × the rate), and 1 − e^(−λ); then the
worker's CPU in the seconds after the last request (the spin's tail: about 1 s, then nothing).
Read the worker's column against the last two: CPU well above the work and near 1 − e^(−λ) is the
spin, not the model.

    .venv/bin/python notes/host/worker_spin.py [--rates 0.25 0.5 1 2 4] [--seconds 12]

Prints figures; not a test. Starts and stops its own server (nothing is left running).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import psutil
from pdlab.process import free_port
from pdlab.serve.client.bench import run_bench
from pdlab.serve.engines import colocated
from pdlab.serve.engines.modelbuild import tiny_model_dir
from pdlab.serve.measure.cpucost import tree_processes
from pdlab.workloads import synthetic_requests


def cpu_by_name(procs: list[psutil.Process]) -> dict[str, float]:
    """CPU seconds (user + system, all threads) of each process, by its name (VLLM::Worker, ...)."""
    out: dict[str, float] = {}
    for p in procs:
        try:
            t = p.cpu_times()
            out[p.name()] = out.get(p.name(), 0.0) + t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", type=float, nargs="+", default=[0.25, 0.5, 1.0, 2.0, 4.0], help="req/s")
    ap.add_argument("--seconds", type=float, default=12.0, help="length of each rate's run (s)")
    args = ap.parse_args()
    model_dir = tiny_model_dir()
    with colocated(model_dir, port=free_port(), cores="0", max_model_len=2128) as dep, dep.engine_cores_reserved():
        engine = tree_processes(dep.servers[0].process.pid)[1:]   # EngineCore and its Worker
        run_bench(dep.url, synthetic_requests(4, 2.0, prompt_tokens=32, output_tokens=1, seed=1),
                  progress=False, seed=1)   # warm-up, not measured
        time.sleep(2.0)
        print(f"{'rate':>6} {'worker':>8} {'engine core':>12} {'work':>8} {'1 − e^(−λ)':>11}   (cores)")
        for i, rate in enumerate(args.rates):
            n = max(3, round(rate * args.seconds))
            reqs = synthetic_requests(n, rate, prompt_tokens=32, output_tokens=1, seed=10 + i)
            before, t0 = cpu_by_name(engine), time.perf_counter()
            recs = run_bench(dep.url, reqs, progress=False, seed=100 + i).records
            wall = time.perf_counter() - t0
            after = cpu_by_name(engine)
            used = {k: (after[k] - before.get(k, 0.0)) / wall for k in after}
            ttft = statistics.median(r.ttft_s for r in recs if r.ok)
            print(f"{rate:6.2f} {used.get('VLLM::Worker', 0):8.2f} {used.get('VLLM::EngineCore', 0):12.2f} "
                  f"{ttft * n / wall:8.3f} {1 - math.exp(-rate):11.2f}")
            time.sleep(1.5)   # let the spin of this rate end before the next
        before = cpu_by_name(engine)
        time.sleep(4.0)
        tail = cpu_by_name(engine).get("VLLM::Worker", 0) - before.get("VLLM::Worker", 0)
        run_bench(dep.url, synthetic_requests(1, 1.0, prompt_tokens=32, output_tokens=1, seed=99), progress=False, seed=99)
        before = cpu_by_name(engine)
        time.sleep(4.0)
        spin = cpu_by_name(engine).get("VLLM::Worker", 0) - before.get("VLLM::Worker", 0)
        print(f"worker CPU in the 4 s after one request: {spin:.2f} s (the spin's tail); "
              f"in 4 s with no request before it: {tail:.2f} s")


if __name__ == "__main__":
    main()
