"""Multimodal classes and encoders of audio or images through ``hf:``
(``poskernel_tl/models/modality.py``): refused in one line from the folder's config, before
any weights or tokenizer load, naming what the model reads; a text model, an
encoder-decoder and a text config of a multimodal family pass."""

import pytest
import transformers.models.auto.configuration_auto as auto
from adapter_configs import OTHER_MODALITIES

from poskernel_tl.apps.cli import main
from poskernel_tl.models.modality import modality_refusal


@pytest.mark.parametrize("adapter,says", [
    ("LlavaForConditionalGeneration", "LlavaForConditionalGeneration is a multimodal model "
                                      "class (its vision_config beside its text_config)"),
    ("Qwen2AudioForConditionalGeneration", "(its audio_config beside its text_config)"),
    ("T5Gemma2ForConditionalGeneration", "(its vision_config beside its text_config)"),
    ("Wav2Vec2ForCTC", "Wav2Vec2ForCTC reads audio (input_values), not token ids"),
    ("ViTForImageClassification", "ViTForImageClassification reads images (pixel_values), "
                                  "not token ids"),
])
def test_a_folder_of_another_modality_is_refused_in_one_line(adapter, says, tmp_path, capsys):
    config = auto.CONFIG_MAPPING[OTHER_MODALITIES[adapter]]()
    config.architectures = [adapter]
    config.save_pretrained(tmp_path)  # a config alone: nothing else is read
    rc = main(["run", "--model", f"hf:{tmp_path}", "--dataset", "random", "--length", "16",
               "--n-seqs", "4", "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and says in err, err


@pytest.mark.parametrize("kind", ["llama", "t5", "bart", "t5gemma", "gemma3_text",
                                  "qwen3_5_text"])
def test_text_models_pass(kind):
    assert modality_refusal(auto.CONFIG_MAPPING[kind]()) is None
