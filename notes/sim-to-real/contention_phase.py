"""What slows the pair's prefill while the decode role works (issue 26): which background, which phase.

Lab 05's contention probe (:func:`pdlab.serve.probes.probe_contention`) timed 1,024-token
prefills alone and while 16 streams decode on the decode role; which phase of that burst (the
decode role's own prefill of the 16 prompts, or their streaming) its three prefills landed in
decided c_p, 0.00–0.64 over six lab 05 runs on 2026-12-05, and the pair's held-out TTFT error
changed sign with it. This starts the pair as lab 05 does and, in ``--rounds`` interleaved
rounds, measures c_p = busy ÷ alone − 1 against several backgrounds on the decode role:

- ``streamed``: the old probe's burst of 16 streams (256-token prompts, 48 tokens), in a loop;
- ``not streamed``: the same burst with ``"stream": false`` (the front ends answer once per request);
- ``K long streams`` (``--long-streams K,...``): K streams sent 1 s before the prefills and
  decoding ``--long-tokens`` each, so the prefills fall wholly in steady streaming; with
  ``--via-proxy`` also sent through the proxy (prefilled on the prefill role, KV pulled, relayed);
- ``K renewed streams`` (``--renewed``): K short streams at a time (16-token prompts, 64 tokens),
  each replaced as it ends, to the decode server and through the proxy: streams that start and
  end as a workload's do; ``--renewed-tokens 1,256`` also sends them straight to the decode
  server with other output lengths (1: starts and ends without decoding, 256: fewer starts).

With ``--leg`` the prefills are sent through the proxy and timed by its prefill leg
(``X-Prefill-Seconds``), as lab 05 splits a workload request's TTFT. It prints each c_p, the CPU
seconds the front ends and this client used per second of each busy window, and the spread per
mode. Nothing else may run meanwhile: a test suite on the other core doubled single prefills.

    .venv/bin/python notes/sim-to-real/contention_phase.py [--rounds 6] [--repeats 3]
    .venv/bin/python notes/sim-to-real/contention_phase.py --rounds 4 --long-streams 1,2 --via-proxy --renewed --leg
    .venv/bin/python notes/sim-to-real/contention_phase.py --rounds 3 --long-streams 1 --long-tokens 400 \
        --renewed-tokens 64,256 --leg --settle 2.5      # a stream's age: --settle 0.5 against 2.5

Prints figures; not a test. Starts and stops its own servers (nothing is left running).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import threading
import time
import urllib.request

import numpy as np
from pdlab.hardware import machine_type
from pdlab.serve import DeployPorts, disaggregated
from pdlab.serve.client.bench import run_bench
from pdlab.serve.engines.modelbuild import tiny_model_dir
from pdlab.serve.measure.cpucost import own_cpu_seconds, thread_deltas, thread_times
from pdlab.serve.probes import while_running
from pdlab.workloads import Request

SERVER_KW = dict(max_model_len=2048, max_num_seqs=128, max_num_batched_tokens=2048)   # lab 05's ci
STREAMS, DECODE_PROMPT_WORDS, DECODE_TOKENS = 16, 256, 48   # the probe's background: 16 streams, 256-token prompts, 48 tokens
RENEWALS = 8   # renewed streams: requests per stream in one client call (several seconds: a measurement never meets a call's start)


def prefill_s(url: str, prompt_tokens: int, repeats: int, seed: int) -> float:
    """Median TTFT (s) of ``repeats`` single ``prompt_tokens``-token prompts, one at a time."""
    recs = run_bench(url, [Request(i, 0.0, prompt_tokens, 1) for i in range(repeats)], progress=False, seed=seed,
                     max_concurrency=1).records
    if not all(r.ok for r in recs):
        raise RuntimeError(f"a prefill to {url} failed: {next(r.error for r in recs if not r.ok)}")
    return float(np.median([r.ttft_s for r in recs]))


def prefill_leg_s(proxy_url: str, prompt_tokens: int, repeats: int, seed: int) -> float:
    """Median prefill leg (s, the course proxy's ``X-Prefill-Seconds``: its POST to the prefill
    server until the answer) of ``repeats`` single ``prompt_tokens``-token prompts sent through the
    proxy one at a time (``max_tokens=1``): what a workload request's prefill side sees."""
    recs = run_bench(proxy_url, [Request(i, 0.0, prompt_tokens, 1) for i in range(repeats)], progress=False,
                     seed=seed, max_concurrency=1).records
    legs = [r.extra.get("prefill_leg_s") for r in recs if r.ok]
    if len(legs) < len(recs) or any(leg is None for leg in legs):
        raise RuntimeError(f"a prefill through {proxy_url} failed or carried no X-Prefill-Seconds")
    return float(np.median(legs))


def streamed_burst(url: str, seed: int) -> None:
    """``STREAMS`` streamed requests at once, as the contention probe's background (256-token prompts)."""
    recs = run_bench(url, [Request(j, 0.0, 256, DECODE_TOKENS) for j in range(STREAMS)], progress=False,
                     seed=seed).records
    if not all(r.ok for r in recs):
        raise RuntimeError(f"a streamed background request failed: {next(r.error for r in recs if not r.ok)}")


