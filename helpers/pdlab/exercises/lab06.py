"""Checks for lab 06 (faults on a live 1P1D deployment).

Exercise 1 is graded on the mechanism, not on the run: which mechanism decides what the client gets
after each fault, and what ``kv_load_failure_policy`` makes of a KV pull that cannot happen. The
key is vLLM's and the proxy's behaviour, so the check runs before the matrix prints any outcome.
"""

from __future__ import annotations

from collections.abc import Mapping

from pdlab.exercises import CheckResult, check_true

__all__ = ["MECHANISMS", "check_fault_mechanisms"]

#: What decides the client's outcome after a fault: Exercise 1 picks one key per fault.
MECHANISMS: dict[str, str] = {
    "nobody to answer": "the client closed its own connection: the engines must only stop the request and free it",
    "stream cut": "the process the client's stream runs through is dead: the connection ends with it",
    "policy decides": "the decode cannot load the KV it was promised: kv_load_failure_policy decides "
                      "(fail: an error; recompute: decode prefills the prompt itself)",
    "KV kept by the stop": "the prefill's memory is intact while the process is stopped, and the lease is enforced by "
                           "its own loop, which cannot run: the KV may still be there when the pull comes",
}

_MECHANISM_OF = {
    "client disconnects mid-stream": "nobody to answer",
    "proxy killed with streams open": "stream cut",
    "decode killed mid-stream": "stream cut",
    "prefill killed before the KV pull": "policy decides",
    "prefill frozen past the KV lease": "KV kept by the stop",
}
#: Does the client get its full answer when the prefill died after its leg, before the decode's pull?
_ANSWERED_AFTER_PREFILL_KILLED = {"fail": False, "recompute": True}


def check_fault_mechanisms(mechanism: Mapping[str, str] | None, answered: Mapping[str, bool] | None) -> CheckResult:
    """Exercise 1: ``mechanism`` maps every fault of :data:`pdlab.serve.experiments.faults.FAULTS` to the key of
    :data:`MECHANISMS` that decides its client's outcome; ``answered`` maps each ``kv_load_failure_policy``
    (``fail``, ``recompute``) to whether the client gets its full answer when the prefill is killed after its
    leg, before the decode pulls the KV."""
    expected = {"mechanism": _MECHANISM_OF, "answered": _ANSWERED_AFTER_PREFILL_KILLED}
    if mechanism is None or answered is None:
        return check_true("Exercise 1", None, False, expected=expected, choice=True, good="", bad="")
    got = {str(k): str(v) for k, v in dict(mechanism).items()}
    unknown = sorted({v for v in got.values() if v not in MECHANISMS})
    wrong = sorted(f for f in _MECHANISM_OF if got.get(f) != _MECHANISM_OF[f])
    extra = sorted(set(got) - set(_MECHANISM_OF))
    got_answered = {str(k): v for k, v in dict(answered).items()}
    wrong_policy = sorted(p for p in _ANSWERED_AFTER_PREFILL_KILLED
                          if not isinstance(got_answered.get(p), bool)
                          or got_answered[p] != _ANSWERED_AFTER_PREFILL_KILLED[p])
    ok = not (unknown or wrong or extra or wrong_policy)
    problems = []
    if unknown:
        problems.append(f"not keys of MECHANISMS: {', '.join(map(repr, unknown))}")
    if extra:
        problems.append(f"not faults of the lab: {', '.join(extra)}")
    if wrong:
        problems.append(f"{len(wrong)} of {len(_MECHANISM_OF)} faults have another mechanism: {', '.join(wrong)}")
    if wrong_policy:
        problems.append(f"the killed prefill under {', '.join(wrong_policy)}: ask what that policy tells a decode "
                        "whose KV pull fails")
    return check_true("Exercise 1", {"mechanism": got, "answered": got_answered}, ok,
                      expected=expected, choice=True,
                      good=f"all {len(_MECHANISM_OF)} mechanisms and both policies' outcomes are right",
                      bad="; ".join(problems) + ". For each fault ask: does the client still hold a connection, is "
                                                "the KV the decode needs still in the prefill's memory, and may the "
                                                "decode make the KV again itself?")
