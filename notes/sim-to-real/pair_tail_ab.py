"""Why does the pair's decode time grow with the rate beyond its quiet steps? (issue 26)

Lab 05's held-out check misses the 1P1D pair's TPOT at its top rate while that run's quiet decode
steps sit at the fit: the time goes into a tail of long token gaps that grows with the rate
(:func:`pdlab.simreal.calibrate.decode_gap_tail`). In lab 05's layout the prefill engine, both API
servers, the proxy and this client share the prefill core, and the decode engine has the other
core alone (`Deployment.decode_cores_reserved`). Tokens reach the client through the decode API
server and the proxy, so a prefill that holds the shared core can hold the tokens back too.

This runs lab 05's pair in that layout and its ShareGPT mix (one prompt per length stratum) at ``--rate`` in blocks of
``--requests`` (fresh prompt text each block), in the order A B B A per round, changing one thing:

- ``A, lab 05``: every process at its default priority;
- ``B, prefill engine niced``: every thread of the prefill engine (EngineCore, Worker) at nice 19,
  so the front ends and the client run as soon as they are runnable; the decode core is untouched.

Each block prints TTFT and TPOT p50 and the gap tail against the decode probe's fit (median and
time ratio, share of long gaps and of the excess they carry, stall seconds per request, tokens
that arrived in merged chunks), and the CPU each role used. If B removes the tail, it is the
front ends waiting for the prefill core, not the decode engine; if not, it is on the decode side.

    .venv/bin/python notes/sim-to-real/pair_tail_ab.py [--rate 7.0] [--requests 30] [--rounds 2]

Prints figures; not a test. Starts and stops its own servers (nothing is left running); needs the
right to lower a niceness again (root or CAP_SYS_NICE), and says so before it changes anything.
"""

from __future__ import annotations

import argparse
import contextlib
import os

import numpy as np
from decode_bias_ab import _cpu_table, _roles, _snapshot  # noqa: I001  (a sibling script: its folder is on sys.path)
from pdlab.metrics import tpot_s, ttft_s
from pdlab.process import thread_ids
from pdlab.serve import DeployPorts, disaggregated
from pdlab.serve.client.bench import build_workload, run_bench
from pdlab.serve.engines.modelbuild import tiny_model_dir
from pdlab.serve.measure.cpucost import machine_cpu_seconds
from pdlab.serve.probes import PROBE_PLANS, probe_decode, probe_prefill
from pdlab.simreal.calibrate import decode_gap_tail, fit_profile

CONDITIONS = ("A, lab 05", "B, prefill engine niced")


@contextlib.contextmanager
def niced(pids: list[int], nice: int = 19):
    """Every thread of ``pids`` at ``nice`` while the block runs; each thread's own value back after."""
    old = {tid: os.getpriority(os.PRIO_PROCESS, tid) for pid in pids for tid in thread_ids(pid)}
    for tid in old:
        os.setpriority(os.PRIO_PROCESS, tid, nice)
    try:
        yield
    finally:
        for tid in (tid for pid in pids for tid in thread_ids(pid)):
            with contextlib.suppress(ProcessLookupError):
                os.setpriority(os.PRIO_PROCESS, tid, old.get(tid, 0))


def _can_renice() -> None:
    """Raise SystemExit naming the problem when this process may not lower a niceness again."""
    own = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, own + 1)
        os.setpriority(os.PRIO_PROCESS, 0, own)
    except PermissionError as exc:
        raise SystemExit("condition B renices the prefill engine to 19 and back to 0, which needs root or "
                         f"CAP_SYS_NICE: {exc}") from exc


