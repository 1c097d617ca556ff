"""Layer-wise KV streaming (Splitwise, Mooncake): hide the transfer behind the prefill.

A prefill produces the KV cache one layer at a time. *Send after prefill* (``serial``) waits
for the last layer and then ships everything: the whole transfer is exposed, added to the
time to first token. *Layer-wise* streaming ships layer i while layer i+1 is computed, so only
what the compute cannot cover stays exposed.

With L layers, compute ``c`` and transfer ``x`` seconds per layer, sending each finished layer
in order gives a finish time ``F_i = max(F_{i-1}, (i+1)·c) + x``; the exposed time after the
prefill ends (``F_L − L·c``) is therefore ``x`` when ``x ≤ c`` (only the last layer shows) and
``c + L·(x − c)`` when ``x > c`` (the link is the bottleneck and the backlog grows every layer).
Send-after-prefill exposes ``L·x``. :func:`measure_overlap` measures both between two processes.
"""

from __future__ import annotations

import statistics

from pdlab.transfer.bench import run_trials
from pdlab.transfer.kvbuffer import BLOCK_BYTES

__all__ = ["predicted_exposed_s", "measure_overlap"]


def predicted_exposed_s(layers: int, compute_per_layer_s: float, transfer_per_layer_s: float,
                        mode: str = "layerwise") -> float:
    """Transfer time (s) left exposed after the prefill's last layer, for ``serial`` or ``layerwise``."""
    if layers <= 0 or compute_per_layer_s < 0 or transfer_per_layer_s < 0:
        raise ValueError("layers must be positive and times non-negative")
    if mode == "serial":
        return layers * transfer_per_layer_s
    if mode != "layerwise":
        raise ValueError(f"mode must be 'serial' or 'layerwise', got {mode!r}")
    finish = 0.0
    for i in range(layers):
        finish = max(finish, (i + 1) * compute_per_layer_s) + transfer_per_layer_s
    return finish - layers * compute_per_layer_s


def measure_overlap(layers: int, layer_bytes: int, compute_per_layer_s: list[float], *,
                    transport: str = "tcp", repeats: int = 3, timeout_s: float = 300.0) -> dict:
    """Measure send-after-prefill vs layer-wise streaming over ``transport``, per compute time.

    The prefill is emulated (each layer takes ``compute_per_layer_s``, sleeping, as a GPU would
    compute while the CPU drives the transfer). First a bulk transfer of the same layout gives
    the per-layer transfer time ``x`` used by :func:`predicted_exposed_s`. Returns
    ``{"transfer_per_layer_s", "bandwidth_bytes_per_s", "rows": [{mode, compute_per_layer_s,
    exposed_s (median), exposed_min_s, exposed_max_s, total_s, predicted_exposed_s, verified}]}``.
    """
    blocks = max(1, layer_bytes // BLOCK_BYTES)
    block_bytes = layer_bytes // blocks
    if blocks * block_bytes != layer_bytes:
        blocks, block_bytes = 1, layer_bytes
    base = {"layers": layers, "blocks": blocks, "block_bytes": block_bytes, "reps": repeats}
    trials = [{**base, "mode": "bulk", "reps": max(repeats, 3)}]
    for c in compute_per_layer_s:
        trials += [{**base, "mode": "serial", "compute_s": c}, {**base, "mode": "layerwise", "compute_s": c}]
    rows = run_trials(transport, trials, timeout_s=timeout_s)
    bulk = [r["seconds"] for r in rows if r["trial"] == 0]
    x = statistics.median(bulk) / layers
    out = []
    for t_index, trial in enumerate(trials[1:], start=1):
        mine = [r for r in rows if r["trial"] == t_index]
        exposed = [r["exposed_s"] for r in mine]
        out.append({"mode": trial["mode"], "compute_per_layer_s": trial["compute_s"],
                    "compute_total_s": statistics.median(r["compute_s"] for r in mine),
                    "exposed_s": statistics.median(exposed), "exposed_min_s": min(exposed),
                    "exposed_max_s": max(exposed), "total_s": statistics.median(r["seconds"] for r in mine),
                    "predicted_exposed_s": predicted_exposed_s(layers, trial["compute_s"], x, trial["mode"]),
                    "verified": all(r["verified"] for r in mine)})
    if not all(r["verified"] for r in rows):
        from pdlab.transfer.measurement import VerificationError

        raise VerificationError(f"{transport}: a layer-wise transfer arrived corrupted")
    return {"transport": transport, "layers": layers, "layer_bytes": layer_bytes, "transfer_per_layer_s": x,
            "bandwidth_bytes_per_s": layers * layer_bytes / statistics.median(bulk), "rows": out}
