"""pdlab.peers.dynamo_planner: Dynamo's offline planner config, report parsing, and one real planner
replay on a small slice (skipped without .venv-peers or the planner's dependencies)."""

from __future__ import annotations

import json

import pytest
from pdlab.metrics import SLO
from pdlab.peers import dynamo_planner as dp
from pdlab.peers.dynamo_compare import PeerSettings, peers_python, write_trace_slice
from pdlab.workloads import mooncake_trace_path

DISAGG = PeerSettings(mode="disaggregated", prefill=2, decode=2)
SLO_ = SLO(ttft_s=10.0, tpot_s=0.05)


needs_peers = pytest.mark.skipif(peers_python() is None,
                                 reason="no peers environment (.venv-peers): run scripts/install_peers.sh")

def test_planner_config_sla():
    cfg = dp.planner_config(SLO_, DISAGG, target="sla", adjustment_interval_s=30, load_interval_s=10)
    assert cfg["mode"] == "disagg" and cfg["optimization_target"] == "sla"
    assert cfg["ttft_ms"] == pytest.approx(10_000.0) and cfg["itl_ms"] == pytest.approx(50.0)
    assert cfg["enable_throughput_scaling"] and cfg["enable_load_scaling"]
    assert cfg["throughput_adjustment_interval_seconds"] == 30 and cfg["load_adjustment_interval_seconds"] == 10
    assert cfg["scheduling"]["scale_interval_seconds"] == 10
    assert cfg["prefill_engine_num_gpu"] == cfg["decode_engine_num_gpu"] == 4
    json.dumps(cfg)


def test_planner_config_threshold_and_errors():
    cfg = dp.planner_config(SLO_, DISAGG, target="throughput", report_dir="/tmp/x")
    assert not cfg["enable_throughput_scaling"] and "throughput_adjustment_interval_seconds" not in cfg
    assert cfg["report_output_dir"] == "/tmp/x"
    with pytest.raises(ValueError, match="target"):
        dp.planner_config(SLO_, DISAGG, target="magic")
    with pytest.raises(ValueError, match="TPOT"):
        dp.planner_config(SLO(ttft_s=1.0), DISAGG)
    with pytest.raises(ValueError, match="disaggregated"):
        dp.planner_config(SLO_, PeerSettings(mode="colocated"))
    with pytest.raises(ValueError, match="multiple"):
        dp.planner_config(SLO_, DISAGG, adjustment_interval_s=25, load_interval_s=10)
    with pytest.raises(ValueError, match="budget"):
        dp.planner_config(SLO_, DISAGG, max_gpu_budget=4)


def test_planner_replay_kwargs(tmp_path):
    cfg = dp.planner_config(SLO_, DISAGG)
    kw = dp.planner_replay_kwargs(DISAGG, tmp_path / "p.npz", cfg, max_model_len=70_000)
    assert kw["num_prefill_workers"] == 2 and kw["num_decode_workers"] == 2 and kw["replay_mode"] == "offline"
    for role in ("prefill", "decode"):
        args = kw[f"{role}_engine_args"]
        assert args["tensor_parallel_size"] == 4 and args["engine"]["max_model_len"] == 70_000
        assert args["engine"]["worker_type"] == role
    assert kw["planner_config"] == cfg


REPORT = {
    "summary": {"median_ttft_ms": 100.0},
    "planner": {"total_ticks": 4, "scaling_events": [{"at_s": 10.0, "component": "prefill", "from": 2, "to": 3}],
                "ticks": [{"at_s": 10.0, "scale_to": {"num_prefill": 3, "num_decode": 1}},
                          {"at_s": 20.0, "scale_to": None},
                          {"at_s": 30.0, "scale_to": {"num_prefill": 4, "num_decode": None}},
                          {"at_s": 40.0, "scale_to": {"num_prefill": 1, "num_decode": 1}}]},
    "stubbed": ["prophet"], "dynamo_version": "1.6.1",
}


def test_parse_planner_report():
    run = dp.parse_planner_report(REPORT, start=(2, 2), target="throughput")
    assert run.timeline == [(10.0, 3, 1), (20.0, 3, 1), (30.0, 4, 1), (40.0, 1, 1)]
    assert run.final == (1, 1) and run.ticks == 4 and run.stubbed == ["prophet"]
    assert run.changes() == [(10.0, 3, 1), (30.0, 4, 1), (40.0, 1, 1)]
    assert run.at(5.0) == (2, 2) and run.at(35.0) == (4, 1)
    # 10-30 s at 3:1, 30-40 s at 4:1: mean prefill (20*3 + 10*4) / 30
    assert run.time_weighted(40.0) == pytest.approx((100 / 30, 1.0))
    with pytest.raises(dp.PlannerUnavailable, match="aisimulate_core"):
        dp.parse_planner_report({"error": "unavailable", "missing": ["aisimulate_core"], "detail": "x"},
                                start=(1, 1), target="sla")


def test_split_rows_and_table():
    place = {"profile": "smoke", "prefill": 4, "decode": 1, "prefill_goodput_rps": 0.75, "decode_goodput_rps": 5.5,
             "rate_rps": 3.0}
    run = dp.parse_planner_report(REPORT, start=(2, 2), target="throughput")
    rows = dp.split_rows(place, [dp.PlannerUnavailable(["aisimulate_core"], "x"), run], last_arrival_s=35.0)
    assert rows[0]["ratio"] == "4.00" and rows[1]["note"].startswith("unavailable")
    assert [r["who"].split(", ")[-1] for r in rows[2:]] == ["final", "last arr.", "mean"]
    assert (rows[3]["prefill"], rows[3]["decode"]) == (4, 1)
    text = dp.format_split_table("t", rows)
    assert "why they can differ" in text and "pdlab place" in text


def test_trace_workload(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": t, "input_length": i, "output_length": o, "hash_ids": [0]}) + "\n"
                             for t, i, o in ((0, 100, 10), (1000, 300, 30), (2000, 200, 20))))
    w = dp.trace_workload(trace)
    assert w.requests == 3 and w.duration_s == pytest.approx(2.0) and w.rate_rps == pytest.approx(1.5)
    assert w.mean_prompt_tokens == pytest.approx(200.0) and w.mean_output_tokens == pytest.approx(20.0)


@needs_peers
def test_real_offline_planner_replay(tmp_path):
    trace = write_trace_slice(mooncake_trace_path("conversation"), tmp_path / "slice.jsonl", 150)
    try:
        run = dp.run_dynamo_planner(trace, DISAGG, SLO_, tmp_path, target="throughput", timeout_s=120)
    except dp.PlannerUnavailable as exc:
        pytest.skip(f"Dynamo's planner cannot run in .venv-peers: {exc}")
    assert run.ticks >= 1 and run.timeline
    assert run.final[0] >= 1 and run.final[1] >= 1
    assert run.summary["completed_requests"] == 150


@needs_peers
def test_sla_target_runs_or_names_what_is_missing(tmp_path):
    trace = write_trace_slice(mooncake_trace_path("conversation"), tmp_path / "slice.jsonl", 50)
    try:
        run = dp.run_dynamo_planner(trace, DISAGG, SLO_, tmp_path, target="sla", timeout_s=120)
    except dp.PlannerUnavailable as exc:
        assert exc.missing and exc.detail   # e.g. aisimulate_core, the SLA planner's performance model
        return
    assert run.ticks >= 1
