"""Half-precision forwards and the automatic batch size."""

import numpy as np
import pytest
import torch
from tiny_models import VOCAB, tiny_loaded

import poskernel_tl as pk
from poskernel_tl import sizes
from poskernel_tl.hooks.fast_attention import set_attention
from poskernel_tl.measurement.measure import choose_scores_path
from poskernel_tl.models.loading import forward_dtype
from poskernel_tl.models.registry import resolve
from poskernel_tl.plan import batching
from poskernel_tl.reducers.track_a_result import STRIP


def _tokens(n, T, seed):
    return torch.randint(3, VOCAB, (n, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("arch", ["llama", "olmo", "gpt2"])
def test_bf16_forward_r2_within_0_01_of_float32(arch, device, tiny_tokenizer):
    ev, cen = _tokens(12, 64, 1), _tokens(12, 64, 2)
    runs = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = tiny_loaded(arch, tiny_tokenizer, device=device, dtype=dtype)
        # the default attention path (TransformerLens's eager path fails in half precision
        # on OLMo with current transformers: float32 cos/sin promote its q/k)
        assert set_attention(model.bridge, "sdpa") == "sdpa"
        assert model.dtype == dtype
        runs[dtype] = pk.measure(model, ev, cen, batch_size=4, progress=False, null_perms=0)
    full, half = runs[torch.float32], runs[torch.bfloat16]
    assert half.provenance["dtype"] == "bfloat16"
    assert half.provenance["scores_from"] == "lag sums of q and k"  # not the bf16 scores
    for name in ("r2_pooled", "r2_gram", "r2_gram_raw", "r2_pooled_nosink"):
        a, b = getattr(full, name), getattr(half, name)
        assert np.isfinite(b).all()
        assert np.abs(a - b).max() < 0.01, (name, np.abs(a - b).max())
    diff = np.abs(full.r2_per_seq - half.r2_per_seq).mean()
    assert diff < 0.01


def test_hooked_scores_only_when_asked_for(tiny_tokenizer):
    """auto: Track A from q and k (no T×T logits, in any dtype); hook: the reference."""
    assert choose_scores_path(tiny_loaded("llama", tiny_tokenizer), "auto") is False
    half = tiny_loaded("llama", tiny_tokenizer, dtype=torch.bfloat16)
    assert choose_scores_path(half, "auto") is False
    assert choose_scores_path(half, "qk") is False
    assert choose_scores_path(half, "hook") is True  # asked for explicitly


def test_auto_dtype_is_float32_on_cpu_and_the_recommended_one_on_cuda():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert forward_dtype("auto", cpu, resolve("llama-3.2-1b")) == torch.float32
    assert forward_dtype("auto", cuda, resolve("smollm2-135m")) == torch.bfloat16
    assert forward_dtype("auto", cuda, resolve("gpt2")) == "auto"  # the checkpoint's own
    assert forward_dtype("float16", cuda, resolve("gpt2")) == torch.float16
    with pytest.raises(ValueError, match="--dtype"):
        pk.load_model("gpt2", dtype="float8")


def test_auto_batch_size_follows_free_memory(tiny_tokenizer):
    """The analyses' automatic batch size: half the free memory, T×T scores counted."""
    model = tiny_loaded("llama", tiny_tokenizer)
    per = batching.per_sequence_bytes(model, 64, materialised=True)
    fixed = batching.fixed_bytes(model, 64, 100)
    assert per > 8 * 4 * 64 * 64 * 4  # at least the score copies of 4 heads
    enough = int(2 * (fixed + 3 * per)) + 1  # half of it is budgeted
    assert batching.auto_batch_size(model, 64, 100, free=enough) == 3
    assert batching.auto_batch_size(model, 64, 100, free=0) == 1  # never below one
    assert batching.auto_batch_size(model, 64, 100, free=1 << 40) == batching.CAP["cpu"]
    assert batching.auto_batch_size(model, 64, 2, free=1 << 40) == 2  # not above n
    # longer sequences: quadratically more per sequence where scores are formed, and
    # linearly where they are not (sdpa attention, Track A from lag sums)
    assert batching.per_sequence_bytes(model, 128, materialised=True) > 2.5 * per
    assert batching.per_sequence_bytes(model, 64, materialised=False) < per
    # affine in T but for Hugging Face's [T, T] float masks (past Track A's strip of STRIP
    # keys, whose width stops growing with T there)
    masks = batching.mask_kinds(model) * 4
    lean = [batching.per_sequence_bytes(model, t, False) - masks * t * t for t in (128, 256, 512)]
    assert STRIP < 128 and lean[2] - lean[1] == 2 * (lean[1] - lean[0]) > 0
    assert batching.free_memory(torch.device("cpu")) > 0


def test_cpu_batches_hold_at_most_cpu_tokens():
    """On CPU, "auto" keeps a batch within CPU_TOKENS tokens (long sequences run 1 or 2 at
    a time), never below one sequence; a GPU keeps its cap."""
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert batching.device_cap(cpu, 256) == batching.CAP["cpu"]
    assert batching.device_cap(cpu, batching.CPU_TOKENS // 2) == 2
    assert batching.device_cap(cpu, batching.CPU_TOKENS) == 1
    assert batching.device_cap(cpu, 4 * batching.CPU_TOKENS) == 1
    assert batching.device_cap(gpu, batching.CPU_TOKENS) == batching.CAP["cuda"]


@pytest.mark.parametrize("bad", [0, -1, "x", "1.5"])
def test_bad_batch_sizes_are_refused(bad):
    with pytest.raises(ValueError, match="--batch-size"):
        sizes.check_batch_size(bad)


def test_measure_with_auto_batch_records_the_size_it_chose(monkeypatch, tiny_tokenizer):
    model = tiny_loaded("llama", tiny_tokenizer)
    work = batching.Workload(32, 4, 0, model.attention != "sdpa", True, 0, False, 4)
    one, two = (batching.estimate_peak(model, work, b, 2) for b in (1, 2))
    free = (one + two) / 2 / batching.AUTO_FRACTION  # room for batch 1 only
    monkeypatch.setattr(batching, "free_memory", lambda dev: int(free))
    res = pk.measure(model, _tokens(4, 32, 3), progress=False, null_perms=0)
    assert res.config["batch_size"] == 1 and res.config["max_memory"] == "auto"
    fixed = pk.measure(model, _tokens(4, 32, 3), batch_size=4, progress=False, null_perms=0,
                       max_memory="4G")
    np.testing.assert_allclose(res.r2_pooled, fixed.r2_pooled, atol=1e-9)
    np.testing.assert_allclose(res.r2_gram, fixed.r2_gram, atol=1e-6)
