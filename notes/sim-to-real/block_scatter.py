"""How much do one rate's blocks of a lab 05 run differ, and what does that leave a perfect model? (issue 26, offline)

Lab 05 runs each rate in blocks, in a mirrored order (A1 B1 C1 C2 B2 A2), so a slow drift of the
machine falls on every rate alike. This reads finished lab 05 runs (their ``OUT_DIR``s) and, per
set-up, cuts each rate's records into its blocks (in the order they arrived, the blocks' sizes) and gives each block its quiet decode steps' level against the run's own
probe fit (:func:`~pdlab.simreal.calibrate.quiet_step_ratio`), in the order the blocks ran.

Then, over all runs:

- **adjacent**: the same rate's two blocks that ran back to back (C1, C2): rms of their ratio − 1,
  the scatter of a block's level a few seconds apart;
- **first and last**: the lowest rate's blocks (A1 first, A2 last): the same over the whole run;
- **a perfect model's chance**: if every block's level scattered independently by the adjacent
  rms ÷ √2 and a rate's TPOT followed its blocks' mean level with ``--elasticity``, how often a
  model exact in everything else would get all held-out TPOTs of one set-up within 10 % (each rate
  fitted, every other rate predicted), of both set-ups, and of both in three runs in a row
  (Monte Carlo, ``--draws``).

    .venv/bin/python notes/sim-to-real/block_scatter.py build/s54a/lab05 [build/s54b/lab05 ...] [--blocks 2]

Prints figures; not a test. Starts nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from pdlab.simreal.calibrate import load_saved_run, quiet_step_ratio


def blocks_of(records, n_blocks: int) -> list[list]:
    """``records`` of one rate as its ``n_blocks`` blocks: sorted by arrival and cut into parts of
    the blocks' sizes (``pdlab.workloads.split_blocks``: equal, the first ones one larger where the
    count does not divide), as each block ran after the one before."""
    recs = sorted(records, key=lambda r: r.arrival_s)
    return [list(part) for part in np.array_split(np.array(recs, dtype=object), n_blocks)]


def perfect_model_chance(sigma_block: float, *, rates: int, blocks: int, elasticity: float, draws: int,
                         seed: int = 0) -> float:
    """P(every held-out TPOT of one set-up within 10 %) when each block's log level is N(0, sigma_block)."""
    rng = np.random.default_rng(seed)
    level = rng.normal(0.0, sigma_block, (draws, rates, blocks)).mean(axis=2)
    ok = np.ones(draws, bool)
    for i in range(rates):
        for j in range(rates):
            if i != j:
                ok &= np.abs(np.exp(elasticity * (level[:, i] - level[:, j])) - 1) <= 0.10
    return float(ok.mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dirs", nargs="+", type=Path, help="lab 05 OUT_DIRs")
    ap.add_argument("--blocks", type=int, default=2, help="lab 05's RATE_BLOCKS")
    ap.add_argument("--elasticity", type=float, default=1.2, help="TPOT change ÷ decode level change")
    ap.add_argument("--draws", type=int, default=200_000)
    args = ap.parse_args()
    adjacent: dict[str, list[float]] = {}
    ends: dict[str, list[float]] = {}
    n_rates = {}
    for d in args.out_dirs:
        for mode in ("colocated", "disaggregated"):
            run = load_saved_run(d, mode)
            lat = run.calibration.latency
            rows = []
            for k, (_, recs) in enumerate(sorted(run.records.items())):
                for b, part in enumerate(blocks_of(recs, args.blocks)):
                    rows.append((min(r.arrival_s for r in part), f"{'ABCDEFGH'[k]}{b + 1}", k,
                                 quiet_step_ratio(part, lat)))
            n_rates[mode] = len(run.records)
            rows.sort()
            t0 = rows[0][0]
            print(f"{d} {mode:>13}: " + "  ".join(f"{name}@{t - t0:.0f}s {q:.3f}" for t, name, _, q in rows))
            for i in range(len(rows) - 1):
                if rows[i][2] == rows[i + 1][2]:
                    adjacent.setdefault(mode, []).append(rows[i + 1][3] / rows[i][3] - 1)
            first = [q for _, _, k, q in rows if k == rows[0][2]]
            if len(first) >= 2:
                ends.setdefault(mode, []).append(first[-1] / first[0] - 1)
    print()
    chances = {}
    for mode, x in adjacent.items():
        x = np.array(x)
        rms = float(np.sqrt(np.mean(x ** 2)))
        e = np.array(ends.get(mode, [np.nan]))
        sigma = rms / np.sqrt(2)
        chances[mode] = perfect_model_chance(sigma, rates=n_rates[mode], blocks=args.blocks,
                                             elasticity=args.elasticity, draws=args.draws)
        print(f"{mode:>13}: adjacent blocks of one rate differ by rms {rms:.1%} ({len(x)} pairs, largest "
              f"{np.max(np.abs(x)):.1%}); first and last by rms {np.sqrt(np.nanmean(e ** 2)):.1%} ({len(e)} pairs); "
              f"a perfect model gets all held-out TPOTs within 10 % with probability {chances[mode]:.2f}")
    if len(chances) == 2:
        both = float(np.prod(list(chances.values())))
        print(f"both set-ups in one run: {both:.2f}; three runs in a row: {both ** 3:.3f} "
              f"(elasticity {args.elasticity:g}, {args.draws:,} draws)")


if __name__ == "__main__":
    main()
