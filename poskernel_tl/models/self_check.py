"""Every model checks itself at load: what the measurement reconstructs from the captured
q and k equals what the model's own softmax reads.

Before the bridge is booted (booting replaces the attention modules in place), a probe of
a few random token sequences runs through the untouched Hugging Face model on its eager
path, and the input of every attention softmax is recorded (:func:`softmax_inputs`: the
logits after the model's own scaling, masks, biases, soft-caps and temperatures; the
entries its mask removes at the dtype's minimum or −inf; a sink's extra columns apart).
After booting, the same probe runs through the capture, and each layer's softmax input is
rebuilt from the captured q and k and the layer's positional terms, as every fit reads it
(:func:`~poskernel_tl.models.softmax_ops.fold_qk`, then
:func:`~poskernel_tl.models.softmax_ops.finish_scores`). :func:`verify_probe` compares the two,
per layer and head (:func:`verify_probe`):

- the entries kept: the layer's :class:`~poskernel_tl.mask.Mask` against the
  entries the model's softmax keeps (off the diagonal), exactly;
- the values on the kept entries, each row less its mean over them (a softmax ignores a
  constant per row), within the forward dtype's tolerance (:data:`TOLERANCE`) relative to
  the largest centred logit.

A layer that differs refuses the model in one line naming the layer, the head and the
deviation (:class:`SelfCheckError`). An encoder-decoder's stack is paired with its own
calls (:func:`paired`: the encoder's self-attentions come first, then each decoder layer's
self- and cross-attention); a model whose calls do not fit its layers is not checked, and
the provenance says so. The probe is one sequence, long enough to cross every window and chunk
(up to 1,024 tokens): on the embedded SmolLM2-135M (32 tokens) the check costs about two
forwards of it at load.
"""

from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from poskernel_tl.errors import UserError
from poskernel_tl.hooks.capture import capture_qk
from poskernel_tl.models.families.registry import family_of
from poskernel_tl.models.geometry import Geometry
from poskernel_tl.models.registry import ModelSpec
from poskernel_tl.models.softmax_ops import entry_offsets, finish_scores, fold_qk, qk_scores

# largest |Δ| over the largest row-centred logit, by the dtype the forward runs in
TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4, torch.bfloat16: 3e-2,
             torch.float16: 5e-3}
MAX_PROBE = 1024
FILL_GAP = 1e3  # an entry this far below its row's largest logit is a mask's fill
SOFTMAXES = {torch.softmax, torch.Tensor.softmax, torch.nn.functional.softmax,
             getattr(torch._C._nn, "softmax", torch.softmax)}


class SelfCheckError(UserError):
    """The measurement would read other logits than the model's softmax does."""


class _Spy(TorchFunctionMode):
    """Records the input of every softmax over the last axis of a [batch, head, T, ≥ T]
    or [batch·head, T, T] tensor, or of one the model's family reads back as [batch, head,
    T, T] (``banded``: the family's
    :meth:`~poskernel_tl.models.families.family.Family.softmax_input`)."""

    def __init__(self, length: int, banded):
        super().__init__()
        self.length, self.banded, self.seen = length, banded, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in SOFTMAXES:
            x, T = args[0], self.length
            dim = kwargs.get("dim", args[1] if len(args) > 1 else -1)
            if dim in (-1, x.ndim - 1):
                read = self.banded(x.detach())
                if read is not None:
                    self.seen.append(read)
                elif x.ndim in (3, 4) and x.shape[-2] == T and x.shape[-1] >= T:
                    self.seen.append(x.detach().clone())
        return func(*args, **kwargs)


def softmax_inputs(hf_model, ids: Tensor, dtype: torch.dtype = torch.float64, **inputs
                   ) -> list[tuple[Tensor, Tensor, Tensor | None]]:
    """Per attention softmax of ``hf_model``'s eager forward on ``ids``, in order: (A
    [batch, head, T, T] in ``dtype``, 0 where masked; the bool of the entries the mask
    keeps — finite, above the dtype's fill and within :data:`FILL_GAP` of its row's
    largest —; the extra columns past T, or None). ``inputs``: more arguments of the forward
    (an encoder-decoder's ``decoder_input_ids``)."""
    b, T = ids.shape
    family = family_of(hf_model.config)
    spy = _Spy(T, lambda x: None if family is None else family.softmax_input(hf_model, x, T))
    with torch.no_grad(), spy:
        hf_model(ids, **inputs)
    out = []
    for x in spy.seen:
        x = x.to(dtype)
        if x.ndim == 3:
            x = x.view(b, -1, *x.shape[1:])
        extra = x[..., T:] if x.shape[-1] > T else None
        A = x[..., :T]
        keep = torch.isfinite(A) & (A > torch.finfo(torch.float32).min / 2)
        top = torch.where(keep, A, -torch.inf).amax(-1, keepdim=True)
        keep &= A >= top - FILL_GAP  # (a finite fill, e.g. OpenAI GPT's −1e4: weight 0)
        out.append((torch.where(keep, A, torch.zeros((), dtype=A.dtype)), keep, extra))
    return out


@dataclass
class Probe:
    """The probe's tokens and what the model's softmax read on them (per call)."""

    ids: Tensor
    read: list[tuple[Tensor, Tensor, Tensor | None]] = field(default_factory=list)
    encoder_decoder: bool = False  # (the calls of both stacks, in the order they ran)


