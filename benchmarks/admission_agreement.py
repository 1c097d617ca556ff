"""How often the simulator, given only the arrivals, the prompt lengths and the calibration, takes the
live proxy's admission decisions: a saved overload-lab run replayed through the engine with the
proxy's policy as its admission hook (:func:`pdlab.serve.experiments.overload.replay_agreement`).

Run the overload lab first (it writes ``build/lab07``), then::

    .venv/bin/python benchmarks/admission_agreement.py [--run-dir build/lab07] [--engine-x 0.98 1 1.02]

``--engine-x``: factors on the calibrated engine slowdown; the rows at 0.98 and 1.02 show how much the
replay's own decisions move with a 2 % slower or faster engine, the ceiling of the agreement.
"""

from __future__ import annotations

import argparse

from pdlab.paths import build_dir
from pdlab.serve.experiments.overload import replay_agreement


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", default=str(build_dir() / "lab07"), help="what the overload lab wrote")
    parser.add_argument("--engine-x", type=float, nargs="+", default=[1.0], help="factors on the engine slowdown")
    args = parser.parse_args(argv)
    rows = replay_agreement(args.run_dir, engine_slowdowns=args.engine_x)
    print(f"{'design':13s} {'load':>4s} {'engine':>6s} {'requests':>8s} {'refused live':>12s} {'replay':>6s} "
          f"{'agree':>5s} {'admitted':>8s} {'refused':>7s}")
    for r in rows:
        print(f"{r['design']:13s} {r['load_x']:3g}× {r['engine_x']:5.2f}× {r['requests']:8d} {r['refused_live']:12.0%} "
              f"{r['refused_replay']:6.0%} {r['agree']:5.0%} {r['agree_on_admitted']:8.0%} {r['agree_on_refused']:7.0%}")


if __name__ == "__main__":
    main()
