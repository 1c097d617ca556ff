"""Overload on a live 1P1D deployment, with and without early rejection at the proxy.

Mooncake (FAST'25 §7, arXiv 2407.00079v3) refuses a request on arrival when its predicted TTFT
misses the SLO, instead of admitting it and missing later; notebook 07 simulates that policy.
Here it runs live (:mod:`pdlab.serve.proxy.admission`, the proxy's ``--admission-profile``), and a run
is measured as one row of :class:`OverloadRow`:

1. The caller brings the prefill model ``t_p(l) = a + b·l + c·l²`` the proxy predicts with
   (:func:`pdlab.simreal.probes.fit_prefill_model` probes and fits it); :func:`measure_handoff` takes
   the rest of a single request's TTFT through the proxy (KV hand-off and first decode step).
2. :func:`saturation_capacity`: every request of a workload at once; completed requests over
   the makespan is the deployment's throughput when saturated (req/s) — an upper bound, not a rate
   whose requests meet the SLO. :func:`slo_capacity` searches down from it for the highest rate at
   which, without admission, ``target`` of the requests meet the SLO: the capacity, the unit of
   "1×, 2×, 3× load".
3. :func:`overload_run` sends the workload at a multiple of that rate and records goodput, the
   SLO attainment of the *admitted* requests, the rejection share (HTTP 503), other failures,
   and the engines' peak memory (RSS of their process trees) and KV-cache usage, sampled while
   it runs. Beside the client's TTFT p90 of the admitted requests it keeps the proxy's own (request
   received → first token sent on) and the p90 of what the admission predicted for them, so a
   missed objective can be placed: in the prediction, or in front of the proxy. The same arrivals go
   through the simulator with the live policy as its admission hook
   (:func:`pdlab.sched.admission.simulate_admission`), given only the arrivals, the prompt lengths and
   the calibration (the prefill fit, the hand-off, the loaded engine's slowdown): never the proxy's
   ``/metrics`` readings or what it learned. The run reports how often those decisions agree with the
   proxy's: overall, on the requests the proxy admitted and on those it refused.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pdlab.metrics import SLO, RequestRecord, percentiles, slo_attainment, summarize
from pdlab.sched.admission import PrefillModel, TTFTAdmission, replay_admission, simulate_admission
from pdlab.serve.measure.evidence import largest_hit_share, scrape_metrics
from pdlab.workloads import Request

__all__ = ["REJECTED", "is_rejected", "save_prefill_profile", "measure_handoff",
           "saturation_capacity", "loaded_slowdown", "run_requests", "slo_capacity", "ResourceSampler", "OverloadRow", "overload_run",
           "AdmissionSettings", "DESIGNS", "overload_matrix", "replay_agreement"]

#: How the client's error text starts for a request the proxy refused on arrival.
REJECTED = "HTTP 503"


def is_rejected(rec: RequestRecord) -> bool:
    """True for a request the front door refused on arrival (HTTP 503), not one that failed later."""
    return (not rec.ok) and (rec.error or "").startswith(REJECTED)


def save_prefill_profile(model: PrefillModel, path: str | Path) -> Path:
    """Write ``{"prefill": [a, b, c]}``, the file the proxy's ``--admission-profile`` reads."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"prefill": [model.a_s, model.b_s_per_token, model.c_s_per_token2]}))
    return path


def measure_handoff(proxy_url: str, model: PrefillModel, lengths: Sequence[int], *, repeats: int = 3,
                    seed: int = 0) -> tuple[float, list[dict[str, float]]]:
    """The part of a single request's TTFT through the proxy that is not its prefill (s, median ≥ 0):
    the KV hand-off and the decode server's first step, what the admission adds to every prediction."""
    from pdlab.serve.pair_probes import probe_handoff

    points = [asdict(p) for p in probe_handoff(proxy_url, lengths, repeats=repeats, seed=seed)]
    rests = [p["ttft_s"] - model.time_s(int(p["tokens"])) for p in points]
    for p, rest in zip(points, rests, strict=True):
        p["handoff_s"] = rest
    return max(float(np.median(rests)), 0.0), points


