"""How closely could a perfect model predict lab 05's held-out runs on this machine? (issue 26)

``machine_steadiness.py`` times bare kernels with no server; ``engine_age.py`` asks whether the
engine slows as it ages. This asks what both leave open: with nothing of ours running but an idle
engine, does the *same* probe — the TTFT of one 1024-token prompt (median of 3) and the token gap
of 8 streams of 256-token prompts decoding 64 tokens together (twice; their geometric mean), fresh
prompt text each time — take the same
time from one minute to the next? If not, no step-time model fitted on some minutes can predict
other minutes more closely than the engine repeats itself.

It starts lab 05's colocated server (the engine alone on core 0, its API server and this client on
core 1) and repeats rounds for ``--seconds``: ``machine_steadiness.py``'s two kernels (matmul,
64 MiB copy) pinned to core 0 while the engine idles, then the two engine probes. It prints:

- per window of ``--window`` seconds, each quantity's median; each one's highest ÷ lowest window;
  how the engine's windows follow each kernel's (correlation and slope of the logarithms);
- **the floor under lab 05's held-out check**: lab 05 (profile ci) runs three rates in blocks of 30
  requests in the order A1 B1 C1 C2 B2 A2 and predicts each rate from a fit on another. Laid over
  the measured series from every starting round, that schedule gives each rate the median probe
  time of its two blocks; a *perfect* model fitted on one rate predicts another with error =
  (its speed ÷ the fitted rate's) − 1. The share of those predictions within ±10 %, and the share
  of schedules with all six within ±10 %, are the best any model could score here — an upper
  bound on the floor: a lab 05 block averages hundreds of steps, a round's probe a few dozen, so
  the probe's own noise (printed: a round's two decode probes against each other) counts too.

    .venv/bin/python notes/sim-to-real/engine_steadiness.py [--seconds 420] [--window 30]
        [--rates 2.7 5.5 8.2] [--out rows.json]

Prints figures; not a test. Starts and stops its own server (nothing is left running).
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # numpy's kernels on the pinned core alone (set before numpy)

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from pdlab.serve import colocated, free_port  # noqa: E402
from pdlab.serve.engines.modelbuild import tiny_model_dir  # noqa: E402
from pdlab.serve.measure.cpucost import machine_cpu_seconds  # noqa: E402
from pdlab.serve.measure.hostcheck import kernels  # noqa: E402
from pdlab.serve.probes import probe_decode, probe_prefill  # noqa: E402

COLUMNS = {"prefill": "engine: 1024-token prefill (ms)", "decode": "engine: decode gap b=8 (ms)",
           "matmul": "host: matmul (ms)", "copy": "host: 64 MiB copy (ms)"}
LAB05_ORDER = (0, 1, 2, 2, 1, 0)   # lab 05's mirrored block order over its three rates


def kernel_times_s(core: int, seconds: float = 0.3) -> dict[str, float]:
    """Each kernel's median time (s) over ``seconds`` of calls, this thread pinned to ``core``."""
    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        out = {}
        for name, fn in kernels().items():
            fn()   # first touches
            times, end = [], time.perf_counter() + seconds
            while time.perf_counter() < end:
                t = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t)
            out[name] = float(np.median(times))
        return out
    finally:
        os.sched_setaffinity(0, old)


def rounds(seconds: float) -> list[dict[str, float]]:
    """Start the server, repeat rounds for ``seconds``, stop it; one row (seconds) per round."""
    model_dir = tiny_model_dir()
    kw = dict(max_model_len=2048 + 80, max_num_seqs=128, max_num_batched_tokens=2048)
    rows = []
    with colocated(model_dir, port=free_port(), cores="0", **kw) as dep, dep.engine_cores_reserved():
        probe_prefill(dep.url, [1024], repeats=2, seed=1)   # warm-up, not counted
        t0 = time.perf_counter()
        k = 0
        while time.perf_counter() - t0 < seconds:
            k += 1
            row = {"t": time.perf_counter() - t0, **kernel_times_s(0)}
            row["prefill"] = probe_prefill(dep.url, [1024], repeats=3, seed=100 * k)[0].time_s
            a, b = (probe_decode(dep.url, [(8, 256)], output_tokens=64, repeats=1, seed=100 * k + j)[0].time_s
                    for j in (1, 2))
            row.update(decode=float(np.sqrt(a * b)), decode_a=a, decode_b=b)
            rows.append(row)
    return rows


def window_medians(rows: list[dict[str, float]], window_s: float) -> list[dict[str, float]]:
    """Per window of ``window_s`` seconds with at least 3 rounds: each quantity's median (s)."""
    t = np.array([r["t"] for r in rows])
    out = []
    for start in np.arange(0.0, t.max() + 1e-9, window_s):
        sel = [r for r, ti in zip(rows, t, strict=True) if start <= ti < start + window_s]
        if len(sel) >= 3:
            out.append({"start": float(start), "rounds": len(sel),
                        **{k: float(np.median([r[k] for r in sel])) for k in COLUMNS}})
    return out


