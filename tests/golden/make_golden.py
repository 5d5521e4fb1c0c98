"""Write the golden condition of ``tests/test_golden.py``: a tiny Llama (GQA, rotary) on
the offline ``prose`` dataset, T = 64, 8 + 8 sequences, batch 4, logits saved.

Run from the repository root with the release whose outputs are the reference:
``python tests/golden/make_golden.py OUT``; the test compares a fresh run with OUT."""

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conftest import make_tiny_tokenizer  # noqa: E402
from tiny_models import tiny_loaded  # noqa: E402

from poskernel_tl.plan.config import RunConfig  # noqa: E402
from poskernel_tl.run.runner import run_condition  # noqa: E402

GOLDEN = dict(model="tiny-llama", dataset="prose", length=64, n_seqs=16, batch_size=4,
              save_logits="yes", progress=False)


def run(out: str) -> None:
    model = tiny_loaded("llama", make_tiny_tokenizer(tempfile.mkdtemp()))
    run_condition(RunConfig(out=out, **GOLDEN), model=model)


if __name__ == "__main__":
    run(sys.argv[1])
