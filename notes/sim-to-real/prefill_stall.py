"""How long does one prefill stall the streams a colocated server is decoding? (issue 26)

Lab 05's simulator runs a colocated server's prefill in the same engine step as the running
decodes (vLLM's chunked prefill) and charges that step the prefill row plus the decode row, the
fixed cost once: ``a_p + b_p·P + c_p·P² + (decode step − a_d)``. The prefill row comes from the
TTFT of lone prompts, which also holds whatever a request spends outside the engine loop: with
lab 05's layout (the engine alone on core 0, its API server and the client on core 1) the HTTP
request, tokenisation, and the first token's trip back through the API server run on the other
core. If ``a_p − a_d`` is that off-engine time, a prefill stalls the streams by only
``b_p·P + c_p·P²``, and the simulator overcharges every mixed step by ``a_p − a_d``: more at
higher rates, where more steps are mixed.

This benchmark measures the stall directly on lab 05's colocated server and layout:

1. **calibration**: lab 05's probe fit (``calibrate``, plan ``ci``) gives ``a_p, b_p, c_p`` and the
   decode row;
2. **rounds** (``--rounds``), each ``--streams`` streams of 256-token prompts generating
   ``--stream-tokens`` tokens, and, from 1 s after they start, one prefill every ``--spacing``
   seconds of each length in ``--lengths`` (``max_tokens=1``, shuffled, fresh prompt text; every
   request of a round goes through one client, the course's streaming client);
3. for each injected prefill, the **stall** each stream saw (``pdlab.serve.probes.prefill_stalls``):
   the time from its last token before the prefill was sent to its first token 3 steps after the
   prefill's first token, minus the steps in between at the stream's own median step away from any
   prefill; the streams' mean.

It prints per length the median stall, the injected request's TTFT, and what three accountings
predict: the simulator's old one (``a_p − a_d + b_p·P + c_p·P²``), an engine-only one
(``b_p·P + c_p·P²``, all the rest of a lone TTFT off-engine), and the calibration's own
(``fixed_s + b_p·P + c_p·P²``, ``fixed_s`` from its short-prompt stall probe,
``pdlab.simreal.calibrate.fit_prefill_stall``), then a fit of the stall over the lengths.

    .venv/bin/python notes/sim-to-real/prefill_stall.py [--rounds 6] [--streams 4]

Prints figures; not a test. Starts and stops its own server (nothing is left running).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from pdlab.process import free_port
from pdlab.serve import colocated
from pdlab.serve.engines.modelbuild import tiny_model_dir
from pdlab.serve.probes import calibrate, probe_prefill_stall

STREAM_PROMPT = 256


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--stream-tokens", type=int, default=1200)
    ap.add_argument("--lengths", default="16,128,512,1024")
    ap.add_argument("--per-length", type=int, default=2, help="prefills of each length per round")
    ap.add_argument("--spacing", type=float, default=0.4, help="seconds between injected prefills")
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")] * args.per_length
    kw = dict(max_model_len=2048, max_num_seqs=128, max_num_batched_tokens=2048)
    with colocated(tiny_model_dir(), port=free_port(), cores="0", **kw) as dep, dep.engine_cores_reserved():
        cal = calibrate(dep.url, plan="ci", seed=0)
        lat, own = cal.latency, cal.prefill_stall
        (ap_, bp, cp), ad = lat.prefill, lat.decode[0]
        print(f"probe fit: prefill a_p {ap_ * 1e3:.2f} ms, b_p {bp * 1e6:.2f} µs/token, c_p {cp * 1e9:.2f} ns/token²; "
              f"decode a_d {ad * 1e3:.2f} ms  → a_p − a_d {(ap_ - ad) * 1e3:+.2f} ms")
        print(f"the calibration's stall probe: {own.injections} prefills of median {own.median_prompt} tokens among "
              f"{own.streams} streams: fixed {own.fixed_s * 1e3:.2f} ms (raw {own.raw_fixed_s * 1e3:+.2f}), "
              f"off-engine {own.off_engine_s * 1e3:.2f} ms", flush=True)
        t0 = time.perf_counter()
        rows = probe_prefill_stall(dep.url, lengths, streams=args.streams, stream_prompt=STREAM_PROMPT,
                                   stream_tokens=args.stream_tokens, rounds=args.rounds, spacing_s=args.spacing,
                                   seed=5000)
        print(f"{args.rounds} rounds, {len(rows)} of {args.rounds * len(lengths)} prefills timed, in "
              f"{time.perf_counter() - t0:.0f} s; load average {os.getloadavg()[0]:.2f}")
    print(f"{'prompt':>7} {'n':>3} {'stall (ms)':>11} {'IQR':>13} {'TTFT (ms)':>10} {'old: a_p−a_d+…':>15} "
          f"{'engine only':>12} {'calibrated':>11}")
    stall_by = {}
    for p in sorted(set(lengths)):
        s = np.array([r["stall_s"] for r in rows if round(r["prompt_tokens"]) == p]) * 1e3
        if not len(s):
            continue
        t = np.array([r["ttft_s"] for r in rows if round(r["prompt_tokens"]) == p]) * 1e3
        engine = (bp * p + cp * p * p) * 1e3
        stall_by[p] = np.median(s)
        print(f"{p:>7} {len(s):>3} {np.median(s):>11.2f} {np.percentile(s, 25):>6.2f}–{np.percentile(s, 75):<6.2f} "
              f"{np.median(t):>10.2f} {(ap_ - ad) * 1e3 + engine:>15.2f} {engine:>12.2f} {own.fixed_s * 1e3 + engine:>11.2f}")
    ps = np.array(sorted(stall_by), dtype=float)
    A = np.vstack([np.ones_like(ps), ps, ps ** 2]).T
    coef = np.linalg.lstsq(A, np.array([stall_by[p] for p in sorted(stall_by)]), rcond=None)[0]
    print(f"\nstall fitted over the lengths' medians: {coef[0]:+.2f} ms + {coef[1] * 1e3:.2f} µs/token·P "
          f"+ {coef[2] * 1e6:.2f} ns/token²·P²; the old intercept a_p − a_d = {(ap_ - ad) * 1e3:+.2f} ms, "
          f"the calibration's {own.fixed_s * 1e3:+.2f} ms")


if __name__ == "__main__":
    main()
