"""Tests of pdlab.transfer's measured transports: sizes, verification, each transport, CLI, hygiene."""

from __future__ import annotations

import json
import subprocess
import sys

import psutil
import pytest
from pdlab.cli import main
from pdlab.transfer import (
    VerificationError,
    checksum,
    expand_transports,
    format_size,
    kv_transfer,
    layout_for_size,
    make_payload,
    measure_transport,
    parse_size,
    parse_sizes,
    transport_status,
)
from pdlab.transfer.overlap import predicted_exposed_s

SMALL = [4096, 256 * 1024]


def _descendants() -> set[int]:
    """PIDs of every live (not zombie) descendant of this process."""
    out = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                out.add(child.pid)
        except psutil.NoSuchProcess:
            continue
    return out


@pytest.fixture
def no_leftover_processes():
    before = _descendants()
    yield
    left = _descendants() - before
    assert not left, f"processes left behind: {left}"


# ------------------------------------------------------------------ sizes, layout, verification
def test_parse_size_binary_decimal_and_errors():
    assert parse_size("4KiB") == 4096
    assert parse_size("1 MiB") == 1 << 20
    assert parse_size("1GiB") == 1 << 30
    assert parse_size("1MB") == 1_000_000
    assert parse_size("512") == 512
    assert parse_sizes("1MiB,4KiB,4KiB") == [4096, 1 << 20]
    for bad in ("", "abc", "4XB", "0", "1.5B", "-4KiB"):
        with pytest.raises(ValueError):
            parse_size(bad)
    assert format_size(256 << 20) == "256 MiB"


def test_layout_is_exact_and_kv_shaped():
    for size in (4096, 1 << 20, 64 << 20, 3 * 4096):
        lay = layout_for_size(size)
        assert lay.total_bytes == size
        assert lay.layers >= 1 and lay.layers <= 32
    assert layout_for_size(64 << 20).block_bytes == 64 * 1024  # 16-token blocks of Llama-3-8B
    assert layout_for_size(4096).layers == 1


def test_checksum_catches_corruption_and_misplaced_pages():
    buf = make_payload(1 << 20, seed=1)
    ref = checksum(buf)
    assert ref == checksum(make_payload(1 << 20, seed=1))
    bad = buf.copy()
    bad[12345] ^= 1
    assert checksum(bad) != ref
    swapped = buf.copy().reshape(-1, 4096)
    swapped[[0, 1]] = swapped[[1, 0]]
    assert checksum(swapped) != ref  # pages are stamped: a swap is not invisible


def test_predicted_overlap_model():
    # transfer shorter than compute: only the last layer is exposed
    assert predicted_exposed_s(32, 0.002, 0.001) == pytest.approx(0.001)
    # link-bound: c + L(x - c)
    assert predicted_exposed_s(32, 0.001, 0.002) == pytest.approx(0.001 + 32 * 0.001)
    assert predicted_exposed_s(32, 0.005, 0.002, "serial") == pytest.approx(0.064)


def test_expand_transports():
    assert expand_transports("shm,tcp") == ["shm", "tcp"]
    assert "nixl" in expand_transports("all")
    with pytest.raises(ValueError):
        expand_transports("carrier-pigeon")


# ------------------------------------------------------------------ real transports, small sizes
@pytest.mark.parametrize("transport", ["shm", "tcp", "gloo", "mooncake", "nixl"])
def test_transport_small_sizes_verified(transport, no_leftover_processes):
    ok, why = transport_status(transport)
    if not ok:
        pytest.skip(why)
    results = measure_transport(transport, SMALL, repeats=2)
    assert [r.size_bytes for r in results] == SMALL
    for r in results:
        assert r.verified
        assert r.latency_min_s <= r.latency_s <= r.latency_max_s
        assert r.bandwidth_bytes_per_s == pytest.approx(r.size_bytes / r.latency_s)


def test_corrupted_transfer_fails_and_leaves_no_process(no_leftover_processes):
    with pytest.raises(VerificationError, match="corrupted"):
        measure_transport("tcp", [64 * 1024], repeats=1, corrupt=True)
    rows = measure_transport("shm", [64 * 1024], repeats=1, corrupt=True, strict=False)
    assert rows[0].verified is False


def test_peer_failure_is_reported_and_cleaned_up(no_leftover_processes):
    from pdlab.transfer.bench import run_trials
    from pdlab.transfer.procs import PeerError

    with pytest.raises(PeerError):  # an impossible layout makes the peers fail mid-run
        run_trials("tcp", [{"layers": 1, "blocks": 1, "block_bytes": 4096, "reps": 1, "mode": "nonsense"}],
                   timeout_s=60)


