"""The measurement's forward never materialises a T × T tensor on the sdpa path, and
every layer says which attention it ran
(:func:`~poskernel_tl.hooks.fast_attention.attention_paths`).

:class:`LargestOutput`, a ``TorchDispatchMode``, sees every ATen operator the forward
dispatches and records the largest tensor any of them returns. It sees operators, not
the scratch memory inside one: on CPU, ``scaled_dot_product_attention`` with
``is_causal=True`` dispatches to ``aten._scaled_dot_product_flash_attention_for_cpu``, a
tiled kernel that returns only the output and a [batch, head_index, query_pos]
log-sum-exp, and whose scratch the mode cannot see, so a second test reads that scratch
from ``torch.profiler``'s allocation records (a fixed set of blocks per thread: 1.06 MB
on 2 threads at T = 1024, 2048 and 4096, where one head's [T, T] float32 scores take 4, 16
and 64 MB). Were torch to take its math fallback instead, that path is built from ATen
operators the mode does see (its [batch, head_index, T, T] product and softmax), and the
first test would fail, as it does for TransformerLens's own attention (the control).
"""

import pytest
import torch
import torch.nn.functional as F
from tiny_models import VOCAB, tiny_loaded
from torch.utils._python_dispatch import TorchDispatchMode

from poskernel_tl.hooks import capture_qk
from poskernel_tl.hooks import fast_attention as fa

LENGTHS = (256, 512)  # T² above every T-linear activation of the tiny Llama at batch 1
FLASH_CPU = "aten._scaled_dot_product_flash_attention_for_cpu.default"


class LargestOutput(TorchDispatchMode):
    """Records the largest tensor (in elements) returned by any operator, and the names
    of the operators that ran."""

    def __init__(self):
        super().__init__()
        self.largest, self.by, self.ops = 0, "", set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops.add(str(func))
        for x in out if isinstance(out, tuple | list) else (out,):
            if isinstance(x, torch.Tensor) and x.numel() > self.largest:
                self.largest, self.by = x.numel(), str(func)
        return out


def _ids(T: int, batch: int = 1) -> torch.Tensor:
    return torch.randint(3, VOCAB, (batch, T), generator=torch.Generator().manual_seed(T))


def _captured_forward(model, ids) -> LargestOutput:
    """The measurement's forward (``capture_qk(stop=True)`` over every layer) under the
    mode; checks that every layer delivered its q/k."""
    seen = []
    with torch.no_grad(), capture_qk(model.bridge, lambda c: seen.append(c.layer), stop=True,
                                     schemes=model.spec.layers) as capture:
        with LargestOutput() as mode:
            capture.forward(ids)
    assert seen == list(range(model.spec.n_layers))
    return mode


@pytest.fixture(scope="module")
def tiny_llama(tiny_tokenizer):
    """The tiny Llama (GQA: 4 query, 2 key-value heads; eager config, as load_model
    loads), on TransformerLens's attention until a test switches it."""
    return tiny_loaded("llama", tiny_tokenizer)


@pytest.mark.parametrize("T", LENGTHS)
def test_sdpa_forward_holds_nothing_quadratic(tiny_llama, T):
    """On the sdpa path the largest tensor of the capture's forward stays below T²
    elements (one head's scores of one sequence); on TransformerLens's eager path the same
    forward returns a [batch, head_index, T, T] tensor (the control)."""
    n_heads = tiny_llama.spec.n_heads
    assert fa.set_attention(tiny_llama.bridge, "eager") == "eager"
    eager = _captured_forward(tiny_llama, _ids(T))
    assert eager.largest >= n_heads * T * T, (eager.largest, eager.by)
    assert fa.set_attention(tiny_llama.bridge, "sdpa") == "sdpa"
    try:
        fast = _captured_forward(tiny_llama, _ids(T))
    finally:
        fa.set_attention(tiny_llama.bridge, "eager")
    assert FLASH_CPU in fast.ops, sorted(o for o in fast.ops if "attention" in o)
    assert fast.largest < T * T, (
        f"T = {T}: {fast.by} returned {fast.largest} elements (T² = {T * T})")


def _largest_allocation(T: int) -> int:
    """The most memory (bytes) any ATen call inside torch's CPU sdpa allocates itself (its
    net "self" allocation in ``torch.profiler``'s memory records: the scratch buffers, a
    math fallback's [batch, head_index, T, T] product) on a [1, 4, T, 16] causal GQA
    attention."""
    from torch.profiler import ProfilerActivity, profile

    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, T, 16, generator=g)
    k, v = (torch.randn(1, 2, T, 16, generator=g) for _ in range(2))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return max(e.self_cpu_memory_usage for e in prof.events())


def test_cpu_flash_kernel_scratch_is_tiled():
    """What the dispatch mode cannot see: the largest allocation inside torch's CPU sdpa
    grows at most like T (its output; the scratch is a fixed set of blocks per thread) —
    from T = 1024 to 4096 by less than 8×, the midpoint between T's 4× and T²'s 16×
    (under ``sdpa_kernel(SDPBackend.MATH)`` it grows 16×: 16 MB to 256 MB)."""
    small, large = _largest_allocation(1024), _largest_allocation(4096)
    assert large < 8 * small, (small, large)


def test_attention_paths_record_each_layer(tiny_llama):
    """sdpa for every layer that ran; the blocker where a hook listens to the scores;
    None for a layer after the capture stopped the forward; :data:`NOT_INSTALLED` on
    TransformerLens's own classes."""
    bridge, ids = tiny_llama.bridge, _ids(32, batch=2)
    assert fa.set_attention(bridge, "sdpa") == "sdpa"
    try:
        fa.clear_attention_paths(bridge)
        assert fa.attention_paths(bridge) == [None, None]
        with torch.no_grad():
            bridge(ids)
            assert fa.attention_paths(bridge) == ["sdpa", "sdpa"]
            fa.clear_attention_paths(bridge)
            assert fa.attention_paths(bridge) == [None, None]
            with capture_qk(bridge, lambda c: None, layers=[0], stop=True,
                            schemes=tiny_llama.spec.layers) as capture:
                capture.forward(ids)
            assert fa.attention_paths(bridge) == ["sdpa", None]
            fa.clear_attention_paths(bridge)
            with capture_qk(bridge, lambda c: None, scores=True, layers=[1],
                            schemes=tiny_llama.spec.layers) as capture:
                capture.forward(ids)
            assert fa.attention_paths(bridge) == [
                "sdpa", "a hook on hook_attn_scores or hook_pattern"]
    finally:
        fa.set_attention(bridge, "eager")
    assert fa.attention_paths(bridge) == [fa.NOT_INSTALLED] * 2


def test_attention_paths_of_gpt2(tiny_tokenizer):
    """The fused-QKV class records its path as its attention runs."""
    model = tiny_loaded("gpt2", tiny_tokenizer)
    assert fa.set_attention(model.bridge, "sdpa") == "sdpa"
    with torch.no_grad():
        model.bridge(_ids(16, batch=2))
    assert fa.attention_paths(model.bridge) == ["sdpa", "sdpa"]
