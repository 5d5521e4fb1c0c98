"""The statistic registry: every reducer keeps the protocol (no host sync in ``update``),
a registered statistic reaches the result, its files, ``heads.csv``, the grid summary and
the memory plan, and the docs' "Add a statistic" example runs as written."""

import contextlib
import re
import types
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from softmax_spy import naive_within_r2
from tiny_models import arch_loaded, tiny_loaded
from torch.overrides import TorchFunctionMode

import poskernel_tl as pk
import poskernel_tl.statistics.long_view as long_view
from poskernel_tl import kernels
from poskernel_tl.kernels.dispatch import IN_LAUNCH
from poskernel_tl.measurement import measure as measure_module
from poskernel_tl.measurement.parts import condition_entries, field_columns, head_columns
from poskernel_tl.measurement.result import ConditionResult
from poskernel_tl.plan import batching
from poskernel_tl.statistics import registry
from poskernel_tl.statistics.statistic import StatisticSpec

ROOT = Path(__file__).resolve().parents[1]
T = 24
# what waits for the device: a host copy, a Python number or truth value, a data-dependent
# shape (nonzero, boolean-mask indexing)
SYNCS = {"item", "cpu", "numpy", "tolist", "__bool__", "__int__", "__float__", "__index__",
         "nonzero", "masked_select", "unique", "argwhere"}


def _bool_index(args) -> bool:
    index = args[1] if len(args) > 1 else None
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


class NoSync(TorchFunctionMode):
    """Raises on any call that makes the host wait for the device."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if IN_LAUNCH[0]:  # Triton's interpreter reading CPU tensors: not the reducer's code
            return func(*args, **(kwargs or {}))
        if name in SYNCS or (name == "__getitem__" and _bool_index(args)):
            raise AssertionError(f"{name} waits for the device")
        return func(*args, **(kwargs or {}))


def no_sync(update, seen: set, name: str):
    def checked(batch):
        seen.add(name)
        with NoSync():
            update(batch)
    return checked


@pytest.mark.parametrize("arch,tiled", [
    ("llama", False), ("gpt_oss", False), ("bloom", False), ("gemma2", False),
    # slow on the kernels' path: the CPU path of the same models, and the kernels' path
    # of every architecture in test_kernels.py and test_launch_budget.py, are the default's
    pytest.param("gpt_oss", True, marks=pytest.mark.slow),
    pytest.param("bloom", True, marks=pytest.mark.slow)])
def test_no_reducer_syncs_in_update(arch, tiled, tiny_tokenizer, monkeypatch):
    """Every reducer of a run with every statistic on (the centering means, Track A,
    Track B, whitening, the null, saved logits, the pattern statistics) updates without a
    host sync, on models whose softmax adds sinks, ALiBi or a soft-cap; ``tiled``: on the
    GPU kernels' path (under Triton's interpreter)."""
    if tiled:
        pytest.importorskip("triton")
    model = (tiny_loaded("llama", tiny_tokenizer) if arch == "llama"
             else arch_loaded(arch, tiny_tokenizer))
    seen: set = set()
    real = measure_module.forward_pass

    def spied(model, ids, make_reducers, *args, **kwargs):
        def made():
            reds = make_reducers()
            for red in reds.values() if isinstance(reds, dict) else reds:
                red.update = no_sync(red.update, seen, type(red).__name__)
            return reds
        return real(model, ids, made, *args, **kwargs)

    monkeypatch.setattr(measure_module, "forward_pass", spied)
    ids = torch.randint(3, 290, (8, T), generator=torch.Generator().manual_seed(0))
    whiten = arch == "llama"
    with kernels.forced() if tiled else contextlib.nullcontext():
        pk.measure(model, ids[4:], ids[:4], progress=False, null_perms=2, null_seqs=2,
                   whiten=whiten, logits_for=[0], batch_size=2)
        expected = {"MomentsReducer", "TrackAReducer", "GramReducer", "PermNullReducer",
                    "LogitSaver", "PrevTokenReducer"} | \
            ({"WhitenedGramReducer"} if whiten else set())
        assert expected <= seen
        monkeypatch.setattr(long_view, "VIEW_TOKENS", T // 2)  # past it: the long view
        pk.measure(model, ids[4:], ids[:4], progress=False, logits_for=[0], batch_size=2)
    assert "LongViewReducer" in seen


def test_every_statistic_is_declared_consistently():
    """Names match their parts, per-head columns are [layer, head_index] fields (or
    properties) of the part, and the plan adds every statistic's bytes."""
    for name, stat in registry.STATISTICS.items():
        assert isinstance(stat, StatisticSpec) and stat.name == name == stat.part.NAME
        fields = {f.name: f for f in stat.part.__dataclass_fields__.values()}
        for col in stat.head_columns:  # a field, or a property computed from them
            assert col in fields or isinstance(getattr(stat.part, col, None), property), \
                (name, col)
        assert stat.description


def test_the_plan_counts_a_registered_statistic(tiny_tokenizer, monkeypatch):
    model = tiny_loaded("llama", tiny_tokenizer)
    work = batching.Workload(T, 4, 4)
    before = batching.phase_bytes(model, work, 1, model.spec.n_layers)
    stat = registry.STATISTICS["prev_token"]
    monkeypatch.setitem(registry.STATISTICS, "prev_token", StatisticSpec(
        stat.name, stat.part, stat.build, stat.description,
        state_bytes=lambda model, work: 1 << 30, head_columns=stat.head_columns))
    after = batching.phase_bytes(model, work, 1, model.spec.n_layers)
    assert after["evaluation pass"] - before["evaluation pass"] == (1 << 30) - \
        stat.state_bytes(model, work)


