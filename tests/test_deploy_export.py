"""``pdlab place --export dynamo|llm-d DIR``: placements written as a DynamoGraphDeployment or llm-d overlays,
validated, and nothing written when a placement cannot be deployed (pdlab.sched.deploy_export)."""

from __future__ import annotations

import copy
import json

import pytest
import yaml
from pdlab.sched.deploy_export import (
    DYNAMO_FILE,
    EXPORT_TARGETS,
    LLM_D_FILES,
    ExportError,
    ExportOptions,
    dgd_problems,
    dynamo_model_check,
    dynamo_template_check,
    export_placement,
    hf_model_id,
    k8s_object_problems,
    llm_d_problems,
    render_dynamo,
    render_llm_d,
    template_key_problems,
)
from pdlab.sched.placement import ParallelConfig, Placement


def _placement(p=(2, 1), d=(4, 1), n_p=3, n_d=2, rate=3.5, affinity="high") -> Placement:
    pre, dec = ParallelConfig(*p), ParallelConfig(*d)
    gpus = n_p * pre.num_gpus + n_d * dec.num_gpus
    return Placement(affinity=affinity, prefill=pre, decode=dec, num_prefill=n_p, num_decode=n_d,
                     prefill_goodput_rps=rate / n_p, decode_goodput_rps=rate / n_d, total_gpus=gpus,
                     cluster_goodput_rps=rate, per_gpu_goodput_rps=rate / gpus, kv_bandwidth_needed_bytes_per_s=0.0,
                     cross_node_bytes_per_s=None, bandwidth_limited=False)


OPTS = ExportOptions("llama-3-70b", gpus_per_node=8, cluster_gpus=16)


def _docs(files: dict[str, str]) -> dict:
    return {name: yaml.safe_load(text) for name, text in files.items()}


def _gpus(container: dict) -> int:
    return int(container["resources"]["limits"]["nvidia.com/gpu"])


def test_dynamo_export_carries_the_placement(tmp_path):
    placement = _placement()
    [result] = export_placement(placement, [("dynamo", tmp_path / "dgd")], OPTS)
    assert [p.name for p in result.files] == [DYNAMO_FILE] and result.files[0].exists()
    doc = yaml.safe_load(result.files[0].read_text())
    assert (doc["apiVersion"], doc["kind"]) == ("nvidia.com/v1beta1", "DynamoGraphDeployment")
    by_type = {c["type"]: c for c in doc["spec"]["components"]}
    assert set(by_type) == {"frontend", "prefill", "decode"}
    front = by_type["frontend"]["podTemplate"]["spec"]["containers"][0]
    assert front["args"][front["args"].index("--router-mode") + 1] == "kv"
    total = 0
    for role, cfg, replicas in (("prefill", placement.prefill, 3), ("decode", placement.decode, 2)):
        comp = by_type[role]
        main = comp["podTemplate"]["spec"]["containers"][0]
        args = main["args"]
        assert comp["replicas"] == replicas and "multinode" not in comp
        assert args[args.index("--model") + 1] == "meta-llama/Meta-Llama-3-70B"
        assert args[args.index("--tensor-parallel-size") + 1] == str(cfg.tp)
        assert args[args.index("--disaggregation-mode") + 1] == role
        kv = json.loads(args[args.index("--kv-transfer-config") + 1])
        assert kv == {"kv_connector": "NixlConnector", "kv_role": {"prefill": "kv_producer", "decode": "kv_consumer"}[role]}
        assert main["resources"]["requests"] == main["resources"]["limits"]
        total += comp["replicas"] * _gpus(main)
    assert total == placement.total_gpus == 14 == result.gpus
    assert any("Dynamo template" in c or "Dynamo's" in c for c in result.checks)
    from pdlab.paths import peers_venv

    if (peers_venv() / "bin" / "python").exists():   # the export went through Dynamo's own model
        assert any(c.startswith("validated by Dynamo 1.6.1's DGD model") for c in result.checks), result.checks


