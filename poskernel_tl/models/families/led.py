"""LED (Longformer encoder-decoder): a BART-layout encoder-decoder under ``led.`` whose
encoder attends through Longformer's sliding windows.

Its decoder is plain BART attention (causal, learned absolute positions, scaled q·k) and is
measured as BART's is (``hf:DIR@decoder``). Its encoder is not: each query keeps the keys
within attention_window / 2 on both sides, computed on a banded [T, window + 1] layout
over inputs padded inside the model to a multiple of the window, beside global tokens
with their own projections where a user asks for them; the capture does not read that
layout, so the encoder is refused in one line.
"""

from poskernel_tl.models.families.bart import Bart
from poskernel_tl.models.families.family import Stack


class Led(Bart):
    NAME = "LED"
    MODEL_TYPES = frozenset({"led"})

    def stack_module(self, hf_model, stack: Stack):
        return getattr(hf_model.led, stack.name)

    def refusal(self, hf_model, stack: Stack | None) -> str | None:
        if stack is None or stack.name != "encoder":
            return None
        window = hf_model.config.attention_window
        return (f"LED's encoder attends through Longformer's sliding windows "
                f"(attention_window {window}: the keys within half of it on each side, on a "
                "banded layout over inputs padded to a multiple of the window, with optional "
                "global tokens): not measured; its decoder is (hf:DIR@decoder)")

    def note(self, hf_model) -> str:
        return ("encoder-decoder: the decoder measured (@decoder), fed the same tokens as "
                "the encoder; the encoder (Longformer's windowed attention) not measured; "
                "cross-attention (no offset) skipped")


FAMILY = Led()