class BusyWindow:
    """Over a ``with`` block: the front ends' and this client's CPU (``cores``, of ``pids``) and every
    thread's of the labelled process trees (``threads``, :func:`~pdlab.serve.measure.cpucost.thread_deltas`)."""

    def __init__(self, pids: list[int], roots: dict[str, int]):
        self.pids, self.roots = pids, roots
        self.cores, self.threads = 0.0, []

    def __enter__(self) -> BusyWindow:
        self.t0, self.cpu0, self.th0 = (time.perf_counter(), own_cpu_seconds(self.pids),
                                        thread_times(self.roots, alone=["client"]))
        return self

    def __exit__(self, *exc) -> None:
        elapsed = time.perf_counter() - self.t0
        self.cores = (own_cpu_seconds(self.pids) - self.cpu0) / elapsed
        self.threads = thread_deltas(self.th0, thread_times(self.roots, alone=["client"]), elapsed)


def long_streams(url: str, streams: int, tokens: int, seed: int) -> None:
    """``streams`` streamed requests at once (256-token prompts) that decode ``tokens`` tokens each:
    long enough that a measurement started after their prefill falls wholly in their streaming."""
    recs = run_bench(url, [Request(j, 0.0, 256, tokens) for j in range(streams)], progress=False, seed=seed).records
    if not all(r.ok for r in recs):
        raise RuntimeError(f"a long stream failed: {next(r.error for r in recs if not r.ok)}")


