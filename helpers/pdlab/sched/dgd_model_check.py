"""Read a DynamoGraphDeployment back with Dynamo's own code and print what it sees, as one JSON line.

A standalone script for the peers environment (``.venv-peers``, made by ``scripts/install_peers.sh``):
it imports only the standard library, pydantic and ``dynamo``, never pdlab, because Dynamo's pins
conflict with the project's environment. :func:`pdlab.sched.deploy_export.dynamo_model_check` runs it
as ``.venv-peers/bin/python dgd_model_check.py`` with a JSON request on stdin::

    {"doc": {...the DGD as parsed YAML...}, "gpus_per_node": 8}      (gpus_per_node may be null)

and reads the last stdout line: ``{"dynamo_version": str, "error": str | null, "roles": {...}}``.
``error`` is the rejection of Dynamo's pydantic DGD model (``dynamo.profiler.utils.config.Config``)
or of its profiler's worker lookup. ``roles`` maps ``prefill`` and ``decode`` to what Dynamo's
profiler code reads from the document: the component found for the role (``name``), its
``replicas``, the main container's ``args`` (``validate_and_get_worker_args``), ``gpus_per_instance``
(TP × PP as the profiler parses the args: the node count its ``set_multinode_config`` writes for nodes
of one GPU), ``node_count`` (``multinode.nodeCount``, 1 without) and ``profiler_node_count``: what
``set_multinode_config`` writes for ``gpus_per_node`` (null without it).

``dynamo.profiler.utils.config`` imports Dynamo's planner package, which imports two names of
``aisimulate_core`` for its performance model; that package cannot be installed from the registry
(see ``scripts/install_peers.sh``), so when it is missing the two names are placeholders that raise
if called. Nothing here calls them.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
import types

__all__ = ["main"]

_PERF_MODEL_NAMES = ("ForwardPassPerfModelConfig", "RustForwardPassPerfModel")


def _placeholder(name: str) -> type:
    def refuse(*args, **kwargs):
        raise ImportError(f"aisimulate_core.sdk.{name} is not installed (placeholder)")

    return type(name, (), {"__init__": refuse})


def _stand_in_for_aisimulate_core() -> None:
    """Placeholders for the two ``aisimulate_core.sdk`` names the planner package imports, if it is missing."""
    if importlib.util.find_spec("aisimulate_core") is not None:
        return
    root, sdk = types.ModuleType("aisimulate_core"), types.ModuleType("aisimulate_core.sdk")
    for name in _PERF_MODEL_NAMES:
        setattr(sdk, name, _placeholder(name))
    root.sdk = sdk
    sys.modules.update({"aisimulate_core": root, "aisimulate_core.sdk": sdk})


def _node_count(component) -> int:
    multinode = component.multinode
    if multinode is None:
        return 1
    return multinode.get("nodeCount", 1) if isinstance(multinode, dict) else multinode.nodeCount


def _profiler_nodes(set_multinode_config, component, gpus_per_node: int) -> int:
    """The node count Dynamo's ``set_multinode_config`` gives a copy of ``component`` for nodes of
    ``gpus_per_node`` GPUs (it splits one instance's TP × PP, parsed from the args)."""
    probe = copy.deepcopy(component)
    set_multinode_config(probe, 0, gpus_per_node)
    return _node_count(probe)


def main() -> int:
    """Read the request from stdin, read the DGD back, print the JSON line; exit 2 on a bad request."""
    try:
        request = json.load(sys.stdin)
        doc, gpus_per_node = request["doc"], request.get("gpus_per_node")
    except (ValueError, KeyError, TypeError) as exc:
        print(f"dgd_model_check: bad request on stdin ({exc}); expected {{'doc': {{...}}, 'gpus_per_node': N}}",
              file=sys.stderr)
        return 2
    _stand_in_for_aisimulate_core()
    from importlib.metadata import version

    from dynamo.planner.config.defaults import SubComponentType
    from dynamo.profiler.utils import config as dgd
    from pydantic import ValidationError

    out: dict = {"dynamo_version": version("ai-dynamo"), "error": None, "roles": {}}
    try:
        cfg = dgd.Config.model_validate(doc)
    except ValidationError as exc:
        out["error"] = f"Config.model_validate: {exc}"
        print(json.dumps(out))
        return 0
    for role in (SubComponentType.PREFILL, SubComponentType.DECODE):
        try:
            component = dgd.get_worker_component_from_config(cfg, backend="vllm", sub_component_type=role)
            args = dgd.validate_and_get_worker_args(component, backend="vllm")
        except ValueError as exc:
            out["error"] = f"{role.value} worker: {exc}"
            break
        profiler_nodes = _profiler_nodes(dgd.set_multinode_config, component, gpus_per_node) if gpus_per_node else None
        out["roles"][role.value] = {"name": component.name, "replicas": component.replicas, "args": args,
                                    "gpus_per_instance": _profiler_nodes(dgd.set_multinode_config, component, 1),
                                    "node_count": _node_count(component), "profiler_node_count": profiler_nodes}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
