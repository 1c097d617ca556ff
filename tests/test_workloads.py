"""pdlab.workloads: trace readers with line-numbered errors, synthetic arrivals."""

import numpy as np
import pytest
from pdlab.workloads import (
    TraceFormatError,
    gamma_arrivals,
    mirrored_order,
    mooncake_trace_path,
    named_workload,
    poisson_arrivals,
    read_mooncake_jsonl,
    read_sharegpt_lengths,
    scale_rate,
    split_blocks,
    stratified_rows,
    synthetic_requests,
)

GOOD = '{"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]}\n'


def test_reads_bundled_conversation_trace():
    reqs = read_mooncake_jsonl(mooncake_trace_path("conversation"))
    assert len(reqs) == 12031
    assert np.mean([r.prompt_tokens for r in reqs]) == pytest.approx(12035, rel=1e-3)
    assert all(b.arrival_s >= a.arrival_s for a, b in zip(reqs, reqs[1:], strict=False))
    assert reqs[0].hash_ids[:2] == (0, 1)


@pytest.mark.parametrize("line,problem", [
    ("{not json\n", "invalid JSON"),
    ('{"timestamp": 5, "output_length": 3, "hash_ids": []}\n', "input_length"),
    ('{"timestamp": 5, "input_length": -3, "output_length": 3}\n', "input_length"),
    ('{"timestamp": 5, "input_length": 2.5, "output_length": 3}\n', "integer"),
    ('{"timestamp": "x", "input_length": 3, "output_length": 3}\n', "timestamp"),
    ('{"timestamp": 5, "input_length": 3, "output_length": 3, "hash_ids": "ab"}\n', "hash_ids"),
])
def test_malformed_line_names_file_and_line(tmp_path, line, problem):
    path = tmp_path / "bad.jsonl"
    path.write_text(GOOD + GOOD + line + GOOD)
    with pytest.raises(TraceFormatError) as info:
        read_mooncake_jsonl(path)
    assert info.value.line == 3 and str(path) in str(info.value) and f"{path}:3:" in str(info.value)
    assert problem in str(info.value)


