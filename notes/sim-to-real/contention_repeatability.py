"""How repeatable is the pair's prefill contention probe? (issue 26)

Lab 05's run fit takes the prefill role's contention ``c_p`` from the calibration probe
(:func:`pdlab.serve.probes.probe_contention`: a 1,024-token prefill alone and while 16 streams
decode on the decode role, the median of ``repeats`` each). Over the lab 05 runs of 2026-12-04/05
the probe gave c_p = 0.00 to 0.43 on the same machine, and the runs whose probe said 0.43
over-predicted the pair's TTFT at every held-out rate. This starts the pair as lab 05 does (tiny
model, prefill engine on core 0, decode engine on core 1, front ends and this client on core 0)
and runs the probe ``--rounds`` times with each of ``--repeats`` (interleaved, so drift hits
both alike), printing every c_p, the spread per setting, and each prefill sample while busy.

    .venv/bin/python notes/sim-to-real/contention_repeatability.py [--rounds 8] [--repeats 3 9]

Prints figures; not a test. Starts and stops its own servers (nothing is left running).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from pdlab.serve import DeployPorts, disaggregated
from pdlab.serve.engines.modelbuild import tiny_model_dir
from pdlab.serve.probes import probe_contention

SERVER_KW = dict(max_model_len=2048, max_num_seqs=128, max_num_batched_tokens=2048)   # lab 05's ci


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=8, help="probes per setting (default 8)")
    ap.add_argument("--repeats", type=int, nargs="+", default=[3, 9],
                    help="prefills per probe, alone and busy (default: 3 9; lab 05 used 3)")
    args = ap.parse_args()
    if args.rounds < 2 or min(args.repeats) < 1:
        ap.error("--rounds must be >= 2 and every --repeats >= 1")
    results: dict[int, list[tuple[float, float, float]]] = {n: [] for n in args.repeats}
    with disaggregated(tiny_model_dir(), ports=DeployPorts.free(), **SERVER_KW) as dep, dep.decode_cores_reserved():
        t0 = time.perf_counter()
        for k in range(args.rounds):
            for j, n in enumerate(args.repeats):
                # a probe draws its prompts from seeds seed + 1 … seed + 100 + (background rounds): seeds 1000
                # apart never repeat a prompt, which vLLM's prefix cache would serve in a few ms
                c = probe_contention(dep.prefill[0].url, dep.decode[0].url, repeats=n,
                                     seed=1000 * (k * len(args.repeats) + j + 1))
                results[n].append((c.prefill, c.prefill_alone_s, c.prefill_busy_s))
                print(f"round {k + 1}, {n} repeats: c_p {c.prefill:.3f} (prefill {c.prefill_alone_s * 1e3:.1f} ms alone, "
                      f"{c.prefill_busy_s * 1e3:.1f} ms busy); c_d {c.decode:.3f}", flush=True)
        print(f"{time.perf_counter() - t0:.0f} s of probing")
    for n, rows in results.items():
        cp = np.array([r[0] for r in rows])
        print(f"{n} repeats: c_p median {np.median(cp):.3f}, range {cp.min():.3f}-{cp.max():.3f}, "
              f"sd {cp.std(ddof=1):.3f} over {len(cp)} probes; prefill alone {np.median([r[1] for r in rows]) * 1e3:.1f} ms, "
              f"busy {np.median([r[2] for r in rows]) * 1e3:.1f} ms (medians)")


if __name__ == "__main__":
    main()
