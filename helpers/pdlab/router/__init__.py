"""``pdlab.router`` — route each request to colocated or disaggregated serving, live and simulated.

- :mod:`pdlab.router.policies` — routing policies (all-colocated, all-disaggregated, threshold,
  SLO-aware), output-length predictors (constant, learned from history), the load → TTFT/TPOT
  estimator;
- :mod:`pdlab.router.sim` — the same policies inside :mod:`pdlab.sim` (a cluster with a colocated
  pool and P/D instances; optional prefix caching);
- :mod:`pdlab.router.server` — the live aiohttp router in front of colocated vLLM servers and the
  P/D proxy (:mod:`pdlab.serve.proxy`);
- :mod:`pdlab.router.client` — streamed open-loop and agent-session load for live runs.

Import the submodules you need; nothing starts at import time.
"""

from pdlab.router.policies import (
    ROUTING_POLICIES,
    TARGETS,
    AllColocated,
    AllDisaggregated,
    ConstantPredictor,
    Estimate,
    HistoryPredictor,
    LoadEstimator,
    OutputPredictor,
    RouteRequest,
    RoutingPolicy,
    SLOAware,
    TargetLoad,
    Threshold,
    make_policy,
    make_predictor,
)

__all__ = [
    "ROUTING_POLICIES", "TARGETS", "AllColocated", "AllDisaggregated", "ConstantPredictor", "Estimate",
    "HistoryPredictor", "LoadEstimator", "OutputPredictor", "RouteRequest", "RoutingPolicy", "SLOAware",
    "TargetLoad", "Threshold", "make_policy", "make_predictor",
]
