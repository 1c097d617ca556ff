"""Transports that listen on every interface are contained (notebook 03's Mooncake Transfer Engine).

Runs the real Mooncake peers (1 MiB, 3 repeats) while watching every process this test starts:
each socket they listen on is on loopback, or inside a namespace whose only interface is ``lo``.
"""

from __future__ import annotations

import os
import threading
import time

import pytest
from pdlab.transfer.netns import (
    loopback_namespace,
    namespace_interfaces,
    namespace_listening,
    namespace_status,
)
from pdlab.transfer.transports import transport_status

psutil = pytest.importorskip("psutil")


def _watch(stop: threading.Event, seen: list[tuple[int, str, int, list[str]]]) -> None:
    me = psutil.Process()
    while not stop.is_set():
        for child in me.children(recursive=True):
            try:
                ifaces = namespace_interfaces(child.pid)
                if ifaces == ["lo"]:  # a namespace of its own: every socket listening there is the peers'
                    socks = namespace_listening(child.pid)
                else:
                    socks = [(c.laddr.ip, c.laddr.port) for c in child.net_connections(kind="inet")
                             if c.status == psutil.CONN_LISTEN and c.laddr]
            except (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError):
                continue
            seen.extend((child.pid, ip, port, ifaces) for ip, port in socks)
        time.sleep(0.05)


def test_loopback_namespace_has_only_lo_and_is_deleted():
    ok, why = namespace_status()
    if not ok:
        pytest.skip(why)
    import subprocess

    with loopback_namespace() as ns:
        out = subprocess.run(["ip", "-n", ns, "-o", "link"], capture_output=True, text=True, check=True).stdout
        names = [line.split(":")[1].strip() for line in out.splitlines()]
        assert names == ["lo"] and "UP" in out
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert ns not in listed


def test_listening_sockets_of_a_namespace_are_read_from_proc():
    import socket

    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        assert ("127.0.0.1", srv.getsockname()[1]) in namespace_listening(os.getpid())


def test_mooncake_listens_only_inside_a_loopback_namespace():
    ok, why = transport_status("mooncake")
    if not ok:
        pytest.skip(why)
    from pdlab.transfer.bench import measure_transport

    stop, seen = threading.Event(), []
    watcher = threading.Thread(target=_watch, args=(stop, seen), daemon=True)
    watcher.start()
    try:
        results = measure_transport("mooncake", [1 << 20], repeats=3)
    finally:
        stop.set()
        watcher.join(timeout=5)
    assert results and all(m.verified for m in results)
    assert seen, "no listening socket of the Mooncake peers was seen"
    exposed = [s for s in seen if s[1] not in ("127.0.0.1", "::1") and s[3] != ["lo"]]
    assert not exposed, f"sockets reachable beyond loopback (pid, address, port, interfaces): {exposed}"
    assert any(s[3] == ["lo"] for s in seen), "the peers did not run in a loopback-only namespace"
    assert namespace_interfaces(os.getpid()) != ["lo"]  # the test itself is outside it


def test_mooncake_store_benchmark_listens_only_inside_a_loopback_namespace():
    from pdlab.transfer.store import store_benchmark, store_status

    ok, why = store_status()
    if not ok:
        pytest.skip(why)
    stop, seen = threading.Event(), []
    watcher = threading.Thread(target=_watch, args=(stop, seen), daemon=True)
    watcher.start()
    try:
        res = store_benchmark(4, 256 * 1024, repeats=1)
    finally:
        stop.set()
        watcher.join(timeout=5)
    assert res["verified"] and seen, "no listening socket of the store's processes was seen"
    exposed = [s for s in seen if s[1] not in ("127.0.0.1", "::1") and s[3] != ["lo"]]
    assert not exposed, f"sockets reachable beyond loopback (pid, address, port, interfaces): {exposed}"
