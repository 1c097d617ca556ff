"""The P/D proxy and the HTTP plumbing it shares with the router.

- :mod:`pdlab.serve.proxy.server` — the disaggregation proxy: prefill on one server, decode on
  another, vLLM's ``kv_transfer_params`` protocol; ``python -m pdlab.serve.proxy`` runs it.
- :mod:`pdlab.serve.proxy.plumbing` — request checks, error mapping, backend status, streaming
  relay; :mod:`pdlab.router.server` uses these names from here.
- :mod:`pdlab.serve.proxy.admission` — early rejection by predicted TTFT (``--admission-profile``).

The names of ``server``, ``plumbing`` and ``admission`` are re-exported here; nothing starts at import time.
"""

from pdlab.serve.proxy import admission, plumbing, server
from pdlab.serve.proxy.admission import *  # noqa: F403 - the names listed in admission.__all__
from pdlab.serve.proxy.plumbing import *  # noqa: F403 - the names listed in plumbing.__all__
from pdlab.serve.proxy.server import *  # noqa: F403 - the names listed in server.__all__

__all__ = [*server.__all__, *plumbing.__all__, *admission.__all__]