def example_module() -> types.ModuleType:
    text = (ROOT / "docs" / "how-to" / "add-statistic.md").read_text()
    section = text[text.index("# Add a statistic"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert code.startswith("# poskernel_tl/statistics/self_mass.py")
    module = types.ModuleType("self_mass")
    exec(compile(code, "docs/how-to/add-statistic.md", "exec"), module.__dict__)
    return module


def test_the_docs_statistic_runs_end_to_end(tiny_tokenizer, tmp_path, monkeypatch):
    """Registered, the docs' statistic is measured (against the pattern
    TransformerLens's own eager attention gives), saved, loaded, in heads.csv and in the
    grid summary's per-condition values."""
    stat = example_module().STATISTIC
    monkeypatch.setitem(registry.STATISTICS, stat.name, stat)
    model = tiny_loaded("llama", tiny_tokenizer)
    ids = torch.randint(3, 290, (4, T), generator=torch.Generator().manual_seed(3))
    res = pk.measure(model, ids, progress=False, null_seqs=3, dataset="random")
    _, cache = model.bridge.run_with_cache(ids[:3])
    want = np.stack([cache[f"blocks.{L}.attn.hook_pattern"].diagonal(dim1=-2, dim2=-1)
                     .mean((0, -1)).double().numpy() for L in range(model.spec.n_layers)])
    assert np.abs(res.self_mass - want).max() < 1e-5
    res.save(tmp_path)
    back = ConditionResult.load(tmp_path)
    assert np.array_equal(back.self_mass, res.self_mass)
    heads = pd.read_csv(next((tmp_path / "results").glob("*_heads.csv")))
    assert np.allclose(heads["self_mass"], res.self_mass.ravel())
    assert back.condition_values()["self_heads"] == float((res.self_mass > 0.5).mean())


def test_every_declared_head_column_reaches_heads_csv(tiny_tokenizer, tmp_path):
    """Every per-head column a part declares (a Track A field's ``head`` label, a
    statistic's ``head_columns``) is a column of the saved heads.csv equal to the result's
    value; a Track A one equals its own column of trackA.csv."""
    model = tiny_loaded("llama", tiny_tokenizer)
    ids = torch.randint(3, 290, (4, 110), generator=torch.Generator().manual_seed(8))
    res = pk.measure(model, ids, progress=False, null_seqs=3, dataset="random")
    res.save(tmp_path)
    heads = pd.read_csv(next((tmp_path / "results").glob("*_heads.csv")))
    track_a = pd.read_csv(next((tmp_path / "results").glob("*_trackA.csv")))
    declared = head_columns()
    assert {c for c, (part, _, _) in declared.items() if part == "track_a"}
    for col, (part, attr, label) in declared.items():
        assert label and np.allclose(heads[col], np.asarray(getattr(res.parts[part], attr))
                                     .ravel(), equal_nan=True), col
        if part == "track_a":
            first = track_a[track_a["seq_id"] == track_a["seq_id"].iloc[0]]
            assert np.allclose(heads[col], first[col], equal_nan=True), col
    # each field-declared column's mean over heads is a per-condition value (grid summary,
    # atlas), labelled
    values, labels = res.condition_values(), {k: lab for k, lab, _ in condition_entries()}
    for col in field_columns():
        assert values[col] == pytest.approx(float(heads[col].mean())) and col in labels


@pytest.mark.parametrize("arch", ["gpt_oss"])
def test_pattern_rows_are_shared_by_the_pattern_statistics(arch, tiny_tokenizer, monkeypatch):
    """The rows' normalisers are formed once per layer and batch, whichever statistics
    read them."""
    from poskernel_tl.reducers import pattern

    model = arch_loaded(arch, tiny_tokenizer)
    calls = []
    real = pattern.row_logsumexp
    monkeypatch.setattr(pattern, "row_logsumexp",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    ids = torch.randint(3, 290, (4, T), generator=torch.Generator().manual_seed(4))
    pk.measure(model, ids, progress=False, null_seqs=4, batch_size=2)
    assert len(calls) == model.spec.n_layers * 2  # two batches, once per layer each


def test_the_head_view_shows_every_registered_statistic(tiny_tokenizer):
    """pk.inspect_head's rows of the registered statistics equal their values on its own
    pattern (sink mass: mean weight on key 0 over rows t ≥ 1; TransformerLens's score:
    mean weight on key t − 1)."""
    model = tiny_loaded("llama", tiny_tokenizer)
    ids = torch.randint(3, 290, (T,), generator=torch.Generator().manual_seed(6))
    view = pk.inspect_head(model, ids, layer=1, head=2)
    labels = {c: label for s in registry.STATISTICS.values() for c, label in s.head_columns.items()}
    assert set(view.statistics) == set(labels.values())
    p = view.pattern.astype(np.float64)
    assert view.statistics[labels["sink_mass"]] == pytest.approx(p[1:, 0].mean(), abs=1e-6)
    prev = np.mean([p[t, t - 1] for t in range(1, T)]) * (T - 1) / T
    assert view.statistics[labels["tl_prev_token"]] == pytest.approx(prev, abs=1e-6)
    A = torch.as_tensor(view.logits, dtype=torch.float64)[None, None]
    within = naive_within_r2(A, torch.ones_like(A, dtype=torch.bool).tril(-1))[0]
    for col in ("R2_within_row_pooled", "R2_within_row_per_seq"):  # completed as measured
        assert view.statistics[labels[col]] == pytest.approx(within, abs=1e-5)
    assert 0 < view.statistics[labels["hf_share"]] < 1
    assert "Per-head statistics on this sequence" in view.page_data().tables
