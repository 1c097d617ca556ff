"""Multi-turn agentic tool-calling sessions: growing histories with shared prefixes, as a trace or as text.

An *agent session* starts with a fixed prefix — the agent's **system prompt** and its **tool
schemas** (the same for every session of the same agent, i.e. "app") — and the user's task. Each
turn the model answers with a **tool call** (the request's output), the tool runs, and its
**tool response** is appended; the next request carries the whole history again::

    turn 1 prompt = system + tools + user
    turn k prompt = turn k-1 prompt + tool call (k-1) + tool response (k-1)

so turn k shares everything but its tail with turn k-1, and every session of one app shares the
system + tools prefix: the workload that makes prefix caching and KV reuse pay. Between turns the
agent "thinks" (the tool executes): ``think_time_s``. Many sessions run at once: sessions start as
a Poisson process.

Calibration (defaults of :class:`AgenticConfig`). The Mooncake FAST'25 *tool & agent* trace
(Table in FACTS §2 / Mooncake FAST'25 §5 and its README) has 23,608 requests in one hour with an
average of **8,596 input** and **182 output** tokens and a **59 % cache ratio**. The published
trace has no session ids (its ``hash_ids`` are remapped), so the session shape is an assumption;
the defaults were chosen so the generated trace reproduces those three averages (checked by
``tests/test_agentic.py`` and shown in lab 04), with values that are plausible for tool-using
agents:

- ``apps=8`` agents with Zipf(1) popularity — a handful of agent products share a cluster;
- system prompt ≈ 800 tokens and tool schemas ≈ 1,000 tokens per app (about eight JSON tool
  schemas of ~130 tokens each) — the prefix shared across sessions;
- the user's task ≈ 2,000 tokens (lognormal, cv 1.2: instructions plus pasted context such as a
  file or an issue thread);
- tool calls (the outputs) lognormal with mean **182** tokens (the trace's mean), cv 0.8;
- tool responses lognormal with mean 4,000 tokens, cv 1.2 (file contents, search results, logs:
  long and heavy-tailed);
- turns per session geometric with mean 2.5 (at most 12), histories capped at 32,768 tokens (the
  session ends when the next prompt would not fit).

  The user-task and tool-response means and the turn count were tuned together (a grid over
  four seeds of 500 sessions) until the trace gave ≈ 8.6k mean input and ≈ 0.6 prefix-cache hit
  ratio: the hit ratio is set by the fresh tokens of each turn (tool call + tool response + the
  partial 512-token block that cannot be reused) against the history carried along, and by how
  often a session's first turn finds its app's prefix. Longer sessions or a longer shared prefix
  push the ratio up (with 3.5 turns and a 2.8k-token prefix it was 0.74).
- think time lognormal with mean 2 s, cv 1 (tool execution: seconds);
- session starts Poisson at 6.56 / 2.5 ≈ 2.6 sessions/s, so the request rate is close to the
  trace's 23,608 requests/hour ≈ 6.56 requests/s (the geometric turn count is cut at 12 turns and
  at the context cap, so slightly fewer turns than 2.5 are realised).

Exports:

- :meth:`AgenticWorkload.requests` — :class:`pdlab.workloads.Request` objects (open-loop arrival
  times: a turn arrives ``think_time_s`` after the previous one was *sent*, plus a nominal
  ``response_time_s``), for the simulator;
- :meth:`AgenticWorkload.to_mooncake_jsonl` — the Mooncake JSONL format (``timestamp`` ms,
  ``input_length``, ``output_length``, ``hash_ids``), where ``hash_ids`` are the chained hashes of
  the prompt's actual 512-token blocks (:func:`pdlab.kvcache.chain_hashes` over the synthetic
  token ids, remapped to small integers in order of first appearance, as Mooncake remapped
  theirs), so ``pdlab trace stats`` measures the prefix-cache hit ratio;
- :func:`chat_messages` / :class:`TextRenderer` — real chat messages (system, user, assistant tool
  call, tool response) whose token counts match, with the model's tokenizer when one is given, for
  live runs; :func:`text_requests` re-measures prompt lengths and hash ids from the real tokens.

Units: tokens, seconds. Everything is deterministic for a given ``seed``.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from pdlab.kvcache import BLOCK_TOKENS
from pdlab.workloads.tokens import encode_ids, single_token_words
from pdlab.workloads.traces import Request, write_mooncake_jsonl

__all__ = [
    "LengthDist",
    "AgenticConfig",
    "Segment",
    "AgenticTurn",
    "AgenticWorkload",
    "generate_agentic",
    "agentic_requests",
    "MOONCAKE_TOOL_AGENT",
    "TextRenderer",
    "chat_messages",
    "text_requests",
]

#: The Mooncake FAST'25 tool & agent trace's published statistics (FACTS §2; Mooncake FAST'25
#: §5 and kvcache-ai/Mooncake ``FAST25-release`` README): requests, mean input / output tokens,
#: cache ratio, duration (s).
MOONCAKE_TOOL_AGENT = {"requests": 23_608, "avg_input_tokens": 8_596, "avg_output_tokens": 182,
                       "cache_ratio": 0.59, "duration_s": 3_600.0}

_VOCAB = 32_000  # synthetic token ids are drawn from [0, _VOCAB)


@dataclass(frozen=True)
class LengthDist:
    """A lognormal length (tokens) or time (seconds) with a given mean and coefficient of variation.

    ``cv = 0`` gives the mean every time. Samples are clipped to [``minimum``, ``maximum``] and,
    for token counts (``integer=True``), rounded.
    """

    mean: float
    cv: float = 0.0
    minimum: float = 1.0
    maximum: float | None = None
    integer: bool = True

    def __post_init__(self) -> None:
        if not (math.isfinite(self.mean) and self.mean > 0):
            raise ValueError(f"mean must be positive, got {self.mean!r}")
        if self.cv < 0:
            raise ValueError(f"cv must be >= 0, got {self.cv!r}")
        if self.maximum is not None and self.maximum < self.minimum:
            raise ValueError(f"maximum {self.maximum} < minimum {self.minimum}")

    def sample(self, rng: np.random.Generator, size: int | None = None) -> Any:
        if self.cv == 0:
            x = np.full(size if size is not None else (), float(self.mean))
        else:
            sigma2 = math.log1p(self.cv**2)
            x = rng.lognormal(math.log(self.mean) - sigma2 / 2, math.sqrt(sigma2), size=size)
        x = np.clip(x, self.minimum, self.maximum if self.maximum is not None else np.inf)
        if self.integer:
            x = np.rint(x).astype(np.int64)
        return x if size is not None else (int(x) if self.integer else float(x))

    def scaled(self, factor: float) -> LengthDist:
        """The same shape with the mean (and bounds) multiplied by ``factor`` (minimum stays ≥ 1)."""
        return replace(self, mean=self.mean * factor, minimum=max(1.0, self.minimum * factor) if self.integer
                       else self.minimum * factor,
                       maximum=None if self.maximum is None else self.maximum * factor)


@dataclass(frozen=True)
class AgenticConfig:
    """Shape of the agentic workload; the defaults are calibrated to the Mooncake tool & agent trace
    (see the module docstring for how each was chosen). Token counts in tokens, times in seconds."""

    sessions: int = 256
    session_rate_per_s: float = 6.56 / 2.5
    apps: int = 8
    app_zipf: float = 1.0
    system_prompt_tokens: LengthDist = LengthDist(800, 0.3, minimum=64)
    tool_schema_tokens: LengthDist = LengthDist(1000, 0.4, minimum=64)
    user_tokens: LengthDist = LengthDist(2000, 1.2, minimum=16)
    tool_call_tokens: LengthDist = LengthDist(182, 0.8, minimum=8, maximum=2048)
    tool_response_tokens: LengthDist = LengthDist(4000, 1.2, minimum=16)
    turns_mean: float = 2.5
    max_turns: int = 12
    think_time_s: LengthDist = LengthDist(2.0, 1.0, minimum=0.05, integer=False)
    response_time_s: float = 0.0
    max_context_tokens: int = 32_768

    def __post_init__(self) -> None:
        if self.sessions < 1:
            raise ValueError(f"sessions must be >= 1, got {self.sessions}")
        if not self.session_rate_per_s > 0:
            raise ValueError(f"session_rate_per_s must be positive, got {self.session_rate_per_s}")
        if self.apps < 1:
            raise ValueError(f"apps must be >= 1, got {self.apps}")
        if not 1 <= self.turns_mean <= self.max_turns:
            raise ValueError(f"turns_mean must be in [1, max_turns={self.max_turns}], got {self.turns_mean}")
        if self.max_context_tokens < 64:
            raise ValueError(f"max_context_tokens must be >= 64, got {self.max_context_tokens}")

    def scaled(self, factor: float, *, max_context_tokens: int | None = None) -> AgenticConfig:
        """Every token length × ``factor`` (the shape, cache ratio and turn structure stay), e.g. 1/8
        to fit a tiny CPU model's context; ``max_context_tokens`` defaults to the scaled cap."""
        if not factor > 0:
            raise ValueError(f"factor must be positive, got {factor}")
        cap = max_context_tokens if max_context_tokens is not None else max(64, int(self.max_context_tokens * factor))
        return replace(self, system_prompt_tokens=self.system_prompt_tokens.scaled(factor),
                       tool_schema_tokens=self.tool_schema_tokens.scaled(factor),
                       user_tokens=self.user_tokens.scaled(factor),
                       tool_call_tokens=self.tool_call_tokens.scaled(factor),
                       tool_response_tokens=self.tool_response_tokens.scaled(factor),
                       max_context_tokens=cap)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Segment:
    """A piece of a prompt: ``role`` (system, tools, user, assistant, tool), its length in tokens, and
    the ``key`` that seeds its content (segments with equal keys have equal tokens and text)."""

    role: str
    tokens: int
    key: str


