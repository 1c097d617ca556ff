"""What the live probes measure: :class:`ProbePlan` and the plans by course profile (:data:`PROBE_PLANS`).

A plan is pure data, checked before any request is sent (:meth:`ProbePlan.check`);
:func:`pdlab.simreal.probes.calibrate` runs one against a live deployment.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ProbePlan", "PROBE_PLANS"]


@dataclass(frozen=True)
class ProbePlan:
    """What to measure. Lengths in tokens; every point keeps the median of its samples.

    Prefill: each of ``prefill_lengths`` ``repeats`` times, one request at a time. Decode: ``b``
    concurrent streams of ``p``-token prompts for every pair with b·p ≤ ``max_probe_tokens`` (the
    KV one probe holds), each generating ``decode_tokens`` tokens, ``decode_repeats`` times; the
    step time is read while all ``b`` decode together (:func:`pdlab.serve.probes.probe_decode`), so the pairs can
    cover the batches and contexts a workload reaches, not only prompts that fit one prefill step. Hand-off: each of ``handoff_lengths``
    ``handoff_repeats`` times through the proxy. Front end on its core (lab 05, CPU):
    ``front_end_requests`` requests at each of its rates (:func:`pdlab.simreal.probes.frontend.probe_front_end_core`).
    Warm-up: ``warmup_passes`` untimed passes of the prefill lengths and decode pairs (and of the
    hand-off lengths, where lab 05 probes them), with other prompt text, before anything is timed:
    without one, the first of two calibrations back to back on a freshly started CPU engine came
    out 11–27 % slower than the second on every prefill and decode time
    (``benchmarks/calibration_scatter.py``). Contention (two servers only): prefills of
    ``contention_prompt`` tokens and decode streams, each alone and while the other server works
    (:func:`pdlab.serve.pair_probes.probe_contention`). Prefill stall (one server only): ``stall_rounds`` rounds of
    ``stall_streams`` streams decoding while one prompt of each of ``stall_lengths`` is prefilled
    ``stall_per_length`` times (:func:`pdlab.serve.probes.probe_prefill_stall`); 0 rounds skips it. Admission (a pair
    behind a proxy): with ``admission``, what each hand-off costs the running streams
    (:func:`pdlab.serve.pair_probes.probe_admission`; recorded, not charged by the replay unless asked). With ``prefill_passes=2`` the prefill probe runs again at the end
    of the calibration and each length keeps the median over both passes: a shared machine's speed
    drifts over minutes (lab 05 printed a 1,024-token prefill at 273 ms in the contention probe
    and 356 ms from the fit of the first pass, two minutes apart), and TTFT follows prefill.
    """

    prefill_lengths: tuple[int, ...] = (16, 256, 768, 1536)
    decode_batches: tuple[int, ...] = (1, 4, 8, 16)
    decode_prompts: tuple[int, ...] = (32, 512, 1024)
    decode_tokens: int = 32
    handoff_lengths: tuple[int, ...] = (32, 512, 1536)
    contention_prompt: int = 1024
    repeats: int = 3
    decode_repeats: int = 2
    max_probe_tokens: int = 16384
    prefill_passes: int = 2
    stall_lengths: tuple[int, ...] = (16, 128)
    stall_per_length: int = 4
    stall_streams: int = 4
    stall_rounds: int = 2
    admission: bool = True
    handoff_repeats: int = 3
    front_end_requests: int = 40
    warmup_passes: int = 1

    def decode_pairs(self) -> list[tuple[int, int]]:
        """(batch, prompt tokens) pairs that are probed."""
        return [(b, p) for b in self.decode_batches for p in self.decode_prompts if b * p <= self.max_probe_tokens]

    def check(self) -> None:
        """Raise ValueError when the plan cannot identify the three coefficients of each row."""
        if len(set(self.prefill_lengths)) < 3:
            raise ValueError(f"prefill_lengths needs >= 3 distinct lengths, got {self.prefill_lengths}")
        pairs = self.decode_pairs()
        if len({b for b, _ in pairs}) < 2 or len({p for _, p in pairs}) < 2 or len(pairs) < 3:
            raise ValueError("decode probes need >= 3 (batch, prompt) pairs with >= 2 batch sizes and >= 2 prompt "
                             f"lengths (b·p ≤ max_probe_tokens={self.max_probe_tokens}), got {pairs}")
        if self.decode_tokens < 4:
            raise ValueError(f"decode_tokens must be >= 4, got {self.decode_tokens}")
        if self.prefill_passes not in (1, 2):
            raise ValueError(f"prefill_passes must be 1 or 2, got {self.prefill_passes}")
        if self.stall_rounds < 0 or (self.stall_rounds and (self.stall_streams < 1 or self.stall_per_length < 1
                                                            or not self.stall_lengths)):
            raise ValueError("the prefill stall probe needs stall_rounds >= 0 and, when it runs, stall_streams >= 1, "
                             f"stall_per_length >= 1 and some stall_lengths, got {self.stall_rounds}, "
                             f"{self.stall_streams}, {self.stall_per_length}, {self.stall_lengths}")
        if min(self.repeats, self.decode_repeats, self.handoff_repeats) < 1:
            raise ValueError(f"repeats, decode_repeats and handoff_repeats must be >= 1, got {self.repeats}, "
                             f"{self.decode_repeats}, {self.handoff_repeats}")
        if self.warmup_passes < 0:
            raise ValueError(f"warmup_passes must be >= 0, got {self.warmup_passes}")
        if self.front_end_requests < 4:
            raise ValueError(f"front_end_requests must be >= 4, got {self.front_end_requests}")


#: Plans by profile: ``smoke`` (a few seconds), ``ci`` (about 20 s of probes on a quiet 2-core
#: machine), ``full`` (GPU servers, longer prompts and bigger batches).
PROBE_PLANS: dict[str, ProbePlan] = {
    # smoke's decode pairs reach 16 streams of 256 tokens: at (1, 8) × (32, 128) a busy machine's noise
    # could hide the batch cost altogether and leave a flat decode row
    "smoke": ProbePlan(prefill_lengths=(16, 256, 1024), decode_batches=(1, 16), decode_prompts=(32, 256),
                       decode_tokens=16, handoff_lengths=(32, 512), repeats=1, decode_repeats=1, handoff_repeats=1,
                       front_end_requests=20, warmup_passes=0, max_probe_tokens=4096, prefill_passes=1,
                       stall_per_length=2, stall_rounds=1),
    # ci: each point's median over 5 prefills, 3 decode runs, 6 hand-offs; two calibrations a minute apart
    # still differ by 10-24 % on single-stream times, the engine's own speed from one minute to the next
    # (benchmarks/calibration_scatter.py), about the block scatter of lab 05's runs
    "ci": ProbePlan(repeats=5, decode_repeats=3, handoff_repeats=6),
    "full": ProbePlan(prefill_lengths=(16, 128, 512, 1024, 2048, 4096, 8192), decode_batches=(1, 8, 32, 64, 128),
                      decode_prompts=(128, 1024), decode_tokens=128, handoff_lengths=(128, 1024, 4096),
                      repeats=5, decode_repeats=3, handoff_repeats=5, max_probe_tokens=131072),
}
