"""What does random sampling cost against greedy decoding on the course's CPU server?

``vllm bench serve`` (vLLM 0.32) no longer sends ``temperature`` unless told, so its requests
sample at the server's default temperature (1.0 for the course's model), while ``pdlab bench``
asks for greedy decoding (``temperature`` 0). Lab 01's client-agreement check compared the two
with that difference in place. This benchmark measures what it was worth with one client only:
``pdlab bench`` on lab 01's agreement server (engine alone on core 0, API server and client on
core 1), one request at a time, alternating blocks at temperature 0 and 1.0 for ``--rounds``
rounds, and prints each arm's median TTFT and TPOT with the 90% bootstrap interval of the ratio
(sampled ÷ greedy). Blocks alternate because the machine's speed moves from one 5-s window to the
next (``benchmarks/machine_steadiness.py``).

    .venv/bin/python notes/host/sampling_cost.py [--rounds 6] [--block 8] [--prompt 128] [--output 16]

Prints figures; not a test. Starts and stops its own server (nothing is left running).
"""

from __future__ import annotations

import argparse

from pdlab.process import free_port
from pdlab.serve.client.agreement import ClientSamples, compare_clients
from pdlab.serve.client.bench import ClientOptions, build_workload, run_bench
from pdlab.serve.engines import colocated
from pdlab.serve.engines.modelbuild import tiny_model_dir
from pdlab.workloads import Request


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6, help="blocks per arm, alternating")
    ap.add_argument("--block", type=int, default=8, help="requests per block")
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens")
    ap.add_argument("--output", type=int, default=16, help="output tokens")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.rounds < 1 or args.block < 1:
        raise SystemExit(f"need --rounds ≥ 1 and --block ≥ 1, got {args.rounds} and {args.block}")
    model = tiny_model_dir()
    arms = {"greedy (temperature 0)": 0.0, "sampled (temperature 1)": 1.0}
    records: dict[str, list] = {name: [] for name in arms}
    with colocated(model, port=free_port(), max_model_len=2048, cores="0") as dep, dep.engine_cores_reserved():
        print(dep.describe())
        served = dep.served_model()
        for r in range(args.rounds):
            for k, (name, temperature) in enumerate(arms.items()):
                seed = args.seed + 2 * r + k
                reqs = [Request(q.request_id, 0.0, q.prompt_tokens, q.output_tokens) for q in
                        build_workload(f"fixed-{args.prompt}-{args.output}", rate_rps=1.0, n=args.block, seed=seed)]
                client = ClientOptions(model=served, tokenizer=model, extra_body={"temperature": temperature})
                records[name] += run_bench(dep.url, reqs, client=client, max_concurrency=1, progress=False,
                                           seed=seed).records
    greedy, sampled = (ClientSamples.from_records(records[name], name) for name in arms)
    print(f"{args.rounds} rounds of {args.block} requests per arm, {args.prompt} prompt and {args.output} output tokens")
    for row in compare_clients(sampled, greedy)[:3]:
        print(f"  {row['metric']}: sampled {row['pdlab_ms']:.2f} ms, greedy {row['vllm_bench_ms']:.2f} ms → "
              f"sampled ÷ greedy {row['pdlab_ms'] / row['vllm_bench_ms']:.3f} "
              f"[{row['ratio_lo']:.3f}, {row['ratio_hi']:.3f}] (90%)")


if __name__ == "__main__":
    main()
