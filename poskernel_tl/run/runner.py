"""One condition (model, dataset, length) end to end: sequence file → :func:`measure`
→ :meth:`ConditionResult.save`. The configuration (:class:`~poskernel_tl.plan.config.RunConfig`)
is saved with the result.
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from poskernel_tl import constants as C
from poskernel_tl import protocol
from poskernel_tl.data.sequences import centering_mask, ensure_sequences, eval_mask
from poskernel_tl.folder import check_space
from poskernel_tl.measurement.measure import measure
from poskernel_tl.measurement.parts import condition_dims, planned_bytes
from poskernel_tl.measurement.result import ConditionResult
from poskernel_tl.models.geometry import Geometry
from poskernel_tl.models.loading import LoadedModel, load_model, resolve_device
from poskernel_tl.models.registry import ModelSpec
from poskernel_tl.plan.config import RunConfig


@dataclass
class PreparedCondition:
    """A condition ready to measure: the model, the run's geometry (checked against the
    loaded model) and the split sequence file."""

    model: LoadedModel
    geometry: Geometry
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


def prepare(cfg: RunConfig, model: LoadedModel | None = None) -> PreparedCondition:
    """Validate ``cfg``, load the model unless given, and build (or reuse) the sequence
    file under ``cfg.out``: what every command working on one condition starts with."""
    geometry = cfg.validate(model.spec if model is not None else None)
    resolve_device(cfg.device)  # whether this machine has it (the name is checked above)
    if model is None:  # checked above against the registry's spec, now against its layers
        model = load_model(cfg)
        geometry = Geometry.checked(model.spec, cfg.length)
    seqs, seq_file, _ = ensure_sequences(
        Path(cfg.out), model.tokenizer, cfg.dataset, cfg.length, cfg.n_seqs, cfg.seed,
        model_name=cfg.model, n_ctx=model.spec.n_ctx, allow_cross_doc=cfg.allow_cross_doc,
        overwrite=cfg.overwrite)
    return PreparedCondition(model, geometry, seqs, seq_file)


def run_condition(cfg: RunConfig, model: LoadedModel | None = None
                  ) -> tuple[ConditionResult, dict[str, Path]]:
    """Measure one condition and write it under ``cfg.out``; returns the result and the
    paths written (the sequence file included)."""
    cond = prepare(cfg, model)
    n_eval = len(cond.eval_tokens)
    logits_for = [i for i in protocol.VIS_EVAL_INDICES if i < n_eval] if cfg.wants_logits() else []
    check_room(cfg, cond, len(logits_for))
    result = measure(
        cond.model, cond.eval_tokens, cond.centering_tokens, **cfg.measure_kwargs(),
        progress=cfg.progress, seq_id=cond.eval_seq_id, logits_for=logits_for,
        dataset=cfg.dataset, config=cfg.to_dict(), geometry=cond.geometry)
    result = result.replace(model=cfg.model)
    written = {"sequences": cond.seq_file, **result.save(cfg.out)}
    return result, written


def output_bytes(spec: ModelSpec, length: int, n_eval: int, centered: bool, n_logits: int
                 ) -> int:
    """≈ bytes a condition writes (:func:`~poskernel_tl.measurement.parts.planned_bytes`):
    the centering means where it is centered, the full Gram matrices up to
    ``GRAM_SAVE_MAX_T`` (the centered one where centered), ``n_logits`` sequences' logits."""
    optional = ("mean_q", "mean_k", "mean_q_half", "mean_k_half") if centered else ()
    if length <= C.GRAM_SAVE_MAX_T:
        optional += ("gram_raw", "gram_centered") if centered else ("gram_raw",)
    return planned_bytes(condition_dims(spec, length, n_eval), n_logits, optional)


def check_room(cfg: RunConfig, cond: PreparedCondition, n_logits: int) -> None:
    """Refuse before the forward, in one line naming the estimate and the shortfall,
    when ``cfg.out`` lacks the room for what the condition will write
    (:func:`output_bytes`, with 10 % to spare)."""
    need = output_bytes(cond.model.spec, cfg.length, len(cond.eval_tokens),
                        cond.centering_tokens is not None, n_logits)
    check_space(cfg.out, int(need * 1.1), f"the output of {cfg.model} · {cfg.dataset} · "
                                          f"T={cfg.length}")


__all__ = ["PreparedCondition", "check_room", "output_bytes", "prepare", "run_condition"]
