"""Evidence of KV transfer, read from a vLLM decode server's Prometheus ``/metrics``.

vLLM (v1 engine, 0.11+) counts every prompt token by where its KV came from
(``vllm:prompt_tokens_by_source_total{source=...}``, ``vllm/v1/metrics/stats.py``
``PromptTokenStats``): ``local_compute`` (prefilled here), ``local_cache_hit`` (prefix cache) and
``external_kv_transfer`` (loaded through the KV connector). On a decode instance that works, the
prompt tokens are ``external_kv_transfer`` and only the last, partial block is recomputed; a decode
instance that recomputed everything (the transfer silently failed) shows ``local_compute`` ≈ all.
The NIXL connector adds histograms per transfer: ``vllm:nixl_bytes_transferred`` (bytes),
``vllm:nixl_xfer_time_seconds`` and ``vllm:nixl_num_failed_transfers``.

Counters are cumulative: take a snapshot before and after a run and use the difference.
"""

from __future__ import annotations

import math
import urllib.request
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["parse_prometheus", "scrape_metrics", "MetricsSnapshot", "KVTransferEvidence", "kv_transfer_evidence",
           "KVTransferVerdict", "check_kv_transfer_is_used", "prefix_cache_hit_share", "largest_hit_share"]

def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Parse the Prometheus text exposition format into ``(name, labels, value)`` samples.

    Uses ``prometheus_client``'s parser (a vLLM dependency): escapes in label values, ``NaN``/``+Inf``
    and timestamps are handled as Prometheus defines them. A malformed line raises ValueError.
    """
    from prometheus_client.parser import text_string_to_metric_families

    return [(sample.name, dict(sample.labels), float(sample.value))
            for family in text_string_to_metric_families(text) for sample in family.samples]


@dataclass(frozen=True)
class MetricsSnapshot:
    """Samples of one scrape; :meth:`total` sums a metric over label sets matching ``labels``."""

    samples: tuple[tuple[str, tuple[tuple[str, str], ...], float], ...]

    @classmethod
    def from_text(cls, text: str) -> MetricsSnapshot:
        return cls(tuple((n, tuple(sorted(lbl.items())), v) for n, lbl, v in parse_prometheus(text)))

    def total(self, name: str, **labels: str) -> float:
        names = {name, name.replace("vllm:", "vllm_")}
        out = 0.0
        for n, lbl, v in self.samples:
            if n in names and all(dict(lbl).get(k) == val for k, val in labels.items()) and not math.isnan(v):
                out += v
        return out

    def has(self, name: str) -> bool:
        names = {name, name.replace("vllm:", "vllm_")}
        return any(n in names for n, _, _ in self.samples)

    def kv_capacity_tokens(self) -> int | None:
        """KV tokens the engine holds, ``num_gpu_blocks × block_size`` of ``vllm:cache_config_info``'s
        labels; None when the scrape has no such sample or its labels are not integers."""
        for n, lbl, _ in self.samples:
            if n in ("vllm:cache_config_info", "vllm_cache_config_info"):
                labels = dict(lbl)
                try:
                    return int(labels["num_gpu_blocks"]) * int(labels["block_size"])
                except (KeyError, ValueError):
                    return None
        return None


def scrape_metrics(base_url: str, timeout_s: float = 10.0) -> MetricsSnapshot:
    """GET ``{base_url}/metrics`` and parse it."""
    with urllib.request.urlopen(base_url.rstrip("/") + "/metrics", timeout=timeout_s) as resp:
        return MetricsSnapshot.from_text(resp.read().decode("utf-8", "replace"))


@dataclass
class KVTransferEvidence:
    """What a decode server did with prompt tokens between two snapshots (tokens, bytes, seconds)."""

    requests: int
    prompt_tokens: int
    external_kv_tokens: int
    local_compute_tokens: int
    local_cache_hit_tokens: int
    nixl_transfers: int
    nixl_bytes: float
    nixl_xfer_time_s: float
    nixl_failed_transfers: int

    @property
    def transferred_fraction(self) -> float:
        """Share of prompt tokens whose KV was loaded from the prefill side (0–1)."""
        return self.external_kv_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def recomputed(self) -> bool:
        """True when decode computed most prompt tokens itself: the transfer did not happen.

        Tokens found in decode's own prefix cache (a repeated prompt) are neither transferred
        nor recomputed, so the test is on ``local_compute``, not on the transferred share.
        """
        return self.prompt_tokens > 0 and self.local_compute_tokens > 0.5 * self.prompt_tokens

    @property
    def bytes_per_request(self) -> float:
        return self.nixl_bytes / self.requests if self.requests else 0.0

    @property
    def xfer_time_per_transfer_s(self) -> float:
        return self.nixl_xfer_time_s / self.nixl_transfers if self.nixl_transfers else 0.0

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return self.nixl_bytes / self.nixl_xfer_time_s if self.nixl_xfer_time_s else 0.0

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(transferred_fraction=self.transferred_fraction, recomputed=self.recomputed,
                 bytes_per_request=self.bytes_per_request,
                 xfer_time_per_transfer_s=self.xfer_time_per_transfer_s,
                 bandwidth_bytes_per_s=self.bandwidth_bytes_per_s)
        return d

    def summary(self) -> str:
        lines = [f"decode server: {self.requests} requests, {self.prompt_tokens:,} prompt tokens — "
                 f"{self.external_kv_tokens:,} loaded through the KV connector "
                 f"({self.transferred_fraction:.0%}), {self.local_compute_tokens:,} recomputed locally, "
                 f"{self.local_cache_hit_tokens:,} from its prefix cache"]
        if self.nixl_transfers:
            lines.append(f"NIXL: {self.nixl_transfers} transfers, {self.nixl_bytes / 1e6:.2f} MB "
                         f"({self.bytes_per_request / 1e3:.1f} kB per request), "
                         f"{self.xfer_time_per_transfer_s * 1e3:.2f} ms per transfer, "
                         f"{self.bandwidth_bytes_per_s / 1e9:.2f} GB/s; failed: {self.nixl_failed_transfers}")
        if self.recomputed:
            lines.append("WARNING: decode recomputed the prompts instead of loading their KV — "
                         "the transfer did not happen (check the connector config and both logs).")
        return "\n".join(lines)


def kv_transfer_evidence(before: MetricsSnapshot, after: MetricsSnapshot) -> KVTransferEvidence:
    """The difference of two snapshots of a decode server's ``/metrics``."""
    def delta(name: str, **labels: str) -> float:
        return after.total(name, **labels) - before.total(name, **labels)

    src = "vllm:prompt_tokens_by_source_total"
    return KVTransferEvidence(
        requests=int(delta("vllm:request_success_total")),
        prompt_tokens=int(delta("vllm:prompt_tokens_total")),
        external_kv_tokens=int(delta(src, source="external_kv_transfer")),
        local_compute_tokens=int(delta(src, source="local_compute")),
        local_cache_hit_tokens=int(delta(src, source="local_cache_hit")),
        nixl_transfers=int(delta("vllm:nixl_bytes_transferred_count")),
        nixl_bytes=delta("vllm:nixl_bytes_transferred_sum"),
        nixl_xfer_time_s=delta("vllm:nixl_xfer_time_seconds_sum"),
        nixl_failed_transfers=int(delta("vllm:nixl_num_failed_transfers_total")),
    )


