"""One condition (model, dataset, length) end to end: sequence file → :func:`measure`
→ :meth:`ConditionResult.save`. The configuration is a dataclass saved with the result.
"""

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from poskernel_tl import constants as C
from poskernel_tl.batching import check_batch_size
from poskernel_tl.datasets import check_dataset_name, saves_logits_by_default
from poskernel_tl.loading import DTYPES, LoadedModel, load_model, resolve_device
from poskernel_tl.measure import measure
from poskernel_tl.registry import ModelSpec, resolve
from poskernel_tl.result import ConditionResult
from poskernel_tl.sequences import centering_mask, ensure_sequences, eval_mask


@dataclass
class RunConfig:
    """Arguments of ``poskernel run``; saved inside the condition's ``cfg.json``."""

    model: str
    dataset: str
    length: int
    n_seqs: int = 200
    out: str = "artifacts/run"
    device: str = "auto"
    batch_size: int | str = "auto"  # or sequences per forward
    seed: int = 0
    dtype: str = "auto"  # float32 on CPU, the model's recommended dtype on CUDA
    save_logits: str = "auto"  # auto: datasets.LOGITS_BY_DEFAULT at T=256 only
    allow_cross_doc: bool = False
    whiten: bool = False  # Track B diagnostic: also fit the centered + whitened Gram
    scores: str = "auto"  # where Track A's logits come from: auto, hook or qk
    compatibility_mode: bool = False  # TransformerLens' HookedTransformer processing
    overwrite: bool = False  # rebuild a mismatched sequence file
    progress: bool = True

    def validate(self, spec: ModelSpec | None = None) -> None:
        """Every check that needs no model, so bad input fails before loading one
        (``spec``: of a model already loaded; default: the registry's)."""
        check_dataset_name(self.dataset)
        spec = spec if spec is not None else resolve(self.model)
        if self.length < 3:
            raise ValueError(f"--length {self.length}: need at least 3 tokens")
        if spec.n_ctx and self.length > spec.n_ctx:
            raise ValueError(f"--length {self.length} exceeds {spec.name}'s context of "
                             f"{spec.n_ctx}")
        if self.n_seqs < 4 or self.n_seqs % 2:
            raise ValueError(f"--n-seqs {self.n_seqs}: need an even number >= 4 (half "
                             "centering, half evaluation)")
        check_batch_size(self.batch_size)
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(f"--dtype {self.dtype}: choose auto or one of "
                             f"{', '.join(DTYPES)}")
        if self.save_logits not in ("auto", "yes", "no"):
            raise ValueError(f"--save-logits {self.save_logits}: choose auto, yes or no")
        if self.scores not in ("auto", "hook", "qk"):
            raise ValueError(f"--scores {self.scores}: choose auto, hook or qk")
        resolve_device(self.device)

    def wants_logits(self) -> bool:
        if self.save_logits != "auto":
            return self.save_logits == "yes"
        return saves_logits_by_default(self.dataset) and self.length == 256

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "RunConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    @classmethod
    def from_json(cls, path: str | Path) -> "RunConfig":
        """The RunConfig of a saved condition (its ``cfg.json``)."""
        meta = json.loads(Path(path).read_text())
        return cls.from_dict(meta.get("config", meta))


@dataclass
class Condition:
    """A condition ready to measure: the model and the split sequence file."""

    model: LoadedModel
    seqs: dict
    seq_file: Path

    @property
    def eval_tokens(self) -> torch.Tensor:
        return self.seqs["input_ids"][eval_mask(self.seqs)]

    @property
    def centering_tokens(self) -> torch.Tensor | None:
        cen = centering_mask(self.seqs)
        return self.seqs["input_ids"][cen] if cen.any() else None

    @property
    def eval_seq_id(self) -> np.ndarray:
        return self.seqs["seq_id"][eval_mask(self.seqs)].numpy()


def prepare(cfg: RunConfig, model: LoadedModel | None = None) -> Condition:
    """Validate ``cfg``, load the model unless given, and build (or reuse) the sequence
    file under ``cfg.out``: what every command working on one condition starts with."""
    cfg.validate(model.spec if model is not None else None)
    if model is None:
        model = load_model(cfg.model, device=cfg.device, dtype=cfg.dtype,
                           compatibility_mode=cfg.compatibility_mode, progress=cfg.progress)
    if cfg.length > model.spec.n_ctx:
        raise ValueError(f"--length {cfg.length} exceeds {model.spec.name}'s context of "
                         f"{model.spec.n_ctx}")
    seqs, seq_file, _ = ensure_sequences(
        Path(cfg.out), model.tokenizer, cfg.dataset, cfg.length, cfg.n_seqs, cfg.seed,
        model_name=cfg.model, n_ctx=model.spec.n_ctx, allow_cross_doc=cfg.allow_cross_doc,
        overwrite=cfg.overwrite)
    return Condition(model, seqs, seq_file)


def run_condition(cfg: RunConfig, model: LoadedModel | None = None
                  ) -> tuple[ConditionResult, dict[str, Path]]:
    """Measure one condition and write it under ``cfg.out``; returns the result and the
    paths written (the sequence file included)."""
    cond = prepare(cfg, model)
    n_eval = len(cond.eval_tokens)
    logits_for = [i for i in C.VIS_EVAL_INDICES if i < n_eval] if cfg.wants_logits() else []
    result = measure(
        cond.model, cond.eval_tokens, cond.centering_tokens, batch_size=cfg.batch_size,
        progress=cfg.progress, seq_id=cond.eval_seq_id, seed=cfg.seed, whiten=cfg.whiten,
        logits_for=logits_for, scores=cfg.scores, dataset=cfg.dataset, config=cfg.to_dict())
    result = result.replace(model=cfg.model)
    written = {"sequences": cond.seq_file, **result.save(cfg.out)}
    return result, written
