"""``poskernel grid --executor slurm``: the grid as cluster jobs, through submitit.

One job per model (the model is loaded once and runs all its conditions; the seed grid
is then 6 jobs for 6 GPUs). Each job runs :func:`poskernel_tl.run.grid.run_grid` into its
own folder ``OUT/jobs/<model>`` (a manifest and lock of its own, so a resubmission
resumes it), and when every job has finished the submitting process merges the job
folders into ``OUT`` (hard links: no second copy on disk) and writes the summary table.
submitit's ``local`` cluster runs the same jobs as processes on this machine, which is
how the tests exercise this path without a cluster.
"""

import re
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from poskernel_tl.errors import UserError
from poskernel_tl.io import save_csv
from poskernel_tl.plan.config import GridConfig
from poskernel_tl.progress import tqdm
from poskernel_tl.run.grid import SUMMARY_CSV, Condition, merge, run_grid

JOBS_DIR = "jobs"
SUBMITIT_DIR = "submitit"
EXECUTORS = ("slurm", "local")


class GridJobError(RuntimeError):
    """One or more jobs failed; the message names them and their log files."""


@dataclass
class SlurmOptions:
    partition: str | None = None
    gpus_per_task: int = 1
    time_min: int = 240
    cpus_per_task: int = 8


def run_job(conds: list[Condition], opts: GridConfig, load=None) -> pd.DataFrame:
    """What one job runs (module level, so submitit can pickle it by reference)."""
    return run_grid(conds, opts, load=load)


def by_model(conds: list[Condition]) -> dict[str, list[Condition]]:
    groups: dict[str, list[Condition]] = {}
    for c in conds:
        groups.setdefault(c.model, []).append(c)
    return groups


def _reason(err: BaseException) -> str:
    """The exception line of a failed job's traceback (submitit puts it in the message)."""
    lines = [x.strip() for x in str(err).splitlines() if x.strip()]
    raised = [x for x in lines if re.match(r"[A-Za-z_][\w.]*(Error|Exception)\b", x)]
    return (raised or lines or [type(err).__name__])[-1]


def executor_parameters(cluster: str, slurm: SlurmOptions) -> dict:
    """What :func:`make_executor` passes to ``AutoExecutor.update_parameters``."""
    params = dict(name="poskernel", timeout_min=slurm.time_min, tasks_per_node=1, nodes=1)
    if cluster == "slurm":
        params.update(gpus_per_node=slurm.gpus_per_task, cpus_per_task=slurm.cpus_per_task)
        if slurm.partition:
            params["slurm_partition"] = slurm.partition
    return params


def make_executor(cluster: str, folder: Path, slurm: SlurmOptions):
    if cluster not in EXECUTORS:
        raise UserError(f"--executor {cluster}: choose one of {', '.join(EXECUTORS)}")
    try:
        import submitit
    except ImportError as err:
        raise UserError("--executor needs submitit: pip install submitit") from err
    if cluster == "slurm" and shutil.which("srun") is None:
        raise UserError("--executor slurm: no Slurm on this machine (srun not found); "
                         "submit from a login node, or use --shard I/N with any scheduler")
    executor = submitit.AutoExecutor(folder=folder, cluster=cluster)
    executor.update_parameters(**executor_parameters(cluster, slurm))
    return executor


def submit_grid(conds: list[Condition], opts: GridConfig, cluster: str = "slurm",
                slurm: SlurmOptions | None = None, load=None, poll_s: float = 5.0
                ) -> pd.DataFrame:
    """Submit one job per model, wait for all of them (a progress bar over jobs), merge
    their folders into ``opts.out`` and return the summary table. ``load``: a picklable
    model loader handed to each job (default: the registry's)."""
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    slurm = slurm or SlurmOptions(partition=opts.slurm_partition,
                                  gpus_per_task=opts.slurm_gpus_per_task,
                                  time_min=opts.slurm_time)
    executor = make_executor(cluster, out / SUBMITIT_DIR, slurm)
    groups = by_model(conds)
    folders = {m: out / JOBS_DIR / m for m in groups}
    jobs = {}
    for model, group in groups.items():
        job_opts = replace(opts, out=str(folders[model]), progress=False)
        jobs[model] = executor.submit(run_job, group, job_opts, load)
    print(f"submitted {len(jobs)} {cluster} job(s): " +
          ", ".join(f"{m} ({j.job_id})" for m, j in jobs.items()))
    pending = dict(jobs)
    with tqdm(total=len(jobs), desc="jobs", unit="job", disable=not opts.progress) as bar:
        while pending:
            for model in [m for m, j in pending.items() if j.done()]:
                del pending[model]
                bar.update()
            if pending:
                time.sleep(poll_s)
    tables, failed = [], []
    for model, job in jobs.items():
        try:
            tables.append(job.result())
        except Exception as err:  # submitit's FailedJobError, UncompletedJobError, ...
            failed.append(f"{model} (job {job.job_id}): {_reason(err)}; log: "
                          f"{job.paths.stderr}")
    done = [folders[m] for m in jobs if (folders[m] / "manifest.json").exists()]
    if done:
        merge(done, out)
    table = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
    if tables:
        save_csv(table, out / SUMMARY_CSV)
    if failed:
        raise GridJobError("job(s) failed; their complete conditions were merged, rerun "
                           "the same command to redo the rest:\n  " + "\n  ".join(failed))
    return table
