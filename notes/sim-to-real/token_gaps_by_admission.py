"""Where a lab 05 run's TPOT differs from its replay: token gaps with an admission and without.
(issue 26, offline on lab 05's output)

In s53a–c the pair fitted on a low rate under-predicted TPOT at the higher rates by 10–12 %
while its quiet decode steps stayed within 0.88–1.10 of the fit. The steps that admit a new
request are one suspect: each rate has more of them. This replays every rate of a lab 05 run
with the run fit fitted on that same rate (``fit_on_run``, lab 05's default) and splits every
stream's token gaps, live and replayed, by whether another request got its first token inside
the gap (an admission on the decode side), printing each class's mean gap (ms) and count per
rate. A model that has admissions right shows the same excess (with − without) live and
replayed; a miss in the gaps without one is not the admissions'. Read the colocated split with
care: there an admission is a prefill inside the streams' step, and the live stall lands partly
in the neighbouring gaps (s53a–c: live +21 to +26 ms, the replay +44 to +47 ms, while the same
rate's mean TPOT agreed within 10 %), so only the totals compare.

    .venv/bin/python notes/sim-to-real/token_gaps_by_admission.py build/s53a/lab05 [build/s53b/lab05 ...]
        [--setup disaggregated] [--slack-ms 2]

Prints figures; not a test. Starts nothing.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from pdlab.metrics import RequestRecord
from pdlab.simreal.calibrate import fit_on_run, load_saved_run, requests_from_records, simulate_like_live

TOKEN_BUDGET, MAX_NUM_SEQS = 2048, 128   # lab 05's defaults


def gaps_by_admission(records: Sequence[RequestRecord], slack_s: float = 0.0) -> tuple[list[float], list[float]]:
    """Every stream's token gaps (s), split into those inside which another request of ``records``
    got its first token, up to ``slack_s`` after the gap's end (the step that admits a request emits
    its first token and the streams' next ones together, and a client reads them in either order),
    and the rest."""
    firsts = np.sort([r.first_token_s for r in records if r.ok and r.first_token_s is not None])
    with_admission: list[float] = []
    without: list[float] = []
    for r in records:
        if not r.ok or len(r.token_times_s or ()) < 2:
            continue
        t = np.asarray(r.token_times_s, dtype=float)
        inside = np.searchsorted(firsts, t[1:] + slack_s, side="right") - np.searchsorted(firsts, t[:-1], side="right")
        gaps = np.diff(t)
        with_admission += gaps[inside > 0].tolist()
        without += gaps[inside == 0].tolist()
    return with_admission, without


def report(out_dir: Path, setup: str, slack_s: float) -> None:
    """Print one lab 05 run's gap split, live and replayed, per rate."""
    run = load_saved_run(out_dir, setup)
    sim_kw = dict(kv_capacity_tokens=run.kv_capacity_tokens, token_budget=TOKEN_BUDGET, max_num_seqs=MAX_NUM_SEQS)
    shared_core = setup == "disaggregated"   # lab 05's RESERVE_DECODE_CORE on a CPU: co-runners on the prefill core
    print(f"{out_dir} ({setup}):")
    for rate, live in run.records.items():
        fit = fit_on_run(run.calibration.latency, live, setup,
                         prefill_core_samples=run.cpu_samples(rate) if shared_core else None, **sim_kw)
        sims = simulate_like_live(requests_from_records(live), setup, fit, **sim_kw)
        parts = []
        for label, recs in (("live", live), ("replay", sims)):
            adm, plain = gaps_by_admission(recs, slack_s)
            if not adm or not plain:
                parts.append(f"{label}: too few gaps of one class ({len(adm)} with, {len(plain)} without)")
                continue
            a, p = np.mean(adm) * 1e3, np.mean(plain) * 1e3
            parts.append(f"{label} {a:.2f} ms with an admission (n {len(adm)}), {p:.2f} without (n {len(plain)}), "
                         f"excess {a - p:+.2f}")
        print(f"  {rate:g} req/s: " + "; ".join(parts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dirs", nargs="+", type=Path, help="lab 05 OUT_DIRs (profiles, records, CPU samples)")
    ap.add_argument("--setup", default="disaggregated", choices=["colocated", "disaggregated"])
    ap.add_argument("--slack-ms", type=float, default=2.0,
                    help="a first token up to this long after a gap's end still counts as inside it (default 2)")
    args = ap.parse_args()
    if not args.slack_ms >= 0:
        ap.error("--slack-ms must be >= 0")
    for out_dir in args.out_dirs:
        report(out_dir, args.setup, args.slack_ms / 1e3)


if __name__ == "__main__":
    main()
