"""pdlab.serve.engines.sglang (command lines, status, the xPyD description) and pdlab.serve.engines.standin (the wire)."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer
from pdlab.serve.client.streaming import outcome_record, stream_request
from pdlab.serve.engines.sglang import SGLangPD, gpu_commands, router_argv, sglang_server_argv, sglang_status
from pdlab.serve.engines.standin import make_standin_app, read_wire_log


def test_server_argv_per_mode_and_errors():
    pre = sglang_server_argv("m", "prefill", 31001, bootstrap_port=9000, gpu_id=2, ib_device="mlx5_0", python="py")
    assert pre[:3] == ["py", "-m", "sglang.launch_server"]
    assert pre[pre.index("--disaggregation-mode") + 1] == "prefill"
    assert pre[pre.index("--disaggregation-bootstrap-port") + 1] == "9000"
    assert pre[pre.index("--base-gpu-id") + 1] == "2" and pre[pre.index("--disaggregation-ib-device") + 1] == "mlx5_0"
    dec = sglang_server_argv("m", "decode", 31002, extra=["--tp", "2"])
    assert "--disaggregation-bootstrap-port" not in dec and dec[-2:] == ["--tp", "2"] and dec[0] == sys.executable
    with pytest.raises(ValueError, match="prefill or decode"):
        sglang_server_argv("m", "both", 1)
    with pytest.raises(ValueError, match="transfer backend"):
        sglang_server_argv("m", "decode", 1, transfer_backend="rdma")


def test_router_argv_pairs_prefill_urls_with_bootstrap_ports():
    argv = router_argv(30000, [("http://a", 8998), ("http://b", None)], ["http://c"], prometheus_port=29000,
                       python="py")
    assert argv[:4] == ["py", "-m", "smg", "launch"] and "--pd-disaggregation" in argv
    assert argv[argv.index("--host") + 1] == argv[argv.index("--prometheus-host") + 1] == "127.0.0.1"
    assert "--shutdown-grace-period-secs" not in argv
    assert router_argv(1, [], [], shutdown_grace_s=5)[-2:] == ["--shutdown-grace-period-secs", "5"]
    i = argv.index("--prefill")
    assert argv[i:i + 5] == ["--prefill", "http://a", "8998", "--prefill", "http://b"]
    assert argv[argv.index("--decode") + 1] == "http://c" and argv[argv.index("--prometheus-port") + 1] == "29000"
    assert "--prefill-policy" not in argv
    cache = router_argv(1, [], [], prefill_policy="cache_aware")
    assert cache[cache.index("--prefill-policy") + 1] == "cache_aware" and cache[cache.index("--policy") + 1] == "round_robin"


def test_gpu_commands_are_copyable_shell_lines():
    lines = gpu_commands("org/model", prefill_port=1, decode_port=2, router_port=3)
    assert len(lines) == 4 and lines[0].startswith("python -m sglang.launch_server --model-path org/model")
    assert "--base-gpu-id 1" in lines[1] and "--prefill http://127.0.0.1:1 8998" in lines[2]
    assert lines[3].startswith("pdlab bench --url http://127.0.0.1:3")


def test_status_is_a_reason_not_an_exception(monkeypatch):
    import importlib.util
    import types

    import pdlab.serve.engines.sglang as sg

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(sg.importlib.util, "find_spec", lambda name: None if name == "sglang" else real_find_spec(name))
    ok, why = sglang_status()
    assert not ok and "sglang package is not installed" in why
    monkeypatch.setattr(sg.importlib.util, "find_spec", lambda name: object() if name == "sglang" else real_find_spec(name))
    for available, expect_ok, phrase in ((False, False, "no CUDA GPU"), (True, True, "available")):
        fake = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda a=available: a))
        monkeypatch.setitem(sys.modules, "torch", fake)
        ok, why = sglang_status()
        assert ok is expect_ok and phrase in why


def test_xpyd_description_of_stand_ins_and_real_workers(tmp_path):
    pd = SGLangPD(n_prefill=2, n_decode=1, prefill_port=41001, decode_port=41101, log_dir=tmp_path)
    assert pd.stand_in and pd.prefill_urls() == ["http://127.0.0.1:41001", "http://127.0.0.1:41002"]
    argv = pd._worker_argv("prefill", 1)
    assert argv[1:3] == ["-m", "pdlab.serve.engines.standin"] and argv[argv.index("--bootstrap-port") + 1] == "8999"
    assert argv[argv.index("--wire-log") + 1] == str(tmp_path / "wire-prefill-1.jsonl")
    real = SGLangPD(model="org/m", n_prefill=1, n_decode=2, log_dir=tmp_path)
    dec = real._worker_argv("decode", 1)
    assert dec[dec.index("--base-gpu-id") + 1] == "2" and dec[dec.index("--port") + 1] == "31102"


def _serve(role: str, wire, requests):
    async def go():
        app = make_standin_app(role, wire, token_interval_s=0.001, prefill_delay_s=0.001, bootstrap_port=8998)
        async with TestServer(app) as server, ClientSession() as session:
            return [await requests(session, str(server.make_url("")).rstrip("/"))]

    return asyncio.run(go())[0]


def test_standin_decode_streams_exactly_max_tokens_and_logs_the_wire(tmp_path):
    wire = tmp_path / "d.jsonl"
    body = {"prompt": "hi", "max_tokens": 5, "bootstrap_room": 7, "bootstrap_host": "127.0.0.1"}

    async def run(session, url):
        async with session.get(url + "/server_info") as resp:
            info = await resp.json()
        return info, await stream_request(session, url, body)

    info, out = _serve("decode", wire, run)
    assert info["disaggregation_mode"] == "decode" and info["stand-in"] is True
    rec = outcome_record(out, request_id=0, sent_s=out.chunk_times[0] - 0.01)
    assert rec.ok and rec.output_tokens == 5 and len(rec.token_times_s) == 5
    assert rec.chunk_tokens == [1] * 5   # the stand-in sends running usage when asked, as vLLM does
    log = read_wire_log(wire)
    assert [e["path"] for e in log] == ["/server_info", "/v1/completions"]
    assert log[1]["body"]["bootstrap_room"] == 7 and log[1]["role"] == "decode"


def test_standin_prefill_answers_one_token_and_rejects_bad_json(tmp_path):
    async def run(session, url):
        async with session.post(url + "/v1/chat/completions",
                                json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 50}) as resp:
            answer = await resp.json()
        async with session.post(url + "/generate", data=b"{not json") as resp:
            bad = resp.status
        async with session.post(url + "/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 3}}) as resp:
            native = await resp.json()
        return answer, bad, native

    answer, bad, native = _serve("prefill", tmp_path / "p.jsonl", run)
    assert answer["usage"]["completion_tokens"] == 1 and answer["choices"][0]["message"]["content"] == " tok"
    assert bad == 400 and native["meta_info"]["completion_tokens"] == 1  # a prefill worker makes one token
    with pytest.raises(ValueError, match="prefill or decode"):
        make_standin_app("router", tmp_path / "x.jsonl")
    assert json.loads((tmp_path / "p.jsonl").read_text().splitlines()[0])["role"] == "prefill"


@pytest.mark.live
def test_smg_routes_pd_to_stand_ins_with_one_room_per_request(tmp_path):
    """The real smg gateway in PD mode in front of two stand-ins: each request reaches both workers with
    the same bootstrap room and the prefill worker's bootstrap port, the client gets the decode worker's
    tokens, smg found the bootstrap port listening, every socket is on loopback, and nothing is left running
    afterwards."""
    import socket
    import urllib.request

    from pdlab.process import free_port, listening_sockets

    base = free_port(count=4)
    pd = SGLangPD(router_port=base, prefill_port=base + 1, decode_port=base + 2, bootstrap_port=base + 3,
                  log_dir=tmp_path)
    with pd:
        with socket.create_connection(("127.0.0.1", pd.bootstrap_port), timeout=5):
            pass
        socks = listening_sockets([p.pid for p in pd.processes])
        answers = []
        for body in ({"model": "stand-in", "prompt": "hi", "max_tokens": 4},
                     {"model": "stand-in", "prompt": "hi again", "max_tokens": 6}):
            req = urllib.request.Request(pd.url + "/v1/completions", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as resp:
                answers.append(json.load(resp))
    assert [a["usage"]["completion_tokens"] for a in answers] == [4, 6]   # the decode stand-in's answer
    posts = {role: [e["body"] for e in read_wire_log(pd.wire_log(role)) if e["method"] == "POST"]
             for role in ("prefill", "decode")}
    assert [b["prompt"] for b in posts["prefill"]] == [b["prompt"] for b in posts["decode"]] == ["hi", "hi again"]
    rooms = [b["bootstrap_room"] for b in posts["prefill"]]
    assert rooms == [b["bootstrap_room"] for b in posts["decode"]] and len(set(rooms)) == 2
    assert {b["bootstrap_port"] for b in posts["prefill"] + posts["decode"]} == {pd.bootstrap_port}
    assert "Bootstrap port did not accept" not in (tmp_path / "router.log").read_text()
    assert {pd.router_port, pd.bootstrap_port} <= {port for *_, port in socks}
    assert [s for s in socks if s[2] not in ("127.0.0.1", "::1")] == [], socks   # smg's metrics port too
    assert all(p.popen.poll() is not None for p in pd.processes)


def test_cache_aware_prefill_routing_keeps_a_conversation_on_one_prefill_stand_in(tmp_path):
    """The real smg with ``--prefill-policy cache_aware`` in front of two prefill stand-ins: each
    follow-up prompt (its conversation's earlier prompt plus a short turn) reaches the prefill worker
    of that conversation, and ``prefill_worker_of`` reads that back from the wire logs."""
    import urllib.request

    from pdlab.process import free_port

    base = free_port(count=6)
    pd = SGLangPD(n_prefill=2, prefill_policy="cache_aware", router_port=base, prefill_port=base + 1,
                  decode_port=base + 3, bootstrap_port=base + 4, log_dir=tmp_path)
    a, b = "alpha " * 200, "omega " * 200
    prompts = [a, b, a + "one more turn", b + "one more turn", a + "one more turn and another"]
    with pd:
        for prompt in prompts:
            body = {"model": "stand-in", "prompt": prompt, "max_tokens": 2}
            req = urllib.request.Request(pd.url + "/v1/completions", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as resp:
                json.load(resp)
        workers = pd.prefill_worker_of(prompts + ["never sent"])
    assert workers[-1] == -1 and -1 not in workers[:-1]
    assert workers[2] == workers[4] == workers[0] and workers[3] == workers[1], workers
    with pytest.raises(RuntimeError, match="wire logs"):
        SGLangPD(model="org/m").prefill_worker_of(["x"])
