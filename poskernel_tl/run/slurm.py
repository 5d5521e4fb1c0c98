"""What a grid job asks Slurm for, and whether the cluster can give it.

:func:`plan_request` derives one job's request from the grid's options and its
conditions: GPUs from ``--device`` (none on a CPU run), CPUs from the partition's nodes,
memory from the model's weights and the measurement's memory budget (the budget the
job's own plan then fits into, :mod:`poskernel_tl.plan.batching`), time from the job's
tokens; every ``--slurm-*`` flag overrides its part. :func:`check_request` compares the
request with what ``sinfo`` reports of the partition's nodes, so a request no node can
satisfy is a :class:`~poskernel_tl.errors.UserError` naming the flag to change, before
anything is submitted (Slurm would refuse a GPU request on a node without GRES, and keep
a job asking for more CPUs than any node has pending for ever).
"""

import math
import re
import shutil
import subprocess
from dataclasses import dataclass

from poskernel_tl.errors import UserError
from poskernel_tl.models.registry import resolve
from poskernel_tl.sizes import GiB, parse_memory

MiB = 1 << 20
CPU_BUDGET = 8 * GiB  # the measurement's memory on a CPU node unless --max-memory says
OVERHEAD = 2 * GiB  # Python, torch, the tokenizer, the data
CPUS_MAX = {False: 16, True: 8}  # --slurm-cpus-per-task auto, without / with a GPU
# time auto: model load + tokens × 2·params multiply-adds at these sustained rates (on CPU
# per core; the grid's own passes and fits included), a safety factor, rounded up
LOAD_MIN, MIN_TIME, STEP_MIN, SAFETY = 10, 30, 15, 3.0
RATE = {False: 5e9, True: 1e12}  # multiply-adds per second, per CPU core / per GPU
SINFO = "%N|%P|%c|%m|%G|%l|%a"


@dataclass(frozen=True)
class Node:
    """One node of a partition, as ``sinfo -N`` reports it."""

    name: str
    partition: str
    cpus: int
    mem_mb: int
    gpus: int
    time_min: int | None  # the partition's time limit; None: infinite
    default: bool  # the cluster's default partition
    up: bool = True


@dataclass(frozen=True)
class Request:
    """One job's resources (``budget``: bytes the job's measurement may use on a CPU
    node, passed to it as ``--max-memory``; None: the job's own default)."""

    partition: str | None
    gpus: int
    cpus: int
    mem_mb: int
    time_min: int
    budget: int | None = None
    gpus_from: str = "--slurm-gpus-per-task"  # the flag that asked for the GPUs

    def sbatch_parameters(self) -> dict:
        """submitit's SlurmExecutor parameters (its names for sbatch's options)."""
        params = dict(job_name="poskernel", time=self.time_min, nodes=1, ntasks_per_node=1,
                      cpus_per_task=self.cpus, mem=f"{self.mem_mb}M")
        if self.gpus:
            params["gpus_per_node"] = self.gpus
        if self.partition:
            params["partition"] = self.partition
        return params


def slurm_minutes(text: str) -> int | None:
    """Slurm's time format ([days-]hours:minutes:seconds, minutes:seconds, minutes) in
    minutes, rounded down; None for infinite/unlimited."""
    text = text.strip()
    if text.lower() in ("infinite", "unlimited", "n/a", ""):
        return None
    days, _, rest = text.rpartition("-")
    parts = [int(x) for x in rest.split(":")]
    if len(parts) == 3:
        h, m, s = parts
    elif days:  # days-hours[:minutes]
        h, m, s = parts[0], (parts[1] if len(parts) > 1 else 0), 0
    else:  # minutes[:seconds]
        h, m, s = 0, parts[0], (parts[1] if len(parts) > 1 else 0)
    return int(days or 0) * 1440 + h * 60 + m + s // 60


def gres_gpus(text: str) -> int:
    """GPUs in a node's GRES string (``gpu:4``, ``gpu:a100:2(S:0-1)``, ``(null)``)."""
    total = 0
    for item in re.sub(r"\([^)]*\)", "", text).split(","):
        fields = item.strip().split(":")
        if fields[0] == "gpu" and len(fields) > 1 and fields[-1].isdigit():
            total += int(fields[-1])
    return total


def parse_sinfo(text: str) -> list[Node]:
    """The nodes in the output of ``sinfo -h -N -o`` :data:`SINFO`."""
    nodes = []
    for line in text.splitlines():
        f = line.strip().split("|")
        if len(f) != 7:
            continue
        mem = re.match(r"\d+", f[3])
        nodes.append(Node(f[0], f[1].rstrip("*"), int(re.match(r"\d+", f[2]).group()),
                          int(mem.group()) if mem else 0, gres_gpus(f[4]),
                          slurm_minutes(f[5]), f[1].endswith("*"), f[6] == "up"))
    return nodes


def cluster_nodes() -> list[Node] | None:
    """Every node of every partition (None: no ``sinfo`` here)."""
    if shutil.which("sinfo") is None:
        return None
    run = subprocess.run(["sinfo", "-h", "-N", "-o", SINFO], capture_output=True, text=True,
                         timeout=60)
    if run.returncode != 0:
        raise UserError(f"--executor slurm: sinfo failed ({run.stderr.strip() or 'no output'});"
                        " is the Slurm controller reachable from here?")
    return parse_sinfo(run.stdout)


