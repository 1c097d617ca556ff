"""pdlab.sim's parts: batch schedulers as registered classes (a toy one added without touching
``Instance``), the role defaults, the KV manager, and the engine as the only owner of its events."""

from pathlib import Path

import pytest
from pdlab.sim import (
    ChunkedPrefill,
    ConstantLatency,
    ContinuousBatching,
    DecodeOnly,
    InstanceSpec,
    KVManager,
    KVLink,
    Scheduler,
    Simulator,
    register_scheduler,
    scheduler_names,
)
from pdlab.sim.state import SimRequest
from pdlab.workloads import Request

PREFILL_S, DECODE_S = 1.0, 0.1
OUTPUT = 5


class OneAtATime(Scheduler):
    """A toy: one request at a time, from its prefill to its last token, first come first served."""

    def form_batch(self, now):
        inst = self.inst
        if self.running:
            decodes = self.ensure_decode_room(now, self.decode_candidates())
            return inst.decode_batch(now, decodes) if decodes else None
        if self.waiting:
            prefill = self.admit_prefills(now, self.spec.max_batched_tokens, 1, True)
            if prefill:
                return inst.prefill_batch(now, prefill, [])
        return None


def _three_at_once(scheduler: str):
    spec = InstanceSpec(ConstantLatency(PREFILL_S, DECODE_S), 10_000, scheduler=scheduler)
    reqs = [Request(i, 0.0, 100, OUTPUT) for i in range(3)]
    sim = Simulator([spec])
    return sim, sim.run(reqs).records


def test_a_registered_toy_scheduler_runs_without_changing_instance():
    register_scheduler("one-at-a-time", OneAtATime)
    assert "one-at-a-time" in scheduler_names()
    sim, toy = _three_at_once("one-at-a-time")
    assert type(sim.instances[0].scheduler) is OneAtATime
    assert all(r.ok for r in toy)
    # one request at a time: each starts after the previous one has finished
    per_request = PREFILL_S + (OUTPUT - 1) * DECODE_S
    for i, r in enumerate(toy):
        assert r.first_token_s == pytest.approx(i * per_request + PREFILL_S)
        assert r.finish_s == pytest.approx((i + 1) * per_request)
    for before, after in zip(toy, toy[1:], strict=False):
        assert after.first_token_s > before.finish_s
    # continuous batching: the first request starts alone (the others arrive after it, at the same
    # time), the other two are prefilled together before it has finished, and all decode together
    _, vllm = _three_at_once("vllm")
    assert vllm[1].first_token_s == vllm[2].first_token_s == pytest.approx(2 * PREFILL_S)
    assert vllm[1].first_token_s < vllm[0].finish_s
    assert vllm[2].finish_s < toy[2].finish_s


def test_role_defaults_and_builtin_classes():
    lat = ConstantLatency(PREFILL_S, DECODE_S)
    specs = [InstanceSpec(lat, 10_000, role="prefill", scheduler="chunked"),
             InstanceSpec(lat, 10_000, role="decode", scheduler="chunked")]
    sim = Simulator(specs, link=KVLink(kv_bytes_per_token=1.0))
    res = sim.run([Request(i, 0.1 * i, 50, 3) for i in range(4)])
    assert all(r.ok for r in res.records)
    assert [type(i.scheduler) for i in sim.instances] == [ContinuousBatching, DecodeOnly]
    chunked = Simulator([InstanceSpec(lat, 10_000, scheduler="chunked")])
    chunked.run([Request(0, 0.0, 10, 2)])
    assert type(chunked.instances[0].scheduler) is ChunkedPrefill


def test_unknown_or_malformed_schedulers_are_clear_errors():
    lat = ConstantLatency(PREFILL_S, DECODE_S)
    with pytest.raises(ValueError, match="unknown scheduler 'nope'.*register_scheduler"):
        InstanceSpec(lat, 1000, scheduler="nope")
    with pytest.raises(TypeError, match="subclass of pdlab.sim.schedulers.Scheduler"):
        register_scheduler("not-a-scheduler", dict)

    class Everywhere(Scheduler):
        roles = ("colocated", "router")

    with pytest.raises(ValueError, match="unknown roles"):
        register_scheduler("everywhere", Everywhere)


def test_kv_manager_counts_tokens_and_prefix_hits():
    kv = KVManager(4 * 16, prefix_caching=True, block_tokens=16)
    first = SimRequest(Request(0, 0.0, 40, 2, hash_ids=(1, 2, 3)), False)
    assert kv.cached_prefix_tokens(first) == 0
    kv.admit_prompt(first, 0)
    assert kv.used == first.kv == 40 and kv.free_tokens == 24
    second = SimRequest(Request(1, 0.0, 40, 2, hash_ids=(1, 2, 9)), False)
    cached = kv.cached_prefix_tokens(second)
    assert cached == 2 * 16                 # blocks 1 and 2
    assert not kv.fits(40)
    kv.release(first)
    assert kv.used == 0 and first.kv == 0
    kv.admit_prompt(second, cached)
    assert second.prefilled == cached and kv.hit_tokens == cached and kv.prompt_tokens_seen == 80
    with pytest.raises(ValueError, match="capacity_tokens"):
        KVManager(0)


def test_only_the_engine_touches_its_event_heap():
    """Parts schedule events through the engine's methods (push, schedule_batch)."""
    pkg = Path(__file__).resolve().parents[1] / "helpers" / "pdlab"
    offenders = [p.relative_to(pkg).as_posix() for p in sorted(pkg.rglob("*.py"))
                 if p.name != "engine.py" and ("event_heap" in p.read_text() or "event_seq" in p.read_text())]
    assert not offenders, offenders
