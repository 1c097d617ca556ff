"""``pdlab model build``: write an offline model folder (tiny random Llama, SmolLM2-135M, or a catalog config)."""

from __future__ import annotations

import argparse

from pdlab.cli import CLIError, Subcommands, add_actions, emit

__all__ = ["register"]


def register(sub: Subcommands) -> None:
    p = sub.add_parser("model", help="build offline model folders for the live labs", description=__doc__)
    msub = add_actions(p, "model")
    b = msub.add_parser("build", help="write a model folder (nothing is downloaded)")
    b.add_argument("--preset", required=True,
                   help="tiny | smollm2-135m | a catalog model name (config + tokenizer only, for --load-format dummy)")
    b.add_argument("--out", required=True, help="output folder (created; must be empty unless --force)")
    b.add_argument("--seed", type=int, default=0, help="seed of the random weights (tiny)")
    b.add_argument("--base", default="llama-3-8b", help="catalog model the tiny preset is scaled from")
    b.add_argument("--force", action="store_true", help="replace a non-empty output folder")
    b.add_argument("--json", action="store_true")
    b.set_defaults(func=_build)


def _build(args: argparse.Namespace) -> int:
    from pdlab.serve.engines.modelbuild import build_model

    try:
        result = build_model(args.preset, args.out, seed=args.seed, overwrite=args.force, base=args.base)
    except FileExistsError as exc:
        raise CLIError(str(exc)) from exc
    d = result.as_dict()
    weights = "random weights" if result.preset == "tiny" else ("weights" if result.has_weights else
                                                                "no weights (serve with --load-format dummy)")
    emit(d, args.json, f"{result.preset}: {result.architecture}, {result.num_params / 1e6:.1f} M parameters, "
                       f"vocab {result.vocab_size:,}, {weights} → {result.path} ({result.seconds:.1f} s)")
    return 0
