"""Where the CPU goes in lab 05's two deployments on two cores (issue 53, the 1P1D error).

Not part of the course. Starts 1P1D (the course's proxy) and then two replicas (vllm-router round
robin) as lab 05 does, sends lab 05's ShareGPT workload at two rates to each, and prints the CPU of
every process per request and as cores while the block ran: each engine core, each API server,
the proxy or router, and the benchmark client (this process). The question: which CPU that the
probes never loaded lands on the engines' cores, and is it the same in both deployments?

    flock /tmp/pdlab-live.lock .venv/bin/python notes/sim-to-real/co_runner_cpu.py [--rates 4.6 15]
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", type=float, nargs="+", default=[4.6, 15.0])
    ap.add_argument("--requests", type=int, default=60)
    args = ap.parse_args()

    from pdlab.process import free_port
    from pdlab.serve.client.bench import build_workload, run_bench
    from pdlab.serve.engines import DeployPorts, colocated_replicas, disaggregated
    from pdlab.serve.engines.modelbuild import tiny_model_dir
    from pdlab.serve.measure.cpucost import CPUMeter, own_cpu_seconds

    kw = dict(max_model_len=2048 + 64 + 16, max_num_seqs=128, max_num_batched_tokens=2048)
    me = os.getpid()
    deps = {"1P1D": lambda: disaggregated(tiny_model_dir(), ports=DeployPorts.free(), **kw),
            "2 replicas": lambda: colocated_replicas(tiny_model_dir(), port=free_port(),
                                                     replica_port=free_port(count=2), **kw)}
    for name, start in deps.items():
        with start() as dep:
            roots = {f"server{i}({s.spec.role},{s.spec.cores})": s.process.pid for i, s in enumerate(dep.servers)}
            if dep.proxy is not None:
                roots["front door"] = dep.proxy.pid
            for k, rate in enumerate(args.rates):
                reqs = build_workload("sharegpt-stratified", rate_rps=rate, n=args.requests, seed=0,
                                      max_prompt_tokens=1024, max_output_tokens=64)
                c0, t0 = own_cpu_seconds([me]), time.monotonic()
                with CPUMeter(roots, per_process=True) as meter:
                    res = run_bench(dep.url, reqs, progress=False, seed=100 + k)
                wall = time.monotonic() - t0
                client = own_cpu_seconds([me]) - c0
                ok = sum(r.ok for r in res.records)
                print(f"\n{name} at {rate} req/s: {ok}/{len(reqs)} ok over {wall:.1f} s, "
                      f"TTFT p50 {res.summary.get('ttft_p50_s', float('nan')) * 1e3:.0f} ms, "
                      f"TPOT p50 {res.summary.get('tpot_p50_s', float('nan')) * 1e3:.1f} ms")
                rows = [(r.label, r.cpu_s) for r in meter.rows if r.cpu_s > 0.01] + [("client (this process)", client)]
                for label, cpu in rows:
                    print(f"  {label:<48} {cpu / wall:5.2f} cores  {cpu / max(ok, 1) * 1e3:6.1f} ms/request")


if __name__ == "__main__":
    main()
