"""Tests of pdlab.workloads.agentic: calibration, prefix structure, Mooncake export, text rendering, CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from pdlab.cli import main
from pdlab.kvcache import chain_hashes
from pdlab.workloads import read_mooncake_jsonl
from pdlab.workloads.agentic import (
    MOONCAKE_TOOL_AGENT,
    AgenticConfig,
    LengthDist,
    TextRenderer,
    agentic_requests,
    generate_agentic,
    text_requests,
)


@pytest.fixture(scope="module")
def big():
    return generate_agentic(seed=3, sessions=500)


def test_defaults_reproduce_the_mooncake_tool_agent_statistics(big):
    s = big.stats()
    assert abs(s["avg_input_tokens"] / MOONCAKE_TOOL_AGENT["avg_input_tokens"] - 1) < 0.08
    assert abs(s["avg_output_tokens"] / MOONCAKE_TOOL_AGENT["avg_output_tokens"] - 1) < 0.08
    assert 0.5 <= s["prefix_cache_hit_ratio"] <= 0.65
    assert 4.0 < s["request_rate_rps"] < 9.0


def test_turns_extend_the_previous_prompt_and_apps_share_prefixes(big):
    for turns in list(big.sessions().values())[:50]:
        for a, b in zip(turns, turns[1:], strict=False):
            assert b.segments[:len(a.segments)] == a.segments
            assert b.prompt_tokens == a.prompt_tokens + a.output_tokens + b.segments[-1].tokens
            assert b.arrival_s > a.arrival_s and b.think_time_s > 0
        assert turns[0].think_time_s == 0
        assert all(t.prompt_tokens + t.output_tokens <= big.config.max_context_tokens for t in turns)
    reqs = big.requests()
    by_app: dict[int, set] = {}
    for t, r in zip(big.turns, reqs, strict=True):
        by_app.setdefault(t.app, set()).add(r.hash_ids[0])
    assert all(len(v) == 1 for v in by_app.values())  # one system prompt per app → one first block


def test_hash_ids_are_the_chain_of_the_actual_blocks():
    w = generate_agentic(seed=1, sessions=12)
    remap: dict[int, int] = {}
    for t, ids in zip(w.turns, w.hash_ids(), strict=True):
        tokens = w.tokens(t)
        assert len(ids) == -(-t.prompt_tokens // 512)
        # our chain hashes int64 bytes instead of decimal text: same equality structure after remapping
        ref = [remap.setdefault(h, len(remap)) for h in chain_hashes([int(x) for x in tokens], 512)]
        assert list(ids) == ref


def test_deterministic_across_processes_and_seed_sensitive():
    # another interpreter with another str-hash seed must give the same sessions (no hash(), no set order)
    code = ("from pdlab.workloads.agentic import generate_agentic; "
            "print([(r.arrival_s, r.prompt_tokens, r.output_tokens, r.hash_ids) "
            "for r in generate_agentic(seed=5, sessions=20).requests()])")
    outs = {subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": h}, check=True,
                           capture_output=True, text=True).stdout for h in ("1", "2")}
    a = generate_agentic(seed=5, sessions=20)
    assert outs == {str([(r.arrival_s, r.prompt_tokens, r.output_tokens, r.hash_ids) for r in a.requests()]) + "\n"}
    assert generate_agentic(seed=6, sessions=20).requests() != a.requests()
    assert len({r.request_id for r in agentic_requests(10, 1.0, seed=2)}) == len(agentic_requests(10, 1.0, seed=2))


def test_config_validation_and_scaling():
    with pytest.raises(ValueError):
        AgenticConfig(sessions=0)
    with pytest.raises(ValueError):
        AgenticConfig(turns_mean=20, max_turns=12)
    with pytest.raises(ValueError):
        LengthDist(-1)
    small = AgenticConfig().scaled(1 / 8)
    s = generate_agentic(small, seed=0, sessions=300).stats()
    assert 800 < s["avg_input_tokens"] < 1400 and s["max_input_tokens"] <= small.max_context_tokens
    x = LengthDist(100, 0.5).sample(np.random.default_rng(0), 20000)
    assert abs(x.mean() / 100 - 1) < 0.03


def test_mooncake_export_roundtrip_and_trace_stats_cli(tmp_path, capsys):
    out = tmp_path / "agentic.jsonl"
    assert main(["workload", "agentic", "--sessions", "300", "--seed", "0", "--out", str(out), "--json"]) == 0
    made = json.loads(capsys.readouterr().out)
    reqs = read_mooncake_jsonl(out)
    assert len(reqs) == made["requests"]
    assert main(["trace", "stats", str(out), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert 0.5 <= stats["prefix_cache_hit_ratio"] <= 0.65
    assert main(["workload", "agentic", "--sessions", "0", "--out", str(out)]) == 2
    assert main(["workload", "agentic", "--out", str(tmp_path / "x.csv")]) == 2


class _WordTokenizer:
    """Whitespace tokenizer standing in for a model's (each ' word' one token)."""

    chat_template = None

    def __init__(self):
        words = ["alpha", "beta", "gamma", "delta", "omega", "kappa", "sigma", "theta", "lambda", "zeta",
                 "iota", "rho", "tau", "phi", "chi", "psi", "eta", "nu", "mu", "xi"]
        self.vocab = {"Ġ" + w: i for i, w in enumerate(words)}

    def get_vocab(self):
        return self.vocab

    def encode(self, text, add_special_tokens=False):
        return [self.vocab.get("Ġ" + w, 999) for w in text.split()]


def test_text_rendering_matches_token_counts():
    w = generate_agentic(AgenticConfig().scaled(1 / 16), seed=0, sessions=4)
    r = TextRenderer(_WordTokenizer())
    rows = text_requests(w, r)
    for row, t in zip(rows, w.turns, strict=True):
        seg_tokens = sum(len(m["content"].split()) for m in row["messages"])
        # segment words + the two fixed headers
        assert seg_tokens - t.prompt_tokens in range(0, 4 * len(row["messages"]) + 8)
        assert row["max_tokens"] == t.output_tokens
    sess = [row for row in rows if row["session_id"] == w.turns[-1].session_id]
    if len(sess) > 1:
        a, b = sess[0]["messages"], sess[1]["messages"]
        assert b[:len(a)] == a  # the history is replayed verbatim: live prefix caching can hit
    plain = TextRenderer()  # no tokenizer: English words
    assert len(plain.segment_text(w.turns[0].segments[0]).split()) == w.turns[0].segments[0].tokens


def test_cli_text_mode_with_the_tiny_tokenizer(tmp_path, capsys):
    from pdlab.serve.engines.modelbuild import tiny_model_dir

    tiny = tiny_model_dir()
    out = tmp_path / "text.jsonl"
    assert main(["workload", "agentic", "--sessions", "3", "--scale", "0.05", "--text", "--tokenizer", str(tiny),
                 "--out", str(out), "--json"]) == 0
    capsys.readouterr()
    line = json.loads(out.read_text().splitlines()[0])
    assert line["messages"][0]["role"] == "system" and line["input_length"] > 0
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny))
    ids = tok.apply_chat_template(line["messages"], add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    assert len(ids) == line["input_length"]