def saturation_capacity(url: str, requests: Sequence[Request], *, seed: int = 0, middle: float = 0.8,
                        request_timeout_s: float = 300.0) -> tuple[float, list[RequestRecord]]:
    """Every request of ``requests`` sent at once; the completion rate (req/s) while the queue is full.

    The rate is counted over the ``middle`` share of the finishes (0.8: from the 10th to the 90th
    percentile finish), so the ramp-up (the first prefills) and the tail (the last decodes, with the
    queue empty) do not dilute it. Raises RuntimeError when any request fails: a capacity measured
    with failures is not one.
    """
    from pdlab.serve.client.bench import ClientOptions, run_bench

    if not 0 < middle <= 1 or len(requests) < 5:
        raise ValueError(f"need ≥ 5 requests and 0 < middle ≤ 1, got {len(requests)} and {middle}")
    burst = [Request(r.request_id, 0.0, r.prompt_tokens, r.output_tokens, r.hash_ids) for r in requests]
    res = run_bench(url, burst, client=ClientOptions(request_timeout_s=request_timeout_s), progress=False, seed=seed)
    bad = [r.error for r in res.records if not r.ok]
    if bad:
        raise RuntimeError(f"{len(bad)} of {len(burst)} requests failed while measuring capacity: {bad[0]}")
    finishes = np.sort([r.finish_s for r in res.records])
    lo, hi = int(round(len(finishes) * (1 - middle) / 2)), int(round(len(finishes) * (1 + middle) / 2)) - 1
    return (hi - lo) / (finishes[hi] - finishes[lo]), res.records


def loaded_slowdown(records: Sequence[RequestRecord], model: PrefillModel) -> float:
    """How much slower the prefill ran under load than ``model`` (the idle fit) predicts, from the
    records of :func:`saturation_capacity`'s burst (every request sent at once): the span from the
    first to the last first token ÷ the fitted prefill time of the prompts served after the first.
    The queue is full for that whole span, so this is the loaded engine's speed, measured once as
    part of the calibration (not learned while the policy runs). At least 1."""
    firsts = sorted((r.first_token_s, r.prompt_tokens) for r in records if r.ok and r.first_token_s is not None)
    if len(firsts) < 2:
        raise ValueError(f"need ≥ 2 answered requests to measure the loaded prefill, got {len(firsts)}")
    predicted = sum(model.time_s(tokens) for _, tokens in firsts[1:])
    span = firsts[-1][0] - firsts[0][0]
    return max(1.0, span / predicted) if predicted > 0 else 1.0


def run_requests(workload: Callable[[float, int], list[Request]], rate_rps: float, duration_s: float) -> list[Request]:
    """The requests of one run at ``rate_rps`` for ``duration_s`` of arrivals: ``workload(rate, n)``
    with n = rate × duration, at least 5. The capacity search's probes and :func:`overload_matrix`'s
    runs both draw from it, so the matrix's 1× run repeats the winning probe's arrivals."""
    return workload(rate_rps, max(5, int(round(rate_rps * duration_s))))


