"""The measurement's outputs against a reference written by release 0.2.0 on the same
sequences and batch size (``tests/golden/v0.2.0``, made by ``golden/make_golden.py``):
every table has the same rows and the reference's columns with the same values (the
protocol's columns first, in order), every
array the same values, and the old files still load."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from golden.make_golden import GOLDEN, run

from poskernel_tl.measurement.result import ConditionResult

GOLDEN_DIR = Path(__file__).parent / "golden" / "v0.2.0"
STEM = "tiny-llama_prose_64"
TOL = 1e-6  # float32 forwards on one machine; the sdpa path moves q/k by float noise


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("golden_run")
    run(str(out))
    return out


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in (root / "results").rglob("*")
                  if p.is_file())


def test_the_same_files_are_written(fresh):
    assert set(_files(GOLDEN_DIR)) <= set(_files(fresh))
    seqs_old = torch.load(GOLDEN_DIR / "data" / f"{STEM}_seqs.pt", weights_only=True)
    seqs_new = torch.load(fresh / "data" / f"{STEM}_seqs.pt", weights_only=True)
    assert torch.equal(seqs_old["input_ids"], seqs_new["input_ids"])


@pytest.mark.parametrize("table", ["trackA.csv", "trackB.csv"])
def test_tables_equal_the_reference(fresh, table):
    old = pd.read_csv(GOLDEN_DIR / "results" / f"{STEM}_{table}")
    new = pd.read_csv(fresh / "results" / f"{STEM}_{table}")
    # the protocol's columns first, in its order; the others may move (the note lists it)
    first = {"trackA.csv": 8, "trackB.csv": 7}[table]
    assert list(new.columns[:first]) == list(old.columns[:first])
    assert set(old.columns) <= set(new.columns)
    assert len(new) == len(old)
    for col in old.columns:
        if pd.api.types.is_float_dtype(old[col]):
            assert np.array_equal(np.isnan(new[col]), np.isnan(old[col])), col
            diff = np.nanmax(np.abs(new[col] - old[col]).fillna(0).to_numpy())
            assert diff <= TOL, f"{table} {col}: max |diff| {diff:.2e}"
        else:
            assert new[col].tolist() == old[col].tolist(), col


def _arrays(path: Path) -> dict[str, np.ndarray]:
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    obj = torch.load(path, weights_only=True)
    obj = obj if isinstance(obj, dict) else {"": obj}
    return {k: v.numpy() for k, v in obj.items()}


def test_arrays_equal_the_reference(fresh):
    for rel in _files(GOLDEN_DIR):
        if rel.endswith((".npz", ".pt")):
            old, new = _arrays(GOLDEN_DIR / rel), _arrays(fresh / rel)
            assert set(old) <= set(new), rel
            for key, a in old.items():
                b = new[key]
                assert a.shape == b.shape, (rel, key)
                if np.issubdtype(a.dtype, np.floating):
                    diff = np.nanmax(np.abs(a - b)) if a.size else 0.0
                    assert diff <= TOL * max(1.0, np.nanmax(np.abs(a))), (rel, key, diff)
                else:
                    assert np.array_equal(a, b), (rel, key)


def test_cfg_keeps_the_reference_keys(fresh):
    old = json.loads((GOLDEN_DIR / "results" / f"{STEM}_cfg.json").read_text())
    new = json.loads((fresh / "results" / f"{STEM}_cfg.json").read_text())
    for key in ("model", "dataset", "length", "centered", "n_eval", "n_centering",
                "logits_saved"):
        assert new[key] == old[key], key
    # the spec gains fields with defaults (``causal``): old keys keep their values
    assert {k: new["spec"][k] for k in old["spec"]} == old["spec"]
    assert new["spec"]["causal"] is True
    assert set(old["config"]) <= set(new["config"])


def test_the_reference_still_loads(fresh):
    old = ConditionResult.load(GOLDEN_DIR, GOLDEN["model"], GOLDEN["dataset"],
                               GOLDEN["length"])
    new = ConditionResult.load(fresh, GOLDEN["model"], GOLDEN["dataset"], GOLDEN["length"])
    np.testing.assert_allclose(old.r2_pooled, new.r2_pooled, atol=TOL)
    np.testing.assert_allclose(old.g_gram, new.g_gram, atol=TOL)
    assert sorted(old.logits) == sorted(new.logits)