@dataclass(frozen=True)
class AgenticTurn:
    """One request of a session: its prompt is ``segments`` in order; ``output_tokens`` is the tool call.

    ``arrival_s`` is the open-loop send time (seconds from the start); ``think_time_s`` the pause
    before this turn after the previous one (0 for a session's first turn).
    """

    session_id: int
    turn: int
    app: int
    arrival_s: float
    think_time_s: float
    output_tokens: int
    segments: tuple[Segment, ...]
    output_key: str

    @property
    def prompt_tokens(self) -> int:
        return sum(s.tokens for s in self.segments)


def _segment_tokens(key: str, n: int) -> np.ndarray:
    """Deterministic synthetic token ids of a segment (same key → same tokens)."""
    seed = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")
    return np.random.default_rng(seed).integers(0, _VOCAB, size=n, dtype=np.int64)


def _chain_from(prev: bytes, tokens: np.ndarray, block_tokens: int) -> tuple[list[bytes], list[int]]:
    """Chained keys of ``tokens`` continuing after the key ``prev``: key_i = BLAKE2b-64(key_{i-1},
    block i's int64 token ids) — the chaining of :func:`pdlab.kvcache.chain_hashes`, hashing the
    block's bytes instead of its decimal text (faster; the ids are remapped anyway)."""
    digests, keys = [], []
    tokens = np.ascontiguousarray(tokens, dtype=np.int64)
    for start in range(0, len(tokens), block_tokens):
        h = hashlib.blake2b(prev, digest_size=8)
        h.update(tokens[start:start + block_tokens].tobytes())
        prev = h.digest()
        digests.append(prev)
        keys.append(int.from_bytes(prev, "big"))
    return digests, keys


