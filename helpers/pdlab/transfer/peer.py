"""One end of a measured KV transfer, run as its own process: ``python -m pdlab.transfer.peer``.

Started by :mod:`pdlab.transfer.bench` (never by hand). The parent writes a JSON plan on stdin
(the sender then gets the receiver's endpoint as a second line) and reads JSON reports from the
file descriptor ``--report-fd``: library logs on stdout/stderr cannot garble them. Each peer
ends with ``os._exit`` after cleaning up, because NIXL/UCX agents crash at interpreter exit.

Plan: ``{"capacity": bytes, "seed": int, "trials": [{"layers", "blocks", "block_bytes", "reps",
"warmup", "mode", "compute_s"}, ...]}``. Modes (sender): ``bulk`` ships all layers at once;
``serial`` emulates a prefill of ``layers × compute_s`` then ships everything (send after
prefill); ``layerwise`` ships each layer as soon as the emulated prefill has produced it.
The emulated compute sleeps (on a GPU the compute does not use the CPU that drives the transfer).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import NoReturn

__all__ = ["main", "Reporter", "run_reporting"]


class Reporter:
    """Writes one JSON object a line to the report pipe: ``report(type="...", **fields)``."""

    def __init__(self, fd: int):
        self.fd = fd

    def __call__(self, **msg) -> None:
        data = (json.dumps(msg) + "\n").encode()
        while data:
            n = os.write(self.fd, data)
            data = data[n:]


def run_reporting(report_fd: int, body: Callable[[Reporter], None]) -> NoReturn:
    """Run a peer's ``body(report)``, then report ``done`` — or ``error`` with the traceback — and exit
    the process (status 0 or 1) without running interpreter clean-up that could hang."""
    report = Reporter(report_fd)
    code = 0
    try:
        body(report)
        report(type="done")
    except BaseException as exc:  # report everything, then leave
        code = 1
        try:
            report(type="error", message=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
        except OSError:
            pass
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _layout(trial: dict):
    from pdlab.transfer.kvbuffer import KVLayout

    return KVLayout(trial["layers"], trial["blocks"], trial["block_bytes"])


def _run_receiver(args, plan, report) -> None:
    from pdlab.transfer.kvbuffer import checksum
    from pdlab.transfer.transports import SideChannel, make_receiver

    recv = make_receiver(args.transport, plan["capacity"], args.host)
    try:
        listener = socket.create_server((args.host, 0))
        listener.settimeout(120)
        report(type="endpoint", endpoint={**recv.endpoint(), "side_port": listener.getsockname()[1]})
        conn, _ = listener.accept()
        listener.close()
        side = SideChannel(conn)
        recv.accept()
        for t_index, trial in enumerate(plan["trials"]):
            layout = _layout(trial)
            size = layout.total_bytes
            for rep in range(trial["warmup"] + trial["reps"]):
                region = recv.buf[:size]
                region.fill(0)  # a transfer that did not happen cannot pass verification
                side.send(SideChannel.READY)
                recv.receive(layout, side)
                side.send(SideChannel.ACK)
                if args.corrupt:
                    region[size // 2] ^= 0xFF
                report(type="recv", trial=t_index, rep=rep, crc=checksum(region))
        side.close()
    finally:
        recv.close()


def _emulated_prefill(layers: int, compute_s: float, t0: float, ready: queue.Queue, marks: dict) -> None:
    for layer in range(layers):
        deadline = t0 + (layer + 1) * compute_s  # absolute deadlines: no drift over layers
        delay = deadline - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        ready.put(layer)
    marks["compute_end"] = time.perf_counter()


def _run_sender(args, plan, report) -> None:
    from pdlab.transfer.kvbuffer import checksum, make_payload
    from pdlab.transfer.transports import SideChannel, make_sender

    payload = make_payload(plan["capacity"], plan.get("seed", 0))
    sender = make_sender(args.transport, payload, args.host)
    try:
        endpoint = json.loads(sys.stdin.readline())
        side = SideChannel(socket.create_connection((args.host, endpoint["side_port"]), timeout=120))
        side.sock.settimeout(None)
        sender.connect(endpoint)
        for t_index, trial in enumerate(plan["trials"]):
            layout = _layout(trial)
            expected = checksum(payload[: layout.total_bytes])
            mode, compute_s = trial.get("mode", "bulk"), float(trial.get("compute_s", 0.0))
            every = list(range(layout.layers))
            for rep in range(trial["warmup"] + trial["reps"]):
                side.expect(SideChannel.READY)
                marks: dict = {}
                t0 = time.perf_counter()
                if mode == "bulk":
                    marks["compute_end"] = t0
                    sender.send_layers(layout, every)
                elif mode == "serial":
                    ready: queue.Queue = queue.Queue()
                    _emulated_prefill(layout.layers, compute_s, t0, ready, marks)
                    sender.send_layers(layout, every)
                elif mode == "layerwise":
                    ready = queue.Queue()
                    producer = threading.Thread(target=_emulated_prefill,
                                                args=(layout.layers, compute_s, t0, ready, marks))
                    producer.start()
                    for _ in every:
                        sender.send_layers(layout, [ready.get()])
                    producer.join()
                else:
                    raise ValueError(f"unknown mode {mode!r}")
                sender.finish(side)
                side.expect(SideChannel.ACK)
                t1 = time.perf_counter()
                report(type="send", trial=t_index, rep=rep, seconds=t1 - t0,
                       compute_s=marks["compute_end"] - t0, exposed_s=t1 - marks["compute_end"], crc=expected)
        side.close()
    finally:
        sender.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pdlab.transfer.peer", description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["recv", "send"], required=True)
    parser.add_argument("--transport", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--report-fd", type=int, required=True)
    parser.add_argument("--corrupt", action="store_true", help="receiver flips one byte (tests verification)")
    args = parser.parse_args(argv)

    def body(report: Reporter) -> None:
        report(type="hello", pid=os.getpid(), role=args.role, transport=args.transport)
        plan = json.loads(sys.stdin.readline())
        (_run_receiver if args.role == "recv" else _run_sender)(args, plan, report)

    run_reporting(args.report_fd, body)


if __name__ == "__main__":
    main()
