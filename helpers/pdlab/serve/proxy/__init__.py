"""The P/D proxy and the HTTP plumbing it shares with the router.

- :mod:`pdlab.serve.proxy.server` — the disaggregation proxy: prefill on one server, decode on
  another, vLLM's ``kv_transfer_params`` protocol; ``python -m pdlab.serve.proxy`` runs it.
- :mod:`pdlab.serve.proxy.plumbing` — request checks, error mapping, backend status, streaming
  relay; :mod:`pdlab.router.server` uses these names from here.
- :mod:`pdlab.serve.proxy.admission` — early rejection by predicted TTFT (``--admission-profile``).

The names other packages use are listed here by module; the admission policy itself lives in
:mod:`pdlab.sched.admission`. Nothing starts at import time.
"""

from pdlab.serve.proxy.admission import MetricsPoller
from pdlab.serve.proxy.plumbing import (
    attach_client_session,
    backend_status,
    client_session,
    error_response,
    forwarded_headers,
    health_response,
    new_stats,
    read_request,
    relay,
    relay_app,
    validate_request,
)
from pdlab.serve.proxy.server import (
    PDProxy,
    ProxyConfig,
    ProxyState,
    ProxyTiming,
    decode_request,
    make_app,
    prefill_request,
)

__all__ = [
    # server
    "ProxyConfig", "ProxyState", "ProxyTiming", "PDProxy", "make_app", "prefill_request", "decode_request",
    # plumbing
    "validate_request", "error_response", "read_request", "new_stats", "backend_status",
    "forwarded_headers", "attach_client_session", "relay_app", "client_session", "health_response", "relay",
    # admission
    "MetricsPoller",
]
