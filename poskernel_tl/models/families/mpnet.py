"""MPNet (Song et al., 2020): a bidirectional encoder with both a learned absolute
position table (added to the embeddings, RoBERTa's offset of two) and a learned table of
per-head biases over bucketed offsets (T5's buckets, two-sided: the ``relative_bias``
term), computed once by the encoder and added in every layer to q·k/√d.

TransformerLens 4.3 has no adapter for it: :class:`MPNetAdapter` is TransformerLens's BERT
adapter with MPNet's module names (the attention's q, k, v, o; the post-LN blocks; the
masked-LM head), registered for ``MPNetForMaskedLM`` before a bridge is booted. A bare
``MPNetModel`` checkpoint (sentence-transformers' ``all-mpnet-base-v2``) loads as the
masked LM, its head left as initialised (nothing reads the model's output).
"""

from transformer_lens.factories.architecture_adapter_factory import (
    SUPPORTED_ARCHITECTURES,
    ArchitectureAdapterFactory,
)
from transformer_lens.model_bridge.generalized_components import (
    AttentionBridge,
    BlockBridge,
    EmbeddingBridge,
    LinearBridge,
    MLPBridge,
    NormalizationBridge,
    PosEmbedBridge,
    UnembeddingBridge,
)
from transformer_lens.model_bridge.supported_architectures.bert import (
    BertArchitectureAdapter,
)

from poskernel_tl.models.families.family import Family

ARCHITECTURE = "MPNetForMaskedLM"


class MPNetAdapter(BertArchitectureAdapter):
    """TransformerLens's BERT adapter with MPNet's module names (module docstring)."""

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        norm = lambda name: NormalizationBridge(name=name, config=self.cfg,
                                                use_native_layernorm_autograd=True)
        self.component_mapping = {
            "embed": EmbeddingBridge(name="mpnet.embeddings.word_embeddings"),
            "pos_embed": PosEmbedBridge(name="mpnet.embeddings.position_embeddings"),
            "embed_ln": norm("mpnet.embeddings.LayerNorm"),
            "blocks": BlockBridge(
                name="mpnet.encoder.layer",
                hook_alias_overrides={"hook_mlp_out": "mlp.out.hook_out",
                                      "hook_mlp_in": "mlp.in.hook_in"},
                submodules={
                    "ln1": norm("attention.LayerNorm"),
                    "ln2": norm("output.LayerNorm"),
                    "attn": AttentionBridge(
                        name="attention.attn", config=self.cfg,
                        submodules={"q": LinearBridge(name="q"), "k": LinearBridge(name="k"),
                                    "v": LinearBridge(name="v"), "o": LinearBridge(name="o")}),
                    "mlp": MLPBridge(name=None, config=self.cfg, submodules={
                        "in": LinearBridge(name="intermediate.dense"),
                        "out": LinearBridge(name="output.dense")}),
                },
            ),
            "mlm_head": LinearBridge(name="lm_head.dense"),
            "unembed": UnembeddingBridge(name="lm_head.decoder"),
            "ln_final": norm("lm_head.layer_norm"),
        }

    def prepare_model(self, hf_model) -> None:
        """Nothing to adjust (BERT's looks for its pooler and next-sentence head)."""


class MPNet(Family):
    NAME = "MPNet"
    MODEL_TYPES = frozenset({"mpnet"})
    LOADS_AS = "masked"
    CAUSAL = False

    def prepare(self, hf_model) -> None:
        """Register :class:`MPNetAdapter` (TransformerLens 4.3's boot checks its list of
        supported architectures, not the adapters registered at run time: both)."""
        ArchitectureAdapterFactory.register_adapter(ARCHITECTURE, MPNetAdapter)
        SUPPORTED_ARCHITECTURES.setdefault(ARCHITECTURE, MPNetAdapter)

    def geometry(self, cfg, stack) -> dict:
        return dict(pe="relative-bias")

    def note(self, hf_model) -> str:
        return ("bidirectional encoder; a learned absolute position table beside the "
                "relative-position bias, which is what its layers' softmax adds")


FAMILY = MPNet()
