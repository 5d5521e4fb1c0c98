"""What a grid job asks Slurm for (from the cluster's nodes and the grid), the checks that
refuse what no node can give, and how the scheduler's answers become job states — without
a cluster (`tests/test_slurm.py` runs the same against a real one)."""

from types import SimpleNamespace

import pytest

from poskernel_tl.apps.cli import build_parser, main
from poskernel_tl.errors import UserError
from poskernel_tl.plan.config import GridConfig, check_slurm
from poskernel_tl.run import executor, slurm, slurm_state
from poskernel_tl.run.grid import GridCell
from poskernel_tl.run.slurm import GiB, MiB, Node, check_request, plan_request

SINFO = """cpu01|debug*|2|24105|(null)|infinite|up
gpu01|gpu|32|256000|gpu:a100:4(S:0-1)|1-00:00:00|up
gpu02|gpu|64|512000|gpu:2,tmpdisk:100|1-00:00:00|up
"""
NODES = slurm.parse_sinfo(SINFO)
CONDS = [GridCell("smollm2-135m", "random", 64, 8), GridCell("smollm2-135m", "prose", 64, 8)]


def test_sinfo_is_read_node_by_node():
    cpu, gpu1, gpu2 = NODES
    assert cpu == Node("cpu01", "debug", 2, 24105, 0, None, True)
    assert (gpu1.partition, gpu1.cpus, gpu1.gpus, gpu1.time_min, gpu1.default) == \
        ("gpu", 32, 4, 1440, False)
    assert gpu2.gpus == 2
    assert [slurm.slurm_minutes(t) for t in ("4:00:00", "30:00", "90", "2-12", "UNLIMITED")] \
        == [240, 30, 90, 3600, None]


def test_a_cpu_run_asks_for_no_gpu_and_the_node_s_cpus():
    req = plan_request(GridConfig(), CONDS, NODES)
    assert (req.partition, req.gpus, req.cpus) == ("debug", 0, 2)
    assert req.budget == slurm.CPU_BUDGET  # the job's --max-memory
    assert req.mem_mb * MiB >= req.budget + slurm.OVERHEAD and req.mem_mb <= 24105
    assert req.time_min == slurm.MIN_TIME  # 1,024 tokens: the minimum
    check_request(req, NODES)
    opts = executor.job_options(GridConfig(), executor.Path("j"), req)
    assert (opts.device, opts.max_memory) == ("cpu", f"{req.budget // MiB}M")
    local = executor.job_options(GridConfig(), executor.Path("j"), None)  # --executor local
    assert (local.device, local.max_memory, local.out) == ("auto", "auto", "j")


def test_a_gpu_run_asks_for_one_gpu_on_a_gpu_partition():
    cfg = GridConfig(device="cuda", slurm_partition="gpu", executor="slurm")
    cfg.validate()  # this machine has no GPU: the jobs' nodes will
    req = plan_request(cfg, CONDS, NODES)
    assert (req.gpus, req.cpus, req.budget) == (1, 8, None)
    check_request(req, NODES)
    assert executor.job_options(cfg, executor.Path("j"), req).device == "cuda"


def test_flags_override_and_the_measurement_fits_the_memory_given():
    cfg = GridConfig(slurm_cpus_per_task=1, slurm_mem="6G", slurm_time=45,
                     slurm_gpus_per_task=0)
    req = plan_request(cfg, CONDS, NODES)
    assert (req.cpus, req.mem_mb, req.time_min) == (1, 6 * 1024, 45)
    assert req.budget < 6 * GiB - slurm.OVERHEAD  # what is left beside the weights


def test_a_small_node_gets_a_smaller_budget_not_a_request_it_cannot_meet():
    small = slurm.parse_sinfo("n1|debug*|4|6000|(null)|infinite|up")
    req = plan_request(GridConfig(), CONDS, small)
    assert req.mem_mb <= 6000 and req.budget < slurm.CPU_BUDGET
    check_request(req, small)


@pytest.mark.parametrize("changes, message", [
    (dict(slurm_cpus_per_task=8), "--slurm-cpus-per-task 8: the nodes of partition debug "
                                  "have at most 2 CPUs"),
    (dict(slurm_gpus_per_task=1), "--slurm-gpus-per-task 1: partition debug has no GPUs"),
    (dict(device="cuda"), "--device cuda asks for 1 GPU: partition debug has no GPUs"),
    (dict(slurm_mem="64G"), "--slurm-mem 65536M: the nodes of partition debug have at most "
                            "24105M"),
    (dict(slurm_partition="big"), "--slurm-partition big: no such partition; sinfo lists "
                                  "debug, gpu"),
    (dict(slurm_partition="gpu", slurm_gpus_per_task=8), "at most 4 GPUs a node"),
    (dict(slurm_partition="gpu", slurm_time=2000), "--slurm-time 2000: partition gpu "
                                                   "allows at most 1440 minutes"),
    (dict(slurm_partition="gpu", slurm_cpus_per_task=64, slurm_gpus_per_task=4),
     "no node of partition gpu has 64 CPUs"),
])
def test_what_no_node_can_give_is_refused_naming_the_flag(changes, message):
    with pytest.raises(UserError, match=message):
        check_request(plan_request(GridConfig(**changes), CONDS, NODES), NODES)


def test_time_auto_stays_within_the_partition_s_limit():
    many = [GridCell("smollm2-135m", "prose", 4096, 20000)]
    req = plan_request(GridConfig(slurm_partition="gpu", device="cuda"), many, NODES)
    assert req.time_min == 1440
    cpu = plan_request(GridConfig(), many, NODES)
    assert cpu.time_min > 1440 and cpu.time_min % slurm.STEP_MIN == 0