def renewed_streams(url: str, streams: int, seed: int, tokens: int = 64) -> None:
    """``streams`` streams to ``url`` (the proxy, or the decode server itself), each replaced by a
    new one as it ends (16-token prompts, ``tokens`` tokens each, ``streams`` at a time): streams
    that start (a short prefill and a KV pull) and end as a workload's do, with a prefill too
    short to queue a measured one for long. One client call sends enough of them to last seconds
    (``RENEWALS`` per stream at 64 tokens, more of shorter ones), so no measurement meets a call's start."""
    per_stream = max(2, min(200, RENEWALS * 64 // max(tokens, 1)))
    recs = run_bench(url, [Request(j, 0.0, 16, tokens) for j in range(per_stream * streams)], progress=False,
                     seed=seed, max_concurrency=streams).records
    if not all(r.ok for r in recs):
        raise RuntimeError(f"a renewed stream failed: {next(r.error for r in recs if not r.ok)}")


def during_streams(url: str, streams: int, tokens: int, seed: int, measure, window: BusyWindow,
                   settle_s: float = 1.0) -> float:
    """``measure()`` started ``settle_s`` after ``streams`` long streams were sent (their prefill on
    the decode role done, all of them decoding), inside ``window``; its result."""
    errors: list[Exception] = []

    def send() -> None:
        try:
            long_streams(url, streams, tokens, seed)
        except Exception as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    worker = threading.Thread(target=send, daemon=True)
    worker.start()
    try:
        time.sleep(settle_s)
        with window:
            out = measure()
    finally:
        worker.join(timeout=300)
    if errors:
        raise RuntimeError(f"background load failed: {errors[0]}") from errors[0]
    if worker.is_alive():
        raise RuntimeError("the long streams did not finish in 300 s")
    return out


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


def while_busy(background, measure, window: BusyWindow, settle_s: float = 0.5) -> float:
    """``measure()`` inside ``window``, ``settle_s`` after ``background(k)`` began running in a loop
    (:func:`~pdlab.serve.probes.while_running`)."""

    def timed() -> float:
        with window:
            return measure()

    return while_running(background, timed, settle_s=settle_s, first_tag=0, label="contention_phase")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=6, help="rounds of both modes, interleaved (default 6)")
    ap.add_argument("--repeats", type=int, default=3, help="prefills per measurement (default 3, lab 05's)")
    ap.add_argument("--prompt", type=int, default=1024, help="prefill prompt tokens (default 1024, lab 05's)")
    ap.add_argument("--long-streams", default="",
                    help="comma-separated stream counts: also measure while that many long streams all decode "
                         "(sent 1 s before the prefills, --long-tokens each); e.g. 2,16")
    ap.add_argument("--via-proxy", action="store_true",
                    help="also send each count of long streams through the proxy (relayed, as the workload's)")
    ap.add_argument("--renewed", action="store_true",
                    help="also measure while each count of short-lived streams runs through the proxy, each one "
                         "replaced as it ends (16-token prompts, 64 tokens: the workload's stream starts and ends)")
    ap.add_argument("--renewed-tokens", default="",
                    help="comma-separated output lengths: also K renewed streams straight to the decode server with "
                         "these many tokens each (1: requests that start and end without decoding; 256: a quarter "
                         "of the starts per second)")
    ap.add_argument("--settle", type=float, default=None,
                    help="seconds from the background's first send to the timed prefills (default: 0.5 for the "
                         "looping backgrounds, as the probe; 1.0 for the long streams)")
    ap.add_argument("--leg", action="store_true",
                    help="time the prefills as the proxy's prefill leg (sent through it) instead of TTFT at the prefill server")
    ap.add_argument("--top-threads", type=int, default=8, help="threads to print per background (default 8)")
    ap.add_argument("--long-tokens", type=int, default=200, help="tokens each long stream decodes (default 200)")
    args = ap.parse_args()
    long_counts = [int(x) for x in args.long_streams.split(",") if x.strip()]
    renewed_tokens = [int(x) for x in args.renewed_tokens.split(",") if x.strip()]
    settle = {} if args.settle is None else {"settle_s": args.settle}
    if args.settle is not None and not args.settle >= 0:
        ap.error("--settle: seconds >= 0")
    if any(n < 1 for n in renewed_tokens):
        ap.error("--renewed-tokens: lengths >= 1")
    if any(k < 1 for k in long_counts):
        ap.error("--long-streams: counts >= 1")
    if args.rounds < 2 or args.repeats < 1 or args.prompt < 1:
        ap.error("--rounds >= 2, --repeats >= 1 and --prompt >= 1")
    print(machine_type())
    rows: dict[str, list[tuple[float, float]]] = {"streamed": [], "not streamed": [],
                                                  **{f"{k} long streams": [] for k in long_counts},
                                                  **{f"{k} long streams via the proxy": [] for k in long_counts
                                                     if args.via_proxy},
                                                  **{f"{k} renewed streams via the proxy": [] for k in long_counts
                                                     if args.renewed},
                                                  **{f"{k} renewed streams": [] for k in long_counts if args.renewed},
                                                  **{f"{k} renewed streams, {n} tokens": [] for k in long_counts
                                                     for n in renewed_tokens}}
    with disaggregated(tiny_model_dir(), ports=DeployPorts.free(), **SERVER_KW) as dep, dep.decode_cores_reserved():
        pre, dec, model = dep.prefill[0].url, dep.decode[0].url, dep.served_model()
        pids = dep.front_end_pids() + [os.getpid()]
        roots = {"prefill server": dep.prefill[0].process.pid, "decode server": dep.decode[0].process.pid,
                 "proxy": dep.proxy.pid, "client": os.getpid()}   # engines included; the client's own threads only
        threads: dict[str, dict[tuple[str, str], float]] = {mode: {} for mode in rows}
        backgrounds = {"streamed": lambda k: streamed_burst(dec, seed=k),
                       "not streamed": lambda k: unstreamed_burst(dec, model, seed=k)}
        for r in range(args.rounds):
            modes = list(rows) if r % 2 == 0 else list(rows)[::-1]
            for j, mode in enumerate(modes):
                seed = 10_000 * (len(rows) * r + j + 1)   # no prompt repeats: the prefix cache serves nothing
                def timed(s: int) -> float:
                    return (prefill_leg_s(dep.url, args.prompt, args.repeats, s) if args.leg
                            else prefill_s(pre, args.prompt, args.repeats, s))

                alone = timed(seed)
                measure = functools.partial(timed, seed + 1)
                window = BusyWindow(pids, roots)
                count, target = int(mode.split()[0]) if mode[0].isdigit() else 0, dep.url if mode.endswith("proxy") else dec
                if mode in backgrounds:
                    busy = while_busy(lambda k, s=seed, b=backgrounds[mode]: b(s + 1000 + k), measure, window,
                                      **settle)
                elif "renewed" in mode:
                    tokens = int(mode.split(", ")[1].split()[0]) if ", " in mode else 64
                    busy = while_busy(lambda k, s=seed, n=count, u=target, t=tokens: renewed_streams(u, n, s + 1000 + k, t),
                                      measure, window, **settle)
                else:
                    busy = during_streams(target, count, args.long_tokens, seed + 1000, measure, window, **settle)
                c_p, cores = max(0.0, busy / alone - 1), window.cores
                rows[mode].append((c_p, cores))
                for t in window.threads:
                    key = (t.label, t.name)
                    threads[mode][key] = threads[mode].get(key, 0.0) + t.cores / args.rounds
                print(f"round {r + 1}, background {mode}: prefill {alone * 1e3:.1f} ms alone, {busy * 1e3:.1f} ms busy, "
                      f"c_p {c_p:.3f}; front ends + client {cores:.2f} cores", flush=True)
    for mode, vals in rows.items():
        cp = np.array([v[0] for v in vals])
        print(f"{mode:29s}: c_p median {np.median(cp):.3f}, range {cp.min():.3f}-{cp.max():.3f}, sd {cp.std(ddof=1):.3f} "
              f"over {len(cp)}; front ends + client {np.median([v[1] for v in vals]):.2f} cores (median)")
    print(f"threads by CPU while the prefills were timed (cores, mean over rounds; threads of one name summed), "
          f"top {args.top_threads} per background:")
    for mode, by_thread in threads.items():
        top = sorted(by_thread.items(), key=lambda kv: -kv[1])[:args.top_threads]
        print(f"  {mode}: " + ", ".join(f"{label}/{name} {cores:.2f}" for (label, name), cores in top))


if __name__ == "__main__":
    main()
