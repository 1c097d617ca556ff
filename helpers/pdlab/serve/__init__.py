"""Live serving, by concern:

- :mod:`pdlab.serve.engines` — launchers: vLLM servers and deployments, SGLang and its stand-ins,
  Dynamo, vLLM's router, the tiny model;
- :mod:`pdlab.serve.proxy` — the P/D proxy and the HTTP plumbing the router shares, early rejection;
- :mod:`pdlab.serve.client` — the benchmark client, streaming, agreement with ``vllm bench``;
- :mod:`pdlab.serve.measure` — CPU cost, host check, TTFT anatomy, ``/metrics`` evidence;
- :mod:`pdlab.serve.experiments` — two front doors on one pair (lab 01's appendix), faults (lab 06) and
  overload (lab 07);
- :mod:`pdlab.serve.probes` and :mod:`pdlab.serve.pair_probes` — the live probes of one server and of a
  prefill/decode pair (lab 05): typed points, fitted by :mod:`pdlab.simreal.probes`.

Each subpackage lists its public names in its own front file (``from pdlab.serve.engines import
colocated``); the process hygiene the labs use beside them is :mod:`pdlab.process`. This file
imports nothing, so importing one subpackage loads no other. Nothing starts at import time.
"""

__all__: list[str] = []