def slo_capacity(url: str, workload: Callable[[float, int], list[Request]], slo: SLO, *, upper_rps: float,
                 duration_s: float, fractions: Sequence[float] = (0.85, 0.7, 0.5, 0.35, 0.25), target: float = 0.9,
                 seed: int = 0, request_timeout_s: float = 120.0, tokenizer: str | Path | None = None,
                 bisect_steps: int = 1) -> tuple[float, list[dict[str, float]]]:
    """The highest rate (req/s) at which ≥ ``target`` of the requests meet ``slo``, searched on
    ``fractions`` × ``upper_rps`` and refined by bisection.

    Tries the rates from the highest down, each for ``duration_s`` of arrivals (:func:`run_requests`)
    sent to ``url`` as they are (no admission), down to the first that meets the target; then
    ``bisect_steps`` probes halve the gap between it and the grid rate above it that missed (a probe
    that meets raises the capacity to its rate, one that misses lowers the upper end), so the answer
    is not the grid's rounding down. The
    default grid starts below the saturated throughput: there the queue never drains, and a probe that
    meets the SLO has seen only the queue's first seconds, which a longer run at that rate does not keep.
    Returns the rate and one row per rate tried (``rate_rps``, ``share_of_upper``, ``attainment``,
    ``ttft_p90_s``, ``goodput_rps``, ``bisection``: True for a bisection probe). Raises RuntimeError
    when even the lowest rate misses. ``tokenizer``: the prompts'
    (None: the server's model folder).
    """
    from pdlab.serve.client.bench import ClientOptions, run_bench

    if not (upper_rps > 0 and duration_s > 0 and 0 < target <= 1) or not fractions or bisect_steps < 0:
        raise ValueError(f"need upper_rps > 0, duration_s > 0, 0 < target ≤ 1, fractions and bisect_steps ≥ 0, got "
                         f"{upper_rps}, {duration_s}, {target}, {list(fractions)}, {bisect_steps}")
    probes: list[dict[str, float]] = []

    def meets(f: float, bisection: bool) -> bool:
        rate = f * upper_rps
        res = run_bench(url, run_requests(workload, rate, duration_s), slo=slo, progress=False,
                        client=ClientOptions(request_timeout_s=request_timeout_s, tokenizer=tokenizer),
                        seed=seed + len(probes))
        ok = [r.ttft_s for r in res.records if r.ok]
        probes.append({"rate_rps": rate, "share_of_upper": f, "attainment": slo_attainment(res.records, slo),
                       "ttft_p90_s": percentiles(ok, [90])["p90"] if ok else float("nan"),
                       "goodput_rps": float(res.summary.get("goodput_rps", float("nan"))), "bisection": bisection})
        return probes[-1]["attainment"] >= target

    missed = None  # the lowest grid share that missed, above the one that meets
    for f in sorted(fractions, reverse=True):
        if meets(f, False):
            lo, hi = f, missed
            for _ in range(bisect_steps if hi is not None else 0):
                mid = (lo + hi) / 2
                if meets(mid, True):
                    lo = mid
                else:
                    hi = mid
            return lo * upper_rps, probes
        missed = f
    raise RuntimeError(f"no rate down to {probes[-1]['rate_rps']:.2f} req/s met the SLO for {target:.0%} of the requests")


class ResourceSampler:
    """Peak RSS (GiB) of labelled process trees and peak KV-cache usage (0–1) of vLLM servers,
    sampled every ``interval_s`` on a thread between ``__enter__`` and ``__exit__``."""

    def __init__(self, roots: Mapping[str, int], metric_urls: Sequence[str] = (), interval_s: float = 0.5):
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.roots, self.metric_urls, self.interval_s = dict(roots), list(metric_urls), interval_s
        self.peak_rss_gib: dict[str, float] = {label: 0.0 for label in self.roots}
        self.peak_kv_usage = 0.0
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        from pdlab.serve.measure.cpucost import tree_processes

        for label, pid in self.roots.items():
            rss = 0
            for proc in tree_processes(pid):
                try:
                    rss += proc.memory_info().rss
                except Exception:  # noqa: BLE001 — a process that ended between listing and reading
                    continue
            self.peak_rss_gib[label] = max(self.peak_rss_gib[label], rss / 2**30)
        for url in self.metric_urls:
            try:
                usage = scrape_metrics(url).total("vllm:kv_cache_usage_perc")
            except OSError:
                continue
            self.peak_kv_usage = max(self.peak_kv_usage, usage)
        self.samples += 1

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> ResourceSampler:
        self.sample()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self.sample()


