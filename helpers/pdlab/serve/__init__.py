"""Live serving, by concern:

- :mod:`pdlab.serve.engines` — launchers: vLLM servers and deployments, SGLang and its stand-ins,
  Dynamo, vLLM's router, the tiny model;
- :mod:`pdlab.serve.proxy` — the P/D proxy and the HTTP plumbing the router shares, early rejection;
- :mod:`pdlab.serve.client` — the benchmark client, streaming, agreement with ``vllm bench``;
- :mod:`pdlab.serve.measure` — CPU cost, host check, TTFT anatomy, ``/metrics`` evidence;
- :mod:`pdlab.serve.experiments` — faults (lab 06) and overload (lab 07);
- :mod:`pdlab.serve.probes` — the live calibration probes (lab 05).

The names of ``engines``, ``client`` and ``measure`` are re-exported here, with the process hygiene
of :mod:`pdlab.process` the labs use beside them; import ``proxy``, ``experiments`` and ``probes`` as
subpackages. Nothing starts at import time.
"""

from pdlab.process import PortInUseError, ServerStartError, free_port, live_processes, stop_all
from pdlab.serve import client, engines, measure
from pdlab.serve.client import *  # noqa: F403 - the names listed in client.__all__
from pdlab.serve.engines import *  # noqa: F403 - the names listed in engines.__all__
from pdlab.serve.measure import *  # noqa: F403 - the names listed in measure.__all__

__all__ = ["PortInUseError", "ServerStartError", "free_port", "live_processes", "stop_all",
           *engines.__all__, *client.__all__, *measure.__all__]
