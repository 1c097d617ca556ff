"""The pair's prefill contention with the decode role's streaming taken out (issue 26).

Lab 05's contention probe (:func:`pdlab.serve.probes.probe_contention`) times 1,024-token
prefills alone and while 16 streams decode on the decode role. On the course's CPU pair those
streams go through the decode API server and this client, both on the prefill core, so the
probe's c_p mixes two things: the decode engine's pull on the shared cache and memory, and the
streaming's CPU on the prefill core, which lab 05's run fit charges per request already. Which of the two a probe of three prefills catches depends on the phase it
lands in (``benchmarks/contention_repeatability.py``); in six lab 05 runs on 2026-12-05 it drew
c_p = 0.00–0.64 and the pair's held-out TTFT error changed sign with it.

This starts the pair as lab 05 does and, in ``--rounds`` interleaved rounds, measures c_p with
the background streamed (the probe as it is) and with the same background not streamed
(``"stream": false``: the decode API server answers once per request, so the engine decodes
while the front ends idle), printing each c_p, the CPU seconds the front ends and this client
used per second of each busy window, and the spread per mode.

    .venv/bin/python benchmarks/contention_phase.py [--rounds 6] [--repeats 3]

Prints figures; not a test. Starts and stops its own servers (nothing is left running).
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
import urllib.request

import numpy as np
from pdlab.hardware import machine_type
from pdlab.serve import DeployPorts, disaggregated
from pdlab.serve.bench import run_bench
from pdlab.serve.cpucost import own_cpu_seconds
from pdlab.serve.modelbuild import tiny_model_dir
from pdlab.workloads import Request

SERVER_KW = dict(max_model_len=2048, max_num_seqs=128, max_num_batched_tokens=2048)   # lab 05's ci
STREAMS, DECODE_PROMPT_WORDS, DECODE_TOKENS = 16, 256, 48   # the probe's background: 16 streams, 256-token prompts, 48 tokens


def prefill_s(url: str, prompt_tokens: int, repeats: int, seed: int) -> float:
    """Median TTFT (s) of ``repeats`` single ``prompt_tokens``-token prompts, one at a time."""
    recs = run_bench(url, [Request(i, 0.0, prompt_tokens, 1) for i in range(repeats)], progress=False, seed=seed,
                     max_concurrency=1).records
    if not all(r.ok for r in recs):
        raise RuntimeError(f"a prefill to {url} failed: {next(r.error for r in recs if not r.ok)}")
    return float(np.median([r.ttft_s for r in recs]))


def streamed_burst(url: str, seed: int) -> None:
    """``STREAMS`` streamed requests at once, as the contention probe's background (256-token prompts)."""
    recs = run_bench(url, [Request(j, 0.0, 256, DECODE_TOKENS) for j in range(STREAMS)], progress=False,
                     seed=seed).records
    if not all(r.ok for r in recs):
        raise RuntimeError(f"a streamed background request failed: {next(r.error for r in recs if not r.ok)}")


def unstreamed_burst(url: str, model: str, seed: int) -> None:
    """``STREAMS`` requests at once, ``"stream": false``: the engine decodes, the front end answers once each."""
    rng = np.random.default_rng(seed)
    words = ["alpha", "bravo", "delta", "echo", "golf", "hotel", "india", "kilo", "lima", "mike", "oscar", "papa"]
    errors: list[Exception] = []

    def one(k: int) -> None:
        prompt = " ".join(rng.choice(words, DECODE_PROMPT_WORDS)) + f" {seed}-{k}"
        body = {"model": model, "prompt": prompt, "max_tokens": DECODE_TOKENS, "ignore_eos": True,
                "temperature": 0.0, "stream": False}
        req = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                resp.read()
        except Exception as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(k,)) for k in range(STREAMS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"an unstreamed background request failed: {errors[0]}")


def while_busy(background, measure, pids: list[int]) -> tuple[float, float]:
    """``measure()`` while ``background(k)`` runs in a loop; (its result, the front ends' and this
    client's CPU seconds per second of the window)."""
    stop, errors = threading.Event(), []

    def loop() -> None:
        k = 0
        while not stop.is_set():
            try:
                background(k)
            except Exception as exc:  # noqa: BLE001 - re-raised below
                errors.append(exc)
                return
            k += 1

    worker = threading.Thread(target=loop, daemon=True)
    worker.start()
    try:
        time.sleep(0.5)   # the background is under way, as in probe_contention
        t0, cpu0 = time.perf_counter(), own_cpu_seconds(pids)
        out = measure()
        cores = (own_cpu_seconds(pids) - cpu0) / (time.perf_counter() - t0)
    finally:
        stop.set()
        worker.join(timeout=120)
    if errors:
        raise RuntimeError(f"background load failed: {errors[0]}") from errors[0]
    return out, cores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=6, help="rounds of both modes, interleaved (default 6)")
    ap.add_argument("--repeats", type=int, default=3, help="prefills per measurement (default 3, lab 05's)")
    ap.add_argument("--prompt", type=int, default=1024, help="prefill prompt tokens (default 1024, lab 05's)")
    args = ap.parse_args()
    if args.rounds < 2 or args.repeats < 1 or args.prompt < 1:
        ap.error("--rounds >= 2, --repeats >= 1 and --prompt >= 1")
    print(machine_type())
    rows: dict[str, list[tuple[float, float]]] = {"streamed": [], "not streamed": []}
    with disaggregated(tiny_model_dir(), ports=DeployPorts.free(), **SERVER_KW) as dep, dep.decode_cores_reserved():
        pre, dec, model = dep.prefill[0].url, dep.decode[0].url, dep.served_model()
        pids = dep.front_end_pids() + [os.getpid()]
        backgrounds = {"streamed": lambda k: streamed_burst(dec, seed=k),
                       "not streamed": lambda k: unstreamed_burst(dec, model, seed=k)}
        for r in range(args.rounds):
            modes = list(backgrounds) if r % 2 == 0 else list(backgrounds)[::-1]
            for j, mode in enumerate(modes):
                seed = 10_000 * (2 * r + j + 1)   # no prompt repeats: the prefix cache serves nothing
                alone = prefill_s(pre, args.prompt, args.repeats, seed)
                busy, cores = while_busy(lambda k, s=seed, b=backgrounds[mode]: b(s + 1000 + k),
                                         lambda s=seed: prefill_s(pre, args.prompt, args.repeats, s + 1), pids)
                c_p = max(0.0, busy / alone - 1)
                rows[mode].append((c_p, cores))
                print(f"round {r + 1}, background {mode}: prefill {alone * 1e3:.1f} ms alone, {busy * 1e3:.1f} ms busy, "
                      f"c_p {c_p:.3f}; front ends + client {cores:.2f} cores", flush=True)
    for mode, vals in rows.items():
        cp = np.array([v[0] for v in vals])
        print(f"{mode:13s}: c_p median {np.median(cp):.3f}, range {cp.min():.3f}-{cp.max():.3f}, sd {cp.std(ddof=1):.3f} "
              f"over {len(cp)}; front ends + client {np.median([v[1] for v in vals]):.2f} cores (median)")


if __name__ == "__main__":
    main()
