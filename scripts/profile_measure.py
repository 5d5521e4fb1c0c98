"""Where a measurement's time goes: CPU seconds of each reducer inside `pk.measure`.

    python scripts/profile_measure.py LENGTH N [--threads 1] [--null-seqs 8]

Runs the embedded default model (SmolLM2-135M) on N random-token sequences of LENGTH
(N/2 centering + N/2 evaluation, in the batches `pk.measure` picks on this device), with
every reducer's `update` and `result` wrapped in a process-CPU timer, after timing the
bare forward (stopped after the last layer, no reducer) on the same sequences. Prints
each line as a total, per sequence of the run and per evaluation sequence; fixed costs
(the permutation null on `--null-seqs` sequences, Track B's fit) are read as totals.
"""

import argparse
import collections
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

import poskernel_tl as pk  # noqa: E402
import poskernel_tl.reducers as reducers  # noqa: E402
from poskernel_tl.measurement.measure import forward_pass  # noqa: E402
from poskernel_tl.plan.allocator import reuse_freed_memory  # noqa: E402
from poskernel_tl.plan.batching import device_cap  # noqa: E402
from poskernel_tl.statistics.registry import STATISTICS  # noqa: E402

SECONDS: dict[str, float] = collections.defaultdict(float)


def timed_method(cls: type, name: str) -> None:
    """Wrap ``cls.name`` so that its CPU seconds add up under "Class.name"."""
    inner = getattr(cls, name)

    def wrapper(self, *args, **kwargs):
        t0 = time.process_time()
        try:
            return inner(self, *args, **kwargs)
        finally:
            SECONDS[f"{cls.__name__}.{name}"] += time.process_time() - t0

    setattr(cls, name, wrapper)


def reducer_classes() -> list[type]:
    """The engine's reducers and every registered statistic's (the ``*Reducer`` classes of
    the module that declares it)."""
    found = [getattr(reducers, name) for name in reducers.__all__ if name.endswith("Reducer")]
    for stat in STATISTICS.values():
        module = sys.modules[stat.part.__module__]
        found += [c for name, c in vars(module).items() if name.endswith("Reducer")
                  and isinstance(c, type) and c.__module__ == module.__name__]
    return list(dict.fromkeys(found))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("length", type=int)
    ap.add_argument("n", type=int, help="sequences (half centering, half evaluation)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--null-seqs", type=int, default=8)
    ap.add_argument("--max-memory", default="auto")
    args = ap.parse_args()
    reuse_freed_memory()  # as the poskernel command (POSKERNEL_MALLOC=default: glibc's own)
    torch.set_num_threads(args.threads)
    for cls in reducer_classes():
        timed_method(cls, "update")
        timed_method(cls, "result")
    model = pk.load_model("smollm2-135m", device="cpu", attention="sdpa", progress=False)
    ids = torch.randint(100, model.bridge.cfg.d_vocab - 100, (args.n, args.length),
                        generator=torch.Generator().manual_seed(0))
    t0 = time.process_time()
    forward_pass(model, ids, lambda: [], device_cap(model.device, args.length), "bare forward",
                 progress=False)
    SECONDS["bare forward (stopped)"] = time.process_time() - t0
    half = args.n // 2
    t0 = time.process_time()
    pk.measure(model, ids[half:], ids[:half], progress=False, null_seqs=args.null_seqs,
               max_memory=args.max_memory)
    SECONDS["pk.measure, whole"] = time.process_time() - t0
    n_eval = args.n - half
    print(f"T = {args.length}, {half} centering + {n_eval} evaluation sequences, "
          f"{args.threads} thread(s); CPU seconds")
    for key, sec in sorted(SECONDS.items(), key=lambda kv: -kv[1]):
        print(f"{key:28s} {sec:9.2f} total  {sec / args.n:7.2f} per sequence  "
              f"{sec / n_eval:7.2f} per evaluation sequence")


if __name__ == "__main__":
    main()
