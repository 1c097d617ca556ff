"""``python -m pdlab.serve.proxy``: run the P/D proxy on 127.0.0.1 (flags: ``--help``)."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence

from aiohttp import web

from pdlab.serve.proxy.server import ProxyConfig, make_app

__all__: list[str] = []


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pdlab.serve.proxy", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--prefill", nargs="+", required=True, help="prefill server URLs")
    parser.add_argument("--decode", nargs="+", required=True, help="decode server URLs")
    parser.add_argument("--read-timeout", type=float, default=60.0, help="seconds of silence from decode allowed")
    parser.add_argument("--connect-timeout", type=float, default=5.0)
    parser.add_argument("--prefill-timeout", type=float, default=120.0)
    parser.add_argument("--admission-profile", help="latency profile JSON: turns on early rejection (TTFT SLO)")
    parser.add_argument("--ttft-slo", type=float, help="seconds; with --admission-profile")
    parser.add_argument("--handoff", type=float, default=0.0, help="seconds added to every predicted TTFT")
    parser.add_argument("--tokenizer", help="tokenizer folder that counts text prompts; with --admission-profile")
    parser.add_argument("--admission-learn", type=float, default=0.2,
                        help="EWMA weight of the measured ÷ predicted prefill time (0: the fitted model as is)")
    parser.add_argument("--admission-headroom", type=float, default=1.0,
                        help="admit when the predicted TTFT ≤ headroom × --ttft-slo (0 < headroom ≤ 1)")
    parser.add_argument("--engine-metrics", action="store_true",
                        help="admission also reads the engines' vLLM /metrics (queue, decode KV headroom)")
    parser.add_argument("--admission-kv-limit", type=float, default=0.95,
                        help="refuse what would take decode's KV-cache usage above this share (with --engine-metrics)")
    parser.add_argument("--drop-kv-transfer-params", action="store_true",
                        help="fault mode: send the decode leg without the prefill's kv_transfer_params "
                             "(the decode prefills every prompt itself, silently)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = ProxyConfig([u.rstrip("/") for u in args.prefill], [u.rstrip("/") for u in args.decode],
                         connect_timeout_s=args.connect_timeout, prefill_timeout_s=args.prefill_timeout,
                         read_timeout_s=args.read_timeout, admission_profile=args.admission_profile,
                         ttft_slo_s=args.ttft_slo, handoff_s=args.handoff, tokenizer=args.tokenizer,
                         admission_learn=args.admission_learn, admission_headroom=args.admission_headroom,
                         engine_metrics=args.engine_metrics, admission_kv_limit=args.admission_kv_limit,
                         drop_kv_transfer_params=args.drop_kv_transfer_params)
    web.run_app(make_app(config), host=args.host, port=args.port, access_log=None,
                print=lambda msg: print(msg, flush=True))


if __name__ == "__main__":  # pragma: no cover
    main()