def probe_length(spec: ModelSpec) -> int:
    """Past the shortest window or chunk of any layer by 16 tokens (32 without one), at
    most the context and :data:`MAX_PROBE`."""
    spans = [s.last + 1 for s in spec.layers or () if s.last is not None]
    spans += [s.terms.chunk for s in spec.layers or () if s.terms.chunk is not None]
    want = min(spans) + 16 if spans else 32
    return max(3, min(want, MAX_PROBE, spec.n_ctx or MAX_PROBE))


def record_probe(hf_model, spec: ModelSpec, vocab: int, seed: int = 0) -> Probe:
    """The probe (random tokens of ids 3 … vocab − 2) and the model's softmax inputs on it,
    on the untouched model (call before booting the bridge)."""
    T = probe_length(spec)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, max(4, vocab - 1), (1, T), generator=g)
    ids = ids.to(next(hf_model.parameters()).device)
    both = getattr(hf_model.config, "is_encoder_decoder", False)  # (the decoder reads them too)
    return Probe(ids, softmax_inputs(hf_model, ids, torch.float32,
                                     **({"decoder_input_ids": ids} if both else {})), both)


def rebuilt(q: Tensor, k: Tensor, spec: ModelSpec, layer: int, scale: float) -> Tensor:
    """The layer's softmax input as the fits read it: scale·q'·k' of the folded q and k,
    the unfolded terms added and the cap applied, [batch, head, T, T] float64."""
    terms = spec.layer_terms(layer)
    q, k = fold_qk(q.double(), k.double(), terms, scale)
    scores = qk_scores(q, k, scale)
    T = q.shape[1]
    pos = torch.arange(T, device=q.device)
    return finish_scores(scores, terms, lambda: entry_offsets(pos, pos), T)


def deviation(A: Tensor, B: Tensor, keep: Tensor) -> Tensor:
    """Per head, the largest |A − B| on the kept entries, each row less its mean there,
    over the largest such |A| (1 at least): [head]."""
    n = keep.sum(-1, keepdim=True).clamp(min=1)
    center = lambda x: torch.where(keep, x - (x * keep).sum(-1, keepdim=True) / n, 0.0)
    a, b = center(A.double()), center(B.double())
    top = a.abs().amax((0, 2, 3)).clamp(min=1.0)
    return (a - b).abs().amax((0, 2, 3)) / top


def paired(probe: Probe, spec: ModelSpec) -> list | None:
    """The softmax calls of the measured layers, in order: every call of a model of one
    stack; of an encoder-decoder's forward (its encoder's self-attentions, then each decoder
    layer's self- and cross-attention) the measured stack's own. None where the count does
    not fit that order."""
    read, n, L = probe.read, len(probe.read), spec.n_layers
    if not probe.encoder_decoder:
        return read if n == L else None
    if spec.stack in (None, "encoder"):  # (the encoder: an encoder-decoder's default)
        return read[:L] if n > L and (n - L) % 2 == 0 else None
    first = n - 2 * L  # the encoder's calls
    return read[first::2] if first >= 0 else None


def verify_probe(bridge, spec: ModelSpec, scale: float, probe: Probe, dtype: torch.dtype) -> dict:
    """Compare the probe's softmax inputs with the captured q/k rebuilt (module
    docstring); raises :class:`SelfCheckError` on a difference. Returns the provenance:
    ``{"checked", "probe", "max_deviation", "tolerance", "note"}``."""
    T = probe.ids.shape[1]
    geometry = Geometry.of(spec, T)
    tol = TOLERANCE.get(dtype, 3e-2)
    base = {"probe": list(probe.ids.shape), "tolerance": tol}
    read = paired(probe, spec)
    if read is None:
        return {**base, "checked": False, "max_deviation": None,
                "note": f"not checked: the model's softmax ran {len(probe.read)} times for "
                        f"{spec.n_layers} measured layers (not paired one to one)"}
    worst = 0.0
    captured: dict[int, tuple[Tensor, Tensor]] = {}
    with torch.no_grad(), capture_qk(bridge, lambda c: captured.update({c.layer: (c.q, c.k)}),
                                     schemes=spec.layers) as capture:
        capture.forward(probe.ids)
    for L, (A, keep, _) in enumerate(read):
        off = ~torch.eye(T, dtype=torch.bool, device=keep.device)
        ours = geometry.mask(L).kept(device=keep.device)
        wrong = (keep[0, 0] & off) ^ ours
        if wrong.any():
            raise SelfCheckError(
                f"{spec.name}: layer {L}'s softmax keeps other entries than the measurement "
                f"reads ({int(wrong.sum())} of {T}² differ on a {T}-token probe): refused "
                "(--no-self-check measures it anyway)")
        q, k = captured[L]
        dev = deviation(A, rebuilt(q, k, spec, L, scale), keep)
        head = int(dev.argmax())
        if float(dev[head]) > tol:
            raise SelfCheckError(
                f"{spec.name}: layer {L}, head {head}: the logits rebuilt from the captured "
                f"q and k differ from what the model's softmax reads by {float(dev[head]):.2g} "
                f"of their scale (tolerance {tol:g} in {str(dtype).removeprefix('torch.')}): "
                "refused (--no-self-check measures it anyway)")
        worst = max(worst, float(dev.max()))
    return {**base, "checked": True, "max_deviation": worst, "note": ""}


__all__ = ["MAX_PROBE", "TOLERANCE", "Probe", "SelfCheckError", "deviation", "probe_length",
           "paired", "rebuilt", "record_probe", "softmax_inputs", "verify_probe"]