def test_llm_d_export_is_a_kustomize_overlay(tmp_path):
    placement = _placement(p=(1, 1), d=(4, 1), n_p=4, n_d=1)
    [result] = export_placement(placement, [("llm-d", tmp_path / "llmd")], OPTS)
    assert sorted(p.name for p in result.files) == sorted(LLM_D_FILES)
    docs = {p.name: yaml.safe_load(p.read_text()) for p in result.files}
    kust = docs["kustomization.yaml"]
    assert (kust["apiVersion"], kust["kind"]) == ("kustomize.config.k8s.io/v1beta1", "Kustomization")
    assert sorted(p["path"] for p in kust["patches"]) == ["patch-decode.yaml", "patch-prefill.yaml"]
    total = 0
    for role, tp, replicas in (("prefill", 1, 4), ("decode", 4, 1)):
        patch = docs[f"patch-{role}.yaml"]
        assert (patch["apiVersion"], patch["kind"], patch["metadata"]["name"]) == ("apps/v1", "Deployment", role)
        server = patch["spec"]["template"]["spec"]["containers"][0]
        assert server["name"] == "modelserver" and server["args"][0] == "meta-llama/Meta-Llama-3-70B"
        assert f"--tensor-parallel-size={tp}" in server["args"]
        assert "NixlConnector" in server["args"][server["args"].index("--kv-transfer-config") + 1]
        assert server["resources"]["requests"]["nvidia.com/gpu"] == server["resources"]["limits"]["nvidia.com/gpu"]
        assert patch["spec"]["replicas"] == replicas
        total += replicas * _gpus(server)
    assert total == placement.total_gpus == 8


def test_an_instance_wider_than_a_node_becomes_a_multinode_component(tmp_path):
    placement = _placement(p=(4, 4), d=(8, 2), n_p=1, n_d=1, affinity="low")
    opts = ExportOptions("llama-3-70b", gpus_per_node=8)
    doc = _docs(render_dynamo(placement, opts))[DYNAMO_FILE]
    by_type = {c["type"]: c for c in doc["spec"]["components"]}
    for role, nodes in (("prefill", 2), ("decode", 2)):
        assert by_type[role]["multinode"] == {"nodeCount": nodes}
        assert _gpus(by_type[role]["podTemplate"]["spec"]["containers"][0]) == 8
    assert "--pipeline-parallel-size" in by_type["prefill"]["podTemplate"]["spec"]["containers"][0]["args"]
    assert dgd_problems(doc, placement, opts) == []
    with pytest.raises(ExportError, match="multi-host"):
        render_llm_d(placement, opts)
    with pytest.raises(ExportError, match="split evenly"):
        render_dynamo(_placement(p=(2, 5), n_p=1, n_d=1), ExportOptions("llama-3-70b", gpus_per_node=4))
    with pytest.raises(ExportError, match="TP8 is wider than a node of 4"):
        render_dynamo(_placement(p=(8, 1), n_p=1, n_d=1), ExportOptions("llama-3-70b", gpus_per_node=4))


