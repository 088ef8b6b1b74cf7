"""Preemption and checkpoint faults through the CLI with real processes: a stop signal mid-epoch
makes `meshrun train` stop at a step boundary, save a checkpoint there, write metrics.json (status
preempted) and exit with 128 + the signal's number; the same command then resumes and ends as an
uninterrupted run. A save that fails stops the run with one line and leaves the checkpoints before
it usable; a checkpoint whose files were damaged later is passed over by resume=auto."""

import csv
import json
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import read_metrics, run_meshrun, train_here
from meshrun import cli

pytestmark = pytest.mark.e2e

# The seeds' MLP, 512 steps an epoch (about a second each here): a signal after the first records
# of the step log lands mid-epoch.
ARGS = [
    "train",
    "mesh=2x4",
    "layout=dense_model",
    "data.num_samples=8192",
    "data.eval_samples=256",
    "train.epochs=2",
    "train.verbose=0",
]
STEPS_PER_EPOCH = 512


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    """The metrics of ARGS run from start to end, what every resumed run must match, in one
    process or two (trained in this process: the reference is not about a process)."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    return train_here(ARGS[1:], folder / "run")  # ARGS less its "train"


def summary_rows(stdout: str) -> dict:
    """The rows of the run summary a run printed, by name (the first column of its table)."""
    cells = [
        line.split("│")[1:3] for line in stdout.splitlines() if line.startswith("│") and line.count("│") == 3
    ]
    return {name.strip(): value.strip() for name, value in cells}


def start_meshrun(args: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "meshrun", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_steps(run_dir: Path, process: subprocess.Popen, count: int, timeout: float = 120) -> None:
    """Waits until the run's step log holds `count` step records (it is written in chunks)."""
    log = run_dir / "log.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[1][-3000:]
        if log.exists() and sum(1 for line in log.read_text().splitlines() if '"step"' in line) >= count:
            return
        time.sleep(0.02)
    raise AssertionError(f"no {count} steps in {log} after {timeout} s")


