"""KV memory of one simulated instance (vLLM's ``KVCacheManager``, in tokens): how many tokens of KV
it holds, how many fit, and its prefix cache. The instance (:mod:`pdlab.sim.instance`), its batch
scheduler (:mod:`pdlab.sim.schedulers`) and the KV hand-off (:mod:`pdlab.sim.engine`) all count
memory here, so a scheduler decides only which requests run.

Units: tokens of KV (one token of one request on every layer of the instance). A request's own
share is ``SimRequest.kv``; :attr:`KVManager.used` is the sum over the requests on the instance,
plus the tokens reserved ahead: the next token of every decode in a batch in flight, and the whole
prompt of a hand-off in flight to a decode instance.

Prefix caching (vLLM's automatic prefix caching): an LRU of ``block_tokens``-token prefix blocks, as
many as the KV capacity holds (:class:`pdlab.sim.state.PrefixLRU`). A prompt whose leading blocks
(its ``hash_ids``) are cached starts its prefill after them (at least one token is computed). The
blocks are looked up without side effects and inserted when the prompt is admitted. The KV is
still held and transferred in full.
"""

from __future__ import annotations

from pdlab.kvcache import BLOCK_TOKENS
from pdlab.sim.state import PrefixLRU, SimRequest

__all__ = ["KVManager"]


class KVManager:
    """KV tokens of one instance: ``capacity`` and ``used`` (tokens), and the prefix cache (None
    without prefix caching) with its counters ``hit_tokens`` (prompt tokens found cached) and
    ``prompt_tokens_seen`` (prompt tokens admitted while caching).

    ``used`` is a plain attribute that the simulator's hot loops read and add to directly; the
    methods say what each change means."""

    __slots__ = ("block_tokens", "capacity", "hit_tokens", "prefix_cache", "prompt_tokens_seen", "used")

    def __init__(self, capacity_tokens: int, *, prefix_caching: bool = False, block_tokens: int = BLOCK_TOKENS):
        if capacity_tokens < 1:
            raise ValueError(f"capacity_tokens must be >= 1, got {capacity_tokens}")
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
        self.capacity = int(capacity_tokens)
        self.used = 0
        self.block_tokens = block_tokens
        self.prefix_cache: PrefixLRU | None = PrefixLRU(max(1, self.capacity // block_tokens)) \
            if prefix_caching else None
        self.hit_tokens = 0
        self.prompt_tokens_seen = 0

    @property
    def free_tokens(self) -> int:
        """Tokens of KV that still fit."""
        return self.capacity - self.used

    def fits(self, tokens: int) -> bool:
        """Whether ``tokens`` more tokens fit now."""
        return self.used + tokens <= self.capacity

    def reserve(self, tokens: int) -> None:
        """Hold ``tokens`` more tokens (a hand-off's prompt, decodes' next tokens)."""
        self.used += tokens

    def release(self, r: SimRequest) -> None:
        """Free the KV that ``r`` holds here (its ``r.kv`` becomes 0)."""
        self.used -= r.kv
        r.kv = 0

    def cached_prefix_tokens(self, r: SimRequest) -> int:
        """Tokens of ``r``'s prompt found in the prefix cache (no side effects), at most
        ``r.target - 1``: at least one token is computed."""
        cache = self.prefix_cache
        hash_ids = r.req.hash_ids
        if cache is None or not hash_ids:
            return 0
        tokens = cache.match(hash_ids) * self.block_tokens
        most = r.target - 1                     # max(0, min(tokens, most)), no builtins
        if most < tokens:
            tokens = most
        return tokens if tokens > 0 else 0

    def admit_prompt(self, r: SimRequest, cached: int) -> None:
        """``r`` is admitted to prefill: hold KV for its whole target, start its prefill after the
        ``cached`` tokens found (:meth:`cached_prefix_tokens`), and touch its blocks in the cache."""
        target = r.target
        cache = self.prefix_cache
        if cache is not None:
            hash_ids = r.req.hash_ids
            if hash_ids:
                cache.insert(hash_ids)
                self.hit_tokens += cached
                self.prompt_tokens_seen += target
        self.used += target
        r.kv = target
        r.prefilled = cached
