"""Models that read something other than text, or text beside something else: an audio or
image encoder (its model reads ``input_values`` or ``pixel_values``, not token ids:
HuBERT, wav2vec 2.0, AST, ViT, DeiT) and a multimodal model (a text stack beside a vision
or audio encoder, its config's text part one of several sub-configs: LLaVA, Qwen-VL, Qwen2-Audio,
Gemma 3 and 4's image-text classes, …). Neither is measured: refused in one line, from the
config alone, before any weights load. (An encoder-decoder's two stacks are a family's to
read, :mod:`poskernel_tl.models.families`, and are not asked here.)"""

from typing import Any

from poskernel_tl.models.scheme import UnreadableSchemeError

# what a model reads, by the name of its main input, where it is not token ids
INPUTS = {"input_values": "audio", "input_features": "audio", "pixel_values": "images"}


def modality_refusal(config: Any) -> str | None:
    """Why a model of ``config`` is not a text model the toolkit measures, or None."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    name = (getattr(config, "architectures", None) or [type(config).__name__])[0]
    subs = _sub_configs(config)
    others = [k for k in subs if k in OTHER_INPUTS]
    if others or "text_config" in subs:
        beside = f"{', '.join(others)} beside its text_config" if others else "text_config"
        return (f"{name} is a multimodal model class (its {beside}): the toolkit measures "
                "text models; the text stack inside it is not measured")
    base = getattr(transformers, MODEL_MAPPING_NAMES.get(config.model_type, ""), None)
    reads = INPUTS.get(getattr(base, "main_input_name", "input_ids"))
    if reads is not None:
        return (f"{name} reads {reads} ({base.main_input_name}), not token ids: the toolkit "
                "measures text models")
    return None


# sub-configs of encoders of other inputs (T5Gemma 2 keeps its vision one in its encoder's)
OTHER_INPUTS = ("vision_config", "audio_config", "speech_config", "vq_config")


def _sub_configs(config: Any, depth: int = 2) -> list[str]:
    """The names of the sub-configs of ``config``, and of theirs (``depth`` levels)."""
    from transformers import PretrainedConfig

    found = []
    for key, value in vars(config).items():
        if isinstance(value, PretrainedConfig):
            found.append(key)
            found += _sub_configs(value, depth - 1) if depth > 1 else []
    return found


def refuse_other_modalities(config: Any) -> None:
    """Raise :class:`~poskernel_tl.models.scheme.UnreadableSchemeError` with
    :func:`modality_refusal`'s line, if any."""
    reason = modality_refusal(config)
    if reason:
        raise UnreadableSchemeError(reason)


__all__ = ["modality_refusal", "refuse_other_modalities"]
