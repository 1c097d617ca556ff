"""One simulation loop: only the simulator engine (pdlab.sim) keeps an event heap; the Conductor's
policies and the admission replays run on it."""

from __future__ import annotations

import re
from pathlib import Path

import pdlab
from pdlab.sched.admission import PrefillModel, TTFTAdmission, simulate_admission
from pdlab.sched.conductor import Conductor, mooncake_cluster
from pdlab.sim import Simulator
from pdlab.workloads import Request

PKG = Path(pdlab.__file__).parent


def test_no_event_heap_outside_the_simulator():
    users = [str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
             if re.search(r"^\s*(import heapq|from heapq import)", p.read_text(), re.M)]
    assert users and all(u.startswith("sim/") for u in users), users


def test_the_conductor_and_the_admission_replay_run_on_the_engine():
    cond = Conductor(mooncake_cluster(2, 1), "global_cache_aware", "slo")
    res = cond.run([Request(0, 0.0, 4096, 4, tuple(range(8))), Request(1, 0.5, 4096, 4, tuple(range(8)))])
    assert type(cond._sim).__mro__[1] is Simulator and all(r.ok for r in res.records)
    assert res.records[1].extra["prefix_tokens"] == 4096  # the second prompt is the first one, cached
    sim = simulate_admission([0.0, 0.0], [100, 100], TTFTAdmission(PrefillModel(0.0, 0.001), 0.15))
    assert sim.admitted() == [True, False] and sim.records[1].extra == {"rejected": "arrival"}
