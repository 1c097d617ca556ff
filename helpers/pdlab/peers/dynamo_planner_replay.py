"""Run NVIDIA Dynamo's offline trace replay with its planner in the loop; print one JSON line.

A standalone script for the peers environment (``.venv-peers``), like :mod:`pdlab.peers.dynamo_replay`:
standard library and ``dynamo`` only. :mod:`pdlab.peers.dynamo_planner` runs it with a JSON request on
stdin::

    {"trace": "/path/trace.jsonl", "kwargs": {...keywords of run_trace_replay, planner_config included...}}

and reads the last stdout line: ``{"summary": {...}, "planner": {"total_ticks", "ticks": [...],
"scaling_events": [...]}, "stubbed": [...], "outer_wall_s", "dynamo_version"}``, or, when the
planner cannot run here, ``{"error": "unavailable", "missing": [...], "detail": str}`` (exit 3).

What the planner needs that this environment may lack (measured with ai-dynamo 1.6.1):

- ``aisimulate`` / ``aisimulate_core``: the SLA planner's performance model (``optimization_target
  ="sla"``: TTFT/ITL targets, throughput-based scaling) is ``aisimulate_core.sdk.RustForwardPassPerfModel``,
  even in its ``fpm_regression`` mode. The only registry package, ``aisimulate==0.13.0``, is a
  wheel stub that downloads the wheel from another host at install time, so it cannot be installed
  here. Without it an SLA run is reported unavailable, never faked.
- The threshold ("easy") modes (``optimization_target`` ``throughput``/``latency``/``load``) build no
  performance model; they only *import* modules that the replay never calls (``aisimulate`` and
  ``aisimulate_core`` names, the Prometheus client, the ARIMA/Kalman/Prophet load predictors).
  Those, when missing, are replaced by stub modules whose objects raise if used; the report names
  them in ``stubbed``. scikit-learn, pandas, plotly, prometheus_client and kubernetes must be
  installed for real (``scripts/install_peers.sh``).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
import types

__all__ = ["main", "REQUIRED", "STUBBABLE"]

#: Modules the planner replay imports and uses: they must be installed.
REQUIRED = ("sklearn", "pandas", "plotly", "prometheus_client", "kubernetes")

#: Module → names it must export; imported by the planner package but unused by a threshold-mode
#: replay (SLA mode needs ``aisimulate_core`` for real).
STUBBABLE = {
    "aisimulate": (), "aisimulate.runner": ("canonical_performance_config",),
    "aisimulate_core": (), "aisimulate_core.sdk": ("ForwardPassPerfModelConfig", "RustForwardPassPerfModel"),
    "aisimulate_core._native": ("RustForwardPassPerfModel",),
    "prometheus_api_client": ("PrometheusConnect",),
    "pmdarima": ("auto_arima",), "filterpy": (), "filterpy.kalman": ("KalmanFilter",), "prophet": ("Prophet",),
}


def _missing(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):
        return True


class _Stub:
    """Stands for an object of a module that is not installed; any use raises ImportError."""

    def __init__(self, *args, **kwargs):
        raise ImportError(f"{type(self).__name__} comes from a module that is not installed (stub)")

    @classmethod
    def best_available(cls, *args, **kwargs):
        raise ImportError(f"{cls.__name__} comes from a module that is not installed (stub)")


def _install_stubs() -> list[str]:
    stubbed = []
    for name, attrs in STUBBABLE.items():
        root = name.split(".")[0]
        if name in sys.modules or not _missing(root):
            continue
        mod = types.ModuleType(name)
        for attr in attrs:
            setattr(mod, attr, type(attr, (_Stub,), {}))
        if name == "prometheus_api_client":
            mod.PrometheusApiClientException = type("PrometheusApiClientException", (Exception,), {})
        sys.modules[name] = mod
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, mod)
        stubbed.append(name)
    return stubbed


def _unavailable(missing: list[str], detail: str) -> int:
    print(json.dumps({"error": "unavailable", "missing": missing, "detail": detail}))
    return 3


def _planner_record(planner) -> dict:
    ticks = []
    for t in planner.ticks:
        topo = t.get("topology", {})
        scale_to = (t.get("effects") or {}).get("scale_to")
        ticks.append({"at_s": t["at_ms"] / 1e3,
                      "active_prefill": topo.get("prefill", {}).get("active_count"),
                      "active_decode": topo.get("decode", {}).get("active_count"),
                      "scale_to": scale_to})
    events = [{"at_s": e.at_s, "component": e.component, "from": e.from_count, "to": e.to_count,
               "reason": e.reason} for e in planner.scaling_events]
    return {"total_ticks": planner.total_ticks, "ticks": ticks, "scaling_events": events}


def main() -> int:
    """Read the request, check what the planner needs, replay, print the JSON line."""
    try:
        request = json.load(sys.stdin)
        trace, kwargs = request["trace"], dict(request["kwargs"])
        target = kwargs["planner_config"].get("optimization_target", "throughput")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        print(f"dynamo_planner_replay: bad request on stdin ({exc}); expected "
              "{'trace': PATH, 'kwargs': {..., 'planner_config': {...}}}", file=sys.stderr)
        return 2
    missing = [m for m in REQUIRED if _missing(m)]
    if missing:
        return _unavailable(missing, "the planner imports and uses these; install them into the peers "
                                     "environment (scripts/install_peers.sh)")
    if target == "sla" and _missing("aisimulate_core"):
        return _unavailable(["aisimulate_core"],
                            "optimization_target='sla' needs the planner's performance model, "
                            "aisimulate_core.sdk.RustForwardPassPerfModel (ai-dynamo requires aisimulate==0.13.0, "
                            "a registry wheel stub that downloads from another host at install time)")
    stubbed = _install_stubs()
    from importlib.metadata import version

    from dynamo.replay import run_trace_replay

    t0 = time.perf_counter()
    report = run_trace_replay([trace], **kwargs)
    outer = time.perf_counter() - t0
    print(json.dumps({"summary": dict(report.summary), "planner": _planner_record(report.planner),
                      "stubbed": stubbed, "outer_wall_s": outer, "dynamo_version": version("ai-dynamo")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
