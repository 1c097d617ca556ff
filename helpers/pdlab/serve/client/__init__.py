"""The benchmark client: open-loop load against a live server, one record per request.

- :mod:`~pdlab.serve.client.bench` — workloads, arrivals and the run (``pdlab bench``);
- :mod:`~pdlab.serve.client.streaming` — one streamed request → :class:`pdlab.metrics.RequestRecord`;
- :mod:`~pdlab.serve.client.agreement` — the client beside ``vllm bench serve`` on the same requests;
- :mod:`~pdlab.serve.client.prefix_workload` — Mooncake requests whose hash blocks become shared prompt text.

Their names are re-exported here; ``vllm_bench`` (``vllm bench serve`` on a CPU install) is run as a
process. Nothing starts at import time.
"""

from pdlab.serve.client import agreement, bench, prefix_workload, streaming
from pdlab.serve.client.agreement import *  # noqa: F403 - the names listed in agreement.__all__
from pdlab.serve.client.bench import *  # noqa: F403 - the names listed in bench.__all__
from pdlab.serve.client.prefix_workload import *  # noqa: F403 - the names listed in prefix_workload.__all__
from pdlab.serve.client.streaming import *  # noqa: F403 - the names listed in streaming.__all__

__all__ = [*bench.__all__, *streaming.__all__, *agreement.__all__, *prefix_workload.__all__]
