"""CodeGen. TransformerLens 4.3's CodeGen attention reads the rotary table and the score
scale from attributes transformers 4.x kept on each attention module (``embed_positions``,
``scale_attn``); transformers 5 keeps the table on ``transformer.rotary_emb`` and the scale
as ``scaling``, and the bridge fails on its first forward. :meth:`CodeGen.prepare` gives
each attention module the attributes the bridge reads, taken from the model itself (the
shared table; √d_head, the inverse of its ``scaling``).
"""

import torch

from poskernel_tl.models.families.family import Family


class CodeGen(Family):
    NAME = "CodeGen"
    MODEL_TYPES = frozenset({"codegen"})

    def prepare(self, hf_model) -> None:
        table = hf_model.transformer.rotary_emb.embed_positions
        for module in hf_model.modules():
            if type(module).__name__ == "CodeGenAttention" and not hasattr(module,
                                                                          "embed_positions"):
                module.register_buffer("embed_positions", table, persistent=False)
                module.scale_attn = torch.tensor(1.0 / module.scaling, dtype=torch.float32,
                                                 device=table.device)


FAMILY = CodeGen()
