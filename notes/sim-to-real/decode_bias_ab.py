"""Why is the disaggregated decode role slower under the workload than when probed alone? (issue 26)

A 1P1D NIXL deployment of the tiny course model on this 2-core CPU (prefill engine pinned to core 0,
decode engine to core 1, as lab 05). The decode role is probed alone, then lab 05's ShareGPT
workload runs at one rate in two conditions that change one thing:

- ``A, as deployed``: the API servers, the proxy and this client float over both cores (the default);
- ``B, decode core reserved``: every thread of the proxy, of both API servers and of this client is
  pinned to core 0 (`Deployment.decode_cores_reserved`), so core 1 holds only the decode engine process.

Each condition prints the decode role's quiet steps, live ÷ probe fit (lab 05's check), and the CPU
seconds every thread of every process used during the run, and on which core each ran last
(``/proc/PID/task/TID/stat``: utime + stime, field 39). If B brings the ratio to ~1, the bias is
other processes running on the decode core; if not, it is work inside the decode process.

    .venv/bin/python notes/sim-to-real/decode_bias_ab.py [--rate 3.0] [--requests 30] [--rounds 2]

Prints figures; not a test. Starts and stops its own servers (nothing is left running).
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections import defaultdict
from pathlib import Path

import numpy as np
from pdlab.metrics import tpot_s
from pdlab.serve import DeployPorts, disaggregated
from pdlab.serve.client.bench import build_workload, run_bench
from pdlab.serve.engines.modelbuild import tiny_model_dir
from pdlab.serve.measure.cpucost import tree_processes
from pdlab.serve.measure.evidence import scrape_metrics
from pdlab.serve.probes import PROBE_PLANS, probe_decode, probe_prefill
from pdlab.simreal.calibrate import decode_steps_vs_model, fit_profile, quiet_step_ratio

TICK = os.sysconf("SC_CLK_TCK")


def _threads(pid: int) -> dict[int, tuple[str, float, int]]:
    """TID → (thread name, CPU seconds so far, core it last ran on) of every thread of ``pid``."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            raw = (task / "stat").read_text()
        except OSError:
            continue
        name = raw[raw.index("(") + 1:raw.rindex(")")]
        f = raw[raw.rindex(")") + 2:].split()
        out[int(task.name)] = (name, (int(f[11]) + int(f[12])) / TICK, int(f[36]))
    return out


def _roles(dep) -> dict[str, list[int]]:
    """Role → PIDs: each server's API process and its descendants (the engine core), the proxy, this client."""
    roles: dict[str, list[int]] = {"client": [os.getpid()]}
    for s in dep.servers:
        api, *engine = tree_processes(s.process.pid)
        roles[f"{s.spec.role} API server"] = [api.pid]
        roles[f"{s.spec.role} engine"] = [p.pid for p in engine]
    roles["proxy"] = [dep.proxy.pid]
    return roles


def _snapshot(roles):
    return {role: {pid: _threads(pid) for pid in pids} for role, pids in roles.items()}


def _by_thread_name(before, after, role: str) -> tuple[dict[str, float], dict[str, set]]:
    """CPU seconds between two snapshots per thread name of ``role``, and the cores each name was seen on."""
    cpu_s: dict[str, float] = defaultdict(float)
    cores: dict[str, set] = defaultdict(set)
    for pid, threads in after[role].items():
        for tid, (name, cpu, core) in threads.items():
            cpu_s[name] += cpu - before[role].get(pid, {}).get(tid, (name, 0.0, core))[1]
            cores[name].add(core)
    return cpu_s, cores


def _cpu_table(before, after, wall_s: float, top: int = 3) -> list[str]:
    lines = []
    for role in after:
        cpu_s, cores = _by_thread_name(before, after, role)
        busiest = sorted(cpu_s.items(), key=lambda kv: -kv[1])[:top]
        lines.append(f"  {role:<20} {sum(cpu_s.values()) / wall_s:6.1%} of a core; busiest threads: " + ", ".join(
            f"{n} {v / wall_s:.1%} (cores {sorted(cores[n])})" for n, v in busiest))
    return lines


