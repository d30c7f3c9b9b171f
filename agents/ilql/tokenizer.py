"""Tokenizers for ILQL: the built-in character tokenizer (built with `tokenizers`, no hub) and a
local Hugging Face tokenizer directory, both seen through `TextTokenizer`.

Character tokenizer: token 0 is always `<pad>` (also used as bos/eos); every other token is one
character, so `encode("abc")` is three ids and `decode` joins characters back without spaces.

A Hugging Face directory is loaded with `AutoTokenizer.from_pretrained(dir, local_files_only=True)`
(never fetched) and must be a fast tokenizer; ILQL keeps its `tokenizers` JSON and special tokens,
so a member's state is self-contained and its export loads with `AutoTokenizer` offline.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

__all__ = ["PAD", "TextTokenizer", "build_char_tokenizer", "tokenizer_from_json", "hf_tokenizer", "load_hf_tokenizer"]

PAD = "<pad>"
_CHAR_SPECIAL = {"pad_token": PAD, "bos_token": PAD, "eos_token": PAD, "unk_token": PAD}
_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")


def build_char_tokenizer(chars: str | list[str]) -> Tokenizer:
    """A tokenizer whose vocabulary is `<pad>` followed by `chars` in order."""
    chars = list(chars)
    if len(set(chars)) != len(chars) or any(len(c) != 1 for c in chars):
        raise ValueError(f"tokenizer: expected distinct single characters, found {chars!r}")
    vocab = {PAD: 0, **{c: i + 1 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return tok


def tokenizer_from_json(text: str) -> Tokenizer:
    return Tokenizer.from_str(text)


def hf_tokenizer(tok: Tokenizer, special: dict[str, str] | None = None):
    """A transformers PreTrainedTokenizerFast wrapping `tok`, for `save_pretrained`."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tok, **(special or _CHAR_SPECIAL))


def load_hf_tokenizer(path: str | Path) -> tuple[Tokenizer, dict[str, str]]:
    """The fast tokenizer and special tokens of a local Hugging Face directory (offline)."""
    from transformers import AutoTokenizer

    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"task.tokenizer: expected 'char' or a local Hugging Face tokenizer directory, found {str(path)!r} "
                         "(no such directory)")
    try:
        hf = AutoTokenizer.from_pretrained(str(path), local_files_only=True, use_fast=True)
    except (OSError, ValueError) as exc:
        raise ValueError(f"task.tokenizer: cannot load a Hugging Face tokenizer from {str(path)!r} offline ({exc})") from None
    if not getattr(hf, "is_fast", False):
        raise ValueError(f"task.tokenizer: expected a fast tokenizer (tokenizer.json) in {str(path)!r}, found "
                         f"{type(hf).__name__}")
    special = {k: str(getattr(hf, k)) for k in _SPECIAL_KEYS if getattr(hf, k, None) is not None}
    return hf.backend_tokenizer, special


class TextTokenizer:
    """What ILQL needs of a tokenizer: encode text segments, decode actions, a BOS id, the vocabulary
    size, and a JSON form that rebuilds it (the member's state carries it)."""

    def __init__(self, tok: Tokenizer, special: dict[str, str] | None = None) -> None:
        self.tok = tok
        self.special = dict(special or _CHAR_SPECIAL)
        self.is_char = special is None or self.special == _CHAR_SPECIAL
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        start = self.special.get("bos_token") or self.special.get("eos_token") or self.special.get("pad_token")
        if start is None or tok.token_to_id(start) is None:
            raise ValueError("task.tokenizer: expected a bos, eos or pad token to start every episode with, found none")
        self.bos_id = int(tok.token_to_id(start))
        unk = self.special.get("unk_token")
        self.unk_id = tok.token_to_id(unk) if unk is not None and not self.is_char else None
        self.unk_text = unk
        self._char_ids = {t: i for t, i in tok.get_vocab().items() if len(t) == 1} if self.is_char else {}

    @classmethod
    def char(cls, chars: str) -> TextTokenizer:
        return cls(build_char_tokenizer(chars))

    @classmethod
    def from_dir(cls, path: str | Path) -> TextTokenizer:
        tok, special = load_hf_tokenizer(path)
        return cls(tok, special)

    @classmethod
    def from_json(cls, text: str, special_json: str | None = None) -> TextTokenizer:
        return cls(tokenizer_from_json(text), json.loads(special_json) if special_json else None)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        if self.is_char:  # one character, one id: a dict lookup is ~50x faster than the Rust round trip per segment
            ids = self._char_ids
            return [[ids.get(c, 0) for c in text] for text in texts]  # unknown -> <pad>, as the tokenizer's unk
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)

    def to_str(self) -> str:
        return self.tok.to_str()

    def special_json(self) -> str | None:
        """The special tokens as JSON, or None for the character tokenizer (its are fixed)."""
        return None if self.is_char else json.dumps(self.special, sort_keys=True)

    def hf(self) -> Any:
        return hf_tokenizer(self.tok, self.special)
