"""Schedulers and their analyses, built on the simulator (notebooks 05, 07, 08, 09).

- :mod:`pdlab.sched.queueing` — DistServe §3.1: M/D/1 TTFT of colocated vs disaggregated prefill.
- :mod:`pdlab.sched.placement` — DistServe's placement search (Alg. 1 and 2): goodput per GPU.
- :mod:`pdlab.sched.conductor` — Mooncake's Conductor: KV-cache-aware prefill scheduling.
- :mod:`pdlab.sched.pools` — Splitwise's heterogeneous prefill/decode pools and the decision guide.
- :mod:`pdlab.sched.deploy_export` — a placement written as a Dynamo DynamoGraphDeployment or llm-d overlays.

Import the submodules; nothing is imported here.
"""

__all__: list[str] = []
