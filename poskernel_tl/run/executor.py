"""``poskernel grid --executor slurm``: the grid as cluster jobs, through submitit.

One job per model (the model is loaded once and runs all its conditions; the seed grid
is then 6 jobs for 6 GPUs). Each job runs :func:`poskernel_tl.run.grid.run_grid` into its
own folder ``OUT/jobs/<model>`` (a manifest, lock and ``grid.log`` of its own, so a
resubmission resumes it), and when every job has finished the submitting process merges
the job folders into ``OUT`` (hard links: no second copy on disk) and writes the summary
table. What each job asks for comes from :mod:`poskernel_tl.run.slurm` (checked against
``sinfo`` before anything is submitted); while the jobs run, the progress line shows what
the scheduler says of each (:mod:`poskernel_tl.run.slurm_state`: ``squeue``, then
``sacct`` where the cluster has accounting), and a failed job is reported with its state,
its reason and its log. A job stops on SIGTERM (``scancel``, the time limit), where
submitit alone would let it run on. submitit's ``local`` cluster runs the same jobs as
processes on this machine, which is how most tests exercise this path without a cluster.
"""

import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd

from poskernel_tl.errors import UserError, stop_line
from poskernel_tl.io import save_csv
from poskernel_tl.plan.config import GridConfig
from poskernel_tl.progress import tqdm
from poskernel_tl.run.grid import LOG, SUMMARY_CSV, GridCell, merge, run_grid
from poskernel_tl.run.slurm import MiB, Request, check_request, cluster_nodes, plan_request
from poskernel_tl.run.slurm_state import GONE, JobState, slurm_state

JOBS_DIR = "jobs"
SUBMITIT_DIR = "submitit"
EXECUTORS = ("slurm", "local")
GONE_POLLS = 2  # polls a job may be out of the queue without a result before it failed
# pending reasons with which Slurm never starts the job as it was asked (the request
# exceeds what the partition allows): the submitter cancels it and says so
NEVER_STARTS = {"PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit",
                "BadConstraints", "InvalidAccount", "InvalidQOS", "QOSNotAllowed",
                "AccountNotAllowed"}
ADVICE = {"PENDING": "Slurm would never start it as asked, so it was cancelled; change "
                     "the --slurm-* options (`--plan` prints the request)",
          "CANCELLED": "scancel (or an administrator) cancelled it",
          "TIMEOUT": "it reached its time limit: raise --slurm-time",
          "OUT_OF_MEMORY": "it ran out of memory: raise --slurm-mem or lower --max-memory",
          GONE: "it left the queue without a result, and the cluster keeps no accounting "
                "(sacct) to say why"}


class GridJobError(RuntimeError):
    """One or more jobs failed; the message names them, their states and log files."""


def _stop(signum, frame):
    print(stop_line(signum), file=sys.stderr, flush=True)
    raise SystemExit(128 + signum)


def run_job(conds: list[GridCell], opts: GridConfig, load=None) -> pd.DataFrame:
    """What one job runs (module level, so submitit can pickle it by reference). SIGTERM
    ends it (submitit's own handler only logs it), before any further result is written:
    the grid writes atomically and records finished conditions in its manifest."""
    signal.signal(signal.SIGTERM, _stop)
    return run_grid(conds, opts, load=load)


def by_model(conds: list[GridCell]) -> dict[str, list[GridCell]]:
    groups: dict[str, list[GridCell]] = {}
    for c in conds:
        groups.setdefault(c.model, []).append(c)
    return groups


def _reason(err: BaseException | str) -> str:
    """The exception line of a failed job's traceback (submitit puts it in the message)."""
    lines = [x.strip() for x in str(err).splitlines() if x.strip()]
    raised = [x for x in lines if re.match(r"[A-Za-z_][\w.]*(Error|Exception)\b", x)]
    return (raised or lines or [type(err).__name__])[-1]


def _submitit():
    try:
        import submitit
    except ImportError as err:
        raise UserError("--executor needs submitit: pip install submitit") from err
    return submitit


def make_executor(cluster: str, folder: Path, request: Request):
    """submitit's executor for ``cluster`` with ``request``'s resources."""
    if cluster not in EXECUTORS:
        raise UserError(f"--executor {cluster}: choose one of {', '.join(EXECUTORS)}")
    submitit = _submitit()
    if cluster == "local":
        executor = submitit.LocalExecutor(folder=folder)
        executor.update_parameters(timeout_min=request.time_min, nodes=1, tasks_per_node=1)
        return executor
    if shutil.which("srun") is None or shutil.which("sbatch") is None:
        raise UserError("--executor slurm: no Slurm on this machine (srun not found); "
                        "submit from a login node, or use --shard I/N with any scheduler")
    executor = submitit.SlurmExecutor(folder=folder)
    executor.update_parameters(**request.sbatch_parameters())
    return executor


def sbatch_lines(request: Request, folder: Path) -> list[str]:
    """The ``#SBATCH`` lines of the job script submitit writes for ``request``."""
    from submitit.slurm.slurm import _make_sbatch_string

    text = _make_sbatch_string(command="python -u -m submitit.core._submit", folder=folder,
                               **request.sbatch_parameters())
    return [line for line in text.splitlines() if line.startswith("#SBATCH")]


def plan_jobs(conds: list[GridCell], opts: GridConfig, cluster: str = "slurm"
              ) -> dict[str, Request]:
    """Each model's request, checked against the cluster (UserError: it cannot run)."""
    nodes = cluster_nodes() if cluster == "slurm" else None
    requests = {m: plan_request(opts, group, nodes) for m, group in by_model(conds).items()}
    for req in requests.values():
        check_request(req, nodes)
    return requests


