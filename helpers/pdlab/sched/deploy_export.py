"""From a placement on paper to a cluster: write a DistServe placement (:class:`pdlab.sched.placement.Placement`)
as an NVIDIA Dynamo ``DynamoGraphDeployment`` or as llm-d kustomize overlays, validated before anything is written.

- **Dynamo** (``dynamo``): one ``DynamoGraphDeployment`` in the ``nvidia.com/v1beta1`` shape that ai-dynamo 1.6.1
  ships (``dynamo/profiler/templates/dgd/vllm/disagg.yaml``: ``spec.components`` with ``type`` frontend / prefill /
  decode, ``podTemplate.spec.containers``). The frontend routes with ``--router-mode`` (``kv`` by default); each
  worker runs ``python3 -m dynamo.vllm --model M --tensor-parallel-size T [--pipeline-parallel-size P]
  --disaggregation-mode prefill|decode`` with vLLM's NIXL connector (``kv_producer`` / ``kv_consumer``). An
  instance wider than a node gets ``multinode.nodeCount`` (one pod per node, the GPUs split evenly), as Dynamo's
  profiler does.
- **llm-d** (``llm-d``): ``kustomization.yaml`` over llm-d's single-host P/D vLLM base (Deployments ``prefill``
  and ``decode``, container ``modelserver``, a routing sidecar in front of decode) and two strategic-merge patches,
  ``patch-prefill.yaml`` and ``patch-decode.yaml``: replicas, ``--tensor-parallel-size``, NIXL
  (``kv_both``), and ``nvidia.com/gpu`` requests = limits. llm-d's single-host base holds one instance per pod,
  so an instance wider than a node is refused (llm-d's multi-host recipe uses LeaderWorkerSets).

Validation reads the rendered files back and checks them as Kubernetes objects (``apiVersion``, ``kind``,
``metadata.name``, containers, ``nvidia.com/gpu`` requests equal to limits) whose GPUs add up to the placement's,
plus each format's structure. Where the peers' environment (``.venv-peers``, ``scripts/install_peers.sh``) holds
ai-dynamo, the DGD is also compared key by key with the vLLM disaggregated template Dynamo ships, and read back by
Dynamo's own code in that environment (a subprocess running :mod:`pdlab.sched.dgd_model_check`): its pydantic
``DynamoGraphDeployment`` model must accept it, and the replicas, GPUs per instance and nodes its profiler reads
must be the placement's. Files are written to a temporary directory and moved into place only
when every requested export rendered and validated: an infeasible placement writes nothing.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from pdlab.models import get_model
from pdlab.paths import peers_venv

if TYPE_CHECKING:
    from pdlab.sched.placement import Placement

__all__ = [
    "EXPORT_TARGETS",
    "ROUTER_MODES",
    "DYNAMO_VERSION",
    "DYNAMO_FILE",
    "LLM_D_FILES",
    "ExportError",
    "ExportOptions",
    "RoleLayout",
    "ExportResult",
    "hf_model_id",
    "k8s_name",
    "role_layouts",
    "check_exportable",
    "render_dynamo",
    "render_llm_d",
    "render",
    "k8s_object_problems",
    "dgd_problems",
    "llm_d_problems",
    "dynamo_template_check",
    "dynamo_model_check",
    "template_key_problems",
    "export_placement",
]

#: Export targets of ``pdlab place --export TARGET DIR``.
EXPORT_TARGETS: tuple[str, ...] = ("dynamo", "llm-d")
#: The frontend's ``--router-mode`` choices in ai-dynamo 1.6.1 (``common/configuration/groups/router_args.py``).
ROUTER_MODES: tuple[str, ...] = ("kv", "round-robin", "random", "power-of-two", "least-loaded")
#: The Dynamo release the DGD targets (the pinned ``ai-dynamo`` of the course's extra).
DYNAMO_VERSION = "1.6.1"
DYNAMO_FILE = "dynamo-graph-deployment.yaml"
LLM_D_FILES: tuple[str, ...] = ("kustomization.yaml", "patch-prefill.yaml", "patch-decode.yaml")
_GPU = "nvidia.com/gpu"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_HF_REPO = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_NIXL_ROLE = {"prefill": "kv_producer", "decode": "kv_consumer"}
_DGD_TYPES = {"frontend", "prefill", "decode", "worker", "planner"}


class ExportError(ValueError):
    """A placement that cannot be exported, or an export that does not validate; nothing was written."""


@dataclass(frozen=True)
class ExportOptions:
    """What the placement is deployed as.

    ``model_id``: Hugging Face repo the workers load (default: the catalog model's source repo);
    ``gpus_per_node``: GPUs per cluster node (None: every instance fits one node); ``cluster_gpus``: GPUs the
    cluster has (None: not checked); images and llm-d's base are pinned defaults a user may override.
    """

    model: str
    model_id: str | None = None
    name: str | None = None
    router_mode: str = "kv"
    gpus_per_node: int | None = None
    cluster_gpus: int | None = None
    namespace: str | None = None
    dynamo_image: str = f"nvcr.io/nvidia/ai-dynamo/vllm-runtime:{DYNAMO_VERSION}"
    vllm_image: str = "docker.io/vllm/vllm-openai:v0.27.1"
    sidecar_image: str = "ghcr.io/llm-d/llm-d-router-disagg-sidecar:v0.8.0"
    llm_d_base: str = "https://github.com/llm-d/llm-d//guides/recipes/modelserver/base/single-host/pd/vllm?ref=main"

    def resolved_model_id(self) -> str:
        return self.model_id or hf_model_id(self.model)

    def resolved_name(self) -> str:
        return self.name or k8s_name(f"pdlab-{get_model(self.model).name}")


@dataclass(frozen=True)
class RoleLayout:
    """One role (prefill or decode) as pods: ``replicas`` instances of TP×PP GPUs, each split over ``nodes``
    pods of ``gpus_per_pod`` GPUs (``nodes`` = 1 unless an instance is wider than a node)."""

    role: str
    tp: int
    pp: int
    replicas: int
    nodes: int
    gpus_per_pod: int


@dataclass
class ExportResult:
    """Where an export went: target, directory, files written, and the checks that passed or were skipped."""

    target: str
    directory: Path
    files: list[Path]
    gpus: int
    checks: list[str]

    def as_dict(self) -> dict[str, Any]:
        return {"target": self.target, "directory": str(self.directory), "files": [str(f) for f in self.files],
                "gpus": self.gpus, "checks": self.checks}


# ---------------------------------------------------------------------------------------------
# names and layout


def hf_model_id(model: str) -> str:
    """The Hugging Face repo of a catalog model, read from the first word of its ``source``
    (``meta-llama/Meta-Llama-3-8B config.json`` → ``meta-llama/Meta-Llama-3-8B``)."""
    cfg = get_model(model)
    first = cfg.source.split()[0] if cfg.source.split() else ""
    if not _HF_REPO.match(first):
        raise ExportError(f"the catalog names no Hugging Face repo for {cfg.name} (source: {cfg.source!r}); "
                          "give the repo the workers load (--export-model ORG/NAME)")
    return first


def k8s_name(text: str) -> str:
    """``text`` as a Kubernetes name (RFC 1123 label: lowercase letters, digits, '-', at most 63 characters)."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:63].strip("-")
    if not name:
        raise ExportError(f"cannot make a Kubernetes name from {text!r}")
    return name


def _layout(role: str, tp: int, pp: int, replicas: int, gpus_per_node: int | None) -> RoleLayout:
    per_instance = tp * pp
    if gpus_per_node is None or per_instance <= gpus_per_node:
        return RoleLayout(role, tp, pp, replicas, 1, per_instance)
    if tp > gpus_per_node:
        raise ExportError(f"a {role} instance's TP{tp} is wider than a node of {gpus_per_node} GPUs")
    nodes = math.ceil(per_instance / gpus_per_node)
    if per_instance % nodes:
        raise ExportError(f"a {role} instance of TP{tp}×PP{pp} = {per_instance} GPUs does not split evenly over "
                          f"{nodes} nodes of {gpus_per_node} GPUs")
    return RoleLayout(role, tp, pp, replicas, nodes, per_instance // nodes)


def role_layouts(placement: Placement, gpus_per_node: int | None = None) -> tuple[RoleLayout, RoleLayout]:
    """The prefill and decode :class:`RoleLayout` of a placement."""
    return (_layout("prefill", placement.prefill.tp, placement.prefill.pp, placement.num_prefill, gpus_per_node),
            _layout("decode", placement.decode.tp, placement.decode.pp, placement.num_decode, gpus_per_node))


def check_exportable(placement: Placement, options: ExportOptions) -> tuple[RoleLayout, RoleLayout]:
    """Raise :class:`ExportError` naming the problem when the placement cannot be deployed: no replicas of a
    role, no rate that meets the SLOs, GPUs that do not add up or exceed the cluster, an instance that does
    not split over nodes. Returns the role layouts."""
    problems = []
    if placement.num_prefill < 1 or placement.num_decode < 1:
        problems.append(f"it has {placement.num_prefill} prefill and {placement.num_decode} decode instances "
                        "(each role needs at least one)")
    if not placement.cluster_goodput_rps > 0:
        problems.append(f"it meets the SLOs at {placement.cluster_goodput_rps:g} req/s: no configuration reaches "
                        "the attainment goal (loosen the SLOs, lower the goal, or add GPUs)")
    need = placement.num_prefill * placement.prefill.num_gpus + placement.num_decode * placement.decode.num_gpus
    if need != placement.total_gpus:
        problems.append(f"its instances use {need} GPUs but it reports {placement.total_gpus}")
    if options.cluster_gpus is not None and need > options.cluster_gpus:
        problems.append(f"it needs {need} GPUs and the cluster has {options.cluster_gpus}")
    if options.router_mode not in ROUTER_MODES:
        problems.append(f"router mode {options.router_mode!r} is not one of {', '.join(ROUTER_MODES)}")
    if problems:
        raise ExportError("cannot export this placement: " + "; ".join(problems))
    return role_layouts(placement, options.gpus_per_node)


def _summary(placement: Placement, target: str) -> str:
    goal = placement.settings.get("attainment")
    goal_text = f"{goal:.0%} SLO attainment" if isinstance(goal, (int, float)) else "the SLO attainment goal"
    return (f"# Generated by `pdlab place --export {target}` from a DistServe placement ({placement.affinity} "
            f"node affinity): prefill {placement.prefill} ×{placement.num_prefill}, decode {placement.decode} "
            f"×{placement.num_decode}, {placement.total_gpus} GPUs,\n# {placement.cluster_goodput_rps:.2f} req/s "
            f"at {goal_text} in pdlab's simulator (a prediction). Edit images, secrets and storage for your "
            "cluster.\n")


# ---------------------------------------------------------------------------------------------
# rendering


def _nixl(role: str) -> str:
    return json.dumps({"kv_connector": "NixlConnector", "kv_role": role}, separators=(",", ":"))


def _gpu_resources(gpus: int) -> dict[str, dict[str, str]]:
    """``nvidia.com/gpu`` requests equal to limits (Kubernetes requires it for extended resources)."""
    return {"limits": {_GPU: str(gpus)}, "requests": {_GPU: str(gpus)}}


def _parallel_args(layout: RoleLayout, sep: str) -> list[str]:
    pairs = [("--tensor-parallel-size", layout.tp)] + ([("--pipeline-parallel-size", layout.pp)] if layout.pp > 1 else [])
    out: list[str] = []
    for flag, value in pairs:
        out += [f"{flag}={value}"] if sep == "=" else [flag, str(value)]
    return out


def _dynamo_worker(layout: RoleLayout, options: ExportOptions, model_id: str) -> dict[str, Any]:
    args = ["--model", model_id, *_parallel_args(layout, " "), "--disaggregation-mode", layout.role,
            "--kv-transfer-config", _nixl(_NIXL_ROLE[layout.role])]
    container = {"name": "main", "image": options.dynamo_image, "command": ["python3", "-m", "dynamo.vllm"],
                 "args": args, "envFrom": [{"secretRef": {"name": "hf-token-secret"}}],
                 "resources": _gpu_resources(layout.gpus_per_pod), "workingDir": "/workspace/examples/backends/vllm"}
    component: dict[str, Any] = {"name": layout.role, "type": layout.role, "replicas": layout.replicas,
                                 "podTemplate": {"spec": {"containers": [container]}}}
    if layout.nodes > 1:
        component["multinode"] = {"nodeCount": layout.nodes}
    return component


def render_dynamo(placement: Placement, options: ExportOptions) -> dict[str, str]:
    """``{file name: YAML text}``: the placement as one ``DynamoGraphDeployment`` (frontend + prefill + decode)."""
    layouts = check_exportable(placement, options)
    model_id = options.resolved_model_id()
    frontend = {"name": "Frontend", "type": "frontend", "replicas": 1, "podTemplate": {"spec": {"containers": [
        {"name": "main", "image": options.dynamo_image, "command": ["python3"],
         "args": ["-m", "dynamo.frontend", "--router-mode", options.router_mode],
         "envFrom": [{"secretRef": {"name": "hf-token-secret"}}]}]}}}
    metadata: dict[str, Any] = {"name": options.resolved_name()}
    if options.namespace:
        metadata["namespace"] = options.namespace
    doc = {"apiVersion": "nvidia.com/v1beta1", "kind": "DynamoGraphDeployment", "metadata": metadata,
           "spec": {"components": [frontend] + [_dynamo_worker(lay, options, model_id) for lay in layouts]}}
    return {DYNAMO_FILE: _summary(placement, "dynamo") + _dump(doc)}


def _split_image(image: str) -> tuple[str, str]:
    name, sep, tag = image.rpartition(":")
    if not sep or "/" in tag:
        raise ExportError(f"image {image!r} has no tag (NAME:TAG)")
    return name, tag


def _llm_d_patch(layout: RoleLayout, model_id: str) -> dict[str, Any]:
    if layout.nodes > 1:
        raise ExportError(f"a {layout.role} instance of TP{layout.tp}×PP{layout.pp} spans {layout.nodes} nodes; "
                          "llm-d's single-host P/D base holds one instance per pod (use llm-d's multi-host "
                          "LeaderWorkerSet recipe, or --export dynamo)")
    args = [model_id, *_parallel_args(layout, "="), "--kv-transfer-config", _nixl("kv_both")]
    if layout.role == "decode":
        args.append("--port=8200")   # llm-d's routing sidecar listens on 8000 in the decode pod
    container = {"name": "modelserver", "command": ["vllm", "serve"], "args": args,
                 "env": [{"name": "VLLM_NIXL_SIDE_CHANNEL_HOST",
                          "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                 "resources": _gpu_resources(layout.gpus_per_pod)}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": layout.role},
            "spec": {"replicas": layout.replicas, "template": {"spec": {"containers": [container]}}}}


def render_llm_d(placement: Placement, options: ExportOptions) -> dict[str, str]:
    """``{file name: YAML text}``: a kustomize overlay of llm-d's single-host P/D vLLM base and its two patches."""
    layouts = check_exportable(placement, options)
    model_id = options.resolved_model_id()
    patches = {f"patch-{lay.role}.yaml": _llm_d_patch(lay, model_id) for lay in layouts}
    images = []
    for placeholder, image in (("REPLACE_MODEL_SERVER_IMAGE", options.vllm_image),
                               ("REPLACE_ROUTING_SIDECAR_IMAGE", options.sidecar_image)):
        new_name, new_tag = _split_image(image)
        images.append({"name": placeholder, "newName": new_name, "newTag": new_tag})
    kustomization: dict[str, Any] = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization"}
    if options.namespace:
        kustomization["namespace"] = options.namespace
    kustomization.update({
        "resources": [options.llm_d_base], "namePrefix": options.resolved_name() + "-", "images": images,
        # the labels llm-d's P/D InferencePool selects model servers by (gaie-pd values: matchLabels)
        "labels": [{"pairs": {"llm-d.ai/inference-serving": "true", "llm-d.ai/guide": "pd-disaggregation",
                              "llm-d.ai/model": k8s_name(get_model(options.model).name),
                              "app.kubernetes.io/managed-by": "pdlab"},
                    "includeSelectors": False, "includeTemplates": True}],
        "patches": [{"path": name} for name in patches]})
    header = _summary(placement, "llm-d")
    out = {"kustomization.yaml": header + _dump(kustomization)}
    out.update({name: header + _dump(doc) for name, doc in patches.items()})
    return out


def render(target: str, placement: Placement, options: ExportOptions) -> dict[str, str]:
    """The files of one export target (:data:`EXPORT_TARGETS`)."""
    if target == "dynamo":
        return render_dynamo(placement, options)
    if target == "llm-d":
        return render_llm_d(placement, options)
    raise ExportError(f"unknown export target {target!r}; choose from {', '.join(EXPORT_TARGETS)}")


def _dump(doc: Any) -> str:
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=120)


# ---------------------------------------------------------------------------------------------
# validation: each returns a list of problems (empty = valid)

_API_VERSION = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?v[0-9]+((alpha|beta)[0-9]+)?$")
_KIND = re.compile(r"^[A-Z][A-Za-z0-9]*$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def _pod_specs(obj: Mapping[str, Any]) -> list[tuple[str, Any, int, int]]:
    """(where, pod spec, replicas, pods per replica) of a Deployment or of each DGD component."""
    spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
    if obj.get("kind") == "DynamoGraphDeployment":
        out = []
        for c in spec.get("components") or []:
            if isinstance(c, Mapping):
                nodes = (c.get("multinode") or {}).get("nodeCount", 1) if isinstance(c.get("multinode"), Mapping) else 1
                out.append((f"component {c.get('name')!r}", (c.get("podTemplate") or {}).get("spec"),
                            c.get("replicas", 1), nodes))
        return out
    template = spec.get("template") if isinstance(spec.get("template"), Mapping) else {}
    return [(f"{obj.get('kind')} {obj.get('metadata', {}).get('name')!r}", template.get("spec"),
             spec.get("replicas", 1), 1)]


def _container_problems(where: str, container: Any) -> list[str]:
    if not isinstance(container, Mapping):
        return [f"{where}: a container is not a mapping"]
    name = container.get("name")
    where = f"{where} container {name!r}"
    problems = [] if isinstance(name, str) and _DNS_LABEL.match(name) else [f"{where}: name is not an RFC 1123 label"]
    for key in ("command", "args"):
        value = container.get(key)
        if value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            problems.append(f"{where}: {key} must be a list of strings")
    resources = container.get("resources") or {}
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    for part, values in (("limits", limits), ("requests", requests)):
        if _GPU in values and _gpu_count(values[_GPU]) is None:
            problems.append(f"{where}: {part}[{_GPU}] = {values[_GPU]!r} is not a positive whole number")
    if _GPU in requests and str(requests[_GPU]) != str(limits.get(_GPU)):
        problems.append(f"{where}: {_GPU} requests ({requests[_GPU]}) differ from limits ({limits.get(_GPU)})")
    return problems


def _gpu_count(value: Any) -> int | None:
    try:
        n = int(str(value))
    except ValueError:
        return None
    return n if n > 0 and str(n) == str(value).strip() else None


def _pod_gpus(pod_spec: Any) -> int:
    total = 0
    for c in (pod_spec or {}).get("containers") or []:
        if isinstance(c, Mapping):
            total += _gpu_count(((c.get("resources") or {}).get("limits") or {}).get(_GPU, 0)) or 0
    return total


def k8s_object_problems(obj: Any, where: str = "object", *, pods: bool = True, named: bool = True) -> list[str]:
    """Problems of ``obj`` as a Kubernetes object: ``apiVersion`` (``group/vN``), ``kind`` (CamelCase),
    with ``named``: ``metadata.name`` (RFC 1123), with ``pods``: a non-empty ``containers`` list in every pod
    template, valid containers, whole positive ``replicas``, ``nvidia.com/gpu`` requests equal to limits."""
    if not isinstance(obj, Mapping):
        return [f"{where}: not a mapping"]
    problems = []
    if not (isinstance(obj.get("apiVersion"), str) and _API_VERSION.match(obj["apiVersion"])):
        problems.append(f"{where}: apiVersion {obj.get('apiVersion')!r} is not group/version")
    if not (isinstance(obj.get("kind"), str) and _KIND.match(obj["kind"])):
        problems.append(f"{where}: kind {obj.get('kind')!r} is not a CamelCase kind")
    name = (obj.get("metadata") or {}).get("name") if isinstance(obj.get("metadata"), Mapping) else None
    if named and not (isinstance(name, str) and len(name) <= 253 and _DNS_SUBDOMAIN.match(name)):
        problems.append(f"{where}: metadata.name {name!r} is not an RFC 1123 name")
    if not pods:
        return problems
    specs = _pod_specs(obj)
    if not specs:
        problems.append(f"{where}: no pod templates")
    for pod_where, pod_spec, replicas, nodes in specs:
        pod_where = f"{where} {pod_where}"
        containers = pod_spec.get("containers") if isinstance(pod_spec, Mapping) else None
        if not (isinstance(containers, list) and containers):
            problems.append(f"{pod_where}: no containers")
            continue
        for c in containers:
            problems += _container_problems(pod_where, c)
        names = [c.get("name") for c in containers if isinstance(c, Mapping)]
        if len(set(names)) != len(names):
            problems.append(f"{pod_where}: container names repeat")
        for label, value in (("replicas", replicas), ("multinode.nodeCount", nodes)):
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                problems.append(f"{pod_where}: {label} {value!r} is not a whole number >= 1")
    return problems


def _flag(args: Sequence[str], name: str) -> str | None:
    """The value of ``--name value`` or ``--name=value`` (the last one wins, as argparse does)."""
    value = None
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


def _role_problems(where: str, args: Sequence[str], layout: RoleLayout, kv_role: str) -> list[str]:
    """TP, PP and the NIXL connector of one worker's command line against its layout."""
    problems = []
    for flag, want in (("--tensor-parallel-size", layout.tp), ("--pipeline-parallel-size", layout.pp)):
        got = _flag(args, flag) or ("1" if flag.startswith("--pipeline") else None)
        if got != str(want):
            problems.append(f"{where}: {flag} is {got}, the placement has {want}")
    try:
        kv = json.loads(_flag(args, "--kv-transfer-config") or "null") or {}
    except json.JSONDecodeError:
        kv = {}
    if kv.get("kv_connector") != "NixlConnector" or kv.get("kv_role") != kv_role:
        problems.append(f"{where}: --kv-transfer-config is not NixlConnector with kv_role {kv_role}")
    return problems


def _gpu_total_problem(where: str, by_role: Mapping[str, int], placement: Placement) -> list[str]:
    total = sum(by_role.values())
    if total != placement.total_gpus:
        return [f"{where}: {_GPU} adds up to {total} GPUs ({dict(by_role)}), the placement uses {placement.total_gpus}"]
    return []


def _main_container(component: Mapping[str, Any]) -> Mapping[str, Any]:
    containers = ((component.get("podTemplate") or {}).get("spec") or {}).get("containers") or []
    return next((c for c in containers if isinstance(c, Mapping) and c.get("name") == "main"), {})


_COMPONENT_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?$")


def _component_problems(components: list[Any]) -> list[str]:
    """What the v1beta1 CRD asks of every component: a ``name`` of at most 63 letters, digits and '-',
    unique regardless of case, and a container named ``main`` with a non-empty image."""
    problems, seen = [], set()
    for c in components:
        if not isinstance(c, Mapping):
            problems.append("DGD: a component is not a mapping")
            continue
        name = c.get("name")
        if not (isinstance(name, str) and len(name) <= 63 and _COMPONENT_NAME.match(name)):
            problems.append(f"DGD: component name {name!r} is not 1-63 letters, digits and '-'")
        elif name.lower() in seen:
            problems.append(f"DGD: component name {name!r} repeats (names are unique regardless of case)")
        else:
            seen.add(name.lower())
        if not _main_container(c).get("image"):
            problems.append(f"DGD component {name!r}: no container named main with an image")
    return problems


def dgd_problems(doc: Any, placement: Placement, options: ExportOptions) -> list[str]:
    """Problems of a ``DynamoGraphDeployment`` written for ``placement``: a Kubernetes object of kind
    DynamoGraphDeployment (``nvidia.com/v1beta1``) with one frontend (a known ``--router-mode``, no GPUs), one
    prefill and one decode component running ``dynamo.vllm`` with the placement's model, TP, PP, replicas and
    NIXL role, and ``nvidia.com/gpu`` × pods × replicas adding up to the placement's GPUs."""
    problems = k8s_object_problems(doc, "DGD")
    if not isinstance(doc, Mapping):
        return problems
    if (doc.get("apiVersion"), doc.get("kind")) != ("nvidia.com/v1beta1", "DynamoGraphDeployment"):
        problems.append(f"DGD: apiVersion/kind are {doc.get('apiVersion')}/{doc.get('kind')}, "
                        "expected nvidia.com/v1beta1/DynamoGraphDeployment")
    components = (doc.get("spec") or {}).get("components") if isinstance(doc.get("spec"), Mapping) else None
    if not isinstance(components, list):
        return problems + ["DGD: spec.components is not a list"]
    problems += _component_problems(components)
    by_type: dict[str, list[Mapping[str, Any]]] = {}
    for c in components:
        if isinstance(c, Mapping):
            by_type.setdefault(str(c.get("type")), []).append(c)
    unknown = sorted(set(by_type) - _DGD_TYPES)
    if unknown:
        problems.append(f"DGD: component types {unknown} are not among {sorted(_DGD_TYPES)}")
    counts = [f"DGD: {len(by_type.get(kind, []))} components of type {kind}, expected 1"
              for kind in ("frontend", "prefill", "decode") if len(by_type.get(kind, [])) != 1]
    if counts:
        return problems + counts
    front = _main_container(by_type["frontend"][0])
    if _flag(front.get("args") or [], "--router-mode") != options.router_mode:
        problems.append(f"DGD frontend: --router-mode is not {options.router_mode}")
    if _pod_gpus({"containers": [front]}):
        problems.append("DGD frontend: asks for GPUs")
    gpus: dict[str, int] = {}
    for layout in role_layouts(placement, options.gpus_per_node):
        comp = by_type[layout.role][0]
        main = _main_container(comp)
        args = main.get("args") or []
        where = f"DGD {layout.role}"
        if not main.get("image") or (main.get("command") or [])[-1:] != ["dynamo.vllm"]:
            problems.append(f"{where}: the main container does not run an image with python3 -m dynamo.vllm")
        if _flag(args, "--model") != options.resolved_model_id():
            problems.append(f"{where}: --model is {_flag(args, '--model')}, expected {options.resolved_model_id()}")
        if _flag(args, "--disaggregation-mode") != layout.role:
            problems.append(f"{where}: --disaggregation-mode is not {layout.role}")
        problems += _role_problems(where, args, layout, _NIXL_ROLE[layout.role])
        nodes = (comp.get("multinode") or {}).get("nodeCount", 1)
        shape = (comp.get("replicas"), nodes, _pod_gpus({"containers": [main]}))
        if shape != (layout.replicas, layout.nodes, layout.gpus_per_pod):
            problems.append(f"{where}: replicas, nodes, GPUs per pod are {shape}, the placement needs "
                            f"{(layout.replicas, layout.nodes, layout.gpus_per_pod)}")
        gpus[layout.role] = shape[0] * shape[1] * shape[2] if all(isinstance(v, int) for v in shape) else 0
    return problems + _gpu_total_problem("DGD", gpus, placement)


def llm_d_problems(docs: Mapping[str, Any], placement: Placement, options: ExportOptions) -> list[str]:
    """Problems of llm-d overlay files ``{file name: parsed YAML}``: a kustomize ``Kustomization`` with a base
    resource, image overrides and exactly the two patches; each patch an ``apps/v1`` Deployment ``prefill`` /
    ``decode`` whose ``modelserver`` serves the model with the placement's TP, PP and replicas over NIXL, and whose
    ``nvidia.com/gpu`` × replicas add up to the placement's GPUs."""
    problems = []
    if set(docs) != set(LLM_D_FILES):
        problems.append(f"llm-d: files are {sorted(docs)}, expected {sorted(LLM_D_FILES)}")
    kust = docs.get("kustomization.yaml")
    problems += k8s_object_problems(kust, "kustomization.yaml", pods=False, named=False)
    if not isinstance(kust, Mapping):
        return problems
    if (kust.get("apiVersion"), kust.get("kind")) != ("kustomize.config.k8s.io/v1beta1", "Kustomization"):
        problems.append("kustomization.yaml: not a kustomize.config.k8s.io/v1beta1 Kustomization")
    if not (isinstance(kust.get("resources"), list) and kust["resources"]):
        problems.append("kustomization.yaml: no base in resources")
    if any(not (isinstance(i, Mapping) and i.get("name") and i.get("newName")) for i in kust.get("images") or [None]):
        problems.append("kustomization.yaml: images need name and newName")
    paths = sorted(p.get("path") for p in kust.get("patches") or [] if isinstance(p, Mapping))
    if paths != ["patch-decode.yaml", "patch-prefill.yaml"]:
        problems.append(f"kustomization.yaml: patches are {paths}, expected patch-decode.yaml and patch-prefill.yaml")
    gpus: dict[str, int] = {}
    for layout in role_layouts(placement, options.gpus_per_node):
        name = f"patch-{layout.role}.yaml"
        patch = docs.get(name)
        problems += k8s_object_problems(patch, name)
        if not isinstance(patch, Mapping) or (patch.get("apiVersion"), patch.get("kind")) != ("apps/v1", "Deployment"):
            problems.append(f"{name}: not an apps/v1 Deployment")
            continue
        if (patch.get("metadata") or {}).get("name") != layout.role:
            problems.append(f"{name}: metadata.name is not {layout.role} (the base's Deployment)")
        spec = patch.get("spec") or {}
        pod = (spec.get("template") or {}).get("spec") or {}
        server = next((c for c in pod.get("containers") or [] if isinstance(c, Mapping)
                       and c.get("name") == "modelserver"), {})
        args = server.get("args") or []
        if args[:1] != [options.resolved_model_id()]:
            problems.append(f"{name}: modelserver does not serve {options.resolved_model_id()} (first argument)")
        problems += _role_problems(name, args, layout, "kv_both")
        if spec.get("replicas") != layout.replicas:
            problems.append(f"{name}: replicas {spec.get('replicas')}, the placement has {layout.replicas}")
        replicas = spec.get("replicas") if isinstance(spec.get("replicas"), int) else 0
        gpus[layout.role] = replicas * _pod_gpus(pod)
    return problems + _gpu_total_problem("llm-d", gpus, placement)


# ---------------------------------------------------------------------------------------------
# the installed Dynamo package's own structures


_TEMPLATE = Path("profiler") / "templates" / "dgd" / "vllm" / "disagg.yaml"


def _dynamo_template() -> tuple[Path | None, str]:
    """The vLLM disaggregated DGD template an installed ``dynamo`` package ships, found without importing it:
    in this interpreter, else in the course's peers environment (:func:`pdlab.paths.peers_venv`, made by
    ``scripts/install_peers.sh``). Returns (path, "") or (None, why not)."""
    spec = importlib.util.find_spec("dynamo")
    places = [Path(p) for p in (spec.submodule_search_locations or [])] if spec is not None else []
    venv = peers_venv()
    places += sorted(venv.glob("lib/python*/site-packages/dynamo"))
    for place in places:
        if (place / _TEMPLATE).exists():
            return place / _TEMPLATE, ""
    return None, (f"no dynamo package with {_TEMPLATE.as_posix()} in this environment or in {venv} "
                  "(scripts/install_peers.sh installs it)")


def template_key_problems(doc: Mapping[str, Any], template: Mapping[str, Any]) -> list[str]:
    """Keys the DGD lacks that Dynamo's template has: ``apiVersion``/``kind`` equal, every top-level,
    ``spec`` and component key, and every main-container key (and resource limit) of each component type."""
    problems = []
    for key in ("apiVersion", "kind"):
        if doc.get(key) != template.get(key):
            problems.append(f"{key} is {doc.get(key)!r}, Dynamo's template has {template.get(key)!r}")
    for where, ours, theirs in (("top level", doc, template), ("spec", doc.get("spec") or {}, template.get("spec") or {})):
        missing = sorted(set(theirs) - set(ours))
        if missing:
            problems.append(f"{where} lacks {missing}")
    ours_by_type = {c.get("type"): c for c in (doc.get("spec") or {}).get("components") or [] if isinstance(c, Mapping)}
    for comp in (template.get("spec") or {}).get("components") or []:
        kind = comp.get("type")
        mine = ours_by_type.get(kind)
        if mine is None:
            problems.append(f"no component of type {kind!r}, Dynamo's template has one")
            continue
        if sorted(set(comp) - set(mine)):
            problems.append(f"{kind} component lacks {sorted(set(comp) - set(mine))}")
        theirs_c, mine_c = _main_container(comp), _main_container(mine)
        missing = sorted(set(theirs_c) - set(mine_c))
        limits = set((theirs_c.get("resources") or {}).get("limits") or {}) - \
            set((mine_c.get("resources") or {}).get("limits") or {})
        if missing or limits:
            problems.append(f"{kind} main container lacks {missing + sorted(limits)}")
    return problems


def dynamo_template_check(doc: Mapping[str, Any]) -> tuple[str, list[str]]:
    """Compare the DGD with the installed Dynamo package's vLLM disaggregated template (key sets).
    Returns (what was checked or why it was skipped, problems)."""
    path, why = _dynamo_template()
    if path is None:
        return f"Dynamo template check skipped: {why}", []
    template = yaml.safe_load(path.read_text())
    problems = [f"against {path.name}: {p}" for p in template_key_problems(doc, template)]
    return f"key sets checked against Dynamo's template {path}", problems


_MODEL_CHECK = Path(__file__).with_name("dgd_model_check.py")


def dynamo_model_check(doc: Mapping[str, Any], placement: Placement, options: ExportOptions, *,
                       timeout_s: float = 120.0) -> tuple[str, list[str]]:
    """Read the DGD back with Dynamo's own code in the peers' environment (:mod:`pdlab.sched.dgd_model_check`
    run by its python): Dynamo's pydantic model (``dynamo.profiler.utils.config.Config``) must accept it, and
    for prefill and decode the replicas, GPUs per instance (TP × PP as Dynamo parses the args), nodes, ``--model``
    and ``--disaggregation-mode`` Dynamo reads must be the placement's; with ``gpus_per_node``, so must the node
    count Dynamo's profiler would set. Returns (what was checked, or why it was skipped, problems); skipped only
    when the peers' environment does not exist, a check that cannot run there is a problem."""
    venv = peers_venv()
    python = venv / "bin" / "python"
    if not python.exists():
        return (f"Dynamo's DGD model check skipped: no peers environment at {venv} "
                "(scripts/install_peers.sh makes it)"), []
    request = json.dumps({"doc": doc, "gpus_per_node": options.gpus_per_node})
    try:
        proc = subprocess.run([str(python), str(_MODEL_CHECK)], input=request, capture_output=True, text=True,
                              timeout=timeout_s)
        seen = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
    except (subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        proc, seen = exc, None
    if not isinstance(seen, dict):
        tail = (getattr(proc, "stderr", "") or "").strip()[-600:]
        return "Dynamo's DGD model check did not run", [
            f"{_MODEL_CHECK.name} failed in {venv} ({getattr(proc, 'returncode', type(proc).__name__)}): {tail}"]
    where = f"Dynamo {seen.get('dynamo_version')}"
    if seen.get("error"):
        return f"{where}'s DGD model", [f"{where}'s DGD model rejects it: {seen['error']}"]
    problems, read = [], []
    for layout in role_layouts(placement, options.gpus_per_node):
        role = seen["roles"][layout.role]
        got = (role["replicas"], role["gpus_per_instance"], role["node_count"])
        want = (layout.replicas, layout.tp * layout.pp, layout.nodes)
        if got != want:
            problems.append(f"{where} reads the {layout.role} component {role['name']!r} as replicas, GPUs per "
                            f"instance, nodes {got}; the placement needs {want}")
        if role["profiler_node_count"] not in (None, layout.nodes):
            problems.append(f"{where}'s profiler would run a {layout.role} instance on {role['profiler_node_count']} "
                            f"nodes of {options.gpus_per_node} GPUs, the DGD on {layout.nodes}")
        for flag, value in (("--model", options.resolved_model_id()), ("--disaggregation-mode", layout.role)):
            if _flag(role["args"], flag) != value:
                problems.append(f"{where} reads {flag} {_flag(role['args'], flag)!r} from {layout.role}, expected {value}")
        read.append(f"{layout.role} {got[0]}×{got[1]} GPUs on {got[2]} node(s)")
    return (f"validated by {where}'s DGD model (dynamo.profiler.utils.config.Config) in {venv}, which reads "
            + ", ".join(read)), problems


# ---------------------------------------------------------------------------------------------
# writing: everything rendered and validated in a temporary directory, then moved


def _validate(target: str, docs: dict[str, Any], placement: Placement, options: ExportOptions) -> tuple[list[str], list[str]]:
    if target == "dynamo":
        doc = docs.get(DYNAMO_FILE)
        problems = dgd_problems(doc, placement, options)
        checks = ["Kubernetes object shape", "DGD structure (frontend, prefill, decode; model, TP, PP, NIXL, router)",
                  f"{_GPU} adds up to the placement's {placement.total_gpus} GPUs"]
        if isinstance(doc, Mapping):
            note, more = dynamo_template_check(doc)
            checks.append(note)
            problems += more
        if isinstance(doc, Mapping) and not problems:   # a DGD pdlab already rejects is not sent to Dynamo
            note, more = dynamo_model_check(doc, placement, options)
            checks.append(note)
            problems += more
        return checks, problems
    problems = llm_d_problems(docs, placement, options)
    return (["Kubernetes object shape", "kustomize overlay (base, images, two Deployment patches; model, TP, PP, NIXL)",
             f"{_GPU} requests = limits, adding up to the placement's {placement.total_gpus} GPUs"], problems)


def export_placement(placement: Placement, exports: Sequence[tuple[str, str | Path]],
                     options: ExportOptions) -> list[ExportResult]:
    """Write ``placement`` for each ``(target, directory)`` of ``exports`` (targets from :data:`EXPORT_TARGETS`).

    Every export is rendered, written to a temporary directory, read back and validated first; only when all
    pass are the files moved into their directories (created if needed; files of the same name are replaced).
    Any problem raises :class:`ExportError` naming it, and nothing is written."""
    targets = [t for t, _ in exports]
    for t in targets:
        if t not in EXPORT_TARGETS:
            raise ExportError(f"unknown export target {t!r}; choose from {', '.join(EXPORT_TARGETS)}")
    if len(set(targets)) != len(targets):
        raise ExportError(f"each export target once, got {targets}")
    dirs = [Path(d) for _, d in exports]
    for d in dirs:
        if d.exists() and not d.is_dir():
            raise ExportError(f"export directory {d} exists and is not a directory")
    rendered = []
    for target in targets:
        try:
            rendered.append(render(target, placement, options))
        except ExportError as exc:
            raise ExportError(f"--export {target}: {exc}; nothing was written") from None
    results = []
    with tempfile.TemporaryDirectory(prefix="pdlab-export-") as tmp:
        for i, (target, files) in enumerate(zip(targets, rendered, strict=True)):
            stage = Path(tmp) / str(i)
            stage.mkdir()
            for name, text in files.items():
                (stage / name).write_text(text)
            docs = {name: yaml.safe_load((stage / name).read_text()) for name in files}
            checks, problems = _validate(target, docs, placement, options)
            if problems:
                raise ExportError(f"--export {target} does not validate: {'; '.join(problems)}; nothing was written")
            results.append(ExportResult(target, dirs[i], [dirs[i] / n for n in files], placement.total_gpus, checks))
        for i, result in enumerate(results):
            result.directory.mkdir(parents=True, exist_ok=True)
            for path in result.files:
                shutil.move(str(Path(tmp) / str(i) / path.name), str(path))
    return results
