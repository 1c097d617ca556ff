"""Does the pair's prefill contention transfer between rates? (issue 26, offline on lab 05's output)

Lab 05's run fit charges the prefill role of the CPU pair a contention ``c_p`` (prefill steps are
``1 + c_p`` times slower while the decode role works), measured on the few prefill-quiet requests
of one rate that waited while others streamed, and predicts the other rates with it. This reads a
finished lab 05 run (its ``OUT_DIR``: profiles, records, CPU samples, KV capacity) and replays
every held-out prediction of the pair with six values of ``c_p`` (and two fits that also shrink the hand-off):

- **run**: the run's own value, not shrunk (``fit_on_run(..., prior_requests=0)``, lab 05's run
  fit until 2026-12-04; one constant, fitted at the fit rate);
- **probe**: the calibration probe's (many streams decoding at once, before any workload);
- **per stream**: the run's value scaled by the decode streams a waiting request meets in the
  replay at the target rate ÷ at the fit rate (a fixed point of three replays): the hypothesis
  that the slowdown comes from the decode role's streaming work on the prefill core, which grows
  with the streams;
- **shrunk**: the run's value and the probe's weighted by the requests that set the run's value
  (``n``) and ``--prior-requests`` (``n0``): (n·run + n0·probe) ÷ (n + n0). A rate with few
  prefill-quiet requests that waited while others streamed leans on the probe;
- **shrunk, with hand-off**: the run fit with both its hand-off shift and its ``c_p`` shrunk
  toward the probe's by the requests that set each (``fit_on_run(..., prior_requests=n0)``; lab
  05's run fit from 2026-12-04 with n0 = 10, and since its late evening with n0 = ∞, the probe's
  values, after seven more runs favoured them: ``docs/LIVE_LABS.md``): the hand-off level is set
  by the prefill-quiet requests that met an idle decode role, and a high rate has few of them too;
- **per stream, hand-off**: *per stream*'s scaled value on the *shrunk, with hand-off* fit (with
  ``--prior-requests inf``, lab 05's run fit since 2026-12-04 with the probe's hand-off);
- **matched**: the value at which the run fit's replay of its own rate has that rate's median TTFT
  (:func:`~pdlab.simreal.calibrate.match_prefill_contention_on_run`): every request of the fit rate
  sets it, not only the prefill-quiet ones that waited.

It prints, per fit rate, ``c_p``, how many requests set it, the streams a waiting request met
(live, per rate) and ``c_p`` per stream; then per variant how many held-out predictions have
both medians (TTFT, TPOT) within 10 %, TTFT within 10 %, and the mean |TTFT error|.

    .venv/bin/python notes/sim-to-real/prefill_contention_transfer.py build/lab05/ci [build/lab05_2 ...]
        [--prior-requests 10]

Prints figures; not a test. Starts nothing. The run fit is lab 05's (``fit_on_run``) for the pair
with ``RESERVE_DECODE_CORE`` on a CPU (the default there).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from pdlab.metrics import RequestRecord, tpot_s, ttft_s
from pdlab.sim.latency import FittedLatency
from pdlab.simreal.calibrate import (
    fit_on_run,
    load_saved_run,
    match_prefill_contention_on_run,
    requests_from_records,
    simulate_like_live,
    with_prefill_contention,
)

TOKEN_BUDGET, MAX_NUM_SEQS = 2048, 128   # lab 05's defaults
MODE = "disaggregated"


def streams_met(records: list[RequestRecord]) -> float:
    """The time-mean number of streams (first token given, not finished) during a request's wait
    for its first token, averaged over the requests that met at least one."""
    ok = [r for r in records if r.ok and r.first_token_s is not None and r.finish_s is not None]
    seen = []
    for r in ok:
        wait = r.first_token_s - r.arrival_s
        if wait > 0:
            overlap = sum(max(0.0, min(r.first_token_s, o.finish_s) - max(r.arrival_s, o.first_token_s))
                          for o in ok if o is not r)
            seen.append(overlap / wait)
    met = [s for s in seen if s > 0]
    return float(np.mean(met)) if met else 0.0


def median_error(sims: list[RequestRecord], live: list[RequestRecord], metric) -> float:
    """Simulated ÷ live median − 1."""
    return float(np.median(metric(sims)) / np.median(metric(live)) - 1)


def print_summary(errors: dict[str, list[tuple[float, float]]]) -> None:
    """Per variant: predictions with both medians within 10 %, with TTFT within 10 %, mean |TTFT error|."""
    for name, errs in errors.items():
        both = sum(abs(t) <= 0.1 and abs(p) <= 0.1 for t, p in errs)
        ttft_ok = sum(abs(t) <= 0.1 for t, _ in errs)
        print(f"  c_p {name:>21}: both medians within 10 % {both}/{len(errs)}, TTFT within 10 % {ttft_ok}/{len(errs)}, "
              f"mean |TTFT error| {np.mean([abs(t) for t, _ in errs]):.1%}")


def report(out_dir: Path, prior_requests: float) -> dict[str, list[tuple[float, float]]]:
    """Print one lab 05 run's held-out predictions of the pair; return (TTFT, TPOT) errors per variant."""
    run = load_saved_run(out_dir, MODE)
    cal, live = run.calibration, run.records
    sim_kw = dict(kv_capacity_tokens=run.kv_capacity_tokens, token_budget=TOKEN_BUDGET, max_num_seqs=MAX_NUM_SEQS)
    rates = list(live)
    samples = {r: run.cpu_samples(r) for r in rates}
    probe_cp = float(cal.latency.meta["cpu_contention"]["prefill"])

    def replay(rate: float, lat: FittedLatency) -> list[RequestRecord]:
        return simulate_like_live(requests_from_records(live[rate]), MODE, lat, **sim_kw)

    print(f"{out_dir}: rates {rates} req/s; probe c_p {probe_cp:.2f}; streams a waiting request met, live: "
          + " / ".join(f"{streams_met(live[r]):.2f}" for r in rates))
    errors: dict[str, list[tuple[float, float]]] = {}
    for fit_rate in rates:
        fit = fit_on_run(cal.latency, live[fit_rate], MODE, prefill_core_samples=samples[fit_rate], prior_requests=0,
                         **sim_kw)
        c_p = float(fit.meta["cpu_contention"]["prefill"])
        n = fit.meta["fit"]["handoff"]["busy_requests"]
        both_shrunk = fit_on_run(cal.latency, live[fit_rate], MODE, prefill_core_samples=samples[fit_rate],
                                 prior_requests=prior_requests, **sim_kw)
        shrunk = float(both_shrunk.meta["cpu_contention"]["prefill"])   # (n·run + n0·probe) ÷ (n + n0)
        matched = float(match_prefill_contention_on_run(fit, live[fit_rate], **sim_kw).meta["cpu_contention"]["prefill"])
        at_fit = streams_met(replay(fit_rate, fit))
        print(f"  fitted on {fit_rate:g} req/s: c_p {c_p:.2f} from {n} requests (shrunk {shrunk:.2f}, matched {matched:.2f});"
              f" streams met in its replay {at_fit:.2f}; c_p per stream {c_p / max(at_fit, 1e-9):.2f}")
        for rate in rates:
            if rate == fit_rate:
                continue
            scaled = c_p
            for _ in range(3):   # the streams at the target rate depend a little on c_p itself
                scaled = c_p * streams_met(replay(rate, with_prefill_contention(fit, scaled))) / max(at_fit, 1e-9)
            variants = {"run": fit, "probe": with_prefill_contention(fit, probe_cp),
                        "per stream": with_prefill_contention(fit, scaled), "shrunk": with_prefill_contention(fit, shrunk),
                        "shrunk, with hand-off": both_shrunk, "matched": with_prefill_contention(fit, matched),
                        "per stream, hand-off": with_prefill_contention(both_shrunk, scaled)}
            for name, variant in variants.items():
                sims = replay(rate, variant)
                errors.setdefault(name, []).append((median_error(sims, live[rate], ttft_s), median_error(sims, live[rate], tpot_s)))
            print(f"    → {rate:g} req/s: TTFT p50 error, c_p run / probe / per stream ({scaled:.2f}) / shrunk / shrunk with hand-off / matched / per stream with the shrunk hand-off: "
                  + " / ".join(f"{errors[n][-1][0]:+.0%}" for n in errors))
    print_summary(errors)
    return errors


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dirs", nargs="+", type=Path, help="lab 05 OUT_DIRs (profiles, records, CPU samples)")
    ap.add_argument("--prior-requests", type=float, default=10.0,
                    help="n0, the probe's weight in requests for the shrunk variant (default 10)")
    args = ap.parse_args()
    if args.prior_requests < 0:
        ap.error(f"--prior-requests must be >= 0, got {args.prior_requests}")
    totals: dict[str, list[tuple[float, float]]] = {}
    for out_dir in args.out_dirs:
        for name, errs in report(out_dir, args.prior_requests).items():
            totals.setdefault(name, []).extend(errs)
    if len(args.out_dirs) > 1:
        print(f"all {len(args.out_dirs)} runs:")
        print_summary(totals)


if __name__ == "__main__":
    main()
