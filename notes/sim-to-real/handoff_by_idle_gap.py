"""Why the pair's hand-off level on a lab 05 run depends on the rate: the requests that met an
idle machine, grouped by how long it had been idle.

``refit_handoff_on_run`` sets a run's hand-off level from its prefill-quiet requests that met an
idle decode role: their live − replayed TTFT. On the runs of 2026-12-04 that level was about
17 ms at 2.8 req/s and 12.5-13.5 ms at the higher rates. A low rate has longer idle gaps between
requests; if the engines, front ends or the proxy are slower to start a request after a long
idle gap (threads asleep, caches cold), the shift follows the gap, not the rate.

For each lab 05 OUT_DIR and set-up, every rate's run is replayed with the probe's fit (no
prefill contention, no front-end delay: these requests met no other request). Of the requests
that met no other request while they waited (prefill-quiet, no stream), it prints live − replayed
TTFT by the **idle gap**: the time from the last earlier request's end to this one's arrival.
Per gap group and rate (low / moderate / high), so a reader can see which one the shift follows.

Records that carry the proxy's prefill leg (``extra["prefill_leg_s"]``, the ``X-Prefill-Seconds``
header, kept since 2026-12-05) split the pair's shift into the prefill side (prefill leg − the
replay's arrival → KV pull) and the hand-off side (the rest − the replay's KV pull → first token).

    .venv/bin/python notes/sim-to-real/handoff_by_idle_gap.py build/lab05/ci [build/lab05_s48a ...]

Prints figures; not a test. Starts nothing.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import numpy as np
from pdlab.metrics import RequestRecord
from pdlab.simreal.calibrate import (
    decode_busy_while_waiting,
    load_saved_run,
    prefill_quiet_requests,
    replay_pairs,
    requests_from_records,
    simulate_like_live,
    ttft_sides,
    with_prefill_contention,
)

TOKEN_BUDGET, MAX_NUM_SEQS = 2048, 128   # lab 05's defaults
SETUPS = ("colocated", "disaggregated")
LOADS = ("low rate", "moderate rate", "high rate")   # lab 05's three rates, in order
GAP_EDGES_S = (0.05, 0.15, 0.4)          # idle-gap groups: < 50 ms, 50-150 ms, 150-400 ms, >= 400 ms


def gap_group(gap_s: float) -> str:
    """The idle-gap group's label, e.g. ``"50-150 ms"``.

    >>> gap_group(0.01), gap_group(0.2), gap_group(1.0)
    ('< 50 ms', '150-400 ms', '>= 400 ms')
    """
    edges_ms = [round(e * 1e3) for e in GAP_EDGES_S]
    for i, edge in enumerate(GAP_EDGES_S):
        if gap_s < edge:
            return f"< {edges_ms[0]} ms" if i == 0 else f"{edges_ms[i - 1]}-{edges_ms[i]} ms"
    return f">= {edges_ms[-1]} ms"


def idle_gap_s(r: RequestRecord, ok: list[RequestRecord]) -> float | None:
    """Seconds from the last end of an earlier-arrived request to ``r``'s arrival (None: none ended before)."""
    ends = [o.finish_s for o in ok if o is not r and o.arrival_s < r.arrival_s and o.finish_s is not None
            and o.finish_s <= r.arrival_s]
    return r.arrival_s - max(ends) if ends else None


def lone_request_shifts(out_dir: Path, setup: str) -> list[dict]:
    """One row per request that met no other request while it waited, at every rate of one run."""
    run = load_saved_run(out_dir, setup)
    cal, kv = run.calibration, run.kv_capacity_tokens
    latency = with_prefill_contention(cal.latency, 0.0) if setup == "disaggregated" else cal.latency
    rows = []
    for rank, rate in enumerate(run.records):
        load = LOADS[rank] if len(run.records) == len(LOADS) else f"rate {rank + 1} of {len(run.records)}"
        live = run.completed(rate)
        quiet = {id(r) for r in prefill_quiet_requests(live) if not decode_busy_while_waiting(r, live)}
        sims = simulate_like_live(requests_from_records(live), setup, latency, kv_capacity_tokens=kv,
                                  token_budget=TOKEN_BUDGET, max_num_seqs=MAX_NUM_SEQS, front_end_s=0.0)
        sides = {x["request_id"]: x for x in ttft_sides(live, sims)}   # where the records carry the prefill leg
        for r, s in replay_pairs(live, sims):
            gap = idle_gap_s(r, live) if id(r) in quiet else None
            if gap is None:
                continue
            row = {"run": out_dir.name, "load": load, "gap_s": gap, "shift_s": r.ttft_s - s.ttft_s}
            if r.request_id in sides:
                row["prefill_side_s"] = sides[r.request_id]["prefill_side_s"]
                row["handoff_side_s"] = sides[r.request_id]["handoff_side_s"]
            rows.append(row)
    return rows


def print_groups(rows: list[dict], by: tuple[str, ...]) -> None:
    """Median shifts (ms) and counts per group of ``by`` (``"gap"``, ``"load"``, ``"run"``)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        key = tuple(gap_group(row["gap_s"]) if k == "gap" else row[k] for k in by)
        groups[key].append(row)
    for key in sorted(groups, key=lambda k: tuple(ORDER.index(v) if v in ORDER else 99 for v in k)):
        g = groups[key]
        text = (f"    {' / '.join(key):>26}: n {len(g):>4}, "
                f"median gap {np.median([r['gap_s'] for r in g]) * 1e3:6.0f} ms, "
                f"live − replayed TTFT {np.median([r['shift_s'] for r in g]) * 1e3:+6.1f} ms")
        split = [r for r in g if "prefill_side_s" in r]
        if split:
            text += (f" (prefill side {np.median([r['prefill_side_s'] for r in split]) * 1e3:+6.1f}, hand-off side "
                     f"{np.median([r['handoff_side_s'] for r in split]) * 1e3:+6.1f} ms, of {len(split)})")
        print(text)


ORDER = [gap_group(e - 1e-9) for e in GAP_EDGES_S] + [gap_group(GAP_EDGES_S[-1])] + list(LOADS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dirs", nargs="+", type=Path, help="lab 05 OUT_DIRs (profiles, records)")
    args = ap.parse_args()
    for setup in SETUPS:
        rows = [row for d in args.out_dirs for row in lone_request_shifts(d, setup)]
        print(f"{setup}: {len(rows)} requests met no other request while they waited, in {len(args.out_dirs)} runs")
        if not rows:
            continue
        print("  by rate:")
        print_groups(rows, ("load",))
        print("  by idle gap:")
        print_groups(rows, ("gap",))
        print("  by idle gap and rate:")
        print_groups(rows, ("gap", "load"))


if __name__ == "__main__":
    main()