def perfect_model_floor(rows: list[dict[str, float]], key: str, rates: list[float], *, requests_per_block: int = 30,
                        gap_s: float = 3.0, tail_s: float = 1.5) -> dict[str, float]:
    """Lab 05's schedule (blocks of ``requests_per_block`` requests lasting that ÷ rate + ``tail_s``
    seconds, ``gap_s`` apart, in ``LAB05_ORDER``) laid over the series of ``key`` from every round
    that leaves room for it. Per schedule each rate's speed is the median of ``key`` over its two
    blocks' rounds, and a perfect model fitted on rate a predicts rate b with error speed_b ÷
    speed_a − 1. Returns the number of schedules, the share of predictions within ±10 %, the
    share of schedules with every prediction within ±10 %, and the median |error|."""
    t, y = np.array([r["t"] for r in rows]), np.array([r[key] for r in rows])
    durations = [requests_per_block / rates[i] + tail_s for i in LAB05_ORDER]
    span = sum(durations) + gap_s * (len(durations) - 1)
    within, all_within, errors = [], [], []
    for start in t[t <= t.max() - span]:
        at, picked = start, {i: [] for i in range(len(rates))}
        for i, d in zip(LAB05_ORDER, durations, strict=True):
            picked[i].extend(y[(t >= at) & (t < at + d)])
            at += d + gap_s
        if any(not v for v in picked.values()):   # a block shorter than a round caught none
            continue
        speed = {i: float(np.median(v)) for i, v in picked.items()}
        err = [speed[b] / speed[a] - 1 for a in speed for b in speed if a != b]
        errors += err
        within += [abs(e) <= 0.10 for e in err]
        all_within.append(all(abs(e) <= 0.10 for e in err))
    if not all_within:
        return {"schedules": 0}
    return {"schedules": len(all_within), "within": float(np.mean(within)), "all_within": float(np.mean(all_within)),
            "median_abs_err": float(np.median(np.abs(errors)))}


def report(rows: list[dict[str, float]], window_s: float, rates: list[float]) -> None:
    wins = window_medians(rows, window_s)
    print(f"\n{'window (s)':>10} {'rounds':>6} " + " ".join(f"{v:>32}" for v in COLUMNS.values()))
    for w in wins:
        print(f"{w['start']:10.0f} {w['rounds']:6d} " + " ".join(f"{w[k] * 1e3:32.2f}" for k in COLUMNS))
    if len(wins) >= 3:
        print("\nhighest ÷ lowest window: " + ", ".join(
            f"{k} {max(w[k] for w in wins) / min(w[k] for w in wins):.2f}×" for k in COLUMNS))
        for eng in ("prefill", "decode"):
            y = np.log([w[eng] for w in wins])
            for host in ("matmul", "copy"):
                x = np.log([w[host] for w in wins])
                r = float(np.corrcoef(x, y)[0, 1]) if x.std() > 0 and y.std() > 0 else float("nan")
                print(f"  {eng} windows against {host} windows: r = {r:+.2f}, slope {np.polyfit(x, y, 1)[0]:+.2f}")
    pairs = [(r["decode_a"], r["decode_b"]) for r in rows if "decode_a" in r]
    if pairs:
        print(f"\nthe probe's own noise: a round's two decode probes, seconds apart, differ by a median "
              f"{np.median([abs(a / b - 1) for a, b in pairs]):.1%} (each round's decode is their geometric mean)")
    print(f"\nlab 05's held-out check with a perfect model (rates {rates} req/s, blocks of 30 requests, "
          "order A1 B1 C1 C2 B2 A2):")
    for key in ("prefill", "decode"):
        f = perfect_model_floor(rows, key, rates)
        if not f["schedules"]:
            print(f"  {key}: the series is shorter than one schedule; run longer")
            continue
        print(f"  {key}: {f['within']:.0%} of predictions within ±10 %, all six within ±10 % in "
              f"{f['all_within']:.0%} of {f['schedules']} schedules; median |error| {f['median_abs_err']:.1%}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=420.0, help="how long to repeat the rounds (s)")
    ap.add_argument("--window", type=float, default=30.0, help="window length (s)")
    ap.add_argument("--rates", type=float, nargs=3, default=[2.7, 5.5, 8.2],
                    help="lab 05's three rates (req/s; it prints them; these are one ci run's on this VM type)")
    ap.add_argument("--out", type=Path, help="also write the rounds (seconds) to this JSON file")
    ap.add_argument("--rows", type=Path, help="report on rounds written earlier with --out; start no server")
    args = ap.parse_args()
    if args.window <= 0 or args.seconds < 3 * args.window:
        raise SystemExit(f"need a positive window and at least three windows, got --seconds {args.seconds} "
                         f"--window {args.window}")
    if any(r <= 0 for r in args.rates):
        raise SystemExit(f"rates must be positive, got {args.rates}")
    if args.rows:
        report(json.loads(args.rows.read_text()), args.window, args.rates)
        return
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    busy0, steal0 = machine_cpu_seconds()
    t0 = time.perf_counter()
    rows = rounds(args.seconds)
    busy1, steal1 = machine_cpu_seconds()
    span = time.perf_counter() - t0
    print(f"{len(rows)} rounds over {span:.0f} s (server start included); machine busy "
          f"{(busy1 - busy0) / span:.2f} cores, stolen {(steal1 - steal0) / span:.3f} cores")
    if args.out:
        args.out.write_text(json.dumps(rows))
    report(rows, args.window, args.rates)


if __name__ == "__main__":
    main()