def partition_nodes(nodes: list[Node], partition: str | None) -> tuple[str, list[Node]]:
    """The nodes of ``partition`` (None: the default partition) and its name."""
    names = sorted({n.partition for n in nodes})
    if partition is None:
        default = [n.partition for n in nodes if n.default]
        if not default:
            raise UserError("--executor slurm: the cluster has no default partition; pass "
                            f"--slurm-partition (one of {', '.join(names) or 'none'})")
        partition = default[0]
    mine = [n for n in nodes if n.partition == partition]
    if not mine:
        raise UserError(f"--slurm-partition {partition}: no such partition; sinfo lists "
                        f"{', '.join(names) or 'none'}")
    return partition, mine


def approx_params(model: str) -> float:
    """The model's parameters, roughly (12·layers·d² blocks + a 50k-token embedding and
    unembedding), from the registry's spec alone: for memory and time, before loading."""
    try:
        spec = resolve(model)
        d = spec.n_heads * spec.d_head
        return float(12 * spec.n_layers * d * d + 2 * 50_000 * d)
    except (UserError, TypeError, AttributeError):  # an hf: id not at hand: say 1B
        return 1e9


def wants_gpu(cfg) -> int:
    return 1 if str(cfg.device).startswith("cuda") else 0


def estimate_minutes(conds, params: float, gpus: int, cpus: int, n_analyses: int) -> int:
    """``--slurm-time auto``: load + the job's tokens at :data:`RATE`, × :data:`SAFETY`."""
    macs = sum(c.n_seqs * c.length for c in conds) * 2 * params * (1 + 0.5 * n_analyses)
    rate = RATE[True] * gpus if gpus else RATE[False] * cpus
    minutes = LOAD_MIN + SAFETY * macs / rate / 60
    return max(MIN_TIME, STEP_MIN * math.ceil(minutes / STEP_MIN))


def plan_request(cfg, conds, nodes: list[Node] | None) -> Request:
    """The request of the job that runs ``conds`` (one model). ``nodes``: sinfo's (None:
    unknown; then the defaults assume a 16-CPU node)."""
    partition, mine = (cfg.slurm_partition, []) if nodes is None else \
        partition_nodes(nodes, cfg.slurm_partition)
    auto_gpus = cfg.slurm_gpus_per_task == "auto"
    gpus = wants_gpu(cfg) if auto_gpus else cfg.slurm_gpus_per_task
    cpus = cfg.slurm_cpus_per_task
    if cpus == "auto":
        cpus = min(CPUS_MAX[bool(gpus)], max((n.cpus for n in mine), default=16))
    params = approx_params(conds[0].model)
    weights = int(params * 4 * 1.2)  # float32 on the host while loading, + 20 %
    budget, mem = None, parse_memory(cfg.slurm_mem)
    if not gpus:
        budget = parse_memory(cfg.max_memory)
        if budget is None:
            room = max((n.mem_mb for n in mine), default=0) * MiB - weights - OVERHEAD
            budget = CPU_BUDGET if not mine else max(GiB, min(CPU_BUDGET, int(room * 0.9)))
        if mem is not None:  # the measurement fits what the job was given
            budget = max(256 * MiB, mem - weights - OVERHEAD)
    if mem is None:
        mem = weights + OVERHEAD + (budget if budget is not None else 2 * weights)
    time = cfg.slurm_time
    if time == "auto":
        time = estimate_minutes(conds, params, gpus, cpus, len(cfg.analyses))
        limit = min((n.time_min for n in mine if n.time_min), default=None)
        time = min(time, limit) if limit else time
    return Request(partition, gpus, cpus, math.ceil(mem / MiB), time, budget,
                   f"--device {cfg.device}" if auto_gpus else "--slurm-gpus-per-task")


def check_request(req: Request, nodes: list[Node] | None) -> None:
    """A UserError naming the flag to change where no node of the partition can run the
    job (nothing to check without ``sinfo``)."""
    if nodes is None:
        return
    part, mine = partition_nodes(nodes, req.partition)
    where = f"partition {part}"
    most = lambda attr: max(getattr(n, attr) for n in mine)
    if req.gpus > most("gpus"):
        have = f"at most {most('gpus')} GPUs a node" if most("gpus") else "no GPUs (no gpu GRES)"
        asked = f"{req.gpus_from} {req.gpus}" if req.gpus_from.startswith("--slurm") else \
            f"{req.gpus_from} asks for {req.gpus} GPU"
        raise UserError(f"{asked}: {where} has {have}; pass a GPU partition with "
                        f"--slurm-partition, or --slurm-gpus-per-task {most('gpus')}")
    if req.cpus > most("cpus"):
        raise UserError(f"--slurm-cpus-per-task {req.cpus}: the nodes of {where} have at "
                        f"most {most('cpus')} CPUs; pass --slurm-cpus-per-task "
                        f"{most('cpus')} or less")
    if req.mem_mb > most("mem_mb"):
        raise UserError(f"--slurm-mem {req.mem_mb}M: the nodes of {where} have at most "
                        f"{most('mem_mb')}M; pass --slurm-mem {most('mem_mb')}M or less "
                        "(the measurement plans itself into what it gets)")
    limit = mine[0].time_min
    if limit is not None and req.time_min > limit:
        raise UserError(f"--slurm-time {req.time_min}: {where} allows at most {limit} "
                        f"minutes; pass --slurm-time {limit} or less (a rerun resumes)")
    if not any(n.gpus >= req.gpus and n.cpus >= req.cpus and n.mem_mb >= req.mem_mb
               for n in mine):
        raise UserError(f"no node of {where} has {req.cpus} CPUs, {req.mem_mb}M and "
                        f"{req.gpus} GPUs together; lower --slurm-cpus-per-task or --slurm-mem")
    if not any(n.up for n in mine):
        raise UserError(f"{where} is not up (sinfo); choose another with --slurm-partition")
