"""Schedulers and their analyses, built on the simulator (notebooks 05, 07, 08, 09).

- :mod:`pdlab.sched.queueing` — DistServe §3.1: M/D/1 TTFT of colocated vs disaggregated prefill.
- :mod:`pdlab.sched.placement` — DistServe's placement search (Alg. 1 and 2): goodput per GPU.
- :mod:`pdlab.sched.conductor` — Mooncake's Conductor: KV-cache-aware prefill scheduling.
- :mod:`pdlab.sched.pools` — Splitwise's heterogeneous prefill/decode pools and the decision guide.
- :mod:`pdlab.sched.admission` — early rejection by predicted TTFT, one policy for the live proxy and the simulator.
- :mod:`pdlab.sched.deploy_export` — a placement written as a Dynamo DynamoGraphDeployment or llm-d overlays.

The names of every submodule are re-exported here; nothing runs at import time.
"""

from pdlab.sched import admission, conductor, deploy_export, placement, pools, queueing
from pdlab.sched.admission import *  # noqa: F403 - the names listed in admission.__all__
from pdlab.sched.conductor import *  # noqa: F403 - the names listed in conductor.__all__
from pdlab.sched.deploy_export import *  # noqa: F403 - the names listed in deploy_export.__all__
from pdlab.sched.placement import *  # noqa: F403 - the names listed in placement.__all__
from pdlab.sched.pools import *  # noqa: F403 - the names listed in pools.__all__
from pdlab.sched.queueing import *  # noqa: F403 - the names listed in queueing.__all__

__all__ = [*queueing.__all__, *placement.__all__, *conductor.__all__, *pools.__all__, *deploy_export.__all__,
           *admission.__all__]
