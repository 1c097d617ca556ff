"""The course beside other tools: the same workload or configuration run through a peer, compared.

- :mod:`pdlab.peers.dynamo_compare` — our simulator beside NVIDIA Dynamo's offline trace replay
  (its Rust mocker) on one trace with matched settings (notebook 07, ``benchmarks/bench_sim.py``).
- :mod:`pdlab.peers.dynamo_planner` — Dynamo's planner in that replay beside ``pdlab place``.
- :mod:`pdlab.peers.aic_compare` — the simulator's latency model beside NVIDIA AIConfigurator
  (notebook 05, ``pdlab gpu-profile --annotate``).
- ``dynamo_replay.py`` and ``dynamo_planner_replay.py`` — standalone scripts run by the peers'
  own Python (``.venv-peers``, ``scripts/install_peers.sh``); they import no pdlab.

The names of ``dynamo_compare``, ``dynamo_planner`` and ``aic_compare`` are re-exported here.
Nothing runs at import time; the peers' packages are imported only when a comparison runs.
"""

from pdlab.peers import aic_compare, dynamo_compare, dynamo_planner
from pdlab.peers.aic_compare import *  # noqa: F403 - the names listed in aic_compare.__all__
from pdlab.peers.dynamo_compare import *  # noqa: F403 - the names listed in dynamo_compare.__all__
from pdlab.peers.dynamo_planner import *  # noqa: F403 - the names listed in dynamo_planner.__all__

__all__ = [*dynamo_compare.__all__, *dynamo_planner.__all__, *aic_compare.__all__]