@pytest.mark.parametrize(
    "stop_signal", [pytest.param(signal.SIGTERM, marks=pytest.mark.smoke), signal.SIGUSR1, signal.SIGINT]
)
def test_a_signal_mid_epoch_saves_and_the_same_command_resumes_exactly(
    tmp_path, stop_signal, uninterrupted, capfd
):
    whole = uninterrupted
    checkpoints = tmp_path / "checkpoints"
    args = [*ARGS, f"checkpoint.dir={checkpoints}", "checkpoint.export=true", "logging.csv=true"]
    first_run = tmp_path / "first"
    process = start_meshrun([*args, f"hydra.run.dir={first_run}"], tmp_path)
    wait_for_steps(first_run, process, 50)
    process.send_signal(stop_signal)
    stdout, stderr = process.communicate(timeout=120)
    name = signal.Signals(stop_signal).name
    assert process.returncode == 128 + stop_signal, stderr[-3000:]
    stopped = read_metrics(first_run)
    step = stopped["train"]["stopped"]["step"]
    assert stopped["status"] == "preempted" and stopped["exit_status"] == 128 + stop_signal
    assert stopped["train"]["stopped"] == {
        "reason": "signal",
        "signal": name,
        "exit_status": 128 + stop_signal,
        "step": step,
        "checkpoint": str(checkpoints / str(step)),
    }
    assert 50 <= step < 2 * STEPS_PER_EPOCH and step % STEPS_PER_EPOCH, "the signal landed mid-epoch"
    epoch = step // STEPS_PER_EPOCH + 1
    assert (
        stopped["checkpoint"]["saved_steps"] == [STEPS_PER_EPOCH] * (epoch - 1) + [step]
        and (checkpoints / str(step)).is_dir()
    )
    assert (
        stopped["eval"] is None and len(stopped["history"]["loss"]) == epoch
    )  # no evaluation; up to the epoch it stopped in
    assert stopped["skipped"] == ["eval", "flops", "export"] and stopped["flops"]["per_step"] is None
    in_epoch = step - (epoch - 1) * STEPS_PER_EPOCH
    assert stopped["timing"]["epoch_steps"] == [STEPS_PER_EPOCH] * (epoch - 1) + [in_epoch]
    with open(first_run / "epochs.csv", newline="") as file:
        last = list(csv.DictReader(file))[-1]
    assert (int(last["epoch_end"]), int(last["step"]), int(last["epoch_steps"])) == (epoch, step, in_epoch)
    rows = summary_rows(stdout)  # what was skipped and why, and the cut epoch marked
    skipped = f"skipped: {name} received after step {step}"
    assert (
        rows["eval"]
        == skipped
        + "; a run stopped by a signal only saves its checkpoint, to exit within the scheduler's grace period"
    )
    assert (
        rows["flops"] == "skipped (XLA's cost analysis, and the compiled memory "
        f"estimate with it): {name} received after step {step}"
    )
    assert rows["export"] == skipped and rows["epochs"].endswith(
        f" s; epoch {epoch}: {in_epoch} of {STEPS_PER_EPOCH} steps"
    )
    assert (
        f"meshrun: {name} received: stopped after step {step}; checkpoint {checkpoints / str(step)}" in stderr
    )
    assert "Traceback" not in stderr

    resumed_run = tmp_path / "resumed"
    capfd.readouterr()
    cli.main(
        [*args, f"hydra.run.dir={resumed_run}"]
    )  # the same command (in this process: the resume is not about a process)
    resumed = read_metrics(resumed_run)
    assert (
        resumed["status"] == "ok"
        and resumed["checkpoint"]["resumed_at_step"] == step
        and resumed["skipped"] is None
    )
    rows = summary_rows(capfd.readouterr().out)
    assert rows["export"] == "model.keras" and rows["epochs"].endswith(
        f" s; epoch {epoch}: {STEPS_PER_EPOCH - in_epoch} of {STEPS_PER_EPOCH} steps"
    )
    assert resumed["history"]["loss"] == pytest.approx(whole["history"]["loss"], abs=1e-6)
    assert resumed["eval"]["loss"] == pytest.approx(whole["eval"]["loss"], abs=1e-6)
    assert json.loads((resumed_run / "metrics.json").read_text())["train"]["stopped"] is None


