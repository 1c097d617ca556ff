"""Does this machine run the same work at the same speed from one window to the next?

Cut into windows of a few seconds, a live run's quiet decode steps on this machine moved by 10–15%
against the fitted step from one 10-s window to the next, with no trend, while steal time stayed
near zero (``notes/host/``). Before any model is blamed, this benchmark asks
whether the bare machine does the same: with no server running, one process pinned to one core
repeats two fixed kernels for ``--seconds`` seconds per core and prints, per window of
``--window`` seconds, the median time of each kernel relative to the run's median:

- ``matmul``: a float32 matrix product, single-threaded (compute- and cache-bound, like a decode
  step of the course's tiny model, whose weights fit in the caches);
- ``copy``: copying a 64 MiB array (memory-bandwidth-bound, like a decode step of a large model).

It also prints the machine's busy and stolen CPU over each core's run (``/proc/stat``), so that a
slow window can be told from a busy machine. The check itself is ``pdlab.serve.measure.hostcheck``,
which the appendix of lab 01 also runs, shorter, before and after its colocated server. If the bare
kernels move by as much as those windows, that movement is the host's, and no fit of the engine can
predict a run more closely.

    .venv/bin/python benchmarks/machine_steadiness.py [--seconds 60] [--window 5] [--cores 0,1]

Prints figures; not a test. Run it on a quiet machine (no lab, no server): it starts nothing.
"""

from __future__ import annotations

import argparse
import os

from pdlab.serve.measure.hostcheck import measure_host


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="run time per core (s)")
    ap.add_argument("--window", type=float, default=5.0, help="window length (s)")
    ap.add_argument("--cores", default=",".join(str(c) for c in sorted(os.sched_getaffinity(0))),
                    help="cores to run on, one after the other (comma-separated)")
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    for core in (int(c) for c in args.cores.split(",")):
        try:
            print(measure_host(core, args.seconds, args.window).summary())
        except ValueError as exc:
            raise SystemExit(str(exc)) from None


if __name__ == "__main__":
    main()