@dataclass
class OverloadRow:
    """One overload run (rates req/s, times s, memory GiB). ``ttft_p90_admitted_s``: the client's TTFT
    p90 of the admitted requests that succeeded; ``ttft_p90_proxy_s``: the proxy's own (received → first
    token sent on); ``predicted_ttft_p90_s``: the p90 of the admission's predictions for them (NaN with
    admission off). ``predicted_rejected_share``: the share the policy refuses with the fit as it is
    (no learning, legs ending when predicted); ``predicted_rejected_share_learned``: the share the
    simulator's replay with the live policy refuses (:func:`overload_run`); ``decisions_agree``,
    ``agree_on_admitted``, ``agree_on_refused``: how often that replay's decisions equal the proxy's,
    over all requests, those the proxy admitted and those it refused (NaN where there are none);
    ``replay_self_agree``: how often the replay agrees with itself when its engine runs 2 % slower,
    the ceiling of that agreement for decisions this close to the threshold.
    ``learned_slowdown``: what the proxy itself learned, reported, not used by the replay."""

    design: str
    load_x: float
    rate_rps: float
    requests: int
    rejected_share: float
    failed_admitted: int
    goodput_rps: float
    attainment_admitted: float
    ttft_p90_admitted_s: float
    ttft_p90_proxy_s: float
    predicted_ttft_p90_s: float
    tpot_p90_admitted_s: float
    predicted_rejected_share: float
    learned_slowdown: float
    predicted_rejected_share_learned: float
    decisions_agree: float
    agree_on_admitted: float
    agree_on_refused: float
    replay_self_agree: float
    peak_engine_rss_gib: float
    peak_proxy_rss_gib: float
    peak_kv_usage: float
    prefix_cache_hit_share: float
    wall_s: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _proxy_slowdown(proxy_url: str) -> float:
    """The slowdown the proxy's admission learned (``GET /proxy/admission``); NaN when it is off."""
    import urllib.request

    with urllib.request.urlopen(proxy_url.rstrip("/") + "/proxy/admission", timeout=10) as resp:
        state = json.loads(resp.read())
    return float(state["slowdown"]) if state.get("enabled") else float("nan")


def overload_run(dep, requests: Sequence[Request], slo: SLO, admission: AdmissionSettings, *, design: str,
                 load_x: float, rate_rps: float, seed: int = 0, request_timeout_s: float = 120.0,
                 server_prompt_tokens: Mapping[int, int] | None = None) -> tuple[OverloadRow, list[RequestRecord]]:
    """Send ``requests`` (arrival times from 0) through ``dep``'s proxy and measure one :class:`OverloadRow`.

    ``admission``: the admission's settings (its ``model``, ``handoff_s`` and ``headroom``; the proxy was
    started with them, or without admission). The same arrivals and prompt lengths
    (``server_prompt_tokens``: request id → the server's prompt length, when the client's differs) go
    through :func:`simulate_admission`: a fresh :class:`TTFTAdmission` with those settings (and the
    proxy's defaults) as the simulator's admission hook, on a prefill engine ``admission.engine_slowdown``
    × slower than the fit (the calibration's loaded engine); with ``design`` ``"engine state"`` it reads the
    simulated engines' state every 0.5 s, as the proxy's poller reads ``/metrics``. Nothing the proxy
    measured or learned during the run goes in.
    """
    from pdlab.serve.client.bench import ClientOptions, run_bench
    from pdlab.serve.measure.ttft import proxy_timings

    roots = {s.spec.role: s.process.pid for s in dep.servers}
    before = dep.metrics_by_role()
    t0 = time.monotonic()
    with ResourceSampler({**roots, "proxy": dep.proxy.pid}, [s.url for s in dep.servers]) as res_meter:
        res = run_bench(dep.url, requests, slo=slo, client=ClientOptions(request_timeout_s=request_timeout_s),
                        progress=False, seed=seed)
    wall = time.monotonic() - t0
    after = dep.metrics_by_role()
    proxy_rows = proxy_timings(dep.url)  # the proxy was restarted for this run: these are its requests
    recs = res.records
    rejected = {r.request_id for r in recs if is_rejected(r)}
    admitted = [r for r in recs if r.request_id not in rejected]
    tokens = [int((server_prompt_tokens or {}).get(r.request_id, r.prompt_tokens)) for r in requests]
    arrivals = [r.arrival_s for r in requests]
    model, handoff_s, headroom = admission.model, admission.handoff_s, admission.headroom
    flags = replay_admission(arrivals, tokens, model, slo.ttft_s, handoff_s, headroom=headroom)
    slowdown = _proxy_slowdown(dep.url)
    if slowdown != slowdown:  # admission off: the proxy admits everything
        learned = nudged = [True] * len(requests)
    else:
        def replay(engine_x: float) -> list[bool]:
            policy = TTFTAdmission(model, slo.ttft_s, handoff_s, headroom=headroom)
            return simulate_admission(arrivals, tokens, policy, engine_slowdown=engine_x,
                                      poll_s=0.5 if design == "engine state" else None).admitted()

        learned, nudged = replay(admission.engine_slowdown), replay(1.02 * admission.engine_slowdown)
    agreement = _agreement(learned, [r.request_id not in rejected for r in requests])
    ok_admitted = [r for r in admitted if r.ok]
    ttft_p90 = percentiles([r.ttft_s for r in ok_admitted], [90])["p90"]
    predicted = [t["predicted_ttft_s"] for t in proxy_rows if t.get("predicted_ttft_s") is not None]
    p90 = lambda xs: float(np.percentile(xs, 90)) if xs else float("nan")  # noqa: E731
    tpots = [r.tpot_s for r in ok_admitted if r.tpot_s is not None]
    summary = summarize(recs, slo)
    row = OverloadRow(design=design, load_x=load_x, rate_rps=rate_rps, requests=len(recs),
                      rejected_share=len(rejected) / len(recs), failed_admitted=sum(not r.ok for r in admitted),
                      goodput_rps=float(summary.get("goodput_rps", float("nan"))),
                      attainment_admitted=slo_attainment(admitted, slo) if admitted else float("nan"),
                      ttft_p90_admitted_s=ttft_p90, ttft_p90_proxy_s=p90([t["ttft_s"] for t in proxy_rows]),
                      predicted_ttft_p90_s=p90(predicted), tpot_p90_admitted_s=p90(tpots),
                      predicted_rejected_share=1.0 - sum(flags) / len(flags), learned_slowdown=slowdown,
                      predicted_rejected_share_learned=1.0 - sum(learned) / len(learned),
                      decisions_agree=agreement["agree"], agree_on_admitted=agreement["agree_on_admitted"],
                      agree_on_refused=agreement["agree_on_refused"],
                      replay_self_agree=sum(a == b for a, b in zip(learned, nudged, strict=True)) / len(learned),
                      peak_engine_rss_gib=sum(v for k, v in res_meter.peak_rss_gib.items() if k != "proxy"),
                      peak_proxy_rss_gib=res_meter.peak_rss_gib["proxy"], peak_kv_usage=res_meter.peak_kv_usage,
                      prefix_cache_hit_share=largest_hit_share(before, after),
                      wall_s=wall)
    return row, recs


