"""What the scheduler says of a job: ``squeue`` while Slurm remembers it (pending,
running, and for ``MinJobAge`` after it ended), then ``sacct`` where the cluster keeps
accounting. A job neither knows is :data:`GONE`: it left the queue, and without
accounting nothing says how (the caller decides it failed unless a result is there).
"""

import shutil
import subprocess
from dataclasses import dataclass

GONE = "GONE"
UNKNOWN = "UNKNOWN"
ENDED = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL",
         "PREEMPTED", "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT", "FINISHED"}
QUIET_REASONS = {"", "None", "(null)"}


@dataclass(frozen=True)
class JobState:
    """A job's state (PENDING, RUNNING, CANCELLED, TIMEOUT, OUT_OF_MEMORY, FAILED, ...),
    the scheduler's reason (e.g. why it pends) and whether the job has ended."""

    state: str
    reason: str = ""
    final: bool | None = None

    def __post_init__(self):
        if self.final is None:
            object.__setattr__(self, "final", self.state in ENDED)

    def __str__(self) -> str:
        if self.reason in QUIET_REASONS:
            return self.state
        return f"{self.state} ({self.reason})"


def _run(cmd: list[str]) -> subprocess.CompletedProcess | None:
    """``cmd``'s outcome; None where it is missing or hangs."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return None


def parse_state(text: str) -> JobState | None:
    """The first line of ``STATE|REASON`` (sacct writes e.g. ``CANCELLED by 0``)."""
    lines = [x for x in text.splitlines() if x.strip()]
    if not lines:
        return None
    state, _, reason = lines[0].strip().partition("|")
    word, _, rest = state.partition(" ")
    return JobState(word.rstrip("+"), reason.strip() or rest.strip())


def squeue_state(job_id: str) -> JobState | None:
    """None where the controller does not know the job (any more); UNKNOWN where squeue
    itself failed (e.g. the controller is briefly unreachable): not an end, ask again."""
    run = _run(["squeue", "-h", "--states=all", "-j", str(job_id), "-o", "%T|%r"])
    if run is None or (run.returncode != 0 and "Invalid job id" not in run.stderr):
        said = (run.stderr.strip().splitlines() or [""])[-1] if run is not None else ""
        return JobState(UNKNOWN, f"squeue: {said or 'no answer'}", final=False)
    return parse_state(run.stdout) if run.returncode == 0 else None


def sacct_state(job_id: str) -> JobState | None:
    """None where sacct fails (no accounting: "Slurm accounting storage is disabled") or
    does not know the job yet."""
    run = _run(["sacct", "-n", "-X", "-P", "-j", str(job_id), "-o", "State"])
    return parse_state(run.stdout) if run is not None and run.returncode == 0 else None


def slurm_state(job_id: str) -> JobState:
    state = squeue_state(job_id)
    if state is not None:
        return state
    return sacct_state(job_id) or JobState(GONE, final=False)
