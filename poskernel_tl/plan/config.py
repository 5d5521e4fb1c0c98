"""One tree of configuration dataclasses, validated once and saved with every output.

:class:`MeasureConfig` (how :func:`poskernel_tl.measure` runs) ⊂ :class:`RunConfig` (one
condition: model, dataset, length, where to write) ⊂ :class:`GridConfig` (many conditions
from a preset). Options are typed (``Literal`` for choices); :func:`add_flags` derives
the command line's flags from the fields (help text in each field's metadata) and
:func:`from_args` builds the dataclass back from the parsed arguments, so a field and its
flag cannot drift apart. The same two functions serve every analysis's options.
"""

import argparse
import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from poskernel_tl.data.datasets import check_dataset, saves_logits_by_default
from poskernel_tl.errors import UserError
from poskernel_tl.models.geometry import Geometry
from poskernel_tl.models.registry import EMBEDDED_DEFAULT, ModelSpec, resolve
from poskernel_tl.sizes import check_batch_size, parse_memory


def option(default, help: str, flag: str | None = None, **extra) -> Any:
    """A dataclass field with its command-line help (``flag`` overrides ``--field-name``;
    a ``--quiet`` style flag of a field defaulting to True stores False)."""
    return field(default=default, metadata={"help": help, "flag": flag, **extra})


def positive_or_auto(text: str) -> int | str:
    """argparse type of ``--batch-size``: an int where the text is one, else the text
    (checked by :func:`check_batch_size` with a one-line message)."""
    try:
        return int(text)
    except ValueError:
        return text


def _choices(tp) -> tuple | None:
    if typing.get_origin(tp) is Literal:
        return typing.get_args(tp)
    return None


def _flag_kwargs(f: dataclasses.Field) -> dict:
    tp, kw = f.type, {"help": f.metadata.get("help")}
    if tp is bool:
        return {**kw, "action": "store_false" if f.default is True else "store_true"}
    choices = _choices(tp)
    if choices:
        return {**kw, "choices": choices, "default": f.default}
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and any(
            _choices(a) for a in args):  # int | Literal["auto"]
        return {**kw, "type": positive_or_auto, "default": f.default}
    optional = typing.get_origin(tp) in (typing.Union, types.UnionType)
    base = next(a for a in args if a is not type(None)) if optional else tp
    if typing.get_origin(base) is tuple:
        inner = typing.get_args(base)[0]
        return {**kw, "nargs": "+", "type": inner, "default": f.default}
    return {**kw, "type": base, "default": f.default}