def _agreement(replayed: Sequence[bool], live: Sequence[bool]) -> dict[str, float]:
    """Shares of equal decisions: overall, where ``live`` admitted, where it refused (NaN: none)."""
    same = [a == b for a, b in zip(replayed, live, strict=True)]
    share = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    return {"agree": share(same), "agree_on_admitted": share([a for a, ok in zip(same, live, strict=True) if ok]),
            "agree_on_refused": share([a for a, ok in zip(same, live, strict=True) if not ok])}


def replay_agreement(run_dir: str | Path, *, engine_slowdowns: Sequence[float] = (1.0,)) -> list[dict[str, Any]]:
    """The simulator's replay of a saved overload run against the proxy's decisions, per design and load.

    ``run_dir`` holds what the overload lab writes: ``calibration.json`` (``prefill`` [a, b, c],
    ``handoff_s``, ``engine_slowdown``, ``headroom``, ``ttft_slo_s``) and ``records_<design>_<load>x.jsonl``
    for the designs with admission. Each run's arrivals (the client's send times) and prompt lengths go
    through :func:`simulate_admission` with a fresh policy of those settings, on an engine
    ``engine_slowdowns`` × the calibration's slowdown (1.0: as calibrated). One row per run and factor:
    ``design``, ``load_x``, ``engine_x``, ``requests``, ``refused_live``, ``refused_replay`` (shares) and
    the agreement overall, on the admitted and on the refused requests.
    """
    from pdlab.metrics import read_records

    run_dir = Path(run_dir)
    try:
        cal = json.loads((run_dir / "calibration.json").read_text())
        model = PrefillModel(*cal["prefill"])
        settings = (float(cal["ttft_slo_s"]), float(cal["handoff_s"]), float(cal["headroom"]), float(cal["engine_slowdown"]))
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{run_dir}/calibration.json is missing or incomplete ({exc})") from None
    slo_s, handoff_s, headroom, slowdown = settings
    rows = []
    for path in sorted(run_dir.glob("records_*x.jsonl")):
        design, load = path.stem.removeprefix("records_").rsplit("_", 1)
        design = design.replace("_", " ")
        if design not in ("bookkeeping", "engine state"):
            continue
        recs = sorted(read_records(path), key=lambda r: (r.arrival_s, str(r.request_id)))
        t0 = recs[0].arrival_s
        arrivals, tokens = [r.arrival_s - t0 for r in recs], [r.prompt_tokens for r in recs]
        live = [not is_rejected(r) for r in recs]
        for x in engine_slowdowns:
            policy = TTFTAdmission(model, slo_s, handoff_s, headroom=headroom)
            replayed = simulate_admission(arrivals, tokens, policy, engine_slowdown=x * slowdown,
                                          poll_s=0.5 if design == "engine state" else None).admitted()
            rows.append({"design": design, "load_x": float(load.removesuffix("x")), "engine_x": x, "requests": len(recs),
                         "refused_live": 1 - sum(live) / len(live), "refused_replay": 1 - sum(replayed) / len(replayed),
                         **_agreement(replayed, live)})
    if not rows:
        raise ValueError(f"{run_dir} holds no records_<design>_<load>x.jsonl of a design with admission")
    return rows