@dataclass
class AgenticWorkload:
    """Sessions of turns generated by :func:`generate_agentic` (turns sorted by arrival)."""

    config: AgenticConfig
    seed: int
    turns: list[AgenticTurn]
    block_tokens: int = BLOCK_TOKENS
    _hashes: list[tuple[int, ...]] | None = field(default=None, repr=False)

    @property
    def num_sessions(self) -> int:
        return len({t.session_id for t in self.turns})

    def sessions(self) -> dict[int, list[AgenticTurn]]:
        """Turns grouped by session, each in turn order."""
        out: dict[int, list[AgenticTurn]] = {}
        for t in sorted(self.turns, key=lambda t: (t.session_id, t.turn)):
            out.setdefault(t.session_id, []).append(t)
        return out

    def tokens(self, turn: AgenticTurn) -> np.ndarray:
        """The synthetic token ids of a turn's prompt (concatenated segments)."""
        return np.concatenate([_segment_tokens(s.key, s.tokens) for s in turn.segments])

    def hash_ids(self) -> list[tuple[int, ...]]:
        """Per turn (in :attr:`turns` order): chained hashes of its prompt's ``block_tokens`` blocks,
        remapped to integers 0, 1, 2 ... in order of first appearance. Computed once, incrementally
        per session (a turn re-hashes only from the first block its predecessor did not fill)."""
        if self._hashes is not None:
            return self._hashes
        remap: dict[int, int] = {}
        by_turn: dict[tuple[int, int], tuple[int, ...]] = {}
        bt = self.block_tokens
        for sid, turns in self.sessions().items():
            tokens = np.zeros(0, dtype=np.int64)
            segs: tuple[Segment, ...] = ()
            digests: list[bytes] = []
            keys: list[int] = []
            for t in turns:
                if segs and t.segments[:len(segs)] == segs:  # the history grew: only the tail is new
                    tail = [_segment_tokens(s.key, s.tokens) for s in t.segments[len(segs):]]
                    common = len(tokens) // bt  # full blocks shared with the previous prompt
                    tokens = np.concatenate([tokens, *tail])
                else:
                    tokens = self.tokens(t)
                    common = 0
                segs = t.segments
                digests, keys = digests[:common], keys[:common]
                d, k = _chain_from(digests[-1] if digests else b"", tokens[common * bt:], bt)
                digests += d
                keys += k
                by_turn[(sid, t.turn)] = tuple(keys)
        out = []
        for t in self.turns:
            ids = []
            for k in by_turn[(t.session_id, t.turn)]:
                if k not in remap:
                    remap[k] = len(remap)
                ids.append(remap[k])
            out.append(tuple(ids))
        self._hashes = out
        return out

    def requests(self) -> list[Request]:
        """The turns as :class:`pdlab.workloads.Request` (open-loop arrivals, hash ids), by arrival."""
        hashes = self.hash_ids()
        return [Request(i, t.arrival_s, t.prompt_tokens, t.output_tokens, h)
                for i, (t, h) in enumerate(zip(self.turns, hashes, strict=True))]

    def to_mooncake_jsonl(self, path: str | Path) -> Path:
        """Write the Mooncake trace format (``timestamp`` in integer ms, lengths, ``hash_ids``)."""
        return write_mooncake_jsonl(self.requests(), path)

    def stats(self) -> dict[str, Any]:
        """Requests, sessions, mean turns, mean input / output tokens, duration and the
        infinite-cache prefix hit ratio (as ``pdlab trace stats``)."""
        from pdlab.kvcache import cache_hit_ratio

        reqs = self.requests()
        n = len(reqs)
        ts = [r.arrival_s for r in reqs]
        return {
            "requests": n,
            "sessions": self.num_sessions,
            "turns_per_session": n / max(1, self.num_sessions),
            "avg_input_tokens": sum(r.prompt_tokens for r in reqs) / n,
            "avg_output_tokens": sum(r.output_tokens for r in reqs) / n,
            "max_input_tokens": max(r.prompt_tokens for r in reqs),
            "duration_s": max(ts) - min(ts),
            "request_rate_rps": n / (max(ts) - min(ts)) if n > 1 and max(ts) > min(ts) else float("nan"),
            "prefix_cache_hit_ratio": cache_hit_ratio(reqs, None, self.block_tokens).ratio,
        }


