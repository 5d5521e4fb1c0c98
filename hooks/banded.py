"""Causal sliding-window attention computed on its band: blocks of queries against the
keys their window reaches, never the [T, T] triangle.

A layer whose queries read keys t − w < s ≤ t (Gemma 2/3's and gpt-oss's local layers,
Mistral, Qwen2's windowed layers) keeps T·w of the T² entries; a full-size masked
``scaled_dot_product_attention`` computes them all and discards the rest (and needs a
[T, T] mask). Here queries [start, end) of a block of ``block`` rows read keys
[key_start, end), key_start = the window's first key (start − w + 1) rounded down to a
multiple of ``block``, under a small bool mask [block, end − key_start] of the entries the
window keeps. Work and memory per block are O(block·(w + 2·block)).

Rounding the key start to a multiple of the block (512 by default, the key tile of
PyTorch's CPU flash-attention kernel) makes every query row reduce the same key tiles, in
the same order, as the full-size call with the [T, T] band mask: on CPU the output is
bitwise the same (checked on Gemma-3-270M shapes at T = 1300, 2048, 4096); on other
kernels it agrees to float rounding.
"""

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from poskernel_tl.mask import Mask

BAND_BLOCK = 512  # queries per block; key starts are rounded down to a multiple of it

_MASKS: dict = {}  # (rows, key offset, keys, window, device) -> bool mask of one block


def _block_mask(rows: int, offset: int, n_keys: int, window: int, device) -> Tensor:
    """Bool [rows, n_keys]: query i (at key index offset + i) keeps key j when
    0 ≤ offset + i − j < window."""
    key = (rows, offset, n_keys, window, str(device))
    if key not in _MASKS:
        if len(_MASKS) >= 8:  # the interior block and a few edge blocks of a forward
            _MASKS.pop(next(iter(_MASKS)))
        t = torch.arange(rows, device=device) + offset
        _MASKS[key] = Mask(max(rows + offset, n_keys), last=window - 1).kept(
            t, torch.arange(n_keys, device=device), diagonal=True)
    return _MASKS[key]


def band_blocks(n: int, window: int, block: int | None = None
                ) -> list[tuple[int, int, int]]:
    """(query start, query end, key start) of each block over ``n`` positions (``block``
    rows each, :data:`BAND_BLOCK` by default)."""
    block = block or BAND_BLOCK
    return [(start, min(start + block, n), max(0, (start - window + 1) // block * block))
            for start in range(0, n, block)]


def banded_sdpa(
    q: Float[Tensor, "batch head_index query_pos d_head"],
    k: Float[Tensor, "batch kv_head_index key_pos d_head"],
    v: Float[Tensor, "batch kv_head_index key_pos d_head"],
    scale: float, window: int, block: int | None = None,
) -> Float[Tensor, "batch head_index query_pos d_head"]:
    """Causal attention within a window of ``window`` tokens (query t reads keys
    t − window < s ≤ t), computed block by block on the band; query head h reads key/value
    head h // (n_heads / n_kv_heads) without expanding the keys."""
    n = q.shape[2]
    gqa = q.shape[1] != k.shape[1]
    out = q.new_empty(q.shape[:3] + v.shape[3:])
    for start, end, key_start in band_blocks(n, window, block):
        mask = _block_mask(end - start, start - key_start, end - key_start, window, q.device)
        out[:, :, start:end] = F.scaled_dot_product_attention(
            q[:, :, start:end], k[:, :, key_start:end], v[:, :, key_start:end],
            attn_mask=mask, scale=scale, enable_gqa=gqa)
    return out


__all__ = ["BAND_BLOCK", "band_blocks", "banded_sdpa"]
