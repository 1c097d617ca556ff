"""``pdlab serve colocated|replicas|disagg``: run vLLM in the foreground until Ctrl-C (then stop every process).

``replicas`` runs N colocated servers, each on cores (or GPUs) of its own, behind ``vllm-router`` in plain
mode (``--policy``, default ``round_robin``): on 2 cores, ``pdlab serve replicas`` is the same hardware as
``pdlab serve disagg``.
"""

from __future__ import annotations

import argparse
import time

from pdlab.cli import CLIError, Subcommands, emit

__all__ = ["register", "run"]


def register(sub: Subcommands) -> None:
    p = sub.add_parser("serve", help="run a colocated, N-replica or prefill/decode-disaggregated vLLM deployment",
                       description=__doc__)
    p.add_argument("mode", choices=["colocated", "replicas", "disagg"])
    p.add_argument("--model", default=None, help="model folder or name (default: build/models/tiny, built if missing)")
    p.add_argument("--connector", default="nixl", choices=["nixl", "example"], help="KV connector (disagg)")
    p.add_argument("--kv-buffer-device", choices=["cpu", "cuda"], help="NIXL KV buffer (default: the device)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--cores", help="colocated CPU cores, e.g. 0-1")
    p.add_argument("--gpus", help="colocated GPUs, e.g. 0,1")
    p.add_argument("--prefill-cores", nargs="+", help="one entry per prefill instance, e.g. 0")
    p.add_argument("--decode-cores", nargs="+", help="one entry per decode instance, e.g. 1")
    p.add_argument("--prefill-gpus", nargs="+", help="one entry per prefill instance, e.g. 0")
    p.add_argument("--decode-gpus", nargs="+", help="one entry per decode instance, e.g. 1")
    p.add_argument("--num-prefill", type=int, default=None, help="prefill instances (default: placements given, or 1)")
    p.add_argument("--num-decode", type=int, default=None, help="decode instances (default: placements given, or 1)")
    p.add_argument("--replica-cores", nargs="+", help="replicas: one entry per replica, e.g. 0 1 (default: core i)")
    p.add_argument("--replica-gpus", nargs="+", help="replicas: one entry per replica, e.g. 0 1 (default: GPU i)")
    p.add_argument("--num-replicas", type=int, default=None,
                   help="replicas: how many (default: placements given, or 2)")
    p.add_argument("--policy", default="round_robin",
                   help="replicas: vllm-router's --policy (default round_robin: each request to the next replica)")
    p.add_argument("--front-end-cores",
                   help="CPU: pin every API server (and the proxy) here while serving, leaving the engines their "
                        "cores alone; lab 01's layout on 2 cores is `colocated --cores 0 --front-end-cores 1` and "
                        "`disagg --front-end-cores 0` (run the client there too: taskset -c CORES pdlab bench ...)")
    p.add_argument("--port", type=int, default=8000,
                   help="entry port (proxy for disagg, vllm-router for replicas, server for colocated); "
                        "replica i listens on PORT + 100 + i")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--dtype", default=None,
                   help="model dtype (default: vLLM's on a GPU; on a CPU bfloat16 only with native bf16, else float32)")
    p.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for /health")
    p.add_argument("--json", action="store_true", help="print the deployment as JSON once it is up")
    p.set_defaults(func=run)


def _model(arg: str | None) -> str:
    if arg:
        return arg
    from pdlab.serve.engines.modelbuild import tiny_model_dir

    return str(tiny_model_dir())


def _front_ends_on(dep, cores: set[int] | None):
    """Pin the deployment's API servers and proxy to ``cores`` while serving (None: leave them)."""
    import contextlib

    from pdlab.process import pinned

    if cores is None:
        return contextlib.nullcontext()
    return pinned(dep.front_end_pids(), cores)


def run(args: argparse.Namespace) -> int:
    from pdlab.process import PortInUseError, ServerStartError
    from pdlab.serve.engines.deploy import (
        DeployPorts,
        RolePlacement,
        colocated,
        colocated_replicas,
        disaggregated,
    )
    from pdlab.serve.engines.vllm_router import RouterMissingError

    front_cores = None
    if args.front_end_cores:
        from pdlab.process import parse_cpu_list

        try:
            front_cores = set(parse_cpu_list(args.front_end_cores))
        except ValueError as exc:
            raise CLIError(f"--front-end-cores {args.front_end_cores!r}: {exc}") from exc
    model = _model(args.model)
    common = {"max_model_len": args.max_model_len, "ready_timeout_s": args.ready_timeout, "device": args.device,
              "dtype": args.dtype}
    if args.kv_buffer_device:
        common["kv_buffer_device"] = args.kv_buffer_device
    if args.mode == "colocated":
        common.pop("kv_buffer_device", None)
        dep = colocated(model, port=args.port, cores=args.cores, gpus=args.gpus, **common)
    elif args.mode == "replicas":
        common.pop("kv_buffer_device", None)
        places = args.replica_cores or args.replica_gpus
        count = args.num_replicas or (len(places) if places else 2)
        try:
            dep = colocated_replicas(model, count=count, places=places, port=args.port, replica_port=args.port + 100,
                                     policy=args.policy, **common)
        except ValueError as exc:
            raise CLIError(f"replicas: {exc}") from exc
    else:
        placements_p = args.prefill_cores or args.prefill_gpus
        placements_d = args.decode_cores or args.decode_gpus
        n_p = args.num_prefill or (len(placements_p) if placements_p else 1)
        n_d = args.num_decode or (len(placements_d) if placements_d else 1)
        dep = disaggregated(model, connector=args.connector,
                            prefill=RolePlacement(n_p, cores=args.prefill_cores, gpus=args.prefill_gpus),
                            decode=RolePlacement(n_d, cores=args.decode_cores, gpus=args.decode_gpus),
                            ports=DeployPorts(proxy=args.port, prefill=args.port + 100, decode=args.port + 200),
                            **common)
    try:
        with dep, _front_ends_on(dep, front_cores):
            info = {"mode": args.mode, "url": dep.url, "servers": [
                {"role": s.spec.role, "url": s.url, "cores": s.spec.cores, "gpus": s.spec.gpus,
                 "log": str(s.log_path), "pid": s.process.pid if s.process else None} for s in dep.servers],
                "front_door": dep.front_door if dep.proxy else None,
                "proxy_log": str(dep.proxy.log_path) if dep.proxy else None, "startup_s": dep.startup_s,
                "front_end_cores": sorted(front_cores) if front_cores else None}
            emit(info, args.json, dep.describe() + f"\nready in {dep.startup_s:.0f} s — Ctrl-C stops everything")
            while dep.alive():
                time.sleep(1.0)
            dead = [s.spec.label for s in dep.servers if not s.alive()]
            raise CLIError(f"a server exited: {', '.join(dead) or 'proxy'}; see the logs above")
    except (PortInUseError, ServerStartError, RouterMissingError) as exc:
        raise CLIError(str(exc)) from exc
