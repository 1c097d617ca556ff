"""Does a vLLM engine get slower over its life, or does the machine drift under it? (issue 26)

Lab 05 runs each rate in two blocks, in a mirrored order (A1 B1 C1 C2 B2 A2), and compares a
rate's two blocks. A change between them is either the host (the VM's core running slower for a
while) or the engine (some state that grows with the requests it has served). The two predict
different things across a restart: a host drift does not care whether the engine is new; an
engine that slows with its age is fast again after a restart.

Per engine life (``--lives``), this starts lab 05's colocated server (the engine alone on core 0;
its API server and this client on core 1), then repeats ``--rounds`` rounds of:

1. **host**: a fixed single-threaded matmul kernel (``machine_steadiness.py``'s) in a process
   pinned to the engine's core while the engine idles, for ``--host-seconds``: the core's speed now;
2. **probes**, the same work every round with fresh prompt text (no prefix-cache hits): the TTFT of
   one 768-token prompt (median of 3) and the mean token gap of 8 streams of 256-token prompts
   decoding together;
3. **load**: one block of lab 05's workload (ShareGPT, stratified, 30 requests at ``--rate``),
   fresh text, which ages the engine as lab 05's runs do.

It prints each round's numbers, and the probes divided by the host kernel (a slower core slows
both; an older engine slows the probes alone), the servers' minor page faults during the round
(first touches of memory, which a young engine pays and an old one does not) and their resident
memory, then per life the last rounds against the first.

    .venv/bin/python notes/sim-to-real/engine_age.py [--lives 2] [--rounds 8] [--rate 2.2]

Prints figures; not a test. Starts and stops its own server (nothing is left running).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np
from pdlab.serve import colocated, free_port
from pdlab.serve.client.bench import build_workload, run_bench
from pdlab.serve.engines.modelbuild import tiny_model_dir
from pdlab.serve.measure.cpucost import tree_processes
from pdlab.serve.probes import probe_decode, probe_prefill
from pdlab.workloads import split_blocks

HOST_KERNEL = """
import os, sys, time
os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.sched_setaffinity(0, {{{core}}})
import numpy as np
rng = np.random.default_rng(0)
a = rng.standard_normal((64, 1024), dtype=np.float32)
w = rng.standard_normal((1024, 1024), dtype=np.float32)
for _ in range(20):
    a @ w
times, end = [], time.perf_counter() + {seconds}
while time.perf_counter() < end:
    t = time.perf_counter()
    for _ in range(8):
        a @ w
    times.append(time.perf_counter() - t)
print(float(np.median(times)))
"""


def host_kernel_s(core: int, seconds: float) -> float:
    """Median time (s) of the fixed matmul kernel on ``core``, in a fresh process pinned there."""
    code = HOST_KERNEL.format(core=core, seconds=seconds)
    env = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    return float(out.stdout.strip())


def minor_faults_and_rss(dep) -> tuple[int, float]:
    """Minor page faults so far (first touches of memory) and resident memory (GiB) of every process
    of ``dep``'s servers (API servers and engine cores)."""
    faults, rss = 0, 0.0
    for s in dep.servers:
        for proc in tree_processes(s.process.pid):
            try:
                with open(f"/proc/{proc.pid}/stat") as fh:
                    faults += int(fh.read().rsplit(")", 1)[1].split()[7])
                rss += proc.memory_info().rss / 2**30
            except (OSError, ProcessLookupError):
                continue
    return faults, rss


def one_life(model_dir, life: int, args) -> list[dict[str, float]]:
    """Start the server, run ``args.rounds`` rounds, stop it; one row per round."""
    kw = dict(max_model_len=2048 + 80, max_num_seqs=128, max_num_batched_tokens=2048)
    reqs = build_workload("sharegpt-stratified", rate_rps=args.rate, n=60, seed=0, max_prompt_tokens=1024,
                          max_output_tokens=64)
    blocks = split_blocks(reqs, 2, args.rate, seed=0)
    rows = []
    with colocated(model_dir, port=free_port(), cores="0", **kw) as dep, dep.engine_cores_reserved():
        t0 = time.perf_counter()
        for k in range(args.rounds):
            seed = 10_000 * life + 100 * k          # fresh prompt text every probe and block
            faults0, _ = minor_faults_and_rss(dep)
            host = host_kernel_s(0, args.host_seconds)
            pre = probe_prefill(dep.url, [768], repeats=3, seed=seed)[0].time_s
            dec = probe_decode(dep.url, [(8, 256)], output_tokens=64, repeats=2, seed=seed + 1)[0].time_s
            t_round = time.perf_counter() - t0
            run_bench(dep.url, blocks[k % 2], progress=False, seed=seed + 2)
            faults1, rss = minor_faults_and_rss(dep)
            row = {"life": life, "round": k + 1, "age (s)": t_round, "host kernel (ms)": host * 1e3,
                   "prefill 768 (ms)": pre * 1e3, "decode gap b=8 (ms)": dec * 1e3,
                   "minor faults (k)": (faults1 - faults0) / 1e3, "servers' RSS (GiB)": rss}
            rows.append(row)
            print(f"life {life} round {k + 1:2d}  age {t_round:5.0f} s  host {host * 1e3:6.2f} ms  "
                  f"prefill {pre * 1e3:6.1f} ms  decode {dec * 1e3:6.2f} ms  "
                  f"prefill ÷ host {pre / host:5.2f}  decode ÷ host {dec / host:5.3f}  "
                  f"minor faults {(faults1 - faults0) / 1e3:7.1f}k  RSS {rss:.2f} GiB", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lives", type=int, default=2, help="engine restarts")
    ap.add_argument("--rounds", type=int, default=8, help="rounds per engine life")
    ap.add_argument("--rate", type=float, default=2.2, help="req/s of each load block (lab 05's middle rate)")
    ap.add_argument("--host-seconds", type=float, default=2.0, help="seconds of the host kernel per round")
    ap.add_argument("--preload", default="", help="a malloc library the servers preload (LD_PRELOAD), e.g. "
                    "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4, as vLLM's CPU guide recommends")
    args = ap.parse_args()
    if args.preload:
        if not os.path.exists(args.preload):
            raise SystemExit(f"--preload {args.preload}: no such file")
        os.environ["LD_PRELOAD"] = args.preload   # inherited by the servers started below
    model_dir = tiny_model_dir()
    rows = [r for life in range(1, args.lives + 1) for r in one_life(model_dir, life, args)]
    print("\nper life, the last two rounds ÷ the first two (1.00 = no change over the engine's life):")
    keys = ("host kernel (ms)", "prefill 768 (ms)", "decode gap b=8 (ms)")
    for life in range(1, args.lives + 1):
        mine = [r for r in rows if r["life"] == life]
        first, last = mine[:2], mine[-2:]
        change = {k: np.mean([r[k] for r in last]) / np.mean([r[k] for r in first]) for k in keys}
        print(f"  life {life}: " + ", ".join(f"{k.split(' (')[0]} {v:.2f}" for k, v in change.items())
              + f" over {mine[-1]['age (s)'] - mine[0]['age (s)']:.0f} s")
    if args.lives >= 2:
        end, start = [r for r in rows if r["life"] == 1][-2:], [r for r in rows if r["life"] == 2][:2]
        print("  across the restart, life 2's first two rounds ÷ life 1's last two: "
              + ", ".join(f"{k.split(' (')[0]} {np.mean([r[k] for r in start]) / np.mean([r[k] for r in end]):.2f}"
                          for k in keys))


if __name__ == "__main__":
    main()
