"""What a layer's softmax reads, formed on one tile of queries against keys: the one
definition every kernel of this folder calls (:mod:`poskernel_tl.models.softmax_terms`
says what each term is and where it is read from the model).

A tile is scale·q·kᵀ of BM query rows against BN keys, formed by one ``tl.dot`` with
float32 accumulation: bf16 and fp16 operands go to the tensor cores as they are (their
products are exact in float32), float32 operands with full float32 products
(``input_precision="ieee"``: no TF32). Then, by original position (the permutation null
passes the permuted positions): a per-row temperature τ_t (Llama 4's NoPE layers), the
paper-form ALiBi term −m_h·(t − s), the soft-cap cap·tanh(x / cap) (Gemma 2).
"""

from typing import no_type_check

import torch
import triton
import triton.language as tl

from poskernel_tl.kernels.dispatch import interpreting
from poskernel_tl.models.softmax_ops import temperatures
from poskernel_tl.models.softmax_terms import SoftmaxTerms


@triton.jit
@no_type_check  # (a Triton kernel: the tests' type-check hook must not wrap it)
def tanh(x):
    """tanh in float32 without cancellation near 0: the odd series to x⁹ below |x| = 0.3
    (remainder < 1e-7 relative), (1 − e^(−2|x|)) / (1 + e^(−2|x|)) with the sign above."""
    a = tl.abs(x)
    x2 = x * x
    series = x * (1.0 + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 + x2 * (-17.0 / 315.0
                                                                     + x2 * (62.0 / 2835.0)))))
    e = tl.exp(-2.0 * a)
    far = (1.0 - e) / (1.0 + e)
    return tl.where(a < 0.3, series, tl.where(x < 0, -far, far))


@triton.jit
@no_type_check  # (a Triton kernel: the tests' type-check hook must not wrap it)
def qk_tile(Q, K, q_off, k_off, rok, kok, BM: tl.constexpr, BN: tl.constexpr,
            D_HEAD: tl.constexpr, BK: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    """Σ_i q_i·k_i of BM query rows against BN keys, float32 [BM, BN]: ``q_off``/``k_off``
    each row's element offset (rows ``~rok``/``~kok`` read as zero), d_head in chunks of
    BK (``UPCAST``: operands cast to float32 first, for Triton's interpreter, which has
    no bf16 products)."""
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for d0 in range(0, D_HEAD, BK):
        dd = d0 + tl.arange(0, BK)
        dm = dd < D_HEAD
        q = tl.load(Q + q_off[:, None] + dd[None, :], mask=rok[:, None] & dm[None, :],
                    other=0.0)
        k = tl.load(K + k_off[:, None] + dd[None, :], mask=kok[:, None] & dm[None, :],
                    other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
            k = k.to(tl.float32)
        if IEEE:
            acc += tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            acc += tl.dot(q, tl.trans(k))
    return acc


@triton.jit
@no_type_check  # (a Triton kernel: the tests' type-check hook must not wrap it)
def logits_at(s, rp, kp, h, scale, cap, TAU, SLOPES, HAS_TAU: tl.constexpr,
              HAS_ALIBI: tl.constexpr, HAS_CAP: tl.constexpr, TRANSPOSED: tl.constexpr):
    """What the softmax reads of head ``h`` at query positions ``rp`` and key positions
    ``kp`` (integer tensors broadcastable to ``s``), float32, from the q·k products ``s``.
    ``TRANSPOSED``: the operands were (k, q), ``s`` is of Aᵀ (``rp`` are key positions:
    the temperature goes with ``kp``, the ALiBi offset changes sign)."""
    s = s * scale
    if HAS_TAU:
        if TRANSPOSED:
            s = s * tl.load(TAU + kp)
        else:
            s = s * tl.load(TAU + rp)
    if HAS_ALIBI:
        slope = tl.load(SLOPES + h)
        if TRANSPOSED:
            s = s - slope * (kp - rp).to(tl.float32)
        else:
            s = s - slope * (rp - kp).to(tl.float32)
    if HAS_CAP:
        s = cap * tanh(s / cap)
    return s


@triton.jit
@no_type_check  # (a Triton kernel: the tests' type-check hook must not wrap it)
def logits_tile(s, row_pos, key_pos, h, scale, cap, TAU, SLOPES, HAS_TAU: tl.constexpr,
                HAS_ALIBI: tl.constexpr, HAS_CAP: tl.constexpr, TRANSPOSED: tl.constexpr):
    """:func:`logits_at` of a tile: the tile's q·kᵀ ``s`` (:func:`qk_tile`) at rows
    ``row_pos[i]`` and keys ``key_pos[j]``."""
    return logits_at(s, row_pos[:, None], key_pos[None, :], h, scale, cap, TAU, SLOPES,
                     HAS_TAU, HAS_ALIBI, HAS_CAP, TRANSPOSED)


@triton.jit
@no_type_check  # (a Triton kernel: the tests' type-check hook must not wrap it)
def kept_offset(lag, last, DIAGONAL: tl.constexpr):
    """The kernels' entry test of a layer's mask at offsets ``lag`` (t − s; s − t for a
    two-sided layer's upper side, read as the mirrored lower one): 1 ≤ lag ≤ ``last``, the
    diagonal too where ``DIAGONAL`` (the softmax's test, which reads s = t), as
    :meth:`~poskernel_tl.mask.Mask.keeps` (the kernels take no binding chunk)."""
    if DIAGONAL:
        return (lag >= 0) & (lag <= last)
    return (lag >= 1) & (lag <= last)


def chunk_of(d: int) -> int:
    """BK: the d_head chunk of :func:`qk_tile` (a power of two from 16 to 64)."""
    return min(64, max(16, triton.next_power_of_2(d)))


_TERMS: dict = {}


def term_args(terms: SoftmaxTerms, length: int, device) -> tuple[tuple, dict]:
    """The arguments of :func:`logits_tile` for a layer's ``terms`` at ``length``:
    (``cap``, ``TAU``, ``SLOPES``) and the constexpr switches.
    The per-position temperatures and the slopes are made once per (terms, length,
    device) and kept (no host-to-device copy per batch)."""
    key = (terms, length, str(device))
    if key not in _TERMS:
        tau = temperatures(terms, length, device, torch.float32)
        slopes = None if terms.slopes is None else torch.tensor(
            terms.slopes, dtype=torch.float32, device=device)
        none = torch.zeros(1, dtype=torch.float32, device=device)
        _TERMS[key] = (float(terms.softcap or 1.0), none if tau is None else tau,
                       none if slopes is None else slopes)
    flags = dict(HAS_TAU=terms.temperature is not None, HAS_ALIBI=terms.slopes is not None,
                 HAS_CAP=terms.softcap is not None)
    return _TERMS[key], flags


def dot_flags(dtype: torch.dtype) -> dict[str, bool]:
    """:func:`qk_tile`'s precision switches for operands of ``dtype``."""
    upcast = interpreting() and dtype in (torch.bfloat16, torch.float16)
    return dict(UPCAST=upcast, IEEE=upcast or dtype == torch.float32)


def operand(x: torch.Tensor) -> torch.Tensor:
    """q or k as a kernel reads it: unit stride along d_head; float32 for float64 input
    (the tiles' products are float32)."""
    if x.dtype == torch.float64:
        x = x.float()
    return x if x.stride(-1) == 1 else x.contiguous()


__all__ = ["chunk_of", "dot_flags", "kept_offset", "logits_at", "logits_tile", "operand",
           "qk_tile", "tanh", "term_args"]
