"""NVIDIA Dynamo on one machine (pdlab.serve.engines.dynamo): launcher errors without processes, and one live 1P1D
deployment of Dynamo's frontend and mocker workers (file discovery, TCP request plane, ZMQ event plane).

The live test is skipped only where ``.venv-peers`` lacks Dynamo (``scripts/install_peers.sh`` installs it).
"""

from __future__ import annotations

import json
import socket
import time
import urllib.request

import pytest
from pdlab.process import PortInUseError, free_port, live_processes
from pdlab.serve.client.prefix_workload import prefix_prompts, shared_prefix_slice
from pdlab.serve.engines.dynamo import (
    DynamoMissingError,
    MockerSpec,
    dynamo_status,
    find_dynamo_python,
    mocker_profile_npz,
    start_dynamo,
)


def test_missing_install_names_the_install_script(tmp_path, monkeypatch):
    monkeypatch.setenv("PDLAB_PEERS_VENV", str(tmp_path / "no-venv"))
    before = list(live_processes())
    with pytest.raises(DynamoMissingError, match="scripts/install_peers.sh"):
        find_dynamo_python()
    with pytest.raises(DynamoMissingError, match="scripts/install_peers.sh"):
        start_dynamo(["agg"], port=free_port())
    ok, why = dynamo_status()
    assert not ok and "install_peers.sh" in why
    assert live_processes() == before


def test_port_in_use_is_refused_before_anything_starts():
    ok, why = dynamo_status()
    if not ok:
        pytest.skip(why)
    before = list(live_processes())
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        with pytest.raises(PortInUseError):
            start_dynamo(["agg"], port=sock.getsockname()[1])
    assert live_processes() == before


def test_worker_sets_are_checked():
    with pytest.raises(ValueError, match="mode"):
        MockerSpec(mode="both")
    ok, _ = dynamo_status()
    if ok:
        with pytest.raises(ValueError, match="prefill and decode"):
            start_dynamo(["prefill"], port=free_port())


def test_mocker_profile_follows_the_fitted_coefficients(tmp_path):
    import numpy as np
    from pdlab.sim.latency import FittedLatency

    model = FittedLatency((0.01, 2e-5, 1e-9), (0.005, 1e-7, 1e-4))
    data = np.load(mocker_profile_npz(model, tmp_path / "p.npz", resolution=8))
    isl = data["prefill_isl"][3]
    assert data["prefill_ttft_ms"][3] == pytest.approx((0.01 + 2e-5 * isl + 1e-9 * isl * isl) * 1e3)
    kv, ctx = data["decode_active_kv_tokens"][5], data["decode_context_length"][2]
    assert data["decode_itl"][5, 2] == pytest.approx((0.005 + 1e-7 * kv + 1e-4 * max(1.0, kv / ctx)) * 1e3)
    assert set(data.files) == {"prefill_isl", "prefill_ttft_ms", "decode_active_kv_tokens",
                               "decode_context_length", "decode_itl"}


def test_prefix_prompts_share_exactly_the_shared_blocks():
    from pdlab.serve.engines.modelbuild import tiny_model_dir
    from pdlab.workloads import Request

    reqs = [Request(0, 0.0, 12, 1, (0, 1, 2)), Request(1, 0.1, 12, 1, (0, 1, 5)), Request(2, 0.2, 10, 1, (7, 8, 9))]
    a, b, c = prefix_prompts(reqs, tiny_model_dir(), block_tokens=4)
    wa, wb, wc = a.split(" "), b.split(" "), c.split(" ")
    assert wa[:9] == wb[:9] and wa[9:] != wb[9:]
    assert len(wa) - 1 == 12 and len(wc) - 1 == 10 and wa[1:5] != wc[1:5]


def test_shared_prefix_slice_comes_in_conversations():
    from pdlab.workloads import mooncake_trace_path, read_mooncake_jsonl

    trace = read_mooncake_jsonl(mooncake_trace_path("conversation"), limit=2000)
    reqs = shared_prefix_slice(trace, 12, block_tokens=32, max_output_tokens=4, rate_rps=5.0)
    assert len(reqs) == 12 and all(r.output_tokens <= 4 for r in reqs)
    assert all(r.prompt_tokens == 32 * len(r.hash_ids) for r in reqs)
    keys = [r.hash_ids[:4] for r in reqs]
    assert all(keys.count(k) >= 2 for k in keys)


@pytest.mark.live
def test_1p1d_mocker_deployment_serves_idles_and_leaves_nothing():
    """Frontend + prefill mocker + decode mocker: one request served, every process ≤ 5% of a core idle,
    every socket on loopback or inside a loopback-only namespace, nothing left after stop (not even a
    grandchild) and the namespace deleted."""
    ok, why = dynamo_status()
    if not ok:
        pytest.skip(why)
    import psutil
    from pdlab.serve.measure.cpucost import measure_cpu

    before = list(live_processes())
    dep = start_dynamo([MockerSpec("prefill"), MockerSpec("decode")], port=free_port(), router_mode="kv")
    pids = []
    try:
        pids = [p.pid for proc in dep.processes() for p in [psutil.Process(proc.pid),
                                                             *psutil.Process(proc.pid).children(recursive=True)]]
        body = {"model": dep.served_model(), "prompt": "hello " * 40, "max_tokens": 5, "ignore_eos": True}
        req = urllib.request.Request(dep.url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            out = json.loads(resp.read())
        assert out["usage"]["completion_tokens"] == 5, out
        socks = dep.sockets()
        assert any(port == dep.port and ip == "127.0.0.1" for _, _, ip, port, _ in socks), socks
        exposed = dep.exposed_sockets()
        if dep.netns is None:
            from pdlab.transfer.netns import namespace_status

            exposed_note = f"no loopback-only namespace here ({namespace_status()[1]}): {exposed}"
        else:
            assert not exposed, f"sockets reachable beyond loopback (pid, process, address, port, interfaces): {exposed}"
        time.sleep(1.0)
        rows = measure_cpu(dep.roots(), 4.0)
        hot = [(r.label, round(r.cores, 3)) for r in rows if r.cores > 0.05]
        assert not hot, f"idle processes above 5% of a core: {hot}"
    finally:
        dep.stop()
    assert live_processes() == before
    assert not dep.discovery_dir.exists()
    time.sleep(0.2)
    left = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not left, f"processes left after stop: {left}"
    if dep.netns is None:  # everything else was checked; the ZMQ event plane listened on 0.0.0.0
        pytest.skip(exposed_note)
    import subprocess

    assert dep.netns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