def _zipf_weights(n: int, s: float) -> np.ndarray:
    w = 1.0 / np.arange(1, n + 1) ** s
    return w / w.sum()


def generate_agentic(config: AgenticConfig | None = None, *, seed: int = 0, **overrides: Any) -> AgenticWorkload:
    """Generate agent sessions (see the module docstring). ``overrides`` replace config fields,
    e.g. ``generate_agentic(sessions=32, turns_mean=4)``."""
    config = replace(config or AgenticConfig(), **overrides) if overrides else (config or AgenticConfig())
    c = config
    rng = np.random.default_rng(seed)
    app_rng = np.random.default_rng([seed, 1])
    app_prefix = [(int(c.system_prompt_tokens.sample(app_rng)), int(c.tool_schema_tokens.sample(app_rng)))
                  for _ in range(c.apps)]
    weights = _zipf_weights(c.apps, c.app_zipf)
    starts = np.cumsum(rng.exponential(1.0 / c.session_rate_per_s, size=c.sessions))
    p_stop = 1.0 / c.turns_mean
    turns: list[AgenticTurn] = []
    for sid in range(c.sessions):
        app = int(rng.choice(c.apps, p=weights))
        n_turns = int(min(c.max_turns, rng.geometric(p_stop)))
        sys_tokens, tool_tokens = app_prefix[app]
        segments = [Segment("system", sys_tokens, f"{seed}/app{app}/system"),
                    Segment("tools", tool_tokens, f"{seed}/app{app}/tools"),
                    Segment("user", int(c.user_tokens.sample(rng)), f"{seed}/s{sid}/user")]
        t_send = float(starts[sid])
        think = 0.0
        for k in range(n_turns):
            out = int(c.tool_call_tokens.sample(rng))
            prompt = sum(s.tokens for s in segments)
            if prompt + out > c.max_context_tokens:
                if k == 0:  # keep at least one turn: trim the user's message to fit
                    room = c.max_context_tokens - out - sys_tokens - tool_tokens
                    if room < 1:
                        raise ValueError(f"max_context_tokens={c.max_context_tokens} cannot hold app {app}'s "
                                         f"prefix of {sys_tokens + tool_tokens} tokens")
                    segments[2] = replace(segments[2], tokens=room)
                else:
                    break
            turns.append(AgenticTurn(sid, k, app, t_send, think, out, tuple(segments), f"{seed}/s{sid}/call{k}"))
            response = int(c.tool_response_tokens.sample(rng))
            segments = segments + [Segment("assistant", out, f"{seed}/s{sid}/call{k}"),
                                   Segment("tool", response, f"{seed}/s{sid}/tool{k}")]
            think = float(c.think_time_s.sample(rng))
            t_send = t_send + c.response_time_s + think
    turns.sort(key=lambda t: (t.arrival_s, t.session_id, t.turn))
    return AgenticWorkload(c, seed, turns)