def _row(recs, tail: dict[str, float], cpu_lines: list[str], busy_cores: float) -> str:
    return (f"TTFT p50 {np.median(ttft_s(recs)) * 1e3:6.1f} ms, TPOT p50 {np.median(tpot_s(recs)) * 1e3:5.2f} ms; "
            f"gaps ÷ fit: median {tail['median ratio']:.2f}, time {tail['time ratio']:.2f}; long (> 2 steps) "
            f"{tail['long share']:.1%} carrying {tail['long excess share']:.0%} of the excess; stall "
            f"{tail['stall s per request'] * 1e3:.1f} ms/request; merged-chunk tokens {tail['shared chunk tokens']:.1%}; "
            f"machine busy {busy_cores:.2f} cores\n" + "\n".join(cpu_lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=7.0, help="requests per second (lab 05's top rate on this VM)")
    ap.add_argument("--requests", type=int, default=30, help="requests per block (a lab 05 block)")
    ap.add_argument("--rounds", type=int, default=2, help="A B B A rounds")
    args = ap.parse_args()
    _can_renice()

    model_dir = tiny_model_dir()
    kw = dict(max_model_len=2048, max_num_seqs=128, max_num_batched_tokens=2048)   # lab 05's SERVER_KW
    plan = PROBE_PLANS["ci"]
    reqs = build_workload("sharegpt-stratified", rate_rps=args.rate, n=args.requests, seed=0,  # lab 05's mix
                          max_prompt_tokens=1024, max_output_tokens=64)
    summary: dict[str, list[dict[str, float]]] = {c: [] for c in CONDITIONS}
    with disaggregated(model_dir, ports=DeployPorts.free(), **kw) as dep, dep.decode_cores_reserved():
        dec_url = dep.decode[0].url
        pre = probe_prefill(dep.prefill[0].url, plan.prefill_lengths, repeats=plan.repeats)
        dec = probe_decode(dec_url, plan.decode_pairs(), output_tokens=plan.decode_tokens, repeats=plan.decode_repeats)
        lat = fit_profile(pre, decode_points=dec)
        print(f"decode probe fit (the decode server alone): a_d {lat.decode[0] * 1e3:.2f} ms, "
              f"b_d {lat.decode[1] * 1e6:.3f} µs/ctx token, c_d {lat.decode[2] * 1e6:.1f} µs/seq")
        roles = _roles(dep)
        prefill_engine = roles["prefill engine"]
        block = 0
        for rnd in range(args.rounds):
            for cond in (CONDITIONS[0], CONDITIONS[1], CONDITIONS[1], CONDITIONS[0]):
                block += 1
                with niced(prefill_engine) if cond == CONDITIONS[1] else contextlib.nullcontext():
                    before, (busy0, _) = _snapshot(roles), machine_cpu_seconds()
                    recs = run_bench(dep.url, reqs, progress=False, seed=2_000_000 + block).records
                    after, (busy1, _) = _snapshot(roles), machine_cpu_seconds()
                bad = [r.error for r in recs if not r.ok]
                if bad:
                    raise RuntimeError(f"{len(bad)} of {len(recs)} requests failed: {bad[0]}")
                wall = max(r.finish_s for r in recs) - min(r.arrival_s for r in recs)
                tail = decode_gap_tail(recs, lat)
                summary[cond].append({"TTFT p50 (ms)": np.median(ttft_s(recs)) * 1e3,
                                      "TPOT p50 (ms)": np.median(tpot_s(recs)) * 1e3,
                                      **{k: tail[k] for k in ("median ratio", "time ratio", "long share",
                                                              "stall s per request", "shared chunk tokens")}})
                print(f"\nround {rnd + 1}, block {block}, {cond}: "
                      + _row(recs, tail, _cpu_table(before, after, wall), (busy1 - busy0) / wall))
    print(f"\nmedians over blocks ({args.requests} requests at {args.rate:g} req/s each), and B ÷ A:")
    for key in summary[CONDITIONS[0]][0]:
        a, b = (float(np.median([row[key] for row in summary[c]])) for c in CONDITIONS)
        print(f"  {key:<22} A {a:9.4g}   B {b:9.4g}   B ÷ A {b / a if a else float('nan'):.2f}")


if __name__ == "__main__":
    main()
