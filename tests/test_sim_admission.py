"""The engine's admission hook (pdlab.sim.admission): refusals recorded as the live client records them,
the policy driven by the simulated clock, its ``done`` at the end of the prefill leg."""

from __future__ import annotations

import pytest
from pdlab.sched.admission import PrefillModel, TTFTAdmission
from pdlab.sim import ConstantLatency, InstanceSpec, Simulator
from pdlab.sim.admission import REJECTED, AdmissionPolicy
from pdlab.workloads import Request


class EveryOther:
    """Refuses every second arrival; logs the calls with the clock it was given."""

    def __init__(self) -> None:
        self.clock = lambda: float("nan")
        self.calls: list[tuple[str, float, str]] = []
        self.n = 0

    def decide(self, prompt_tokens, output_tokens=0):
        self.n += 1
        admit = self.n % 2 == 1
        self.calls.append(("decide", self.clock(), str(prompt_tokens)))
        return type("Verdict", (), {"admit": admit, "reason": "" if admit else "odd one out"})()

    def start(self, key, prompt_tokens):
        self.calls.append(("start", self.clock(), key))

    def done(self, key):
        self.calls.append(("done", self.clock(), key))


def _pd(prefill_s=1.0):
    return [InstanceSpec(ConstantLatency(prefill_s, 0.01), 10_000, role="prefill", max_num_seqs=1),
            InstanceSpec(ConstantLatency(prefill_s, 0.01), 10_000, role="decode")]


def test_refusals_are_error_records_and_the_policy_runs_on_simulated_time():
    policy = EveryOther()
    assert isinstance(policy, AdmissionPolicy)
    reqs = [Request(i, 0.5 * i, 100, 5) for i in range(4)]
    res = Simulator(_pd(), admission=policy).run(reqs)
    refused = [r for r in res.records if not r.ok]
    assert [r.request_id for r in refused] == [1, 3]
    assert all(r.error.startswith(REJECTED) and "odd one out" in r.error and r.extra == {"rejected": "arrival"}
               and r.first_token_s is None for r in refused)
    assert all(r.ok for r in res.records if r.request_id in (0, 2))
    decides = [(t, n) for kind, t, n in policy.calls if kind == "decide"]
    assert decides == [(0.0, "100"), (0.5, "100"), (1.0, "100"), (1.5, "100")]  # the arrivals' times
    # the prefill leg of request 0 ends at 1.0 s (one prompt at a time, 1 s each), request 2's at 2.0 s
    dones = [(t, key) for kind, t, key in policy.calls if kind == "done" and key in ("0", "2")]
    assert dones[0] == (1.0, "0") and (2.0, "2") in dones
    assert ("start", 0.0, "0") in policy.calls and not any(c[0] == "start" and c[2] == "1" for c in policy.calls)


def test_the_proxy_policy_refuses_a_burst_on_the_engine():
    model = PrefillModel(0.0, 0.001)  # 0.1 s per 100-token prompt
    policy = TTFTAdmission(model, ttft_slo_s=0.35, learn=0.0)
    prefill = InstanceSpec(ConstantLatency(0.1, 0.0), 10_000, role="prefill", max_num_seqs=1)
    decode = InstanceSpec(ConstantLatency(0.0, 0.001), 10_000, role="decode")
    res = Simulator([prefill, decode], admission=policy).run([Request(i, 0.0, 100, 2) for i in range(6)])
    assert [r.ok for r in res.records] == [True, True, True, False, False, False]  # 0.1 + 0.2 + 0.3 s ≤ 0.35 s
    assert policy.admitted == 3 and policy.rejected == 3 and not policy.in_flight  # every leg came back
    assert max(r.ttft_s for r in res.records if r.ok) == pytest.approx(0.3)