def _decode_engine_ms_per_token(before, after, tokens: float) -> str:
    """CPU ms per generated token (the engine's own counter) of the decode engine's busiest threads
    and of the decode API server (all threads)."""
    engine, _ = _by_thread_name(before, after, "decode engine")
    api, _ = _by_thread_name(before, after, "decode API server")
    busiest = sorted(engine.items(), key=lambda kv: -kv[1])[:3]
    return (f"{tokens:,.0f} tokens; CPU per token: decode API server {sum(api.values()) / tokens * 1e3:.2f} ms, "
            "decode engine " + ", ".join(f"{n} {v / tokens * 1e3:.2f} ms" for n, v in busiest))


def _tokens(url: str) -> float:
    return scrape_metrics(url).total("vllm:generation_tokens_total")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=3.0, help="requests per second (lab 05's middle rate)")
    ap.add_argument("--requests", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=2, help="A/B alternations")
    args = ap.parse_args()

    model_dir = tiny_model_dir()
    kw = dict(max_model_len=2048 + 80, max_num_seqs=128, max_num_batched_tokens=2048)
    plan = PROBE_PLANS["ci"]
    with disaggregated(model_dir, ports=DeployPorts.free(), **kw) as dep:
        dec_url = dep.decode[0].url
        roles = _roles(dep)
        pre = probe_prefill(dec_url, plan.prefill_lengths, repeats=plan.repeats)
        before, tok0 = _snapshot(roles), _tokens(dec_url)
        dec = probe_decode(dec_url, plan.decode_pairs(), output_tokens=plan.decode_tokens, repeats=plan.decode_repeats)
        after, tok1 = _snapshot(roles), _tokens(dec_url)
        print("decode probe (the decode server alone, no hand-offs): "
              + _decode_engine_ms_per_token(before, after, tok1 - tok0))
        lat = fit_profile(pre, decode_points=dec)
        print(f"decode probe fit (alone): a_d {lat.decode[0] * 1e3:.2f} ms, b_d {lat.decode[1] * 1e6:.3f} µs/ctx token, "
              f"c_d {lat.decode[2] * 1e6:.1f} µs/seq; fit mean |err| {lat.meta['fit']['decode']['mape']:.1%}")
        reqs = build_workload("sharegpt", rate_rps=args.rate, n=args.requests, seed=0, max_prompt_tokens=1024,
                              max_output_tokens=64)
        for rnd in range(args.rounds):
            for cond in ("A, as deployed", "B, decode core reserved"):
                layout = dep.decode_cores_reserved() if cond.startswith("B") else contextlib.nullcontext()
                with layout:
                    load0 = os.getloadavg()[0]
                    before, tok0 = _snapshot(roles), _tokens(dec_url)
                    res = run_bench(dep.url, reqs, progress=False, seed=rnd)
                    after, tok1 = _snapshot(roles), _tokens(dec_url)
                    recs = res.records
                    wall = max(r.finish_s or 0 for r in recs) - min(r.arrival_s for r in recs)
                    steps = [row for row in decode_steps_vs_model(recs, lat) if np.isfinite(row["live / fitted, quiet"])]
                    q = quiet_step_ratio(recs, lat)
                    print(f"\nround {rnd + 1}, {cond} (load average {load0:.1f}): "
                          f"{sum(r.ok for r in recs)}/{len(recs)} ok, TPOT p50 {np.median(tpot_s(recs)) * 1e3:.1f} ms, "
                          f"quiet decode steps live / probe fit {q:.2f} (by batch: "
                          + ", ".join(f"{r['batch']} {r['live / fitted, quiet']:.2f}" for r in steps) + ")")
                    print("\n".join(_cpu_table(before, after, wall)))
                    print("  " + _decode_engine_ms_per_token(before, after, tok1 - tok0))


if __name__ == "__main__":
    main()
