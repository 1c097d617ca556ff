"""``pdlab kv`` end to end, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def pdlab(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pdlab.cli", *args], capture_output=True, text=True, timeout=60)


def test_course_text_example_over_ndr():
    out = pdlab("kv", "--model", "llama-3-70b", "--dtype", "fp8", "--tokens", "10000", "--link", "ib-ndr", "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["kv_bytes_per_token"] == 163_840 and isinstance(d["kv_bytes_per_token"], int)
    assert d["kv_bytes"] == 1_638_400_000 and d["tokens"] == 10_000
    assert d["bandwidth_bytes_per_s"] == 50e9
    assert d["transfer_s"] == pytest.approx(0.0328, rel=0.005)
    assert set(d) == {"model", "dtype", "kv_bytes_per_token", "tokens", "kv_bytes", "bandwidth_bytes_per_s",
                      "transfer_s"}


def test_bandwidth_in_gbs_and_no_link():
    d = json.loads(pdlab("kv", "--model", "llama-3-8b", "--tokens", "1000", "--bandwidth-gbs", "25", "--json").stdout)
    assert d["transfer_s"] == pytest.approx(131_072 * 1000 / 25e9)
    d = json.loads(pdlab("kv", "--model", "llama-3-8b", "--json").stdout)
    assert "transfer_s" not in d and d["tokens"] == 1


def test_config_file(tmp_path):
    cfg = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    d = json.loads(pdlab("kv", "--config", str(tmp_path), "--dtype", "fp16", "--json").stdout)
    assert d["kv_bytes_per_token"] == 2 * 32 * 32 * 128 * 2


@pytest.mark.parametrize("args,needle", [
    (("--model", "llama-3-70", "--json"), "llama-3-70b"),
    (("--model", "llama-3-70b", "--link", "infiniband", "--json"), "unknown link"),
    (("--model", "llama-3-70b", "--tokens", "-5"), "--tokens"),
    (("--model", "llama-3-70b", "--bandwidth-gbs", "0"), "positive"),
])
def test_bad_input_exits_2_with_a_message(args, needle):
    out = pdlab("kv", *args)
    assert out.returncode == 2 and needle in out.stderr and "Traceback" not in out.stderr
