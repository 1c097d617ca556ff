"""Is the calibration's hand-off probe longer than the workload's hand-off? (issue 26)

Lab 05 fits the pair's hand-off (proxy, KV pull, the decode server's first token) from the
calibration probe (:func:`pdlab.serve.probes.probe_handoff`: single prompts of a few lengths, one
after another, ``max_tokens=1``) as TTFT − the prefill fit − one decode step. On lab 05's runs the
requests of the workload that met an idle decode role came out 7–13 ms faster on their hand-off
side than that fit says, at every rate. This measures the hand-off without any model: the proxy
sends each request's prefill leg back (``X-Prefill-Seconds``), so TTFT − prefill leg is the
hand-off side as the client sees it. It starts the pair as lab 05 does and, in ``--rounds``
interleaved rounds (so drift hits all alike), runs

- ``probe, 1 token``: the calibration's probe as it is (sequential, ``max_tokens=1``);
- ``probe, N tokens``: the same prompts, one at a time, ``max_tokens=--tokens`` (one change: the
  output length);
- ``workload``: lab 05's lowest-rate workload (ShareGPT lengths, Poisson at ``--rate``), of which
  the requests during whose wait no other request streamed are the ones lab 05 sets its run's
  hand-off on;

each inside the engines' TTFT breakdown (:class:`pdlab.serve.measure.ttft.BreakdownWindow`), whose mean
parts say where in the hand-off the time goes (decode front end, decode queue, KV transfer,
decode first step).

    .venv/bin/python notes/sim-to-real/handoff_probe_vs_workload.py [--rounds 3] [--rate 2.6] [--requests 60]

Prints figures; not a test. Starts and stops its own servers (nothing is left running).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from pdlab.hardware import machine_type
from pdlab.metrics import RequestRecord
from pdlab.serve import DeployPorts, disaggregated
from pdlab.serve.client.bench import build_workload, run_bench
from pdlab.serve.engines.modelbuild import tiny_model_dir
from pdlab.serve.measure.ttft import BreakdownWindow, combine_breakdowns
from pdlab.serve.probes import PROBE_PLANS
from pdlab.simreal.calibrate import decode_busy_while_waiting
from pdlab.workloads import Request

SERVER_KW = dict(max_model_len=2048, max_num_seqs=128, max_num_batched_tokens=2048)   # lab 05's ci
HANDOFF_PARTS = ("proxy", "decode front end", "decode queue", "KV transfer", "decode first step")


def handoff_side_ms(records: list[RequestRecord]) -> np.ndarray:
    """TTFT − the proxy's prefill leg (ms) of each request that has both."""
    return np.array([(r.ttft_s - r.extra["prefill_leg_s"]) * 1e3 for r in with_leg(records)])


def with_leg(records: list[RequestRecord]) -> list[RequestRecord]:
    """The requests that finished and carry the proxy's prefill leg."""
    return [r for r in records if r.ok and r.ttft_s is not None and "prefill_leg_s" in r.extra]


