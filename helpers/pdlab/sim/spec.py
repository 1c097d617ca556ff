"""What a simulated deployment is made of: :class:`InstanceSpec` (one serving instance: latency
model, KV capacity, role, batch scheduler, prefix caching, hand-off physics) and :class:`KVLink` (the
path KV takes from a prefill to a decode instance). The behaviour they select is described in
:mod:`pdlab.sim.engine`, :mod:`pdlab.sim.instance` and :mod:`pdlab.sim.schedulers` (the scheduler
names: the built-in ``"vllm"`` and ``"chunked"``, and any added with
:func:`pdlab.sim.schedulers.register_scheduler`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pdlab.kvcache import BLOCK_TOKENS
from pdlab.sim.latency import LatencyModel
from pdlab.sim.schedulers import scheduler_class

__all__ = ["InstanceSpec", "KVLink", "ROLES", "HANDOFF_RESERVATIONS", "LINK_SHARING"]

ROLES = ("colocated", "prefill", "decode")
HANDOFF_RESERVATIONS = ("prompt", "vllm", "none")
LINK_SHARING = ("fifo", "fair")


@dataclass
class InstanceSpec:
    """How to build one instance. ``latency.tp``/``latency.pp`` give its GPU count.

    ``scheduler``: the name of a registered batch scheduler (:mod:`pdlab.sim.schedulers`).
    ``prefix_caching`` / ``prefix_block_tokens``: vLLM-style automatic prefix caching on colocated
    and prefill instances (see :mod:`pdlab.sim.kvmanager`). ``handoff_reservation`` (decode instances),
    ``cpu_group``, ``cpu_contention`` and ``admit_overhead_s``: hand-off physics, see
    :mod:`pdlab.sim.engine`.
    """

    latency: LatencyModel
    kv_capacity_tokens: int
    role: str = "colocated"
    scheduler: str = "vllm"
    token_budget: int = 2048
    max_num_seqs: int = 256
    max_batched_tokens: int = 16384
    name: str = ""
    prefix_caching: bool = False
    prefix_block_tokens: int = BLOCK_TOKENS
    handoff_reservation: str = "prompt"
    cpu_group: str | None = None
    cpu_contention: float = 0.0
    admit_overhead_s: float = 0.0

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {self.role!r}")
        scheduler_class(self.scheduler)     # a clear error for a name that is not registered
        if self.handoff_reservation not in HANDOFF_RESERVATIONS:
            raise ValueError(f"handoff_reservation must be one of {HANDOFF_RESERVATIONS}, "
                             f"got {self.handoff_reservation!r}")
        if self.kv_capacity_tokens < 1:
            raise ValueError(f"kv_capacity_tokens must be >= 1, got {self.kv_capacity_tokens}")
        for name in ("token_budget", "max_num_seqs", "max_batched_tokens", "prefix_block_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.cpu_contention < 0:
            raise ValueError(f"cpu_contention must be >= 0, got {self.cpu_contention}")
        if self.admit_overhead_s < 0:
            raise ValueError(f"admit_overhead_s must be >= 0, got {self.admit_overhead_s}")

    @property
    def num_gpus(self) -> int:
        return int(getattr(self.latency, "tp", 1)) * int(getattr(self.latency, "pp", 1))


@dataclass
class KVLink:
    """The path KV takes from a prefill to a decode instance.

    ``bandwidth_bytes_per_s`` per direction (None = instantaneous). Transfers from one prefill
    instance share its link: one after another with ``sharing="fifo"`` (default), or all at once
    with equal shares of the bandwidth with ``sharing="fair"`` (processor sharing). With
    ``layerwise_overlap`` the KV of each layer is sent while the next layer computes, so after the
    prefill ends only max(transfer / layers, transfer − prefill time · (layers − 1) / layers)
    remains. ``setup_s`` is paid once per transfer before data moves (handshake, descriptors);
    ``latency_s`` after the last byte.
    """

    kv_bytes_per_token: float
    bandwidth_bytes_per_s: float | None = None
    num_layers: int = 1
    layerwise_overlap: bool = False
    latency_s: float = 0.0
    sharing: str = "fifo"
    setup_s: float = 0.0

    def __post_init__(self) -> None:
        if self.sharing not in LINK_SHARING:
            raise ValueError(f"sharing must be one of {LINK_SHARING}, got {self.sharing!r}")
        if self.setup_s < 0 or self.latency_s < 0:
            raise ValueError("setup_s and latency_s must be >= 0")

    def wire_s(self, tokens: int, prefill_s: float = 0.0) -> float:
        """Seconds of data on the wire, at the full bandwidth, after the prefill ends."""
        if self.bandwidth_bytes_per_s is None:
            return 0.0
        full = tokens * self.kv_bytes_per_token / self.bandwidth_bytes_per_s
        if self.layerwise_overlap and self.num_layers > 1:
            hidden = prefill_s * (self.num_layers - 1) / self.num_layers
            full = max(full / self.num_layers, full - hidden)
        return full

    def transfer_s(self, tokens: int, prefill_s: float = 0.0) -> float:
        """Seconds after the prefill ends for ``tokens`` tokens of KV on an idle link."""
        return self.setup_s + self.wire_s(tokens, prefill_s) + self.latency_s
