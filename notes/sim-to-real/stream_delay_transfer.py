"""Does a delay per stream met on arrival transfer between rates? (issue 26, offline on lab 05's output)

On s49a the pair's prefill side, live − the run fit's replay, grew with the streams a request met
on arrival (``notes/sim-to-real/prefill_leg_by_streams.py``). This fits, on each rate of a lab 05 run,
live − replayed TTFT of every request as a + b × (streams on arrival), a least-absolute-deviation
line, and predicts the run's other rates with lab 05's run fit plus that delay per request: each
request reaches the simulated engine a + b × (streams on arrival in the replay) later, three
replays to a fixed point, TTFT counted from its send. Prints a and b per fit rate and, per run
and over all, the held-out predictions with both medians within 10 % and the mean |TTFT error|,
lab 05's run fit beside it.

    .venv/bin/python notes/sim-to-real/stream_delay_transfer.py build/lab05/ci [build/lab05_s49a ...]

Prints figures; not a test. Starts nothing.
"""
from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import numpy as np
from pdlab.metrics import RequestRecord, tpot_s, ttft_s
from pdlab.sim.latency import FittedLatency
from pdlab.simreal.calibrate import (
    fit_on_run,
    load_saved_run,
    replay_pairs,
    requests_from_records,
    simulate_like_live,
    streams_on_arrival,
)

MODE = "disaggregated"
TOKEN_BUDGET, MAX_NUM_SEQS = 2048, 128   # lab 05's defaults
LEAD_S = 1.0   # every arrival is moved this much later first, so a negative delay keeps it after 0


def lad_line(x: np.ndarray, y: np.ndarray, iterations: int = 50) -> tuple[float, float]:
    """Intercept and slope of the least-absolute-deviation line through (x, y) (reweighted least squares)."""
    design, w = np.c_[np.ones_like(x), x], np.ones_like(y)
    for _ in range(iterations):
        coef = np.linalg.lstsq(design * np.sqrt(w)[:, None], y * np.sqrt(w), rcond=None)[0]
        w = 1 / np.maximum(np.abs(y - design @ coef), 1e-4)
    return float(coef[0]), float(coef[1])


def replay_with_delays(live: list[RequestRecord], fit: FittedLatency, a: float, b: float, passes: int = 3,
                       **kw) -> list[RequestRecord]:
    """The run replayed with each request reaching the engine a + b × (streams on its arrival in the
    previous replay) seconds after its send; records on the send clock."""
    reqs = requests_from_records(live)
    sent = {r.request_id: r.arrival_s + LEAD_S for r in reqs}
    delays = dict.fromkeys(sent, 0.0)
    for _ in range(passes):
        moved = [replace(r, arrival_s=sent[r.request_id] + delays[r.request_id]) for r in reqs]
        sims = [replace(s, arrival_s=sent[s.request_id]) for s in simulate_like_live(moved, MODE, fit, **kw)]
        delays = {rid: a + b * n for rid, n in streams_on_arrival(sims).items()}
    return sims


def median_errors(sims: list[RequestRecord], live: list[RequestRecord]) -> tuple[float, float]:
    """Simulated ÷ live median TTFT − 1 and median TPOT − 1."""
    return (float(np.median(ttft_s(sims)) / np.median(ttft_s(live)) - 1),
            float(np.median(tpot_s(sims)) / np.median(tpot_s(live)) - 1))


def report(out_dir: Path) -> dict[str, list[tuple[float, float]]]:
    """Print one run's lines a + b·streams and its held-out predictions; return (TTFT, TPOT) errors per variant."""
    run = load_saved_run(out_dir, MODE)
    kw = dict(kv_capacity_tokens=run.kv_capacity_tokens, token_budget=TOKEN_BUDGET, max_num_seqs=MAX_NUM_SEQS)
    rates = list(run.records)
    live = {r: run.completed(r) for r in rates}
    errors: dict[str, list[tuple[float, float]]] = {"lab 05's run fit": [], "+ a + b × streams": []}
    lines = []
    for fit_rate in rates:
        fit = fit_on_run(run.calibration.latency, live[fit_rate], MODE, prefill_core_samples=run.cpu_samples(fit_rate),
                         **kw)
        pairs = replay_pairs(live[fit_rate], simulate_like_live(requests_from_records(live[fit_rate]), MODE, fit, **kw))
        met = streams_on_arrival(live[fit_rate])
        a, b = lad_line(np.array([met[r.request_id] for r, _ in pairs], float),
                        np.array([r.ttft_s - s.ttft_s for r, s in pairs]))
        lines.append(f"fitted on {fit_rate:g} req/s: a {a * 1e3:+.1f} ms, b {b * 1e3:+.1f} ms per stream")
        for rate in rates:
            if rate != fit_rate:
                plain = simulate_like_live(requests_from_records(live[rate]), MODE, fit, **kw)
                errors["lab 05's run fit"].append(median_errors(plain, live[rate]))
                errors["+ a + b × streams"].append(median_errors(replay_with_delays(live[rate], fit, a, b, **kw), live[rate]))
    print(f"{out_dir.name}: " + "; ".join(lines))
    print_summary(errors)
    return errors


def print_summary(errors: dict[str, list[tuple[float, float]]]) -> None:
    for name, errs in errors.items():
        both = sum(abs(t) <= 0.1 and abs(p) <= 0.1 for t, p in errs)
        print(f"  {name:>18}: both medians within 10 % {both}/{len(errs)}, mean |TTFT error| "
              f"{np.mean([abs(t) for t, _ in errs]):.1%}; TTFT errors " + " ".join(f"{t:+.0%}" for t, _ in errs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dirs", nargs="+", type=Path, help="lab 05 OUT_DIRs (profiles, records, CPU samples)")
    totals: dict[str, list[tuple[float, float]]] = {}
    args = ap.parse_args()
    for out_dir in args.out_dirs:
        for name, errs in report(out_dir).items():
            totals.setdefault(name, []).extend(errs)
    if len(args.out_dirs) > 1:
        print(f"all {len(args.out_dirs)} runs:")
        print_summary(totals)


if __name__ == "__main__":
    main()