def test_memcpy_and_benchmark_report(no_leftover_processes):
    from pdlab.transfer import benchmark

    report = benchmark(["shm", "cuda"], [4096], repeats=2)
    d = report.as_dict()
    assert d["memcpy_bytes_per_s"] > 0
    assert {"transport", "size_bytes", "bandwidth_bytes_per_s", "latency_s", "verified"} <= set(d["results"][0])
    assert d["best"][0]["fraction_of_memcpy"] > 0
    if not transport_status("cuda")[0]:
        assert "cuda" in d["skipped"] and "CUDA" in d["skipped"]["cuda"]


# ------------------------------------------------------------------ CLI
def test_cli_json_keys(capsys, no_leftover_processes):
    assert main(["transfer", "bench", "--transport", "shm,tcp", "--sizes", "4KiB", "--repeats", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["memcpy_bytes_per_s"] > 0
    assert {r["transport"] for r in out["results"]} == {"shm", "tcp"}
    for r in out["results"]:
        assert {"transport", "size_bytes", "bandwidth_bytes_per_s", "latency_s", "verified"} <= set(r)
        assert r["verified"] is True


def test_cli_unavailable_transport_exits_2(capsys, monkeypatch):
    import pdlab.cli.transfer as cli_transfer

    monkeypatch.setattr(cli_transfer, "transport_status",
                        lambda name: (False, "mooncake is not installed: pip install mooncake-transfer-engine-non-cuda"))
    assert main(["transfer", "bench", "--transport", "mooncake", "--sizes", "4KiB"]) == 2
    assert "pip install" in capsys.readouterr().err


def test_cli_cuda_without_gpu_exits_2(capsys):
    if transport_status("cuda")[0]:
        pytest.skip("a GPU is present")
    assert main(["transfer", "bench", "--transport", "cuda", "--sizes", "4KiB"]) == 2
    assert "CUDA" in capsys.readouterr().err


def test_cli_bad_size_exits_2(capsys):
    assert main(["transfer", "bench", "--transport", "tcp", "--sizes", "4 parsecs"]) == 2


# ------------------------------------------------------------------ overlap, emulated links, store
def test_layerwise_overlap_hides_transfer(no_leftover_processes):
    from pdlab.transfer.overlap import measure_overlap

    res = measure_overlap(8, 2 << 20, [0.03], repeats=3)  # serial exposes ~8 layers, layer-wise ~1
    by_mode = {r["mode"]: r for r in res["rows"]}
    assert all(r["verified"] for r in res["rows"])
    assert by_mode["layerwise"]["exposed_s"] < by_mode["serial"]["exposed_s"]


def test_emulated_link_scales_and_cleans_up(no_leftover_processes):
    from pdlab.transfer.netem import emulation_status, replay_kv_transfer

    ok, why = emulation_status()
    if not ok:
        pytest.skip(why)
    before = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    rows = replay_kv_transfer(4 << 20, 4, [0.25], repeats=1)
    assert rows[0]["verified"]
    # 4 MiB at 0.25 Gbit/s is ≈134 ms by the napkin; TCP/IP headers make it a little slower
    napkin = 4 * 2**20 * 8 / 0.25e9
    assert 0.8 * napkin < rows[0]["seconds"] < 3 * napkin
    after = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert after == before


def test_emulated_link_unavailable_is_clear(monkeypatch):
    import pdlab.transfer.netem as netem

    monkeypatch.setattr(netem.os, "geteuid", lambda: 1000)
    ok, why = netem.emulation_status()
    assert not ok and "root" in why
    with pytest.raises(netem.EmulationUnavailable):
        with netem.emulated_link(1.0):
            pass


def test_prefix_block_keys_share_prefixes():
    from pdlab.transfer.store import prefix_block_keys

    a = prefix_block_keys(list(range(1024)), 256)
    b = prefix_block_keys(list(range(512)) + [7] * 512, 256)
    assert len(a) == 4 and a[:2] == b[:2] and a[2] != b[2] and a[3] != b[3]
    assert prefix_block_keys(list(range(300)), 256) == a[:1]


def test_mooncake_store_put_get(no_leftover_processes):
    from pdlab.transfer.store import MooncakeMaster, store_benchmark, store_status

    ok, why = store_status()
    if not ok:
        pytest.skip(why)
    res = store_benchmark(4, 256 * 1024, repeats=1)
    assert res["verified"] and res["get_bytes_per_s"] > 0 and res["put_bytes_per_s"] > 0
    with MooncakeMaster() as master:
        probe = subprocess.run(
            [sys.executable, "-c", f"import socket; socket.create_connection(('127.0.0.1', {master.rpc_port}), timeout=2)"],
            capture_output=True)
        assert probe.returncode == 0
    with pytest.raises(VerificationError):
        store_benchmark(2, 64 * 1024, repeats=1, corrupt=True)


def test_napkin_api_intact():
    from pdlab.models import get_model

    t = kv_transfer(get_model("llama-3-8b"), 1000, "bf16", 1e9)
    assert t.kv_bytes == 131072 * 1000 and t.transfer_s == pytest.approx(0.131072)
