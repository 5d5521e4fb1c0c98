"""One run's geometry (``models/geometry.py``): each layer's kept offsets read from the
model's own layers, the length checked in one place, and one value handed from the run to
every reducer and kept by the result."""

import pytest
import torch
from tiny_models import arch_loaded, tiny_loaded

import poskernel_tl as pk
from poskernel_tl.errors import UserError
from poskernel_tl.measurement import measure as measure_module
from poskernel_tl.models.geometry import Geometry
from poskernel_tl.plan.config import RunConfig
from poskernel_tl.run.runner import run_condition


def test_windows_are_read_per_layer(tiny_tokenizer):
    """Tiny Gemma 3: three 16-token sliding windows and one global layer."""
    spec = arch_loaded("gemma3", tiny_tokenizer).spec
    g = Geometry.of(spec, 40)
    assert g.lags == (15, 15, 39, 15) and g.n_layers == 4 and g.causal and g.windowed
    assert [m.last for m in g.masks] == [15, 15, 39, 15]
    assert [m.window_last for m in g.masks] == [15, 15, None, 15]
    assert g.mask(2).last == 39 and g.mask(2).whole
    short = Geometry.of(spec, 12)  # shorter than the window: every layer keeps everything
    assert short.lags == (11,) * 4 and not short.windowed
    assert all(m.whole for m in short.masks)


def test_a_length_is_refused_in_one_line(tiny_tokenizer):
    spec = tiny_loaded("gpt2", tiny_tokenizer).spec
    for length, phrase in ((2, "at least 3 tokens"), (spec.n_ctx + 1, "exceeds")):
        with pytest.raises(UserError, match=phrase) as err:
            Geometry.checked(spec, length)
        assert "\n" not in str(err.value) and str(length) in str(err.value)
    assert Geometry.checked(spec, spec.n_ctx) == Geometry.of(spec, spec.n_ctx)


def test_a_run_checks_its_length_once_and_hands_the_geometry_down(tiny_tokenizer, tmp_path,
                                                                   monkeypatch):
    """``poskernel run`` on a loaded model: one check, and the geometry it made is the one
    every evaluation pass's reducers are built from and the one the result reports."""
    model = tiny_loaded("llama", tiny_tokenizer)
    made, seen = [], []
    checked = Geometry.checked.__func__

    def counted(cls, spec, length, what="--length"):
        made.append(checked(cls, spec, length, what))
        return made[-1]

    def spied(model, geometry, *args, **kwargs):
        seen.append(geometry)
        return build(model, geometry, *args, **kwargs)

    build = measure_module.eval_reducers
    monkeypatch.setattr(Geometry, "checked", classmethod(counted))
    monkeypatch.setattr(measure_module, "eval_reducers", spied)
    cfg = RunConfig(model=model.spec.name, dataset="random", length=24, n_seqs=4,
                    out=str(tmp_path), batch_size=2, progress=False, null_perms=0)
    result, _ = run_condition(cfg, model=model)
    assert len(made) == 1 and seen and all(g is made[0] for g in seen)
    assert result.geometry == made[0] == Geometry.of(model.spec, 24)
    # called on its own, pk.measure makes (and checks) the geometry of its tokens
    pk.measure(model, torch.randint(3, 200, (2, 16)), progress=False, null_perms=0)
    assert len(made) == 2 and made[1].length == 16 and seen[-1] is made[1]
    with pytest.raises(ValueError, match="for 24 tokens, the sequences have 16"):
        pk.measure(model, torch.randint(3, 200, (2, 16)), progress=False, geometry=made[0])