def line_fit(tokens: np.ndarray, side_ms: np.ndarray) -> tuple[float, float]:
    """Least squares side = a + b × tokens: (a in ms, b in ms per 1,000 prompt tokens)."""
    b, a = np.polyfit(tokens, side_ms, 1)
    return float(a), float(b * 1e3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the three groups (default 3)")
    ap.add_argument("--rate", type=float, default=2.6, help="the workload's rate, req/s (default 2.6, lab 05's lowest)")
    ap.add_argument("--requests", type=int, default=60, help="workload requests per round (default 60)")
    ap.add_argument("--tokens", type=int, default=16, help="max_tokens of the second probe (default 16)")
    ap.add_argument("--repeats", type=int, default=3, help="probe prompts per length per round (default 3, lab 05's)")
    args = ap.parse_args()
    if args.rounds < 1 or args.rate <= 0 or args.requests < 2 or args.tokens < 2 or args.repeats < 1:
        ap.error("--rounds >= 1, --rate > 0, --requests >= 2, --tokens >= 2 and --repeats >= 1")
    lengths = PROBE_PLANS["ci"].handoff_lengths
    groups = ("probe, 1 token", f"probe, {args.tokens} tokens", "workload, decode idle", "workload, decode busy")
    sides: dict[str, list[float]] = {g: [] for g in groups}
    tokens: dict[str, list[int]] = {g: [] for g in groups}
    legs: dict[str, list[float]] = {g: [] for g in groups}
    windows: dict[str, list] = {g: [] for g in groups[:3]}
    print(machine_type())
    with disaggregated(tiny_model_dir(), ports=DeployPorts.free(), **SERVER_KW) as dep, dep.decode_cores_reserved():
        t0 = time.perf_counter()
        for k in range(args.rounds):
            order = [n for n in lengths for _ in range(args.repeats)]
            np.random.default_rng(k).shuffle(order)
            runs = {groups[0]: ([Request(i, 0.0, n, 1) for i, n in enumerate(order)], 1),
                    groups[1]: ([Request(i, 0.0, n, args.tokens) for i, n in enumerate(order)], 1),
                    groups[2]: (build_workload("sharegpt-stratified", rate_rps=args.rate, n=args.requests, seed=k,
                                               max_prompt_tokens=1024, max_output_tokens=64), None)}
            for j, (group, (reqs, conc)) in enumerate(runs.items()):
                # seeds far apart: no prompt text repeats, so the prefix cache serves nothing
                with BreakdownWindow(dep) as window:
                    recs = run_bench(dep.url, reqs, progress=False, seed=10_000 * (3 * k + j + 1),
                                     max_concurrency=conc).records
                ok = [r for r in recs if r.ok]
                if len(ok) < len(recs):
                    raise RuntimeError(f"{group}: {len(recs) - len(ok)} of {len(recs)} requests failed")
                windows[group].append((window.breakdown([r.ttft_s for r in ok]), len(ok)))
                if group.startswith("workload"):
                    idle = [r for r in ok if not decode_busy_while_waiting(r, ok)]
                    busy = [r for r in ok if decode_busy_while_waiting(r, ok)]
                    parts = ((groups[2], idle), (groups[3], busy))
                else:
                    parts = ((group, ok),)
                for g, part in parts:
                    sides[g] += handoff_side_ms(part).tolist()
                    legs[g] += [r.extra["prefill_leg_s"] * 1e3 for r in with_leg(part)]
                    tokens[g] += [r.server_prompt_tokens or r.prompt_tokens for r in with_leg(part)]
                side = handoff_side_ms(ok)
                print(f"round {k + 1}, {group}: {len(ok)} requests, hand-off side median {np.median(side):.1f} ms",
                      flush=True)
        print(f"{time.perf_counter() - t0:.0f} s of requests")
    bins = ((0, 256), (256, 768), (768, 4096))
    print("\nhand-off side = TTFT − the proxy's prefill leg (ms), all rounds; by prompt tokens (median, n):")
    print(f"  {'':24s}{'all':>16s}" + "".join(f"{f'{lo}-{hi}':>16s}" for lo, hi in bins)
          + f"{'a + b/1k tokens':>20s}{'prefill leg':>13s}")
    for g in groups:
        s, n = np.array(sides[g]), np.array(tokens[g])
        if len(s) < 2:
            continue
        cells = [f"{np.median(s):7.1f} ({len(s):3d})"]
        for lo, hi in bins:
            m = (n > lo) & (n <= hi)
            cells.append(f"{np.median(s[m]):7.1f} ({m.sum():3d})" if m.any() else f"{'—':>13s}")
        a, b = line_fit(n, s) if len(set(n)) > 1 else (float("nan"), float("nan"))
        print(f"  {g:24s}" + "".join(f"{c:>16s}" for c in cells) + f"{a:10.1f} + {b:5.1f}"
              + f"{np.median(legs[g]):13.1f}")
    print("\nthe engines' mean TTFT parts on the hand-off side (ms; the workload's over all its requests):")
    print(f"  {'':24s}" + "".join(f"{p:>19s}" for p in HANDOFF_PARTS))
    for g, rows in windows.items():
        bd = combine_breakdowns([b for b, _ in rows], [n for _, n in rows])
        print(f"  {g:24s}" + "".join(f"{bd.parts[p] * 1e3:19.2f}" for p in HANDOFF_PARTS))


if __name__ == "__main__":
    main()