def test_sigterm_to_a_two_process_job_stops_both_at_one_step_and_the_same_command_resumes(tmp_path):
    """The local launcher passes the signal on; the processes agree on the step (they check
    together every 20 steps), each saves its shards of that checkpoint, and the job exits 143.
    64 steps an epoch (a step takes 30-60 ms in two processes here): the step log's first records
    come at the end of epoch 1 (step 64), and the processes check at steps 81, 101 and 121 before
    epoch 2 ends at 128, so the signal lands mid-epoch if it arrives within 57 steps (1.7 to 3.4 s;
    it was in by step 81 on the 2-core machine under a load of 10). (The reference is a two-process run too: a
    one-process run's eval loss differs by up to 5e-5.)"""
    steps_per_epoch = 64
    args = [
        "train",
        "distributed.local_processes=2",
        "mesh=2x4",
        "layout=dense_model",
        f"data.num_samples={16 * steps_per_epoch}",
        "data.eval_samples=256",
        "train.epochs=2",
        "train.verbose=0",
    ]
    whole_run = tmp_path / "whole"
    done = run_meshrun([*args, f"hydra.run.dir={whole_run}"], tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    whole = read_metrics(whole_run)
    assert whole["timing"]["epoch_steps"] == [steps_per_epoch] * 2

    checkpoints = tmp_path / "checkpoints"
    args = [*args, f"checkpoint.dir={checkpoints}"]
    first_run = tmp_path / "first"
    process = start_meshrun([*args, f"hydra.run.dir={first_run}"], tmp_path)
    wait_for_steps(first_run, process, 50)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=180)
    assert process.returncode == 143, stderr[-3000:]
    stopped = read_metrics(first_run)
    step = stopped["train"]["stopped"]["step"]
    assert (
        stopped["status"] == "preempted"
        and (step - 1) % 20 == 0
        and step < 2 * steps_per_epoch
        and step % steps_per_epoch
    ), "mid-epoch, at a checked step"
    assert (checkpoints / str(step)).is_dir() and f"SIGTERM received: stopped after step {step}" in stderr

    resumed_run = tmp_path / "resumed"
    done = run_meshrun([*args, f"hydra.run.dir={resumed_run}"], tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    resumed = read_metrics(resumed_run)
    assert resumed["checkpoint"]["resumed_at_step"] == step and resumed["devices"]["processes"] == 2
    assert resumed["history"]["loss"] == pytest.approx(whole["history"]["loss"], abs=1e-5)
    assert resumed["eval"]["loss"] == pytest.approx(whole["eval"]["loss"], abs=1e-5)


def test_a_checkpoint_dir_that_vanishes_mid_run_stops_it_with_one_line_and_the_last_checkpoint_resumes(
    tmp_path,
):
    checkpoints, moved = tmp_path / "checkpoints", tmp_path / "moved"
    args = [
        *ARGS[:-2],
        "train.epochs=1",
        "train.verbose=0",
        f"checkpoint.dir={checkpoints}",
        "checkpoint.every_steps=200",
        "checkpoint.async_save=false",
    ]
    process = start_meshrun([*args, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    deadline = time.monotonic() + 120
    while not (checkpoints / "200" / "_CHECKPOINT_METADATA").exists():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[1][-3000:]
        time.sleep(0.01)
    checkpoints.rename(moved)
    checkpoints.write_text("not a dir any more")
    _, stderr = process.communicate(timeout=120)
    lines = stderr.strip().splitlines()
    assert process.returncode == 1 and len(lines) == 1, stderr[-3000:]
    assert lines[0].startswith(
        f"meshrun: error: training failed: CheckpointNotSaved: saving step 400 into {checkpoints} failed ("
    )
    assert "Not a directory" in lines[0] and "no complete checkpoint is there" in lines[0]
    cli.main(
        [*args[:-3], f"resume={moved}", f"hydra.run.dir={tmp_path / 'resumed'}"]
    )  # in this process: not about a process
    assert read_metrics(tmp_path / "resumed")["status"] == "ok"
    assert read_metrics(tmp_path / "resumed")["checkpoint"]["resumed_at_step"] == 200


def test_a_full_disk_stops_the_run_with_one_line_and_the_last_checkpoint_resumes_exactly(
    tmp_path, uninterrupted
):
    """A real full disk: the checkpoint dir is a 2600 KiB tmpfs, room for one checkpoint of the
    MLP (about 1.8 MiB) but not two. The save at step 400 stops the run with one line naming the
    dir and ENOSPC; the checkpoint of step 200 resumes to an uninterrupted run's losses. The
    tmpfs lives in a mount namespace of its own (unshare), so the run goes in a shell script that
    copies the checkpoints, as the failed save left them, out of it before it ends; the resume
    reads that copy, through the CLI in this process (it is not about a process)."""
    if (
        shutil.which("unshare") is None
        or subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"]).returncode
    ):
        pytest.skip(
            "no mount namespace here (unshare --user --map-root-user "
            "--mount fails), so no small tmpfs to fill"
        )
    disk, checkpoints, saved = tmp_path / "disk", tmp_path / "disk" / "checkpoints", tmp_path / "saved"
    disk.mkdir()
    meshrun = [sys.executable, "-m", "meshrun", *ARGS]
    script = "\n".join(
        [
            f"mount -t tmpfs -o size=2600k tmpfs {disk} || exit 99",
            shlex.join(
                [
                    *meshrun,
                    f"checkpoint.dir={checkpoints}",
                    "checkpoint.every_steps=200",
                    f"hydra.run.dir={tmp_path / 'full'}",
                ]
            )
            + f" 2> {tmp_path / 'full.err'}; echo $? > {tmp_path / 'full.status'}",
            shlex.join(["cp", "-a", str(checkpoints), str(saved)]),
        ]
    )
    done = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, (done.stderr[-3000:], (tmp_path / "full.err").read_text()[-3000:])
    lines = (tmp_path / "full.err").read_text().strip().splitlines()
    assert (tmp_path / "full.status").read_text().strip() == "1" and len(lines) == 1, lines
    assert lines[0].startswith(
        f"meshrun: error: training failed: CheckpointNotSaved: saving step 400 into {checkpoints} failed "
        "(OSError: [Errno 28] No space left on device: the checkpoint takes about "
    )
    assert lines[0].endswith(
        f"the newest complete checkpoint is {checkpoints / '200'} "
        f"(traceback in {tmp_path / 'full'}/error.log)"
    )
    cli.main([*ARGS, f"resume={saved}", f"hydra.run.dir={tmp_path / 'resumed'}"])
    resumed = read_metrics(tmp_path / "resumed")
    assert resumed["status"] == "ok" and resumed["checkpoint"]["resumed_at_step"] == 200
    assert resumed["history"]["loss"] == pytest.approx(uninterrupted["history"]["loss"], abs=1e-6)
    assert resumed["eval"]["loss"] == pytest.approx(uninterrupted["eval"]["loss"], abs=1e-6)


def test_resume_auto_passes_over_a_damaged_newest_checkpoint_and_still_ends_exactly(
    tmp_path, uninterrupted, capfd
):
    """The runs go through the CLI in this process (none of it is about a process)."""
    checkpoints = tmp_path / "checkpoints"
    first = [
        *ARGS[:-2],
        "train.epochs=1",
        "train.verbose=0",
        f"checkpoint.dir={checkpoints}",
        "checkpoint.every_steps=150",
    ]
    cli.main([*first, f"hydra.run.dir={tmp_path / 'first'}"])
    assert read_metrics(tmp_path / "first")["status"] == "ok"
    assert sorted(int(p.name) for p in checkpoints.iterdir()) == [150, 300, 450]
    damaged = max((checkpoints / "450" / "state").rglob("d/*"), key=lambda p: p.stat().st_size)
    damaged.write_bytes(damaged.read_bytes()[:100])  # truncated after the save
    capfd.readouterr()
    with pytest.raises(SystemExit) as named:  # by path: no fallback
        cli.main([*ARGS, f"resume={checkpoints}", f"hydra.run.dir={tmp_path / 'named'}"])
    stderr = capfd.readouterr().err
    assert named.value.code == 2 and stderr.strip().splitlines() == [
        f"meshrun: error: resume: checkpoint {checkpoints / '450'} cannot be read "
        f"({stderr.split(' cannot be read (')[1].split('): ')[0]}): its files were changed after it was "
        "saved; resume from another of its steps (resume=<dir>/<step>) or start again (resume=never)"
    ], stderr[-3000:]
    cli.main([*ARGS, f"checkpoint.dir={checkpoints}", f"hydra.run.dir={tmp_path / 'resumed'}"])
    assert read_metrics(tmp_path / "resumed")["status"] == "ok"
    done = capfd.readouterr()
    said = done.out + done.err
    assert (
        f"checkpoint {checkpoints / '450'} cannot be read (" in said
        and "passing over it to the newest checkpoint before it" in said
    )
    resumed = read_metrics(tmp_path / "resumed")
    assert resumed["checkpoint"]["resumed_at_step"] == 300
    whole = uninterrupted
    assert resumed["history"]["loss"] == pytest.approx(whole["history"]["loss"], abs=1e-6)
    assert resumed["eval"]["loss"] == pytest.approx(whole["eval"]["loss"], abs=1e-6)


def keep_sending(process: subprocess.Popen, signum: int, every_s: float = 0.01, timeout: float = 60) -> str:
    """Sends `signum` to `process` every `every_s` until it exits, as a user who keeps pressing
    Ctrl-C; returns its stderr. (Two signals sent while the process runs no Python arrive as one,
    and a stop takes about 0.1 s here: no single delay is sure to land a second one inside it.)"""
    deadline = time.monotonic() + timeout
    while process.poll() is None and time.monotonic() < deadline:
        process.send_signal(signum)
        time.sleep(every_s)
    return process.communicate(timeout=10)[1]


def test_a_second_ctrl_c_stops_at_once_with_one_line(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    process = start_meshrun(
        [*ARGS, f"checkpoint.dir={checkpoints}", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path
    )
    wait_for_steps(tmp_path / "run", process, 50)
    stderr = keep_sending(process, signal.SIGINT)
    assert process.returncode == 130, stderr[-3000:]
    assert not (tmp_path / "run" / "metrics.json").exists(), "stopped at once: no run summary"
    assert stderr.strip().splitlines() == [
        "meshrun: error: interrupted; stopped at once (a first Ctrl-C "
        "during training stops at a step boundary with a checkpoint)"
    ], stderr[-3000:]


def test_sigterm_while_a_two_process_job_starts_up_ends_it_with_143_and_one_line(tmp_path):
    """A signal before training began (the processes still importing, joining or building): the
    launcher passes it on and the job ends with 143 and one line, not as a failed job, whether
    the processes caught it (they stop after their first step, with its checkpoint) or were still
    too early to (killed by it, nothing to save)."""
    run_dir = tmp_path / "run"
    process = start_meshrun(
        [
            "train",
            "distributed.local_processes=2",
            "mesh=2x4",
            "layout=dense_model",
            "train.verbose=0",
            f"hydra.run.dir={run_dir}",
        ],
        tmp_path,
    )
    deadline = time.monotonic() + 60
    while not (run_dir / "processes.json").exists():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[1][-3000:]
        time.sleep(0.01)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    lines = stderr.strip().splitlines()
    assert process.returncode == 143 and len(lines) == 1, stderr[-3000:]
    assert lines[0].startswith("meshrun: SIGTERM received: ")
    if (run_dir / "metrics.json").exists():
        assert (
            read_metrics(run_dir)["train"]["stopped"]["step"] == 1
            and (run_dir / "checkpoints" / "1").is_dir()
        )
    else:
        assert "stopped before training began; nothing was saved" in lines[0]


@pytest.mark.parametrize(
    "shapes", ["2x4,4x2", "2x4,2x2"], ids=["jobs-in-this-process", "jobs-in-their-own-processes"]
)
def test_sigterm_to_a_multirun_stops_its_job_with_a_checkpoint_and_runs_no_later_job(tmp_path, shapes):
    """In a multirun the signal stops the running job (in this process, or passed on to the job's
    own process when the jobs' device counts differ) and the jobs after it are not started."""
    sweep_dir = tmp_path / "sweep"
    process = start_meshrun(
        [
            "train",
            "-m",
            f"mesh={shapes}",
            "layout=dense_model",
            "data.num_samples=8192",
            "train.verbose=0",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        tmp_path,
    )
    wait_for_steps(sweep_dir / "0", process, 50)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr[-3000:]
    stopped = read_metrics(sweep_dir / "0")
    step = stopped["train"]["stopped"]["step"]
    assert stopped["status"] == "preempted" and (sweep_dir / "0" / "checkpoints" / str(step)).is_dir()
    assert f"job 0: SIGTERM received: stopped after step {step}" in stderr
    assert not (sweep_dir / "1").exists()
