"""Where the pair's run fit loses TTFT under load: each request's prefill leg and hand-off side,
live against the replay, by the streams it met on arrival. (issue 26, offline on lab 05's output)

Since 2026-12-05 every record of the pair carries the course proxy's prefill leg
(``extra["prefill_leg_s"]``: its POST to the prefill server until the answer). Each rate of a lab
05 run is replayed with the run fit fitted on that same rate (``fit_on_run``, lab 05's default),
and every request's TTFT is split on both sides:

- **prefill side**: live prefill leg − the replay's arrival → start of the KV pull;
- **hand-off side**: live (TTFT − prefill leg) − the replay's KV pull → first token.

Printed per rate and by the number of other requests already streaming when the request arrived.
A part the model has right stays near 0 whatever the streams; a part that grows with them is load
the model spreads evenly over time but a request meets at its arrival.

    .venv/bin/python notes/sim-to-real/prefill_leg_by_streams.py build/lab05/ci [build/lab05_s49a ...]

Prints figures; not a test. Starts nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from pdlab.simreal.calibrate import (
    fit_on_run,
    load_saved_run,
    requests_from_records,
    simulate_like_live,
    ttft_sides,
)

MODE = "disaggregated"
TOKEN_BUDGET, MAX_NUM_SEQS = 2048, 128   # lab 05's defaults
STREAM_GROUPS = ((0, 0), (1, 1), (2, 2), (3, 4), (5, 7), (8, 10**6))


def report(out_dir: Path) -> None:
    """Print one lab 05 run's pair: per rate, the two sides' excess (ms) by streams met on arrival."""
    run = load_saved_run(out_dir, MODE)
    kw = dict(kv_capacity_tokens=run.kv_capacity_tokens, token_budget=TOKEN_BUDGET, max_num_seqs=MAX_NUM_SEQS)
    for rate in run.records:
        live = run.completed(rate)
        fit = fit_on_run(run.calibration.latency, live, MODE, prefill_core_samples=run.cpu_samples(rate), **kw)
        sims = simulate_like_live(requests_from_records(live), MODE, fit, **kw)
        rows = [(x["streams"], x["prefill_side_s"], x["handoff_side_s"]) for x in ttft_sides(live, sims)]
        if not rows:
            print(f"{out_dir.name} {rate:g} req/s: no record carries the prefill leg (a run before 2026-12-05)")
            continue
        print(f"{out_dir.name} {rate:g} req/s, run fit on itself: {len(rows)} requests; live − replayed, median: "
              f"prefill side {np.median([x[1] for x in rows]) * 1e3:+.1f} ms, hand-off side {np.median([x[2] for x in rows]) * 1e3:+.1f} ms")
        for lo, hi in STREAM_GROUPS:
            g = [x for x in rows if lo <= x[0] <= hi]
            if len(g) >= 3:
                label = f"{lo}" if lo == hi else (f"{lo}-{hi}" if hi < 10**6 else f">= {lo}")
                print(f"    {label:>5} streams on arrival: n {len(g):>3}, prefill side {np.median([x[1] for x in g]) * 1e3:+6.1f} ms, "
                      f"hand-off side {np.median([x[2] for x in g]) * 1e3:+6.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dirs", nargs="+", type=Path, help="lab 05 OUT_DIRs (profiles, records, CPU samples)")
    for out_dir in ap.parse_args().out_dirs:
        report(out_dir)


if __name__ == "__main__":
    main()
