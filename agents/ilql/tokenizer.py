"""Character-level tokenizers built with `tokenizers` (no hub), saved as JSON with the model.

Token 0 is always `<pad>` (also used as bos/eos). Every other token is one character, so
`encode("abc")` is three ids and `decode` joins characters back without spaces.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

__all__ = ["PAD", "build_char_tokenizer", "tokenizer_from_json", "hf_tokenizer"]

PAD = "<pad>"


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


def hf_tokenizer(tok: Tokenizer):
    """A transformers PreTrainedTokenizerFast wrapping `tok`, for `save_pretrained`."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, bos_token=PAD, eos_token=PAD, unk_token=PAD)
