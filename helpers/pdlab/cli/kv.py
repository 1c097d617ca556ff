"""``pdlab kv``: KV-cache bytes per token, for N tokens, and the time to move them over a link."""

from __future__ import annotations

import argparse

from pdlab.cli import CLIError, Subcommands, emit
from pdlab.models import get_model, load_config
from pdlab.transfer import kv_transfer, resolve_bandwidth

__all__ = ["register", "run"]


def register(sub: Subcommands) -> None:
    p = sub.add_parser("kv", help="KV-cache size and transfer time for a model",
                       description=__doc__)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="catalog model name, e.g. llama-3-70b")
    src.add_argument("--config", help="path to an HF config.json (or its folder)")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp8", "fp32"], help="KV dtype")
    p.add_argument("--tokens", type=int, default=1, help="number of tokens (default 1)")
    bw = p.add_mutually_exclusive_group()
    bw.add_argument("--link", help="catalog link name, e.g. ib-ndr (per-direction bandwidth)")
    bw.add_argument("--bandwidth-gbs", type=float, help="bandwidth in GB/s (decimal, per direction)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.tokens < 0:
        raise CLIError(f"--tokens must be >= 0, got {args.tokens}")
    model = get_model(args.model) if args.model else load_config(args.config)
    result = kv_transfer(model, args.tokens, args.dtype, resolve_bandwidth(args.link, args.bandwidth_gbs))
    d = result.as_dict()
    text = (f"{model.name} ({model.attention_kind}), {args.dtype}: {d['kv_bytes_per_token']:,} B/token; "
            f"{args.tokens:,} tokens = {d['kv_bytes'] / 1e9:.3f} GB")
    if result.transfer_s is not None:
        text += f"; {result.transfer_s * 1e3:.2f} ms at {result.bandwidth_bytes_per_s / 1e9:g} GB/s"
    emit(d, args.json, text)
    return 0