@dataclass(frozen=True)
class KVTransferVerdict:
    """What :func:`check_kv_transfer_is_used` found: ``ok`` and a sentence that says why, with the counts."""

    ok: bool
    reason: str
    evidence: KVTransferEvidence

    def __bool__(self) -> bool:
        return self.ok


def check_kv_transfer_is_used(before: MetricsSnapshot, after: MetricsSnapshot, prompt_tokens: int, *,
                              max_local_share: float = 0.5) -> KVTransferVerdict:
    """Did a decode server load the prompts' KV from the prefill side, between two scrapes of its ``/metrics``?

    ``prompt_tokens``: the prompt tokens the client sent through the P/D pair between the scrapes (its
    own count). A pair that works loads them through the KV connector and computes at most the last,
    partial block of each prompt; a silent fallback to decode-only (a front door that drops
    ``kv_transfer_params``, a wrong side-channel port) shows 0 external KV tokens and a local prefill
    equal to the prompt, with no error anywhere. Not ok when decode loaded no token through the
    connector, computed more than ``max_local_share`` of the prompt tokens it did not find in its own
    prefix cache, saw fewer prompt tokens than were sent (the requests went elsewhere), or found every
    one in its prefix cache (nothing to judge).
    """
    if prompt_tokens < 1:
        raise ValueError(f"prompt_tokens must be ≥ 1 (the tokens sent between the scrapes), got {prompt_tokens}")
    if not 0 < max_local_share < 1:
        raise ValueError(f"max_local_share must lie in (0, 1), got {max_local_share}")
    ev = kv_transfer_evidence(before, after)
    counts = (f"{ev.prompt_tokens:,} prompt tokens reached decode: {ev.external_kv_tokens:,} loaded through the KV "
              f"connector, {ev.local_compute_tokens:,} computed locally, {ev.local_cache_hit_tokens:,} from its prefix cache")
    if ev.prompt_tokens < prompt_tokens:
        return KVTransferVerdict(False, f"decode saw {ev.prompt_tokens:,} of the {prompt_tokens:,} prompt tokens sent: "
                                        "the requests did not all reach this decode server", ev)
    to_load = ev.prompt_tokens - ev.local_cache_hit_tokens
    if to_load <= 0:
        return KVTransferVerdict(False, f"cannot tell: every prompt token came from decode's prefix cache ({counts}); "
                                        "send prompts it has not seen", ev)
    if ev.external_kv_tokens == 0:
        return KVTransferVerdict(False, f"silent fallback to decode-only: {counts}", ev)
    if ev.local_compute_tokens > max_local_share * to_load:
        return KVTransferVerdict(False, f"decode recomputed most prompts ({ev.local_compute_tokens / to_load:.0%} of "
                                        f"the tokens it had to load): {counts}", ev)
    return KVTransferVerdict(True, f"the KV transfer is used: {counts}", ev)


def prefix_cache_hit_share(before: MetricsSnapshot, after: MetricsSnapshot) -> float:
    """Share (0–1) of a server's prompt tokens served from its own prefix cache between two snapshots.

    Any role: on a colocated or prefill server a hit skips prefill compute, on a decode server it
    skips the KV pull. A run that should start from a cold cache should show ~0. NaN when no
    prompt token arrived.
    """
    prompt = after.total("vllm:prompt_tokens_total") - before.total("vllm:prompt_tokens_total")
    src = "vllm:prompt_tokens_by_source_total"
    hits = after.total(src, source="local_cache_hit") - before.total(src, source="local_cache_hit")
    return hits / prompt if prompt > 0 else float("nan")


def largest_hit_share(before: Mapping[str, MetricsSnapshot], after: Mapping[str, MetricsSnapshot]) -> float:
    """The largest :func:`prefix_cache_hit_share` of any server (or role) between two sets of
    snapshots keyed alike (by URL or role): one number for "did this run meet warm caches".
    NaN when no server received a prompt token."""
    shares = [prefix_cache_hit_share(before[k], after[k]) for k in after]
    return max((h for h in shares if h == h), default=float("nan"))
