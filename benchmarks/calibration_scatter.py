"""How far two calibrations of the same engine, back to back, are apart: the probe's own scatter.

Lab 05 predicts two deployments from one probe calibration of one engine on its core and of the
KV link. If two calibrations taken a minute apart on an unchanged engine differ by more than the
live run's blocks do, the prediction's error is partly the probe's. This script starts the
engine as lab 05 does (one colocated vLLM server, with its API server, on core 0 of a CPU host),
runs lab 05's probe plan twice in a row with different prompt text (:func:`pdlab.simreal.probes.calibrate`,
the plan of ``--profile`` without the pair-only admission probe) and, on a CPU, its front-end probe twice
(:func:`pdlab.simreal.probes.frontend.probe_front_end_core`), then, with ``--link``, starts the pair and
probes the hand-off twice (each fitted beside its own engine calibration,
:func:`pdlab.simreal.predict.with_link`, as lab 05 fits it). It prints the two calibrations coefficient by
coefficient (:func:`pdlab.simreal.compare.calibration_differences`): each coefficient, the times
the rows give, and the relative difference. Where lab 05 has run at the same profile
(``build/lab05/<profile>/verdict.json``), its block scatter is printed beside them.

    flock /tmp/pdlab-live.lock .venv/bin/python benchmarks/calibration_scatter.py [--profile ci] [--no-link]

Prints figures; not a test. Starts and stops its servers; run it alone (under the lock).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

#: The second calibration's seed offset: its probes send other prompt text than the first's, so none
#: of its prompts is in vLLM's prefix cache (with the same seed the second prefill row came out 3×
#: faster on a 1,024-token prompt).
SECOND_SEED_OFFSET = 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="ci", choices=["smoke", "ci", "full"], help="lab 05's probe plan")
    ap.add_argument("--no-link", action="store_true", help="skip the pair and its two hand-off probes")
    ap.add_argument("--no-front-end", action="store_true", help="skip the two front-end probes (CPU only)")
    ap.add_argument("--front-end-rates", type=float, nargs="+", default=[2.5, 7.5],
                    help="the front-end probe's rates (req/s; lab 05's at ci are about these)")
    ap.add_argument("--seed", type=int, default=0, help="the first calibration's probe seed (lab 05's); the second "
                    f"uses seed + {SECOND_SEED_OFFSET}")
    ap.add_argument("--json", help="also write the rows to this JSON file")
    args = ap.parse_args()

    import pandas as pd
    from pdlab.paths import repo_root
    from pdlab.process import free_port
    from pdlab.serve.engines import DeployPorts, colocated, disaggregated
    from pdlab.serve.engines.modelbuild import tiny_model_dir
    from pdlab.serve.engines.vllm import detect_serve_device
    from pdlab.serve.pair_probes import probe_handoff
    from pdlab.simreal.compare import calibration_differences
    from pdlab.simreal.predict import with_link
    from pdlab.simreal.probes import PROBE_PLANS, calibrate
    from pdlab.simreal.probes.frontend import probe_front_end_core

    plan = replace(PROBE_PLANS[args.profile], admission=False)
    server_kw = dict(max_model_len=2048 + 64 + 16, max_num_seqs=128, max_num_batched_tokens=2048)
    device = detect_serve_device()
    place = dict(cores="0") if device == "cpu" else dict(gpus="0")
    t0 = time.perf_counter()
    with colocated(tiny_model_dir(), port=free_port(), **place, **server_kw) as dep:
        # the second calibration's prompts differ from the first's: the same text would hit vLLM's prefix cache
        cals = [calibrate(dep.url, plan=plan, seed=args.seed + k * SECOND_SEED_OFFSET) for k in range(2)]
        if device == "cpu" and not args.no_front_end:   # lab 05's front-end probe, twice, at its per-engine rates
            cals = [replace(c, front_end_core=probe_front_end_core(
                dep.url, dep.front_end_pids(), rates_rps=tuple(args.front_end_rates),
                requests_per_rate=plan.front_end_requests, seed=args.seed + k * SECOND_SEED_OFFSET))
                for k, c in enumerate(cals)]
    print(f"two engine calibrations, plan {args.profile}: {cals[0].seconds:.0f} s and {cals[1].seconds:.0f} s of "
          f"probes ({time.perf_counter() - t0:.0f} s with start-up)")
    if not args.no_link:
        with disaggregated(tiny_model_dir(), ports=DeployPorts.free(), **server_kw) as dep:
            cals = [with_link(c, probe_handoff(dep.url, plan.handoff_lengths, repeats=plan.handoff_repeats,
                                               warmup=plan.warmup_passes,
                                               seed=args.seed + k * SECOND_SEED_OFFSET)) for k, c in enumerate(cals)]
    rows = calibration_differences(*cals)
    table = pd.DataFrame(rows).set_index("coefficient")
    with pd.option_context("display.width", 140, "display.float_format", "{:.4g}".format):
        print(table)
    derived = [r for r in rows if r["coefficient"].startswith(("prefill of", "decode step", "hand-off of", "front end at"))]
    print(f"largest |relative difference| of the times the rows give: "
          f"{max(abs(r['rel_diff']) for r in derived):.1%}")
    verdict = repo_root() / "build" / "lab05" / args.profile / "verdict.json"
    if verdict.is_file():
        v = json.loads(verdict.read_text())
        for name, d in v.items():
            if isinstance(d, dict) and "block_rms_ttft" in d:
                print(f"lab 05's last {args.profile} run, {name}: block scatter {d['block_rms_ttft']:.1%} TTFT, "
                      f"{d['block_rms_tpot']:.1%} TPOT (rms log ratio of consecutive blocks)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
