"""Model configs: catalog, HF config rules (GQA/MHA/MLA), KV bytes and parameter counts."""

from __future__ import annotations

import json

import pytest
from pdlab.catalog import UnknownNameError
from pdlab.models import from_hf_config, get_model, kv_bytes_per_token, list_models, load_config, param_counts


@pytest.mark.parametrize("name,bf16", [
    ("llama-3-8b", 131_072), ("mistral-7b", 131_072), ("llama-3-70b", 327_680), ("llama-2-70b", 327_680),
    ("qwen2.5-72b", 327_680), ("llama-3.1-405b", 516_096), ("opt-13b", 819_200), ("opt-66b", 2_359_296),
    ("opt-175b", 4_718_592), ("deepseek-v3", 70_272), ("mixtral-8x7b", 131_072),
])
def test_catalog_kv_bytes_per_token_match_the_reference_sheet(name, bf16):
    model = get_model(name)
    assert kv_bytes_per_token(model, "bf16") == bf16
    assert kv_bytes_per_token(model, "fp8") == bf16 // 2
    assert kv_bytes_per_token(model, "fp32") == bf16 * 2


def test_llama_70b_fp8_is_163840_bytes_per_token():
    assert kv_bytes_per_token(get_model("llama-3-70b"), "fp8") == 2 * 80 * 8 * 128


def test_gqa_without_head_dim_derives_it_from_hidden_over_heads():
    cfg = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8}
    m = from_hf_config(cfg)
    assert m.head_dim == 128 and m.attention_kind == "GQA"
    assert kv_bytes_per_token(m, "bf16") == 2 * 32 * 8 * 128 * 2


def test_gqa_with_explicit_head_dim_uses_it():
    # Gemma-style: head_dim is not hidden/heads.
    cfg = {"hidden_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 16,
           "head_dim": 256}
    m = from_hf_config(cfg)
    assert m.head_dim == 256
    assert kv_bytes_per_token(m, "bf16") == 2 * 28 * 16 * 256 * 2


def test_mha_without_num_key_value_heads_is_full_attention():
    cfg = {"model_type": "opt", "hidden_size": 5120, "num_hidden_layers": 40, "num_attention_heads": 40,
           "ffn_dim": 20480, "vocab_size": 50272}
    m = from_hf_config(cfg)
    assert m.num_kv_heads == 40 and m.attention_kind == "MHA" and not m.gated_mlp
    assert kv_bytes_per_token(m, "fp16") == 819_200


def test_mla_counts_latent_plus_rope_without_factor_two():
    cfg = {"hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
           "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128}
    m = from_hf_config(cfg)
    assert m.is_mla and m.attention_kind == "MLA"
    assert kv_bytes_per_token(m, "bf16") == 61 * 576 * 2
    assert kv_bytes_per_token(m, "fp8") == 35_136


def test_load_config_reads_a_file_or_folder(tmp_path):
    cfg = {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
           "intermediate_size": 8192, "vocab_size": 128256}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert load_config(tmp_path).num_kv_heads == 8
    assert load_config(tmp_path / "config.json").head_dim == 64
    with pytest.raises(FileNotFoundError):
        load_config(tmp_path / "missing")


def test_config_without_required_fields_is_a_clear_error():
    with pytest.raises(ValueError, match="hidden_size"):
        from_hf_config({"num_hidden_layers": 2})


@pytest.mark.parametrize("name,total_b,active_b", [
    ("llama-3-8b", 8.03, 8.03), ("llama-3-70b", 70.55, 70.55), ("mixtral-8x7b", 46.7, 12.9),
    ("deepseek-v3", 671.0, 37.5), ("opt-66b", 65.7, 65.7),
])
def test_parameter_counts_match_published_sizes(name, total_b, active_b):
    counts = param_counts(get_model(name))
    assert counts["total"] / 1e9 == pytest.approx(total_b, rel=0.01)
    assert counts["active"] / 1e9 == pytest.approx(active_b, rel=0.02)


def test_llama_8b_parameter_count_by_hand():
    h, f, L, v = 4096, 14336, 32, 128256
    per_layer = 2 * h * h + 2 * h * 1024 + 3 * h * f
    assert param_counts(get_model("llama-3-8b"))["total"] == L * per_layer + 2 * v * h


def test_unknown_model_lists_closest_names():
    with pytest.raises(UnknownNameError) as err:
        get_model("llama3-70")
    assert "llama-3-70b" in str(err.value)


def test_catalog_has_every_required_model_with_a_source():
    names = {m.name for m in list_models()}
    for required in ("llama-3-8b", "llama-3-70b", "llama-3.1-405b", "llama-2-70b", "mistral-7b", "qwen2.5-72b",
                     "opt-13b", "opt-66b", "opt-175b", "mixtral-8x7b", "deepseek-v3"):
        assert required in names
    assert all(m.source for m in list_models())
