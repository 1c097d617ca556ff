"""Benchmarks of the serving simulator and the placement search (prints figures; not a timed test).

    .venv/bin/python benchmarks/bench_sim.py              # everything
    .venv/bin/python benchmarks/bench_sim.py --only sim   # the Mooncake replay only

Targets (issue #5, on a 2-core machine):
- Mooncake conversation trace (12,031 requests) on 8 colocated TP-4 Llama-3-70B instances on
  H100: under 10 s (``sim_wall_s``; the trace is read outside the timed part).
- Placement of OPT-66B on 4 nodes × 8 A100s, profile ``full``: under 2 minutes.
- ``pdlab queue`` check values at R=0.5, D=1, K=1.5, and the simulated averages (100k requests).
"""

from __future__ import annotations

import argparse
import json
import time


def bench_sim(record_token_times: bool) -> dict:
    from pdlab.metrics import SLO
    from pdlab.sim import simulate
    from pdlab.workloads import mooncake_trace_path, read_mooncake_jsonl

    t0 = time.perf_counter()
    reqs = read_mooncake_jsonl(mooncake_trace_path("conversation"))
    read_s = time.perf_counter() - t0
    res = simulate(reqs, "colocated", "h100-sxm", "llama-3-70b", instances=8, tp=4,
                   record_token_times=record_token_times)
    s = res.summary(SLO(ttft_s=30.0, tpot_s=0.1))
    return {"requests": s["requests"], "completed": s["completed"], "trace_read_s": round(read_s, 3),
            "sim_wall_s": round(res.sim_wall_s, 3), "record_token_times": record_token_times,
            "ttft_p50_s": round(s["ttft_p50_s"], 3), "ttft_p99_s": round(s["ttft_p99_s"], 3),
            "tpot_p50_s": round(s["tpot_p50_s"], 4), "tpot_p99_s": round(s["tpot_p99_s"], 4),
            "slo_attainment (TTFT 30 s, TPOT 100 ms)": round(s["slo_attainment"], 4),
            "goodput_rps": round(s["goodput_rps"], 3)}


def bench_place(profile: str) -> dict:
    from pdlab.metrics import SLO
    from pdlab.placement import SEARCH_PROFILES, place

    p = place("opt-66b", "a100-80gb", 4, 8, "sharegpt", SLO(ttft_s=2.5, tpot_s=0.15), settings=SEARCH_PROFILES[profile])
    d = p.as_dict(with_candidates=False)
    return {k: d[k] for k in ("prefill", "decode", "num_prefill", "num_decode", "prefill_goodput_rps",
                              "decode_goodput_rps", "total_gpus", "cluster_goodput_rps", "per_gpu_goodput_rps",
                              "search_wall_s")} | {"profile": profile}


def bench_queue(requests: int) -> dict:
    from pdlab.queueing import avg_ttft_all, simulate_all

    t0 = time.perf_counter()
    sim = simulate_all(0.5, 1.0, 1.5, requests=requests)
    return {"closed_form": {k: round(v, 3) for k, v in avg_ttft_all(0.5, 1.0, 1.5).items()},
            "simulated": {k: round(v, 4) for k, v in sim.items()}, "requests": requests,
            "wall_s": round(time.perf_counter() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=["sim", "place", "queue"])
    ap.add_argument("--place-profile", default="full", choices=["smoke", "ci", "full"])
    ap.add_argument("--queue-requests", type=int, default=100_000)
    args = ap.parse_args()
    if args.only in (None, "sim"):
        print("mooncake replay:", json.dumps(bench_sim(True)))
        print("mooncake replay:", json.dumps(bench_sim(False)))
    if args.only in (None, "queue"):
        print("queue:", json.dumps(bench_queue(args.queue_requests)))
    if args.only in (None, "place"):
        print("placement:", json.dumps(bench_place(args.place_profile)))


if __name__ == "__main__":
    main()