def test_validators_catch_broken_objects():
    placement = _placement()
    doc = _docs(render_dynamo(placement, OPTS))[DYNAMO_FILE]
    assert dgd_problems(doc, placement, OPTS) == []
    wrong_gpus = copy.deepcopy(doc)
    wrong_gpus["spec"]["components"][2]["podTemplate"]["spec"]["containers"][0]["resources"] = \
        {"limits": {"nvidia.com/gpu": "8"}, "requests": {"nvidia.com/gpu": "4"}}
    problems = " | ".join(dgd_problems(wrong_gpus, placement, OPTS))
    assert "requests (4) differ from limits (8)" in problems and "adds up to 22 GPUs" in problems
    no_front = copy.deepcopy(doc)
    no_front["spec"]["components"] = no_front["spec"]["components"][1:]
    assert any("type frontend" in p for p in dgd_problems(no_front, placement, OPTS))
    renamed = copy.deepcopy(doc)
    renamed["spec"]["components"][1]["name"] = "Decode"   # the CRD's names are unique regardless of case
    renamed["spec"]["components"][0]["podTemplate"]["spec"]["containers"][0]["name"] = "frontend"
    problems = " | ".join(dgd_problems(renamed, placement, OPTS))
    assert "'decode' repeats" in problems and "component 'Frontend': no container named main" in problems
    assert any("metadata.name" in p for p in k8s_object_problems({**doc, "metadata": {"name": "Bad_Name"}}))
    assert any("apiVersion" in p for p in k8s_object_problems({**doc, "apiVersion": "nvidia"}))
    assert any("no containers" in p for p in k8s_object_problems(
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"}, "spec": {"template": {"spec": {}}}}))
    docs = _docs(render_llm_d(placement, OPTS))
    assert llm_d_problems(docs, placement, OPTS) == []
    docs["patch-decode.yaml"]["spec"]["replicas"] = 3
    docs["patch-prefill.yaml"]["spec"]["template"]["spec"]["containers"][0]["args"][1] = "--tensor-parallel-size=1"
    problems = " | ".join(llm_d_problems(docs, placement, OPTS))
    assert "replicas 3" in problems and "--tensor-parallel-size is 1" in problems and "adds up to 18" in problems
    del docs["kustomization.yaml"]
    assert any("files are" in p for p in llm_d_problems(docs, placement, OPTS))


# A stand-in for llm-d's single-host P/D base (guides/recipes/modelserver/base/single-host/pd/vllm): its two
# Deployments, their model-server container, and the decode pod's routing sidecar, with the image placeholders.
_BASE = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: prefill}
spec:
  selector: {matchLabels: {llm-d.ai/role: prefill}}
  template:
    metadata: {labels: {llm-d.ai/role: prefill}}
    spec:
      containers: [{name: modelserver, image: REPLACE_MODEL_SERVER_IMAGE, args: [base]}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: decode}
spec:
  selector: {matchLabels: {llm-d.ai/role: decode}}
  template:
    metadata: {labels: {llm-d.ai/role: decode}}
    spec:
      initContainers: [{name: routing-proxy, image: REPLACE_ROUTING_SIDECAR_IMAGE, restartPolicy: Always}]
      containers: [{name: modelserver, image: REPLACE_MODEL_SERVER_IMAGE, args: [base]}]
"""


def test_llm_d_overlay_builds_with_kustomize(tmp_path):
    """``kubectl kustomize`` (offline) applies the overlay to a stand-in base: patches merge by container name."""
    import shutil
    import subprocess

    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed: the overlay is checked by llm_d_problems only")
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "deploy.yaml").write_text(_BASE)
    (tmp_path / "base" / "kustomization.yaml").write_text("resources: [deploy.yaml]\n")
    placement = _placement(p=(1, 1), d=(4, 1), n_p=4, n_d=1)
    opts = ExportOptions("llama-3-70b", gpus_per_node=8, llm_d_base="../base")
    export_placement(placement, [("llm-d", tmp_path / "overlay")], opts)
    built = subprocess.run(["kubectl", "kustomize", str(tmp_path / "overlay")], capture_output=True, text=True,
                           timeout=60)
    assert built.returncode == 0, built.stderr
    deployments = {d["metadata"]["name"]: d for d in yaml.safe_load_all(built.stdout)}
    assert sorted(deployments) == ["pdlab-llama-3-70b-decode", "pdlab-llama-3-70b-prefill"]
    total = 0
    for name, d in deployments.items():
        pod = d["spec"]["template"]
        assert pod["metadata"]["labels"]["llm-d.ai/inference-serving"] == "true"
        [server] = pod["spec"]["containers"]
        assert server["image"] == "docker.io/vllm/vllm-openai:v0.27.1" and server["args"][0] != "base"
        total += d["spec"]["replicas"] * _gpus(server)
        if name.endswith("decode"):
            assert pod["spec"]["initContainers"][0]["image"].startswith("ghcr.io/llm-d/llm-d-router-disagg-sidecar")
    assert total == placement.total_gpus


def test_template_comparison_names_missing_keys():
    doc = _docs(render_dynamo(_placement(), OPTS))[DYNAMO_FILE]
    template = {"apiVersion": "nvidia.com/v1beta1", "kind": "DynamoGraphDeployment", "metadata": {"name": "t"},
                "spec": {"components": [{"name": "prefill", "type": "prefill", "replicas": 1, "podTemplate": {
                    "spec": {"containers": [{"name": "main", "image": "i", "args": [], "volumeMounts": [],
                                             "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}]}}
    problems = template_key_problems(doc, template)
    assert problems == ["prefill main container lacks ['volumeMounts']"]
    template["spec"]["components"].append({"name": "planner", "type": "planner"})
    assert "no component of type 'planner'" in " ".join(template_key_problems(doc, template))


def test_against_the_installed_dynamo_templates():
    """Compared with the DGD template the installed ai-dynamo ships; skipped where it is not installed."""
    doc = _docs(render_dynamo(_placement(), OPTS))[DYNAMO_FILE]
    note, problems = dynamo_template_check(doc)
    if "skipped" in note.split(";")[0]:
        pytest.skip(note)
    assert problems == [], problems


def test_infeasible_placement_writes_nothing(tmp_path):
    out = tmp_path / "out"
    zero = _placement(rate=0.0)
    for target in EXPORT_TARGETS:
        with pytest.raises(ExportError, match="0 req/s.*nothing was written"):
            export_placement(zero, [(target, out)], OPTS)
    assert not out.exists()
    too_big = _placement(n_p=8)   # 8×2 + 2×4 = 24 GPUs on a 16-GPU cluster
    with pytest.raises(ExportError, match="needs 24 GPUs and the cluster has 16"):
        export_placement(too_big, [("dynamo", out)], OPTS)
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    wide = _placement(p=(4, 4), d=(4, 4), n_p=1, n_d=1, affinity="low")   # llm-d refuses multi-node instances
    with pytest.raises(ExportError, match="llm-d.*multi-host"):
        export_placement(wide, [("dynamo", tmp_path / "dgd"), ("llm-d", out)], ExportOptions("llama-3-70b",
                                                                                              gpus_per_node=8))
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"] and not (tmp_path / "dgd").exists()
    with pytest.raises(ExportError, match="choose from dynamo, llm-d"):
        export_placement(_placement(), [("kserve", out)], OPTS)


def test_hf_model_id_from_the_catalog():
    assert hf_model_id("llama-3-8b") == "meta-llama/Meta-Llama-3-8B"
    with pytest.raises(ExportError, match="--export-model"):
        hf_model_id("opt-175b")


# ---------------------------------------------------------------------------------------------
# the CLI

PLACE = ["place", "--model", "opt-13b", "--gpu", "a100-80gb", "--nodes", "1", "--gpus-per-node", "2",
         "--workload", "fixed-512-64", "--slo-ttft", "0.4", "--slo-tpot", "0.06", "--profile", "smoke",
         "--workers", "1"]


def test_cli_exports_both_targets(tmp_path, capsys):
    from pdlab.cli import main

    assert main([*PLACE, "--export", "dynamo", str(tmp_path / "dgd"), "--export", "llm-d", str(tmp_path / "llmd"),
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [e["target"] for e in out["exports"]] == ["dynamo", "llm-d"]
    assert (tmp_path / "dgd" / DYNAMO_FILE).exists()
    assert sorted(p.name for p in (tmp_path / "llmd").iterdir()) == sorted(LLM_D_FILES)
    assert all(e["gpus"] == out["total_gpus"] for e in out["exports"])
    doc = yaml.safe_load((tmp_path / "dgd" / DYNAMO_FILE).read_text())
    assert doc["metadata"]["name"] == "pdlab-opt-13b"


def test_cli_unknown_target_exits_2_and_lists_targets(tmp_path, capsys):
    from pdlab.cli import main

    with pytest.raises(SystemExit) as exc:
        main([*PLACE, "--export", "kserve", str(tmp_path / "x")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'kserve'" in err and "dynamo, llm-d" in err
    assert not (tmp_path / "x").exists()


def test_cli_infeasible_placement_exits_2_without_files(tmp_path, capsys):
    from pdlab.cli import main

    out = tmp_path / "out"
    impossible = [a if a not in ("0.4", "0.06") else "1e-6" for a in PLACE]
    assert main([*impossible, "--affinity", "low", "--export", "dynamo", str(out)]) == 2
    assert "0 req/s" in capsys.readouterr().err and not out.exists()
    no_fit = [*PLACE[:2], "llama-3.1-405b", *PLACE[3:]]   # 405B does not fit 2 A100s: place() refuses
    assert main([*no_fit, "--export", "llm-d", str(out)]) == 2
    assert "does not fit" in capsys.readouterr().err and not out.exists()


# ---------------------------------------------------------------------------------------------
# Dynamo's own model, in the peers' environment


def _peers_or_skip():
    from pdlab.paths import peers_venv

    if not (peers_venv() / "bin" / "python").exists():
        pytest.skip(f"no peers environment at {peers_venv()} (scripts/install_peers.sh makes it): "
                    "Dynamo's DGD model check does not run here")


@pytest.mark.slow   # Dynamo's import in a subprocess: about 5 s a check
def test_dynamo_reads_the_dgd_back_as_the_placement():
    """Dynamo's pydantic DGD model accepts the export, and its profiler reads the placement's replicas, TP × PP,
    nodes (also those it would set itself for 8-GPU nodes), model and roles from it."""
    _peers_or_skip()
    for placement, opts in ((_placement(), OPTS),
                            (_placement(p=(4, 4), d=(4, 4), n_p=1, n_d=1, affinity="low"),
                             ExportOptions("llama-3-70b", gpus_per_node=8))):
        doc = _docs(render_dynamo(placement, opts))[DYNAMO_FILE]
        note, problems = dynamo_model_check(doc, placement, opts)
        assert problems == [] and note.startswith("validated by Dynamo 1.6.1's DGD model"), (note, problems)
    assert "prefill 1×16 GPUs on 2 node(s), decode 1×16 GPUs on 2 node(s)" in note


@pytest.mark.slow   # Dynamo's import in a subprocess: about 5 s a check
def test_dynamo_model_check_names_what_dynamo_reads_differently():
    _peers_or_skip()
    placement = _placement()
    doc = _docs(render_dynamo(placement, OPTS))[DYNAMO_FILE]
    decode = next(c for c in doc["spec"]["components"] if c["type"] == "decode")
    args = decode["podTemplate"]["spec"]["containers"][0]["args"]
    args[args.index("--tensor-parallel-size") + 1] = "8"
    _, problems = dynamo_model_check(doc, placement, OPTS)
    assert problems == ["Dynamo 1.6.1 reads the decode component 'decode' as replicas, GPUs per instance, nodes "
                        "(2, 8, 1); the placement needs (2, 4, 1)"]
    decode["replicas"] = "two"   # not an int: Dynamo's pydantic model refuses the document
    _, problems = dynamo_model_check(doc, placement, OPTS)
    assert len(problems) == 1 and "DGD model rejects it: Config.model_validate" in problems[0] and "replicas" in problems[0]


def test_dynamo_model_check_says_when_there_is_no_peers_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("PDLAB_PEERS_VENV", str(tmp_path / "none"))
    placement = _placement()
    note, problems = dynamo_model_check(_docs(render_dynamo(placement, OPTS))[DYNAMO_FILE], placement, OPTS)
    assert problems == [] and note == (f"Dynamo's DGD model check skipped: no peers environment at {tmp_path / 'none'} "
                                       "(scripts/install_peers.sh makes it)")
