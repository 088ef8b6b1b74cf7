"""meshrun through a real SLURM cluster: a 2-task job submitted with scripts/sbatch_meshrun.sh, and
one through Hydra's submitit launcher (hydra/launcher=meshrun_slurm). Each task is one process of
the job and finds its place from SLURM's environment (distributed=auto). `.ci/run` starts a
single-node cluster on localhost with scripts/slurm_localhost.sh; where no cluster answers, the
tests are skipped with the reason."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import FAST, fast_run_in_process, read_metrics, run_meshrun

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
JOB = ["devices.platform=cpu", "mesh=2x4", "layout=dense_model", *FAST]

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]


@pytest.fixture(scope="module")
def cluster():
    """Skips unless a SLURM cluster here runs a 2-task step."""
    if shutil.which("sbatch") is None:
        pytest.skip(
            "no SLURM here (sbatch not found); scripts/slurm_localhost.sh start sets up a local cluster"
        )
    status = subprocess.run([str(SCRIPTS / "slurm_localhost.sh"), "status"], capture_output=True, timeout=120)
    if status.returncode != 0:
        pytest.skip(
            "SLURM is installed but no cluster runs a 2-task step "
            "here; start one with scripts/slurm_localhost.sh start"
        )


def check_two_task_run(run_dir: Path) -> None:
    metrics = read_metrics(run_dir)
    assert metrics["status"] == "ok"
    assert metrics["devices"]["processes"] == 2 and metrics["devices"]["per_process"] == 4
    assert metrics["distributed"]["source"] == "SLURM"
    single = fast_run_in_process("2x4", "dense_model")
    for multi, one in zip(metrics["history"]["loss"], single["history"]["loss"], strict=True):
        assert multi == pytest.approx(one, abs=1e-5)
    assert "emulating 8 CPU devices over 2 processes" in (run_dir / "process-1.log").read_text()


def test_an_sbatch_job_of_two_tasks_trains_like_one_process(cluster, tmp_path):
    submitted = subprocess.run(
        [
            "sbatch",
            "--wait",
            "--parsable",
            "--nodes=1",
            "--ntasks-per-node=2",
            f"--chdir={tmp_path}",
            f"--output={tmp_path}/slurm-%j.out",
            str(SCRIPTS / "sbatch_meshrun.sh"),
            *JOB,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    outputs = "\n".join(p.read_text() for p in tmp_path.glob("slurm-*.out"))
    assert submitted.returncode == 0, (submitted.stderr, outputs[-3000:])
    job_id = submitted.stdout.strip().split(";")[0]
    check_two_task_run(tmp_path / "outputs" / "slurm" / job_id)
    assert outputs.count("meshrun: dense_model on mesh 2x4") == 1  # only process 0 reports
    assert "process 1 of 2 joining the job (SLURM)" in outputs


def test_the_submitit_launcher_runs_a_two_task_job(cluster, tmp_path):
    pytest.importorskip(
        "hydra_plugins.hydra_submitit_launcher",
        reason="hydra-submitit-launcher is not installed (pip install 'meshrun[slurm]')",
    )
    sweep_dir = tmp_path / "sweep"
    done = run_meshrun(
        [
            "train",
            "-m",
            "hydra/launcher=meshrun_slurm",
            "hydra.launcher.tasks_per_node=2",
            "distributed=auto",
            *JOB,
            f"hydra.sweep.dir={sweep_dir}",
        ],
        tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    check_two_task_run(sweep_dir / "0")
    rows = json.loads((sweep_dir / "summary.json").read_text())["rows"]
    assert [r["status"] for r in rows] == ["ok"]


# Two epochs of 256 steps, for the stop-and-requeue tests.
REQUEUED_JOB = [
    "mesh=2x4",
    "layout=dense_model",
    "data.num_samples=4096",
    "data.eval_samples=256",
    "train.epochs=2",
    "train.verbose=0",
]


@pytest.fixture(scope="module")
def two_process_whole(tmp_path_factory) -> dict:
    """The metrics of REQUEUED_JOB run without a stop by two local processes, whose sums round as
    the two tasks' do."""
    folder = tmp_path_factory.mktemp("whole")
    done = run_meshrun(
        ["train", "distributed.local_processes=2", *REQUEUED_JOB, f"hydra.run.dir={folder / 'run'}"],
        folder,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return read_metrics(folder / "run")


def test_usr1_to_an_sbatch_job_saves_requeues_and_the_requeued_job_finishes_exactly(
    cluster, tmp_path, two_process_whole
):
    """`scancel --signal=USR1 --batch` (what --signal=B:USR1@120 sends before the time limit): the
    script passes it on, the tasks stop together with a checkpoint and exit 138, the script
    requeues the job (SLURM would start it again about 2 minutes later; the test lets it start at
    once) and the requeued job resumes from that checkpoint and ends with an uninterrupted run's
    losses."""
    submitted = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--nodes=1",
            "--ntasks-per-node=2",
            f"--chdir={tmp_path}",
            f"--output={tmp_path}/slurm-%j.out",
            str(SCRIPTS / "sbatch_meshrun.sh"),
            "devices.platform=cpu",
            *REQUEUED_JOB,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    run_dir = tmp_path / "outputs" / "slurm" / job_id
    try:
        stop_and_requeue(job_id, run_dir, ["scancel", "--signal=USR1", "--batch", job_id])
        wait_until(lambda: job_state(job_id) == "", 300)
    finally:
        subprocess.run(["scancel", job_id], timeout=30)
    output = (tmp_path / f"slurm-{job_id}.out").read_text()
    assert (
        "SIGUSR1 received: stopped after step" in output and f"requeueing job {job_id} (restart 1)" in output
    ), output[-3000:]
    check_resumed_exactly(run_dir, two_process_whole)


def test_usr2_to_a_submitit_job_saves_submitit_requeues_it_and_it_finishes_exactly(
    cluster, tmp_path, two_process_whole
):
    """Hydra's submitit launcher: SIGUSR2 to the job's tasks (what SLURM sends signal_delay_s
    before the time limit) makes them stop together with a checkpoint; then submitit's own handler
    requeues the job, which resumes from the checkpoint in its run dir (a requeued job defaults to
    resume=auto) and ends with an uninterrupted run's losses; the launcher waits it out and exits 0."""
    pytest.importorskip(
        "hydra_plugins.hydra_submitit_launcher",
        reason="hydra-submitit-launcher is not installed (pip install 'meshrun[slurm]')",
    )
    sweep_dir = tmp_path / "sweep"
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "meshrun",
            "train",
            "-m",
            "hydra/launcher=meshrun_slurm",
            "hydra.launcher.tasks_per_node=2",
            "distributed=auto",
            "devices.platform=cpu",
            *REQUEUED_JOB,
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    job_id = None
    try:
        wait_until(lambda: any(p.is_dir() for p in (sweep_dir / ".submitit").glob("[0-9]*")), 120)
        job_id = next(p for p in (sweep_dir / ".submitit").glob("[0-9]*") if p.is_dir()).name
        stop_and_requeue(job_id, sweep_dir / "0", ["scancel", "--signal=USR2", job_id])
        _, stderr = launcher.communicate(timeout=300)
    finally:
        launcher.kill()
        if job_id:
            subprocess.run(["scancel", job_id], timeout=30)
    assert launcher.returncode == 0, stderr[-3000:]
    task_0 = (sweep_dir / ".submitit" / job_id / f"{job_id}_0_log.err").read_text()
    assert (
        "SIGUSR2 received: stopped after step" in task_0
        and "submitit requeues the job, which resumes from it" in task_0
    ), task_0[-3000:]
    check_resumed_exactly(sweep_dir / "0", two_process_whole)
    rows = json.loads((sweep_dir / "summary.json").read_text())["rows"]
    assert [r["status"] for r in rows] == ["ok"]


def stop_and_requeue(job_id: str, run_dir: Path, stop: list[str]) -> None:
    """Sends the stop with `stop` once the job has trained 50 steps and waits until it is requeued;
    SLURM holds a requeued job for about two minutes, which the test does not wait for."""
    wait_until(
        lambda: (
            (run_dir / "log.jsonl").exists() and (run_dir / "log.jsonl").read_text().count('"step"') >= 50
        ),
        180,
    )
    subprocess.run(stop, check=True, timeout=30)
    wait_until(lambda: job_state(job_id) == "PENDING", 120)
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=True, timeout=30)


def check_resumed_exactly(run_dir: Path, whole: dict) -> None:
    """The requeued run resumed mid-run from its own checkpoint and ended as `whole` did."""
    metrics = read_metrics(run_dir)
    step = metrics["checkpoint"]["resumed_at_step"]
    assert metrics["status"] == "ok" and (run_dir / "checkpoints" / str(step)).is_dir() and 0 < step < 512
    assert metrics["history"]["loss"] == pytest.approx(whole["history"]["loss"], abs=1e-5)
    assert metrics["eval"]["loss"] == pytest.approx(whole["eval"]["loss"], abs=1e-5)


def job_state(job_id: str) -> str:
    """The job's state as squeue shows it ('' once it has left the queue)."""
    return subprocess.run(
        ["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=30
    ).stdout.strip()


def wait_until(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not reached in {timeout} s"
        time.sleep(0.5)
