"""Which decode level and prefill accounting carry lab 05's run fit to the other rates? (issue 26, offline)

Lab 05's run fit is fitted on one rate and predicts the others (section 5). This reads finished
lab 05 runs (their ``OUT_DIR``s: profiles, records, CPU samples, KV capacity) and replays every
held-out prediction of each set-up with lab 05's run fit (:func:`~pdlab.simreal.calibrate.fit_on_run`)
in two variants per set-up:

- the pair: the decode row at its quiet steps' level (``match_tpot=False``, lab 05 until
  2026-12-05) and matched to the fit rate's median TPOT (the default since);
- colocated: the profile as it was saved, and with a prefill stall (``--stall-fraction F``: the
  engine's fixed part of a prompt's step is F × (a_p − a_d), the rest off-engine; runs saved before
  the stall probe have none, and ``notes/sim-to-real/prefill_stall.py`` measured F of about 0.3–0.5 on
  the course's VM). Without ``--stall-fraction`` both colocated variants are the saved profile.

It prints per run, set-up and variant how many of the held-out predictions have both medians (TTFT
and TPOT) within 10 %, TPOT and TTFT alone, and the errors; then the totals, the probe fit's own
median errors at each rate (lab 05's goal table), and each rate's run fit replaying its own rate
(what the model misses with the rate's own levels), averaged over the runs.

    .venv/bin/python notes/sim-to-real/heldout_decode_level.py build/s53a/lab05 [build/s53b/lab05 ...]
        [--stall-fraction 0.4]

Prints figures; not a test. Starts nothing.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
from pdlab.metrics import tpot_s, ttft_s
from pdlab.sim.latency import FittedLatency
from pdlab.simreal.calibrate import fit_on_run, load_saved_run, requests_from_records, simulate_like_live
from pdlab.simreal.records import PrefillStall


def with_stall_fraction(lat: FittedLatency, fraction: float) -> FittedLatency:
    """``lat`` with a prefill stall whose engine part is ``fraction`` × (a_p − a_d) (the saved one kept)."""
    if lat.meta.get("prefill_stall"):
        return lat
    span = max(lat.prefill[0] - lat.decode[0], 0.0)
    stall = PrefillStall(streams=0, stream_prompt=0, injections=0, median_prompt=0, raw_fixed_s=math.nan,
                         fixed_s=fraction * span, off_engine_s=(1 - fraction) * span)
    return FittedLatency(lat.prefill, lat.decode, tp=lat.tp, pp=lat.pp, meta={**lat.meta, "prefill_stall": stall.to_dict()})


def variant_probe(run, variant: dict) -> FittedLatency:
    """``run``'s probe fit, with the variant's prefill stall where it names one."""
    probe = run.calibration.latency
    if variant.get("stall_fraction") is not None:
        probe = with_stall_fraction(probe, variant["stall_fraction"])
    return probe


def heldout(run, mode: str, variant: dict, kw: dict) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """(TTFT, TPOT) median errors, (simulated − live) / live, of every held-out prediction of
    ``run``, and of each rate's run fit on its own rate (lowest rate first)."""
    probe = variant_probe(run, variant)
    held, own = [], []
    for fit_rate, recs in sorted(run.records.items()):
        fit = fit_on_run(probe, recs, mode, match_tpot=variant.get("match_tpot", True),
                         prefill_core_samples=run.cpu_samples(fit_rate) if mode == "disaggregated" else None, **kw)
        for rate, live in sorted(run.records.items()):
            sim = simulate_like_live(requests_from_records(live), mode, fit, **kw)
            err = (float(np.median(ttft_s(sim)) / np.median(ttft_s(live)) - 1),
                   float(np.median(tpot_s(sim)) / np.median(tpot_s(live)) - 1))
            (held if rate != fit_rate else own).append(err)
    return held, own


def probe_fit_errors(run, mode: str, variant: dict, kw: dict) -> list[tuple[float, float]]:
    """(TTFT, TPOT) median errors of the probe fit itself at each rate (lab 05's goal table)."""
    probe = variant_probe(run, variant)
    out = []
    for live in run.records.values():
        sim = simulate_like_live(requests_from_records(live), mode, probe, **kw)
        out.append((float(np.median(ttft_s(sim)) / np.median(ttft_s(live)) - 1),
                    float(np.median(tpot_s(sim)) / np.median(tpot_s(live)) - 1)))
    return out


def line(errs: list[tuple[float, float]]) -> str:
    both = sum(abs(a) <= 0.1 and abs(b) <= 0.1 for a, b in errs)
    tpot = sum(abs(b) <= 0.1 for _, b in errs)
    ttft = sum(abs(a) <= 0.1 for a, _ in errs)
    return (f"both {both}/{len(errs)}, TPOT {tpot}, TTFT {ttft}; mean |TPOT| {np.mean([abs(b) for _, b in errs]):.1%}, "
            f"|TTFT| {np.mean([abs(a) for a, _ in errs]):.1%}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dirs", nargs="+", type=Path, help="lab 05 OUT_DIRs")
    ap.add_argument("--stall-fraction", type=float, default=None,
                    help="colocated: the engine's share of a_p − a_d where a profile has no prefill stall")
    ap.add_argument("--token-budget", type=int, default=2048)
    ap.add_argument("--max-num-seqs", type=int, default=128)
    args = ap.parse_args()
    variants = {"colocated": {"as saved": {}, "stall split": {"stall_fraction": args.stall_fraction}},
                "disaggregated": {"quiet-step level": {"match_tpot": False}, "TPOT-matched level": {}}}
    totals: dict[tuple[str, str], list] = {}
    by_rate: dict[tuple[str, str], list] = {}
    own_rate: dict[tuple[str, str], list] = {}
    for d in args.out_dirs:
        for mode, vs in variants.items():
            run = load_saved_run(d, mode)
            kw = dict(kv_capacity_tokens=run.kv_capacity_tokens, token_budget=args.token_budget,
                      max_num_seqs=args.max_num_seqs)
            for name, v in vs.items():
                errs, own = heldout(run, mode, v, kw)
                totals.setdefault((mode, name), []).extend(errs)
                by_rate.setdefault((mode, name), []).append(probe_fit_errors(run, mode, v, kw))
                own_rate.setdefault((mode, name), []).append(own)
                print(f"{d} {mode:>13} {name:>18}: {line(errs)}; TPOT " + " ".join(f"{b:+.0%}" for _, b in errs),
                      flush=True)
    print("\nall runs, run fit held out")
    for (mode, name), errs in totals.items():
        print(f"{mode:>13} {name:>18}: {line(errs)}")
    for title, table in (("probe fit at each rate", by_rate), ("each rate's run fit on its own rate", own_rate)):
        print(f"\nall runs, {title} (lowest first): mean median TTFT / TPOT error")
        for (mode, name), runs in table.items():
            n = min(len(r) for r in runs)
            e = np.array([r[:n] for r in runs])     # runs × rates × (TTFT, TPOT)
            print(f"{mode:>13} {name:>18}: TTFT " + " / ".join(f"{x:+.1%}" for x in e[:, :, 0].mean(0))
                  + "; TPOT " + " / ".join(f"{x:+.1%}" for x in e[:, :, 1].mean(0)))


if __name__ == "__main__":
    main()
