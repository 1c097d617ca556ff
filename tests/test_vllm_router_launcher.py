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