@dataclass(frozen=True)
class AdmissionSettings:
    """The proxy's early rejection in :func:`overload_matrix`: the fitted prefill ``model`` (saved at
    ``profile_path``), the measured ``handoff_s``, the ``tokenizer`` the proxy counts prompts with,
    and ``headroom`` (admit when the predicted TTFT ≤ headroom × the SLO). ``engine_slowdown``: how
    much slower the loaded prefill engine runs than the idle fit (from the calibration:
    :func:`loaded_slowdown` of the saturation burst), the simulated engine of the offline replay."""

    model: PrefillModel
    handoff_s: float
    profile_path: str | Path
    tokenizer: str | Path
    headroom: float = 1.0
    engine_slowdown: float = 1.0

    def proxy_args(self, ttft_slo_s: float) -> list[str]:
        """The proxy's command-line flags that turn this admission on."""
        return ["--admission-profile", str(self.profile_path), "--ttft-slo", f"{ttft_slo_s:g}",
                "--handoff", f"{self.handoff_s:.6f}", "--tokenizer", str(self.tokenizer),
                "--admission-headroom", f"{self.headroom:g}"]


#: The designs of :func:`overload_matrix`: no admission, the proxy's bookkeeping alone, and the
#: policy that also reads the engines' ``/metrics`` (queue and decode KV headroom).
DESIGNS = ("no admission", "bookkeeping", "engine state")


def overload_matrix(dep, workload: Callable[[float, int], list[Request]], slo: SLO, admission: AdmissionSettings, *,
                    capacity_rps: float, loads: Sequence[float], duration_s: float, seed: int = 0,
                    request_timeout_s: float = 120.0, designs: Sequence[str] = DESIGNS
                    ) -> list[tuple[OverloadRow, list[RequestRecord]]]:
    """Each load (× ``capacity_rps``) for ``duration_s`` through ``dep``'s proxy under each of ``designs``
    (:data:`DESIGNS`; ``admission``: the policy's settings). The order of the designs rotates from one
    load to the next (drift of the machine falls on all); all get the same arrivals and prompt lengths
    at a load (``workload(rate, n)``) but each run its own prompt text (seed ``seed + len(designs)·load
    index + k``), so a design that runs later does not find an earlier one's prompts in the prefix
    caches. The proxy is restarted for each run and left without admission."""
    unknown = [d for d in designs if d not in DESIGNS]
    if unknown or not designs:
        raise ValueError(f"unknown designs {unknown}; known: {', '.join(DESIGNS)}")
    args = {"no admission": [], "bookkeeping": admission.proxy_args(slo.ttft_s),
            "engine state": [*admission.proxy_args(slo.ttft_s), "--engine-metrics"]}
    out = []
    try:
        for i, x in enumerate(loads):
            rate = x * capacity_rps
            requests = run_requests(workload, rate, duration_s)
            order = list(designs[i % len(designs):]) + list(designs[:i % len(designs)])
            for k, design in enumerate(order):
                dep.restart_proxy(args[design])
                out.append(overload_run(dep, requests, slo, admission, design=design, load_x=x, rate_rps=rate,
                                        seed=seed + len(designs) * i + k, request_timeout_s=request_timeout_s))
    finally:
        dep.restart_proxy()
    return out