def agentic_requests(n_sessions: int, session_rate_per_s: float | None = None, seed: int = 0,
                     config: AgenticConfig | None = None) -> list[Request]:
    """``(..., seed) -> list[Request]`` form of :func:`generate_agentic`, as :mod:`pdlab.workloads` asks
    of generators."""
    over: dict[str, Any] = {"sessions": n_sessions}
    if session_rate_per_s is not None:
        over["session_rate_per_s"] = session_rate_per_s
    return generate_agentic(config, seed=seed, **over).requests()


# ---------------------------------------------------------------------------------------------- text

_WORDS = ("the of and to in is that for it as with was on be by at this are from or an have not but "
          "which one all were when we there can their has more if will out so up about into than them "
          "time only new some could these two may first then do any like my now over such our man me "
          "even most made after also did many before must through back years where much your way well "
          "down should because each just those people how too little state good very make world still "
          "own see men work long get here between both life being under never day same another know "
          "while last might us great old year off come since against go came right used take three "
          "file data list read write value error result query search tool call line code test run page "
          "open close name type path user item key table row count size start end next step plan task").split()

_ROLE_HEADERS = {"tools": "Available tools (JSON schemas):", "tool": "Tool result:"}


class TextRenderer:
    """Turns segments into text with exactly (tokenizer given) or about (no tokenizer) the right
    number of tokens.

    With a tokenizer (a model folder path, or an object with ``encode``), segments are made of words
    that are single tokens with a leading space in that tokenizer (byte-level BPE splits on
    spaces first, so N such words are N tokens). Without one, common English words are used
    (about one token each in GPT-style tokenizers). ``tokenizer`` may also be a loaded Hugging Face
    tokenizer (then :meth:`prompt_token_ids` applies its chat template).
    """

    def __init__(self, tokenizer: Any = None, *, max_words: int = 2048):
        if isinstance(tokenizer, str | Path):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
        self.tokenizer = tokenizer
        self.words = (single_token_words(tokenizer, max_words=max_words, extra=_WORDS) if tokenizer is not None
                      else list(_WORDS))
        if len(self.words) < 16:
            raise ValueError("the tokenizer has too few single-token words to render text")
        self._cache: dict[tuple[str, int], str] = {}

    def _encode(self, text: str) -> list[int]:
        return encode_ids(self.tokenizer, text)

    def segment_text(self, seg: Segment) -> str:
        """Text of ``seg.tokens`` tokens (each word one token, led by a space), deterministic in ``seg.key``."""
        k = (seg.key, seg.tokens)
        if k not in self._cache:
            seed = int.from_bytes(hashlib.blake2b(seg.key.encode(), digest_size=8).digest(), "big")
            idx = np.random.default_rng(seed).integers(0, len(self.words), size=seg.tokens)
            self._cache[k] = "".join(" " + self.words[i] for i in idx)
        return self._cache[k]

    def messages(self, turn: AgenticTurn) -> list[dict[str, str]]:
        """OpenAI chat messages of a turn: system (prompt + tool schemas), user, then assistant tool
        calls and tool responses (role ``user`` for tool results, so any chat template accepts them)."""
        segs = list(turn.segments)
        system = self.segment_text(segs[0]) + "\n" + _ROLE_HEADERS["tools"] + self.segment_text(segs[1])
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": self.segment_text(segs[2])}]
        for s in segs[3:]:
            if s.role == "assistant":
                msgs.append({"role": "assistant", "content": self.segment_text(s)})
            else:
                msgs.append({"role": "user", "content": _ROLE_HEADERS["tool"] + self.segment_text(s)})
        return msgs

    def prompt_token_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of the rendered chat prompt (the tokenizer's chat template with the generation
        prompt); without a chat-template tokenizer, the words joined (approximate)."""
        tok = self.tokenizer
        if tok is not None and getattr(tok, "chat_template", None):
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
            return list(ids)
        if tok is not None:
            return self._encode("\n".join(m["content"] for m in messages))
        return [0] * sum(len(m["content"].split()) for m in messages)


def chat_messages(turn: AgenticTurn, tokenizer: Any = None) -> list[dict[str, str]]:
    """The chat messages of one turn (see :class:`TextRenderer`)."""
    return TextRenderer(tokenizer).messages(turn)


def text_requests(workload: AgenticWorkload, renderer: TextRenderer, *,
                  block_tokens: int = BLOCK_TOKENS) -> list[dict[str, Any]]:
    """One dict per turn (in ``workload.turns`` order) for live runs: ``messages``, ``max_tokens``
    (the tool-call length), and the real ``prompt_tokens`` and remapped ``hash_ids`` measured
    with the renderer's tokenizer, plus ``session_id``, ``turn``, ``think_time_s``, ``arrival_s``."""
    from pdlab.kvcache import chain_hashes

    remap: dict[int, int] = {}
    out = []
    for t in workload.turns:
        msgs = renderer.messages(t)
        ids = renderer.prompt_token_ids(msgs)
        hashes = []
        for h in chain_hashes(ids, block_tokens):
            hashes.append(remap.setdefault(h, len(remap)))
        out.append({"session_id": t.session_id, "turn": t.turn, "app": t.app, "arrival_s": t.arrival_s,
                    "think_time_s": t.think_time_s, "messages": msgs, "max_tokens": t.output_tokens,
                    "prompt_tokens": len(ids), "nominal_prompt_tokens": t.prompt_tokens,
                    "hash_ids": tuple(hashes)})
    return out
