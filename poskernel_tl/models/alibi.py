"""Reading ALiBi slopes from a model's own code: the helpers its family's file
(:mod:`poskernel_tl.models.families`: BLOOM, MPT, Falcon with ``alibi=True``) calls.

Each family builds its bias with its own function, on its own scale, and adds it where it
likes; the slope m_h that matters is the one on the softmax's input. Each builder is
called on two key positions (:func:`two_keys`) and m_h is read as the step from key 0 to
key 1 (:func:`ramp_step`). Every one of them differs from the paper's −m_h·(t − s) by a
per-row constant (:mod:`poskernel_tl.models.terms.alibi`); the tests check each against
the input of Hugging Face's eager softmax.
"""

import torch


def ramp_step(bias: torch.Tensor, n_heads: int) -> tuple[float, ...]:
    """m_h from a bias built at key positions 0 and 1: [..., head, ..., 2] → step."""
    b = bias.double().reshape(n_heads, -1)
    return tuple(float(x) for x in b[:, -1] - b[:, -2])


def two_keys() -> torch.Tensor:
    """The attention mask of one sequence of two keys, what the builders are called with."""
    return torch.ones(1, 2, dtype=torch.long)


__all__ = ["ramp_step", "two_keys"]
