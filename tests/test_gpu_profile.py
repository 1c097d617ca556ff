"""scripts/gpu_profile.sh / pdlab gpu-profile: the smoke size end to end on this CPU, and the loader."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from pdlab.cli import main as cli_main
from pdlab.paths import repo_root
from pdlab.roofline.measure import list_profiles
from pdlab.roofline.measure import load_device_profile as load_roofline
from pdlab.sim.latency import load_profile as load_latency
from pdlab.sim.latency import nnls_fit
from pdlab.simreal.gpu_profile import (
    FORMAT,
    find_gpu_profiles,
    gpu_profile_command,
    handoff_rows,
    load_gpu_profile,
    roofline_rows,
    step_rows,
)


def _positive(x) -> bool:
    return isinstance(x, int | float) and math.isfinite(x) and x > 0


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """Run the script once (smoke size, CPU) into a temporary folder."""
    out = tmp_path_factory.mktemp("gpu-profile")
    script = repo_root() / "scripts" / "gpu_profile.sh"
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(out)}
    proc = subprocess.run([str(script), "--size", "smoke", "--device", "cpu", "--out", str(out), "--strict",
                           "--json"], capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, json.loads(proc.stdout)


def test_smoke_run_writes_sane_json(smoke):
    out, printed = smoke
    path = out / "cpu-gpu-profile.json"
    assert path.exists() and (out / "cpu-latency.json").exists() and (out / "cpu-roofline.json").exists()
    text = path.read_text()
    assert socket.gethostname() not in text
    gp = load_gpu_profile(path)
    d = gp.data
    assert d == json.loads(text) and printed["format"] == FORMAT == d["format"]
    assert d["errors"] == {} and d["size"] == "smoke" and d["device"]["kind"] == "cpu" and not gp.is_gpu
    assert d["command"].startswith("pdlab gpu-profile") and d["date"].endswith("Z")
    assert d["seconds"] < 60
    # roofline: positive, finite peaks; layer points present
    roof = gp.roofline
    assert _positive(roof.matmul_flops_per_s["fp32"]) and _positive(roof.memory_bytes_per_s)
    assert load_roofline(out / "cpu-roofline.json").matmul_flops_per_s == roof.matmul_flops_per_s
    assert all(_positive(r["measured"]) for r in roofline_rows(gp))
    # hand-off: every measured path verified; the CUDA paths skipped with a reason
    res = d["handoff"]["results"]
    assert {r["kind"] for r in res} == {"host-memcpy", "shm"}
    assert all(r["verified"] is True and _positive(r["bandwidth_bytes_per_s"]) and _positive(r["latency_s"])
               for r in res)
    skipped = d["handoff"]["skipped"]
    assert {"cuda-d2d", "cuda-h2d-pinned", "cuda-h2d-pageable", "cuda-d2h-pinned", "cuda-d2h-pageable",
            "cuda-ipc"} <= set(skipped)
    assert all("CUDA" in why for why in skipped.values()) and "shared memory" in skipped["cuda-ipc"]
    rows = handoff_rows(gp)
    assert {r["kind"] for r in rows if r["best GB/s"] is None} == set(skipped)
    # steps: both phases, positive times, analytic predictions beside them
    pts = d["steps"]["points"]
    assert sum(p["phase"] == "prefill" for p in pts) >= 3 and sum(p["phase"] == "decode" for p in pts) >= 3
    for p in pts:
        assert _positive(p["time_s"]) and _positive(p["analytic_measured_roof_s"]) and _positive(p["fitted_s"])
        assert p["analytic_spec_s"] is None and p["aiconfigurator_s"] is None  # no CPU datasheet, no AIC here
    assert d["aiconfigurator"]["available"] is False and d["aiconfigurator"]["reason"]
    assert len(step_rows(gp)) == len(pts)


def test_fitted_profile_loads_in_the_simulator(smoke):
    out, _ = smoke
    gp = load_gpu_profile(out / "cpu-gpu-profile.json")
    fitted = load_latency(out / "cpu-latency.json")
    assert fitted.prefill == gp.latency().prefill and fitted.decode == gp.latency().decode
    assert gp.latency_file() == out / "cpu-latency.json"
    ratios = []
    for p in gp.data["steps"]["points"]:
        b = p["batch"]
        pred = (fitted.prefill_time_s([p["tokens"]] * b) if p["phase"] == "prefill"
                else fitted.decode_time_s([p["context"]] * b))
        ratios.append(pred / p["time_s"])
    assert all(0.2 < r < 5 for r in ratios), ratios  # a fit of a noisy shared CPU, within a sane factor
    assert 0.5 < float(np.median(ratios)) < 2, ratios
    rc = cli_main(["simulate", "--synthetic", "--requests", "20", "--rate", "5", "--prompt-tokens", "64",
                   "--output-tokens", "8", "--mode", "disaggregated", "--gpu", "h200", "--model", "llama-3-8b",
                   "--profile", str(out / "cpu-latency.json"), "--json"])
    assert rc == 0


def _synthetic(kind: str, name: str, date: str) -> dict:
    """A made-up profile in the file format (test data, not a measurement)."""
    roof = {"kind": kind, "name": name, "torch": "test", "date": date, "size": "full",
            "matmul_flops_per_s": {"bf16": 7.0e14, "fp8": 1.2e15}, "memory_bytes_per_s": 4.0e12, "schema": 1}
    return {
        "format": FORMAT, "name": "h200", "size": "full", "parts": ["roofline", "handoff", "steps"], "date": date,
        "command": gpu_profile_command(), "device": {"kind": kind, "name": name, "catalog_gpu": "h200"},
        "spec": {"gpu": "h200", "matmul_flops_per_s": {"bf16": 9.89e14, "fp8": 1.979e15},
                 "memory_bytes_per_s": 4.8e12},
        "roofline": roof,
        "handoff": {"results": [{"path": "device → device", "kind": "cuda-d2d", "size_bytes": s,
                                 "latency_s": s / 1.5e12 + 1e-5, "bandwidth_bytes_per_s": s / (s / 1.5e12 + 1e-5),
                                 "verified": True, "verified_by": "byte compare"} for s in (4096, 1 << 30)],
                    "skipped": {"cuda-p2p": "one GPU visible (1); peer copies need two"}},
        "steps": {"points": [{"phase": "decode", "batch": 1, "tokens": 1, "context": 512, "time_s": 0.008,
                              "analytic_measured_roof_s": 0.005, "analytic_spec_s": 0.004, "fitted_s": 0.0081}],
                  "fit": {"prefill": [0.01, 1e-5, 1e-10], "decode": [0.007, 1e-8, 1e-5]}},
        "errors": {}, "files": {},
    }


def test_loader_on_a_synthetic_profile(tmp_path):
    (tmp_path / "h200-gpu-profile.json").write_text(json.dumps(_synthetic("cuda", "NVIDIA H200", "2026-01-02T00:00:00Z")))
    (tmp_path / "cpu-gpu-profile.json").write_text(json.dumps(_synthetic("cpu", "AMD EPYC", "2026-01-03T00:00:00Z")))
    (tmp_path / "broken-gpu-profile.json").write_text("{not json")
    found = find_gpu_profiles(tmp_path)
    assert [p.path.name for p in found] == ["h200-gpu-profile.json"]  # CPU and broken files left out
    assert len(find_gpu_profiles(tmp_path, gpu_only=False)) == 2
    assert find_gpu_profiles(tmp_path / "absent") == []
    gp = found[0]
    assert gp.is_gpu and "NVIDIA H200" in gp.label
    rows = {r["quantity"]: r for r in roofline_rows(gp)}
    assert rows["matmul bf16 (TFLOP/s)"]["measured / datasheet"] == pytest.approx(7.0e14 / 9.89e14)
    assert rows["memory bandwidth (TB/s)"]["measured"] == pytest.approx(4.0)
    h = handoff_rows(gp)
    assert h[0]["best GB/s"] == pytest.approx((1 << 30) / ((1 << 30) / 1.5e12 + 1e-5) / 1e9)
    assert h[-1]["skipped because"].startswith("one GPU")
    s = step_rows(gp)[0]
    assert s["measured (ms)"] == pytest.approx(8.0) and s["measured / analytic (measured roof)"] == pytest.approx(1.6)
    assert gp.latency().decode_time_s([512]) == pytest.approx(0.007 + 512e-8 + 1e-5)
    # the roofline list of data/profiles/ is not confused by GPU-profile files
    assert list_profiles(tmp_path) == []
    with pytest.raises(ValueError, match="not a GPU profile"):
        (tmp_path / "x.json").write_text(json.dumps({"format": "something else"}))
        load_gpu_profile(tmp_path / "x.json")
    with pytest.raises(FileNotFoundError):
        load_gpu_profile(tmp_path / "missing.json")


def test_aiconfigurator_annotation(monkeypatch, tmp_path):
    """--annotate adds AIConfigurator's step predictions (its estimator replaced by a stand-in here)."""
    from dataclasses import asdict

    import pdlab.peers.aic_compare as aic
    from pdlab.models import get_model

    calls = []

    def fake_estimate(model, gpu, *, batch, isl, osl, tp, backend):
        calls.append((model, gpu, batch, isl, osl, tp))
        return {"ttft_ms": 10.0 * batch, "tpot_ms": 2.0, "backend_version": "test"}

    monkeypatch.setattr(aic, "aic_estimate", fake_estimate)
    monkeypatch.setattr(aic, "aic_available", lambda: True)
    monkeypatch.setattr(aic, "_aic_installed", lambda: True)
    data = _synthetic("cuda", "NVIDIA H200", "2026-01-02T00:00:00Z")
    data["steps"]["model"] = asdict(get_model("llama-3-8b"))
    data["steps"]["points"].append({"phase": "prefill", "batch": 2, "tokens": 1024, "context": 1024, "time_s": 0.1})
    path = tmp_path / "h200-gpu-profile.json"
    path.write_text(json.dumps(data))
    assert cli_main(["gpu-profile", "--annotate", str(path), "--json"]) == 0
    gp = load_gpu_profile(path)
    assert [p["aiconfigurator_s"] for p in gp.data["steps"]["points"]] == [0.002, 0.02]
    assert calls == [("llama-3-8b", "h200", 1, 511, 2, 1), ("llama-3-8b", "h200", 2, 1024, 2, 1)]
    assert gp.data["aiconfigurator"]["available"] is True
    assert step_rows(gp)[1]["AIConfigurator (ms)"] == pytest.approx(20.0)
    # a model AIConfigurator does not know is refused with the reason, and the file is left alone
    data["steps"]["model"] = asdict(get_model("llama-3-8b")) | {"name": "tiny", "num_layers": 2}
    path.write_text(json.dumps(data))
    assert cli_main(["gpu-profile", "--annotate", str(path), "--json"]) == 1
    assert json.loads(path.read_text()) == data


def test_nnls_fallback_matches_scipy(monkeypatch):
    import sys

    from scipy.optimize import nnls

    rng = np.random.default_rng(0)
    for _ in range(20):
        a = np.column_stack([np.ones(8), rng.uniform(1, 1e4, 8), rng.uniform(1, 1e6, 8)])
        y = a @ np.array([rng.uniform(0, 1e-2), rng.uniform(-1e-6, 1e-6), rng.uniform(0, 1e-9)]) \
            + rng.normal(0, 1e-4, 8)
        scale = np.abs(a).max(axis=0)
        expected = nnls(a / scale, y)[0] / scale
        with monkeypatch.context() as m:
            m.setitem(sys.modules, "scipy.optimize", None)   # a bare GPU image: numpy only
            assert np.allclose(nnls_fit(a, y), expected, rtol=1e-6, atol=1e-12)
        assert np.allclose(nnls_fit(a, y), expected, rtol=1e-6, atol=1e-12)


def test_cli_rejects_unknown_parts(capsys):
    assert cli_main(["gpu-profile", "--parts", "roofline,bogus"]) == 2
    assert "bogus" in capsys.readouterr().err
