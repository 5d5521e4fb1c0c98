"""The inputs of a head view, checked before anything runs: which head
(:func:`check_head`) and which tokens (:func:`token_ids`)."""

from collections.abc import Sequence

import numpy as np
import torch
from jaxtyping import Int
from torch import Tensor

from poskernel_tl.data.sequences import is_int, sequence_frame
from poskernel_tl.errors import UserError
from poskernel_tl.models.loading import LoadedModel

MIN_TOKENS = 3


def check_head(model_name: str, n_layers: int, n_heads: int, layer, head) -> None:
    """ValueError naming the valid range unless 0 ≤ layer < n_layers, 0 ≤ head < n_heads."""
    if not is_int(layer) or not 0 <= layer < n_layers:
        raise UserError(f"layer {layer!r} is out of range: {model_name} has layers "
                         f"0..{n_layers - 1}")
    if not is_int(head) or not 0 <= head < n_heads:
        raise UserError(f"head {head!r} is out of range: {model_name} has heads "
                         f"0..{n_heads - 1} per layer")


def token_ids(model: LoadedModel, text_or_tokens, max_tokens: int | None = None
              ) -> Int[Tensor, " pos"]:
    """One sequence of token ids: a string (tokenized without special tokens; an
    encoder's framed ``[CLS]`` … ``[SEP]`` as its sequences are, see
    :func:`~poskernel_tl.data.sequences.sequence_frame`), a list or 1-D array of ids, or a
    [1, pos] tensor; cut to ``max_tokens`` (the frame included); 3 ≤ T ≤ context."""
    x = text_or_tokens
    prefix, suffix = (), ()
    if isinstance(x, str):
        prefix, suffix = sequence_frame(model.tokenizer) if model.tokenizer else ((), ())
        if model.tokenizer is None:
            raise UserError("this model has no tokenizer: pass token ids instead of text")
        ids = torch.tensor(model.tokenizer(x, add_special_tokens=False)["input_ids"],
                           dtype=torch.long)
    elif isinstance(x, Tensor | np.ndarray) or (isinstance(x, Sequence) and all(
            is_int(i) for i in x)):
        ids = torch.as_tensor(np.asarray(x) if isinstance(x, Sequence) else x)
        if ids.ndim == 2 and ids.shape[0] == 1:
            ids = ids[0]
        if ids.ndim != 1 or (ids.numel() and ids.dtype.is_floating_point) or ids.dtype == \
                torch.bool:
            raise UserError(f"token ids must be one sequence of integers (pos) or "
                             f"(1, pos), got {ids.dtype} {tuple(ids.shape)}")
        ids = ids.long().cpu()
    else:
        raise UserError("text_or_tokens: a string, a list of token ids, or a 1-D / [1, pos] "
                        f"integer tensor; got {type(x).__name__}")
    if max_tokens is not None:
        if not is_int(max_tokens) or max_tokens < MIN_TOKENS:
            raise UserError(f"max_tokens must be an integer >= {MIN_TOKENS}, got "
                             f"{max_tokens!r}")
        ids = ids[:max_tokens - len(prefix) - len(suffix)]
    if prefix or suffix:
        ids = torch.cat([torch.tensor(prefix, dtype=torch.long), ids,
                         torch.tensor(suffix, dtype=torch.long)])
    T, name, n_ctx = len(ids), model.spec.name, model.spec.n_ctx
    if T < MIN_TOKENS:
        raise UserError(f"the text has {T} token(s); inspecting a head needs at least "
                         f"{MIN_TOKENS} (the fit uses the lags Δ = 1..T−1)")
    if n_ctx and T > n_ctx:
        raise UserError(f"the text has {T} tokens, more than {name}'s context of {n_ctx}; "
                         f"pass a shorter text or max_tokens={n_ctx}")
    vocab = model.bridge.cfg.d_vocab
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise UserError(f"token ids outside the vocabulary [0, {vocab})")
    return ids


__all__ = ["MIN_TOKENS", "check_head", "token_ids"]
