"""Run NVIDIA Dynamo's offline trace replay once and print its report as one JSON line.

A standalone script for the peers environment (``.venv-peers``, made by
``scripts/install_peers.sh``): it imports only the standard library and ``dynamo``, never pdlab
or numpy, because Dynamo's pins conflict with the project's environment. :mod:`pdlab.peers.dynamo_compare`
runs it as ``.venv-peers/bin/python dynamo_replay.py`` with a JSON request on stdin::

    {"trace": "/path/trace.jsonl", "kwargs": {...keywords of dynamo.replay.run_trace_replay...}}

and reads the last stdout line: ``{"summary": {...}, "outer_wall_s": float, "dynamo_version": str}``
(``summary`` is Dynamo's own, times in ms; ``outer_wall_s`` is the whole call in seconds, timed here).
Dynamo's Rust logs go to stderr.
"""

from __future__ import annotations

import json
import sys
import time

__all__ = ["main"]


def main() -> int:
    """Read the request from stdin, replay, print the JSON line; exit 2 on a bad request."""
    try:
        request = json.load(sys.stdin)
        trace, kwargs = request["trace"], dict(request.get("kwargs", {}))
    except (ValueError, KeyError, TypeError) as exc:
        print(f"dynamo_replay: bad request on stdin ({exc}); expected {{'trace': PATH, 'kwargs': {{...}}}}",
              file=sys.stderr)
        return 2
    from importlib.metadata import version

    from dynamo.replay import run_trace_replay

    t0 = time.perf_counter()
    report = run_trace_replay([trace], **kwargs)
    outer = time.perf_counter() - t0
    print(json.dumps({"summary": dict(report.summary), "outer_wall_s": outer,
                      "dynamo_version": version("ai-dynamo")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
