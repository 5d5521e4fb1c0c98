"""HRM-Text (the hierarchical reasoning model): two stacks of attention layers, a
low-level one run ``L_cycles`` times per high-level cycle and a high-level one run
``H_cycles`` times, each layer's attention called several times in one forward, on inputs
that change from call to call (and a prefix-LM mask over the prompt). A per-layer measurement
would pool different computations; TransformerLens names the stacks ``L_blocks`` and
``H_blocks``. Refused in one line."""

from poskernel_tl.models.families.family import Family


class HrmText(Family):
    NAME = "HRM-Text"
    MODEL_TYPES = frozenset({"hrm_text"})

    def refusal(self, hf_model, stack) -> str | None:
        cfg = hf_model.config
        return (f"HRM-Text calls each layer's attention several times per forward (its "
                f"low-level stack looped {cfg.L_cycles} times in each of {cfg.H_cycles} "
                "high-level cycles, on changing inputs): one kernel per layer and head is not "
                "defined; not measured")


FAMILY = HrmText()
