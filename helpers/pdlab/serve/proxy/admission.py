"""The proxy's early rejection, live: :class:`pdlab.sched.admission.TTFTAdmission` fed by the engines' ``/metrics``.

The policy itself (the predicted TTFT, the learned slowdown, the decode KV check) is the pure class
in :mod:`pdlab.sched.admission`, the one the simulator runs too; import it from there. This module
adds what only a live proxy has: :class:`MetricsPoller`, a thread that reads vLLM's ``/metrics``
on the prefill and decode engines every ``interval_s`` and keeps the last good
:class:`~pdlab.sched.admission.EngineState`. The policy calls it on every arrival and gets that
reading at once — a ``/metrics`` that is down, slow or malformed only makes the reading old, and
an old reading sends the policy back to its own bookkeeping (with a logged warning).

vLLM's names (checked against the installed vLLM's ``v1/metrics/loggers.py``):
``vllm:num_requests_waiting``, ``vllm:num_requests_running`` (prefill), ``vllm:kv_cache_usage_perc``
(decode, 0–1) and ``vllm:cache_config_info``'s ``num_gpu_blocks`` × ``block_size`` labels (the
decode KV-cache size in tokens).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from pdlab.sched.admission import EngineState
from pdlab.serve.measure.evidence import MetricsSnapshot, scrape_metrics

__all__ = ["engine_state_from_metrics", "MetricsPoller"]

log = logging.getLogger(__name__)


def engine_state_from_metrics(prefill: MetricsSnapshot, decode: MetricsSnapshot, at_s: float) -> EngineState:
    """One :class:`EngineState` from a prefill and a decode scrape; ValueError names a missing metric."""
    for snap, role, name in ((prefill, "prefill", "vllm:num_requests_waiting"),
                             (prefill, "prefill", "vllm:num_requests_running"),
                             (decode, "decode", "vllm:kv_cache_usage_perc")):
        if not snap.has(name):
            raise ValueError(f"the {role} engine's /metrics has no {name}")
    return EngineState(at_s, int(prefill.total("vllm:num_requests_waiting")),
                       int(prefill.total("vllm:num_requests_running")),
                       min(max(decode.total("vllm:kv_cache_usage_perc"), 0.0), 1.0), decode.kv_capacity_tokens())


class MetricsPoller:
    """Reads the prefill and decode engines' ``/metrics`` every ``interval_s`` on a daemon thread.

    Calling the poller returns the last good reading at once (None before the first), stamped with
    ``clock`` at the scrape (the policy's clock). A failed scrape (down, slower than ``timeout_s``,
    malformed) is logged and leaves the last reading as it was, so it ages out of the policy's use.
    """

    def __init__(self, prefill_url: str, decode_url: str, *, interval_s: float = 0.5, timeout_s: float = 0.5,
                 clock: Callable[[], float] = time.monotonic):
        if not (interval_s > 0 and timeout_s > 0):
            raise ValueError(f"interval_s and timeout_s must be positive, got {interval_s} and {timeout_s}")
        self.prefill_url, self.decode_url = prefill_url.rstrip("/"), decode_url.rstrip("/")
        self.interval_s, self.timeout_s, self.clock = interval_s, timeout_s, clock
        self.last: EngineState | None = None
        self.failures = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __call__(self) -> EngineState | None:
        return self.last

    def poll(self) -> EngineState | None:
        """One scrape of both engines; the new reading, or None (logged) when it failed."""
        at = self.clock()
        try:
            state = engine_state_from_metrics(scrape_metrics(self.prefill_url, self.timeout_s),
                                              scrape_metrics(self.decode_url, self.timeout_s), at)
        except Exception as exc:  # noqa: BLE001 — down, slow or malformed: keep the last reading
            self.failures += 1
            log.warning("engine /metrics unreadable (%s: %s)", type(exc).__name__, exc)
            return None
        self.last = state
        return state

    def start(self) -> MetricsPoller:
        def loop() -> None:
            while not self._stop.is_set():
                self.poll()
                self._stop.wait(self.interval_s)

        self._thread = threading.Thread(target=loop, name="pdlab-metrics-poller", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s * 2 + 1)