def test_timestamps_must_not_go_back(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(GOOD.replace('"timestamp": 0', '"timestamp": 10') + GOOD)
    with pytest.raises(TraceFormatError, match=":2:"):
        read_mooncake_jsonl(path)


def test_sharegpt_lengths_and_bad_csv(tmp_path):
    table = read_sharegpt_lengths()
    assert table.shape[1] == 2 and len(table) > 10_000 and table.min() >= 1
    bad = tmp_path / "l.csv"
    bad.write_text("num_prefill_tokens,num_decode_tokens\n10,20\nx,3\n")
    with pytest.raises(TraceFormatError, match=r"l\.csv:3:"):
        read_sharegpt_lengths(bad)


def test_stratified_sharegpt_covers_prompt_lengths_evenly_and_keeps_pairs():
    table = read_sharegpt_lengths()
    n = 60
    reqs = synthetic_requests(n, 1.0, lengths="sharegpt-stratified", seed=0)
    prompts = np.array([r.prompt_tokens for r in reqs])
    rows = stratified_rows(table, n, np.random.default_rng(1))   # what seed 0 draws (its lengths use seed + 1)
    assert prompts.tolist() == table[rows, 0].tolist()
    # one row from each of n equal strata of the rows sorted by prompt length
    position = np.empty(len(table), dtype=np.int64)
    position[np.argsort(table[:, 0], kind="stable")] = np.arange(len(table))
    edges = np.linspace(0, len(table), n + 1).astype(np.int64)
    assert sorted((np.searchsorted(edges, position[rows], side="right") - 1).tolist()) == list(range(n))
    assert not np.all(np.diff(prompts) >= 0), "stratified requests must arrive in random order, not by length"
    pairs = {tuple(row) for row in table.tolist()}
    assert all((r.prompt_tokens, r.output_tokens) in pairs for r in reqs), "a prompt lost its own output length"
    assert [r.prompt_tokens for r in named_workload("sharegpt-stratified", n, 1.0, 0)] == prompts.tolist()
    # the largest gap between neighbours in the middle third: a plain random sample leaves wider ones
    mid = lambda p: np.diff(np.sort(p)[n // 3: 2 * n // 3]).max()  # noqa: E731
    plain = [mid([r.prompt_tokens for r in synthetic_requests(n, 1.0, lengths="sharegpt", seed=s)]) for s in range(20)]
    strat = [mid([r.prompt_tokens for r in synthetic_requests(n, 1.0, lengths="sharegpt-stratified", seed=s)])
             for s in range(20)]
    assert np.median(strat) < 0.6 * np.median(plain)
    with pytest.raises(ValueError, match="stratify"):
        stratified_rows(table[:5], 6, np.random.default_rng(0))
    with pytest.raises(ValueError, match="sharegpt-stratified"):
        synthetic_requests(3, 1.0, lengths="lmsys", seed=0)


def test_mirrored_order_puts_every_rate_at_the_same_mean_position():
    assert mirrored_order(3) == [(0, 0), (1, 0), (2, 0), (2, 1), (1, 1), (0, 1)]
    for levels, blocks in ((3, 2), (4, 4), (1, 2)):
        order = mirrored_order(levels, blocks)
        assert sorted(order) == [(lvl, b) for lvl in range(levels) for b in range(blocks)]
        # a drift linear in time (drift = position) adds the same to every level
        means = [np.mean([pos for pos, (x, _) in enumerate(order) if x == lvl]) for lvl in range(levels)]
        assert max(means) - min(means) == pytest.approx(0.0)
    assert mirrored_order(3, 1) == [(0, 0), (1, 0), (2, 0)]
    with pytest.raises(ValueError, match="at least one level"):
        mirrored_order(0)


def test_split_blocks_keeps_the_length_mix_ids_and_rate_of_each_block():
    reqs = named_workload("sharegpt-stratified", 60, 1.0, seed=3)
    parts = split_blocks(reqs, 2, 2.0, seed=7)
    assert [len(p) for p in parts] == [30, 30]
    assert sorted(r.request_id for p in parts for r in p) == sorted(r.request_id for r in reqs)  # each once, ids unique
    by_id = {r.request_id: r for r in reqs}
    assert all((r.prompt_tokens, r.output_tokens) == (by_id[r.request_id].prompt_tokens, by_id[r.request_id].output_tokens)
               for p in parts for r in p)
    # alternate ranks of prompt length: the blocks' sorted lengths interleave (a0 ≤ b0 ≤ a1 ≤ b1 …)
    a, b = (sorted(r.prompt_tokens for r in p) for p in parts)
    assert all(x <= y for x, y in zip(a, b, strict=True)) and all(y <= x for y, x in zip(b, a[1:], strict=False))
    for k, p in enumerate(parts):   # each block keeps the requests' order, with its own arrivals seeded seed + k
        ids = {r.request_id for r in p}
        assert [r.request_id for r in p] == [r.request_id for r in reqs if r.request_id in ids]
        assert np.allclose([r.arrival_s for r in p], poisson_arrivals(2.0, 30, seed=7 + k))
    with pytest.raises(ValueError, match="blocks"):
        split_blocks(reqs[:2], 3, 1.0)


def test_arrivals_rate_seed_and_burstiness():
    a = poisson_arrivals(4.0, 20000, seed=1)
    assert len(a) / a[-1] == pytest.approx(4.0, rel=0.03)
    assert np.array_equal(a, poisson_arrivals(4.0, 20000, seed=1))
    g = np.diff(gamma_arrivals(4.0, 20000, cv=3.0, seed=1))
    assert g.std() / g.mean() == pytest.approx(3.0, rel=0.1)
    with pytest.raises(ValueError):
        poisson_arrivals(0, 10)


def test_synthetic_and_named_workloads():
    reqs = synthetic_requests(100, 2.0, prompt_tokens=512, output_tokens=64, seed=3)
    assert {r.prompt_tokens for r in reqs} == {512}
    fast = scale_rate(reqs, 2.0)
    assert fast[-1].arrival_s == pytest.approx(reqs[-1].arrival_s / 2)
    share = named_workload("sharegpt", 50, 1.0, seed=0)
    assert len(share) == 50 and max(r.prompt_tokens + r.output_tokens for r in share) <= 2048
    assert named_workload("fixed-128-8", 5, 1.0)[0].output_tokens == 8
    with pytest.raises(ValueError, match="unknown workload"):
        named_workload("nope", 5, 1.0)


def test_single_token_words_are_checked_by_encoding():
    from pdlab.workloads.tokens import encode_ids, single_token_words

    class Tok:  # "Ġthe" is one token; "Ġcats" is a vocabulary piece that encodes as two
        vocab = {"Ġthe": 0, "Ġcats": 1, "ĠNo": 2, "Ġx": 3, "Ġdog": 4, "the": 5}

        def get_vocab(self):
            return self.vocab

        def encode(self, text, add_special_tokens=False):
            piece = "Ġ" + text.strip()
            return [self.vocab[piece]] if piece in self.vocab and piece != "Ġcats" else [8, 9]

    tok = Tok()
    assert encode_ids(tok, " the") == [0]
    assert single_token_words(tok) == ["the", "dog"]  # id order; not capitalised, not one letter, not two tokens
    assert single_token_words(tok, max_words=1) == ["the"]
    assert single_token_words(tok, extra=["dog", "zebra"]) == ["the", "dog"]  # extra is checked too