def describe_jobs(conds: list[GridCell], opts: GridConfig) -> str:
    """``--executor slurm --plan``: the sbatch lines of every job."""
    out, nodes_known = Path(opts.out), shutil.which("sinfo") is not None
    lines = [] if nodes_known else ["(no sinfo here: the request is not checked against "
                                    "the cluster)"]
    for model, req in plan_jobs(conds, opts).items():
        budget = f"; --max-memory {req.budget // MiB}M in the job" if req.budget else ""
        lines.append(f"job {model}: {len(by_model(conds)[model])} condition(s){budget}")
        lines += ["  " + s for s in sbatch_lines(req, out / SUBMITIT_DIR)]
    return "\n".join(lines)


def job_options(opts: GridConfig, folder: Path, req: Request | None) -> GridConfig:
    """The grid options of one job: its folder; on a Slurm request for no GPU, device cpu
    and the request's memory budget (unless --max-memory says otherwise). ``req`` None:
    a local job, which sees this machine as it is."""
    changes = dict(out=str(folder), progress=False)
    if req is None:
        return replace(opts, **changes)
    if not req.gpus and opts.device == "auto":
        changes["device"] = "cpu"
    if req.budget and opts.max_memory == "auto":
        changes["max_memory"] = f"{req.budget // MiB}M"
    return replace(opts, **changes)


def submit(executor, job_opts: GridConfig, group, load):
    submitit = _submitit()
    try:
        return executor.submit(run_job, group, job_opts, load)
    except submitit.core.utils.FailedJobError as err:  # sbatch refused the request
        raise UserError(f"sbatch refused the job: {_reason(err)}; change the --slurm-* "
                        "options (`--plan` prints the request)") from None


def job_logs(out: Path, models) -> list[Path]:
    """Each job's grid log (``OUT/jobs/<model>/grid.log``)."""
    return [Path(out) / JOBS_DIR / m / LOG for m in models]


def _state(job, cluster: str, gone: dict[str, int]) -> JobState:
    """What the scheduler says of ``job`` now; final once it has ended."""
    if job.paths.result_pickle.exists():
        return JobState("FINISHED")
    if cluster == "local":
        return JobState(job.state, final=job.done())
    state = slurm_state(job.job_id)
    if state.state == GONE:
        gone[job.job_id] = gone.get(job.job_id, 0) + 1
        return JobState(GONE, final=gone[job.job_id] >= GONE_POLLS)
    if state.state == "PENDING" and state.reason in NEVER_STARTS:
        subprocess.run(["scancel", str(job.job_id)], capture_output=True, timeout=60)
        return JobState("PENDING", state.reason, final=True)
    return state


def wait(jobs: dict, cluster: str, progress: bool, poll_s: float) -> dict[str, JobState]:
    """Poll until every job has ended; the bar's line shows the others' states."""
    final: dict[str, JobState] = {}
    gone: dict[str, int] = {}
    with tqdm(total=len(jobs), desc="jobs", unit="job", disable=not progress) as bar:
        while len(final) < len(jobs):
            now = {m: _state(j, cluster, gone) for m, j in jobs.items() if m not in final}
            for model, state in now.items():
                if state.final:
                    final[model] = state
                    bar.update()
            bar.set_postfix_str("; ".join(f"{m} {jobs[m].job_id}: {s}" for m, s in
                                          now.items() if not s.final), refresh=True)
            if len(final) < len(jobs):
                time.sleep(poll_s)
    return final


def outcome(job, state: JobState) -> tuple[object | None, str | None]:
    """(the job's table, None), or (None, why it failed)."""
    if job.paths.result_pickle.exists():
        from submitit.core.utils import pickle_load

        tag, value = pickle_load(job.paths.result_pickle)
        if tag == "success":
            return value, None
        if "timed-out" in str(value):  # submitit's USR2 handler, 90 s before the limit
            return None, f"TIMEOUT: {ADVICE['TIMEOUT']} ({_reason(value)})"
        return None, f"{state.state if state.state != 'FINISHED' else 'FAILED'}: " \
                     f"{_reason(value)}"
    why = ADVICE.get(state.state, "")
    return None, f"{state}" + (f": {why}" if why else "")


def submit_grid(conds: list[GridCell], opts: GridConfig, cluster: str = "slurm",
                load=None, poll_s: float = 5.0) -> pd.DataFrame:
    """Submit one job per model, wait for all of them (a progress bar over jobs, with what
    the scheduler says of each), merge their folders into ``opts.out`` and return the
    summary table. ``load``: a picklable model loader handed to each job (default: the
    registry's)."""
    out = Path(opts.out)
    requests = plan_jobs(conds, opts, cluster)  # refused here, before anything is submitted
    out.mkdir(parents=True, exist_ok=True)
    groups = by_model(conds)
    folders = {m: out / JOBS_DIR / m for m in groups}
    jobs = {}
    for model, group in groups.items():
        executor = make_executor(cluster, out / SUBMITIT_DIR, requests[model])
        slurm = requests[model] if cluster == "slurm" else None
        jobs[model] = submit(executor, job_options(opts, folders[model], slurm),
                             group, load)
    print(f"submitted {len(jobs)} {cluster} job(s): " +
          ", ".join(f"{m} ({j.job_id})" for m, j in jobs.items()), flush=True)
    states = wait(jobs, cluster, opts.progress, poll_s)
    tables, failed = [], []
    for model, job in jobs.items():
        table, why = outcome(job, states[model])
        if why is None:
            tables.append(table)
        else:
            failed.append(f"{model} (job {job.job_id}) {why}; log: {job.paths.stderr}; "
                          f"grid log: {folders[model] / LOG}")
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