def flag_name(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def cli_fields(cls) -> list[dataclasses.Field]:
    """The fields of ``cls`` that are command-line options (metadata ``cli=False`` opts out)."""
    return [f for f in dataclasses.fields(cls) if f.metadata.get("cli", True)
            and "help" in f.metadata]


def add_flags(parser: argparse.ArgumentParser, cls, exclude: tuple[str, ...] = ()) -> None:
    """One flag per option field of ``cls`` (except ``exclude``), typed from the field."""
    for f in cli_fields(cls):
        if f.name not in exclude:
            parser.add_argument(flag_name(f), dest=f.name, **_flag_kwargs(f))


def from_args(cls, args: argparse.Namespace, **overrides):
    """``cls`` from parsed arguments: every field that has a value in ``args``."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values = {k: v for k, v in vars(args).items() if k in fields and v is not None}
    for k, v in values.items():  # lists from nargs="+": tuples, commas split
        if isinstance(v, list):
            inner = type(v[0]) if v else str
            values[k] = tuple(inner(x) for item in v
                              for x in (item.split(",") if isinstance(item, str) else [item])
                              if x != "")
    return cls(**{**values, **overrides})


def check_choices(obj) -> None:
    """Every ``Literal`` field holds one of its values (a UserError names the flag)."""
    for f in dataclasses.fields(obj):
        value, choices = getattr(obj, f.name), _choices(f.type)
        if choices and value not in choices:
            raise UserError(f"{flag_name(f)} {value}: choose one of "
                            f"{', '.join(map(str, choices))}")


def check_device_name(device: str) -> None:
    """``--device`` is auto, cpu, cuda or cuda:N. Whether this machine has it needs torch:
    :func:`~poskernel_tl.models.loading.resolve_device`, before a model loads."""
    if device not in ("auto", "cpu", "cuda") and not re.fullmatch(r"cuda:[0-9]+", device):
        raise UserError(f"--device {device}: not a device; use auto, cpu, cuda or cuda:N")


def check_slurm(cfg) -> None:
    """The ``--slurm-*`` numbers are whole numbers (GPUs may be 0) or auto."""
    for name, low in (("slurm_gpus_per_task", 0), ("slurm_cpus_per_task", 1),
                      ("slurm_time", 1)):
        value = getattr(cfg, name)
        if value != "auto" and not (isinstance(value, int) and value >= low):
            raise UserError(f"--{name.replace('_', '-')} {value}: a whole number >= {low}, "
                            "or auto")
    if cfg.slurm_mem != "auto":
        try:
            parse_memory(cfg.slurm_mem)
        except UserError:
            raise UserError(f"--slurm-mem {cfg.slurm_mem}: a size such as 16G or 800M, "
                            "or auto") from None


@dataclass(kw_only=True)
class MeasureConfig:
    """How :func:`poskernel_tl.measure` runs (besides the tokens)."""

    batch_size: int | Literal["auto"] = option(
        "auto", "sequences per forward, or auto: as many as fit in half the free memory "
        "(at most 4 on CPU, 64 on a GPU); halved on out-of-memory")
    seed: int = option(0, "seed of the sequences, the 80/20 splits and the null")
    whiten: bool = option(False, "Track B diagnostic: also fit the centered and whitened "
                                 "Gram")
    scores: Literal["auto", "hook", "qk"] = option(
        "auto", "Track A logits from hook_attn_scores (hook), from q·kᵀ (qk), or "
        "whichever the model computes anyway (auto)")
    null_perms: int = option(4, "position permutations of the Track A null (0: none)")
    null_seqs: int = option(8, "evaluation sequences the permutation null and the pattern "
                            "statistics (previous-token score, sink metrics) read")
    max_memory: str = option(
        "auto", "memory the run may use besides the model, e.g. 12G or 800M (a bare "
        "number is GiB); auto: 80 percent of what is available at the start. Planned "
        "before the run: Track B runs in blocks of layers (one more partial forward "
        "each) where it does not fit, and a run that cannot fit is refused")

    def validate(self) -> None:
        check_choices(self)
        check_batch_size(self.batch_size)
        parse_memory(self.max_memory)
        if self.null_perms < 0 or self.null_seqs < 1:
            raise UserError(f"--null-perms {self.null_perms} / --null-seqs {self.null_seqs}:"
                            " need >= 0 permutations and >= 1 sequence")

    def measure_kwargs(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(MeasureConfig)}


@dataclass(kw_only=True)
class RunConfig(MeasureConfig):
    """One condition (``poskernel run``); saved inside the condition's ``cfg.json``."""

    model: str = option(EMBEDDED_DEFAULT, "registry name (see `poskernel models`) or "
                                          "hf:<repo id>")
    dataset: str = option("prose", "wikipedia, code, random, repeated, prose, stdlib-code or "
                                   "text:PATH")
    length: int = option(256, "tokens per sequence (3 up to the model's context)")
    n_seqs: int = option(200, "sequences: first half centering, second half evaluation")
    out: str = option("artifacts/run", "output folder")
    device: str = option("auto", "auto, cpu or cuda")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = option(
        "auto", "forward dtype; auto: float32 on CPU, the model's recommended dtype on a "
        "GPU (statistics accumulate in float32/float64)")
    save_logits: Literal["auto", "yes", "no"] = option(
        "auto", "full logits of 10 eval sequences (auto: Wikipedia-like, T=256); past "
        "T=256 one sequence's long view for the report's head views (yes only)")
    allow_cross_doc: bool = option(False, "let windows span document boundaries "
                                          "(recorded in the data file)")
    compatibility_mode: bool = option(False, "TransformerLens' HookedTransformer weight "
                                             "processing (slower; q/k do not change)")
    attention: Literal["sdpa", "eager"] = option(
        "sdpa", "sdpa: attention through torch's scaled_dot_product_attention with the same "
        "hook points (TransformerLens's own code whenever attn_scores/pattern are hooked); "
        "eager: always TransformerLens's own")
    self_check: bool = option(True, "skip the check at load that the logits measured are "
                                    "those the model's softmax reads (said in provenance)",
                              flag="--no-self-check")
    overwrite: bool = option(False, "rebuild a sequence file that does not match this run")
    progress: bool = option(True, "no progress bars", flag="--quiet")

    def validate(self, spec: ModelSpec | None = None) -> Geometry:
        """Every check that needs no model, so bad input fails before loading one
        (``spec``: of a model already loaded; default: the registry's). Returns the
        run's geometry at ``--length``, checked against ``spec``."""
        super().validate()
        check_dataset(self.dataset)
        spec = spec if spec is not None else resolve(self.model)
        geometry = Geometry.checked(spec, self.length)
        if self.n_seqs < 4 or self.n_seqs % 2:
            raise UserError(f"--n-seqs {self.n_seqs}: need an even number >= 4 (half "
                            "centering, half evaluation)")
        check_device_name(self.device)  # whether this machine has it: where the model loads
        return geometry

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

PER_CONDITION = ("model", "dataset", "length", "overwrite")  # set by the grid per condition


@dataclass(kw_only=True)
class GridConfig(RunConfig):
    """Many conditions from a preset (``poskernel grid``)."""

    preset: str = option("demo", "demo (embedded model, offline) or seed")
    models: tuple[str, ...] | None = option(None, "narrow the preset's models")
    datasets: tuple[str, ...] | None = option(None, "narrow the preset's datasets")
    lengths: tuple[int, ...] | None = option(None, "narrow the preset's lengths")
    n_seqs: int | None = option(None, "sequences per condition (preset default)")
    out: str = option("artifacts/grid", "output folder")
    save_logits: Literal["auto", "yes", "no"] = option(
        "yes", "full logits of 10 eval sequences at T ≤ 256 (head views show a real "
        "sequence's pattern)")
    analyses: tuple[str, ...] = option((), "analyses to run per condition after the "
                                           "tracks, e.g. spectral separable (resumable)")
    shard: str | None = option(None, "I/N: run every N-th condition starting at I "
                                     "(0-based)")
    merge: tuple[str, ...] | None = option(None, "combine the shard folders DIR … into "
                                                 "--out instead of running")
    force: bool = option(False, "redo conditions recorded with a different configuration")
    plan: bool = option(False, "print the plan and stop")
    executor: Literal["here", "slurm", "local"] = option(
        "here", "here: in this process; slurm: one job per model on a Slurm cluster; "
        "local: the same jobs as processes on this machine (submitit)")
    slurm_partition: str | None = option(None, "Slurm partition for --executor slurm "
                                               "(default: the cluster's default partition)")
    slurm_gpus_per_task: int | Literal["auto"] = option(
        "auto", "GPUs per job; auto: 1 with --device cuda, none otherwise")
    slurm_cpus_per_task: int | Literal["auto"] = option(
        "auto", "CPUs per job; auto: a node's CPUs (at most 16; 8 beside a GPU)")
    slurm_mem: str = option(
        "auto", "memory per job, e.g. 16G; auto: the model's weights plus the measurement's "
        "budget (--max-memory, 8G by default on CPU) plus 2G")
    slurm_time: int | Literal["auto"] = option(
        "auto", "time limit per job in minutes; auto: estimated from the job's conditions "
        "(at least 30)")

    def validate(self, spec: ModelSpec | None = None) -> None:
        MeasureConfig.validate(self)
        check_device_name(self.device)  # (the jobs' nodes have it, maybe not this one)
        if self.executor == "slurm":
            check_slurm(self)
        for d in self.datasets or ():
            check_dataset(d)
        for m in self.models or ():
            resolve(m)
        if self.n_seqs is not None and (self.n_seqs < 4 or self.n_seqs % 2):
            raise UserError(f"--n-seqs {self.n_seqs}: need an even number >= 4")

    def run_config(self, model: str, dataset: str, length: int, n_seqs: int,
                   **changes) -> RunConfig:
        """The RunConfig of one of the grid's conditions."""
        names = {f.name for f in dataclasses.fields(RunConfig)}
        values = {k: v for k, v in dataclasses.asdict(self).items() if k in names}
        values.update(model=model, dataset=dataset, length=length, n_seqs=n_seqs,
                      save_logits=self.save_logits if length <= 256 else "no", **changes)
        return RunConfig(**values)
