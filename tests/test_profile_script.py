"""scripts/profile_measure.py on the embedded SmolLM2 at a short length: every reducer of a
measurement is timed, and what the reducers took fits inside the whole run."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.smollm2
@pytest.mark.slow  # a script that times pk.measure, whose path on SmolLM2 default tests take
def test_profile_measure_times_every_reducer():
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "profile_measure.py"),
                           "64", "4", "--null-seqs", "2"], capture_output=True, text=True,
                          env=env, timeout=600, check=True)
    rows = dict(re.findall(r"^(\S[^\d]*?)\s+([\d.]+) total", proc.stdout, re.M))
    for name in ("TrackAReducer.update", "GramReducer.update", "GramReducer.result",
                 "MomentsReducer.update", "PermNullReducer.update",
                 "FreqUsageReducer.update", "bare forward (stopped)", "pk.measure, whole"):
        assert name in rows, proc.stdout
    reducers = sum(float(v) for k, v in rows.items() if "Reducer." in k)
    assert 0 < reducers <= float(rows["pk.measure, whole"])
    assert "2 centering + 2 evaluation sequences" in proc.stdout