@pytest.mark.parametrize("flag, value", [("--slurm-cpus-per-task", "many"),
                                         ("--slurm-cpus-per-task", "0"),
                                         ("--slurm-gpus-per-task", "-1"),
                                         ("--slurm-time", "soon"), ("--slurm-mem", "lots")])
def test_bad_slurm_flags_are_user_errors(flag, value):
    args = vars(build_parser().parse_args(["grid", "--executor", "slurm", flag, value]))
    fields = {k: v for k, v in args.items() if k.startswith("slurm_")}
    with pytest.raises(UserError, match=flag):  # what GridConfig.validate runs (the type
        check_slurm(SimpleNamespace(**fields))  # checks under pytest refuse "many" first)


def test_plan_prints_the_sbatch_lines_without_a_cluster(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sinfo: not checked, said so
    text = executor.describe_jobs(CONDS, GridConfig(out=str(tmp_path)))
    assert "not checked" in text and "job smollm2-135m: 2 condition(s)" in text
    assert "#SBATCH --cpus-per-task=16" in text and "--gpus" not in text
    assert main(["grid", "--executor", "slurm", "--slurm-time", "0"]) == 2
    assert "--slurm-time 0" in capsys.readouterr().err


def test_scheduler_answers_become_states():
    assert str(slurm_state.parse_state("PENDING|Resources\n")) == "PENDING (Resources)"
    assert str(slurm_state.parse_state("RUNNING|None")) == "RUNNING"
    cancelled = slurm_state.parse_state("CANCELLED by 0\n")  # sacct
    assert (cancelled.state, cancelled.final) == ("CANCELLED", True)
    assert slurm_state.parse_state("") is None
    for state in ("TIMEOUT", "OUT_OF_MEMORY", "FAILED", "COMPLETED"):
        assert slurm_state.parse_state(f"{state}|None").final
    assert not slurm_state.parse_state("COMPLETING|None").final


class FakeJob:
    job_id = "7"

    def __init__(self, folder):
        self.paths = type("P", (), {"result_pickle": folder / "7_result.pkl",
                                    "stderr": folder / "7_0_log.err"})()


def test_a_job_gone_from_the_queue_without_a_result_fails_after_a_grace_poll(
        tmp_path, monkeypatch):
    """No accounting: squeue has forgotten the job and sacct fails."""
    monkeypatch.setattr(executor, "slurm_state", lambda job_id: slurm_state.JobState(
        slurm_state.GONE, final=False))
    states = executor.wait({"m": FakeJob(tmp_path)}, "slurm", progress=False, poll_s=0.0)
    table, why = executor.outcome(FakeJob(tmp_path), states["m"])
    assert table is None and why.startswith("GONE") and "no accounting" in why


def test_a_cancelled_job_is_named_with_the_scheduler_s_state(tmp_path, monkeypatch):
    monkeypatch.setattr(executor, "slurm_state",
                        lambda job_id: slurm_state.JobState("CANCELLED", "None"))
    states = executor.wait({"m": FakeJob(tmp_path)}, "slurm", progress=False, poll_s=0.0)
    assert executor.outcome(FakeJob(tmp_path), states["m"])[1].startswith("CANCELLED")
    timeout = slurm_state.JobState("TIMEOUT")
    assert "raise --slurm-time" in executor.outcome(FakeJob(tmp_path), timeout)[1]


def _fake(folder, name: str, script: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)


def test_a_controller_out_of_reach_is_no_end_but_a_forgotten_job_is(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    _fake(tmp_path, "squeue", 'echo "slurm_load_jobs error: Unable to contact slurm '
                              'controller (connect failure)" >&2; exit 1')
    _fake(tmp_path, "sacct", 'echo "Slurm accounting storage is disabled" >&2; exit 1')
    state = slurm_state.slurm_state("7")
    assert (state.state, state.final) == (slurm_state.UNKNOWN, False)
    assert "Unable to contact" in str(state)
    _fake(tmp_path, "squeue", 'echo "slurm_load_jobs error: Invalid job id specified" >&2; '
                              'exit 1')
    assert slurm_state.slurm_state("7").state == slurm_state.GONE  # and no accounting
    _fake(tmp_path, "sacct", 'echo "TIMEOUT"')
    assert slurm_state.slurm_state("7") == slurm_state.JobState("TIMEOUT")


def test_a_job_slurm_never_starts_is_cancelled_and_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    _fake(tmp_path, "squeue", 'echo "PENDING|PartitionConfig"')
    _fake(tmp_path, "scancel", f'echo "$@" > {tmp_path}/cancelled')
    states = executor.wait({"m": FakeJob(tmp_path)}, "slurm", progress=False, poll_s=0.0)
    assert (tmp_path / "cancelled").read_text().split() == ["7"]
    why = executor.outcome(FakeJob(tmp_path), states["m"])[1]
    assert why.startswith("PENDING (PartitionConfig): Slurm would never start it")


def test_a_job_stopped_at_its_time_limit_is_named_timeout(tmp_path):
    from submitit.core.utils import cloudpickle_dump

    job = FakeJob(tmp_path)  # what submitit's handler of the limit's USR2 leaves
    cloudpickle_dump(("error", "Traceback ...\nsubmitit.core.utils.UncompletedJobError: Job "
                               "not requeued because: timed-out and not checkpointable."),
                     job.paths.result_pickle)
    table, why = executor.outcome(job, slurm_state.JobState("FINISHED"))
    assert table is None and why.startswith("TIMEOUT: it reached its time limit: raise "
                                            "--slurm-time")
