"""The vllm-router launcher's errors, without any engine."""

from __future__ import annotations

import socket

import pytest
from pdlab.process import PortInUseError, free_port, live_processes
from pdlab.serve.engines import vllm_router
from pdlab.serve.engines.vllm_router import RouterMissingError, find_vllm_router, start_vllm_router


def test_missing_binary_names_the_install_script(monkeypatch, tmp_path):
    before = live_processes()  # other tests' processes are not this one's to judge
    monkeypatch.setenv("PDLAB_PEERS_VENV", str(tmp_path / "nowhere"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RouterMissingError, match="scripts/install_peers.sh"):
        find_vllm_router()
    with pytest.raises(RouterMissingError, match="scripts/install_peers.sh"):
        start_vllm_router("http://127.0.0.1:1", "http://127.0.0.1:2", port=free_port())
    assert live_processes() == before


def test_port_in_use_is_refused_before_anything_starts(monkeypatch, tmp_path):
    before = live_processes()  # other tests' processes are not this one's to judge
    fake = tmp_path / "bin" / "vllm-router"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PDLAB_PEERS_VENV", str(tmp_path))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        with pytest.raises(PortInUseError, match="vllm-router"):
            start_vllm_router("http://127.0.0.1:1", "http://127.0.0.1:2", port=port)
    assert live_processes() == before


def test_a_router_that_exits_is_reported_with_its_log_and_reaped(monkeypatch, tmp_path):
    before = live_processes()  # other tests' processes are not this one's to judge
    from pdlab.process import ServerStartError

    fake = tmp_path / "bin" / "vllm-router"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'no workers reachable' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PDLAB_PEERS_VENV", str(tmp_path))
    with pytest.raises(ServerStartError, match="no workers reachable"):
        start_vllm_router("http://127.0.0.1:1", "http://127.0.0.1:2", port=free_port(), log_dir=tmp_path, timeout_s=10)
    assert live_processes() == before
    assert vllm_router.find_vllm_router() == fake


def test_plain_mode_argv_routes_among_workers_and_pd_mode_keeps_its_flags():
    """The command lines of both modes: plain mode names every worker after --worker-urls and no PD
    flag; PD mode names the connector and each prefill and decode server; mixing them, an empty or
    schemeless URL and an unknown policy are refused with the reason."""
    from pdlab.serve.engines.vllm_router import router_argv

    plain = router_argv("vr", port=9000, workers=["http://127.0.0.1:9100", "http://127.0.0.1:9101"])
    assert plain[:5] == ["vr", "--host", "127.0.0.1", "--port", "9000"]
    at = plain.index("--worker-urls")
    assert plain[at + 1:at + 3] == ["http://127.0.0.1:9100", "http://127.0.0.1:9101"]
    assert plain[plain.index("--policy") + 1] == "round_robin"
    assert not {"--vllm-pd-disaggregation", "--prefill", "--decode", "--kv-connector"} & set(plain)
    pd_argv = router_argv("vr", port=9000, prefill=["http://p:1"], decode=["http://d:2", "http://d:3"],
                          policy="cache_aware", extra_args=["--disable-retries"])
    assert "--worker-urls" not in pd_argv and pd_argv[-1] == "--disable-retries"
    assert pd_argv[pd_argv.index("--kv-connector") + 1] == "nixl"
    assert [pd_argv[i + 1] for i, a in enumerate(pd_argv) if a == "--decode"] == ["http://d:2", "http://d:3"]
    assert pd_argv[pd_argv.index("--prefill") + 1] == "http://p:1"
    with pytest.raises(ValueError, match="not both"):
        router_argv("vr", port=1, workers=["http://w:1"], prefill=["http://p:1"], decode=["http://d:1"])
    with pytest.raises(ValueError, match="at least one worker URL"):
        router_argv("vr", port=1)
    with pytest.raises(ValueError, match="at least one decode URL"):
        router_argv("vr", port=1, prefill=["http://p:1"])
    with pytest.raises(ValueError, match=r"must start with http://.*127\.0\.0\.1:9100"):
        router_argv("vr", port=1, workers=["127.0.0.1:9100"])
    with pytest.raises(ValueError, match="unknown vllm-router policy 'fastest'"):
        router_argv("vr", port=1, workers=["http://w:1"], policy="fastest")


FAKE_ROUTER = """#!{python}
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
json.dump(sys.argv[1:], open({argv_file!r}, "w"))
port = int(sys.argv[sys.argv.index("--port") + 1])

class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass

HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def test_start_in_plain_mode_passes_the_workers_and_stops_the_router(monkeypatch, tmp_path):
    """A stand-in binary that records its arguments and answers /health: the launcher starts it in
    plain mode with every worker, reports it, and stops it on leaving the block."""
    import json
    import sys

    from pdlab.serve.engines.vllm_router import start_vllm_router_workers

    before = live_processes()  # other tests' processes are not this one's to judge
    argv_file = tmp_path / "argv.json"
    fake = tmp_path / "bin" / "vllm-router"
    fake.parent.mkdir()
    fake.write_text(FAKE_ROUTER.format(python=sys.executable, argv_file=str(argv_file)))
    fake.chmod(0o755)
    monkeypatch.setenv("PDLAB_PEERS_VENV", str(tmp_path))
    workers = ["http://127.0.0.1:9100", "http://127.0.0.1:9101"]
    with start_vllm_router_workers(workers, port=free_port(), log_dir=tmp_path, timeout_s=20) as router:
        assert router.alive() and router.workers == workers and router.policy == "round_robin"
        assert router.startup_s is not None and router.startup_s >= 0
        assert "workers=" in repr(router)
        args = json.loads(argv_file.read_text())
        assert args[args.index("--worker-urls") + 1:args.index("--worker-urls") + 3] == workers
        assert "--vllm-pd-disaggregation" not in args
    assert not router.alive()
    assert live_processes() == before


def test_round_robin_split_finds_the_routers_offset_from_the_workers_counters():
    """Six requests (prompt tokens 500, 10, 500, 10, 10, 10 in send order) dealt in turn to two workers:
    from worker 0 (1,010 tokens served, 30 for worker 1) the split deals from request 0; from the
    opposite counts it deals from request 1. Counters no dealing explains leave a share unmatched."""
    from pdlab.metrics import RequestRecord
    from pdlab.serve.engines.vllm_router import round_robin_split

    prompts = [500, 10, 500, 10, 10, 10]
    recs = [RequestRecord(i, arrival_s=float(i), prompt_tokens=p, output_tokens=4) for i, p in enumerate(prompts)][::-1]
    # listed in reverse: the split must order by arrival, not trust the list
    split, miss = round_robin_split(recs, [1010, 30])
    assert miss == 0.0
    assert [[r.request_id for r in part] for part in split] == [[0, 2, 4], [1, 3, 5]]
    split, miss = round_robin_split(recs, [30, 1010])
    assert miss == 0.0
    assert [[r.request_id for r in part] for part in split] == [[1, 3, 5], [0, 2, 4]]
    recs[0] = RequestRecord(5, arrival_s=5.0, prompt_tokens=10, output_tokens=4, server_prompt_tokens=12)   # the server's count wins
    assert round_robin_split(recs, [1010, 32])[1] == 0.0
    split, miss = round_robin_split(recs, [530, 512])  # no dealing fits: the closest misplaces 480 of 1,042 tokens
    assert miss == pytest.approx(480 / 1042)
    with pytest.raises(ValueError, match="at least one worker"):
        round_robin_split(recs, [])
