"""Does a warm engine serve the same block faster the second time? (issue 53, the negative bias)

Not part of the course. Lab 05's predictions came out optimistic in 34 of 36 per-rate medians
after the calibration got its warm-up pass. One candidate: a live workload keeps meeting batch
shapes (token counts per step) the engine has not run yet, while the probes repeat a few. This
starts one colocated engine on core 0 as lab 05 does, calibrates it (with the warm-up pass),
then sends lab 05's ShareGPT block at one rate ``--passes`` times back to back, each pass with
other prompt text, and prints each pass's median TTFT and TPOT beside the replay's prediction.
If the first pass is slower than the rest, first-shape costs are real.

    flock /tmp/pdlab-live.lock .venv/bin/python notes/sim-to-real/repeat_blocks.py [--rate 8.5] [--passes 4]
"""

from __future__ import annotations

import argparse


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=8.5, help="req/s on the one engine")
    ap.add_argument("--passes", type=int, default=4)
    ap.add_argument("--requests", type=int, default=40)
    args = ap.parse_args()

    from dataclasses import replace

    import numpy as np
    from pdlab.metrics import tpot_s, ttft_s
    from pdlab.process import free_port
    from pdlab.serve.client.bench import build_workload, run_bench
    from pdlab.serve.engines import colocated
    from pdlab.serve.engines.modelbuild import tiny_model_dir
    from pdlab.simreal import replay
    from pdlab.simreal.probes import PROBE_PLANS, calibrate

    kw = dict(max_model_len=2048 + 64 + 16, max_num_seqs=128, max_num_batched_tokens=2048)
    reqs = build_workload("sharegpt-stratified", rate_rps=args.rate, n=args.requests, seed=0,
                          max_prompt_tokens=1024, max_output_tokens=64)
    with colocated(tiny_model_dir(), port=free_port(), cores="0", **kw) as dep:
        cal = calibrate(dep.url, plan=replace(PROBE_PLANS["ci"], admission=False), seed=0)
        sim = replay(reqs, "colocated", cal, token_budget=2048, max_num_seqs=128)
        print(f"predicted: TTFT p50 {np.median(ttft_s(sim)) * 1e3:.1f} ms, TPOT p50 {np.median(tpot_s(sim)) * 1e3:.2f} ms")
        for k in range(args.passes):
            recs = run_bench(dep.url, reqs, progress=False, seed=1_000_000 + k).records
            print(f"pass {k + 1}: TTFT p50 {np.median(ttft_s(recs)) * 1e3:.1f} ms, "
                  f"TPOT p50 {np.median(tpot_s(recs)) * 1e3:.2f} ms", flush=True)


if __name__ == "__main__":
    main()
