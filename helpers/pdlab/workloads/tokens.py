"""Text of an exact number of tokens: words that are one token each in a given tokenizer.

Byte-level BPE tokenizers (GPT-2, Llama 3, SmolLM2, the course's tiny model) and SentencePiece
ones split text at spaces before merging, so a word that is a single vocabulary piece with its
leading-space marker (``Ġthe``, ``▁the``) stays one token after a space: N such words, each led by
a space, are N tokens. Both the benchmark's prompts (:class:`pdlab.serve.client.bench.PromptSynthesizer`) and
the agentic sessions' text (:class:`pdlab.workloads.agentic.TextRenderer`) are built from them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["encode_ids", "single_token_words"]


def encode_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` without special tokens (a ``tokenizers.Tokenizer`` or a Hugging Face tokenizer)."""
    enc = tokenizer.encode(text, add_special_tokens=False)
    return list(getattr(enc, "ids", enc))


def single_token_words(tokenizer: Any, *, max_words: int | None = None, extra: Iterable[str] = ()) -> list[str]:
    """Words (lower-case ASCII letters, 2–10 of them) that ``" " + word`` encodes to exactly one token.

    Candidates are the vocabulary's space-led pieces in id order (most frequent merges first), then
    ``extra``; each is checked by encoding it. At most ``max_words`` words (all when None).
    """
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    candidates = [piece[1:] for piece in sorted(vocab, key=vocab.__getitem__) if piece[:1] in ("Ġ", "▁")]
    words: list[str] = []
    seen: set[str] = set()
    for word in [*candidates, *extra]:
        if max_words is not None and len(words) >= max_words:
            break
        if word in seen or not (word.isascii() and word.isalpha() and word.islower() and 2 <= len(word) <= 10):
            continue
        seen.add(word)
        if len(encode_ids(tokenizer, " " + word)) == 1:
            words.append(word)
    return words
