"""What ``pk.measure`` and the analyses accept as sequences: an int tensor [n, T] or a list
of strings, tokenized without special tokens and cut to one length T, checked against
the model (context, vocabulary) before any forward pass."""

from collections.abc import Sequence

import torch
from jaxtyping import Int

from poskernel_tl.errors import UserError
from poskernel_tl.models.loading import LoadedModel

Tokens = Int[torch.Tensor, "batch pos"]
CenteringTokens = Int[torch.Tensor, "n_centering pos"]  # another count, the same length


def as_tokens(model: LoadedModel, data, length: int | None = None
              ) -> Int[torch.Tensor, "batch pos"] | None:
    """An int tensor [n, T] as given, or a list of strings tokenized without special
    tokens (BOS included: none) and cut to ``length`` tokens (default: the shortest
    text's length). A text or sequence shorter than ``length`` is refused, naming it."""
    ids = _token_lists(model, data)
    return None if ids is None else _cut(ids, length)


def _cut(ids: list, length: int | None, what: str = "text") -> Int[torch.Tensor, "batch pos"]:
    """Token lists as a tensor [n, length] (default length: the shortest); a shorter list
    is refused in one line naming it."""
    T = min(len(x) for x in ids) if length is None else int(length)
    short = [(i, len(x)) for i, x in enumerate(ids) if len(x) < T]
    if short:
        i, n = short[0]
        raise UserError(f"{what} {i} has {n} tokens, fewer than length={T}: pass longer "
                        "texts or a smaller length")
    return torch.tensor([list(x[:T]) for x in ids], dtype=torch.long)


def _token_lists(model: LoadedModel, data) -> list | None:
    """Token ids per sequence of an int tensor [n, T] or a list of strings."""
    if data is None:
        return None
    if torch.is_tensor(data):
        if data.dtype not in (torch.int64, torch.int32) or data.ndim != 2:
            raise UserError(f"tokens must be an int tensor [n_seqs, T], got {data.dtype} "
                             f"{tuple(data.shape)}")
        return data.long().tolist()
    if isinstance(data, str) or not isinstance(data, Sequence):
        raise UserError("tokens: an int tensor [n_seqs, T] or a list of strings")
    if model.tokenizer is None:
        raise UserError("this model has no tokenizer: pass token ids")
    return [model.tokenizer(t, add_special_tokens=False)["input_ids"] for t in data]


def check_tokens(model: LoadedModel, tokens: torch.Tensor, what: str) -> None:
    n, T = tokens.shape
    if T < 3:
        raise UserError(f"{what}: sequences of {T} tokens; the fit needs T >= 3")
    if model.spec.n_ctx and T > model.spec.n_ctx:
        raise UserError(f"{what}: T={T} exceeds {model.spec.name}'s context of "
                         f"{model.spec.n_ctx}")
    if n and (int(tokens.min()) < 0 or int(tokens.max()) >= model.bridge.cfg.d_vocab):
        raise UserError(f"{what}: token ids outside the vocabulary [0, "
                         f"{model.bridge.cfg.d_vocab})")


def checked_tokens(model: LoadedModel, tokens, centering_tokens, length: int | None = None
                   ) -> tuple[Tokens, CenteringTokens | None, str | None]:
    """The evaluation and centering token ids cut to one length, checked (no centering:
    None), and a note when that length was chosen here: ``length``, else the shortest
    sequence of the two sets (both cut to it)."""
    ev, cen = _token_lists(model, tokens), _token_lists(model, centering_tokens)
    if len(ev) < 2:
        raise UserError("need at least 2 evaluation sequences")
    if cen is not None and len(cen) == 0:
        cen = None
    note = None
    if length is None:
        lengths = {len(x) for x in ev + (cen or [])}
        length = min(lengths)
        if len(lengths) > 1:
            note = (f"sequences of {min(lengths)} to {max(lengths)} tokens, all cut to the "
                    f"shortest (T = {length}); pass length= to choose T")
    ev_ids = _cut(ev, length, "evaluation text")
    cen_ids = None if cen is None else _cut(cen, length, "centering text")
    check_tokens(model, ev_ids, "evaluation tokens")
    if cen_ids is not None:
        check_tokens(model, cen_ids, "centering tokens")
    return ev_ids, cen_ids, note


__all__ = ["as_tokens", "check_tokens", "checked_tokens"]
