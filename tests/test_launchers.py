"""meshrun.launch.launchers: which launcher a train job gets (meshrun.jobs.launcher_for, the one
place that chooses) and what the launchers do: a job run in this process and the same job run in a
process of its own train alike; under Hydra's submitit launcher a job stopped by submitit's signal
hands it on with the invocation as it was when the job began; a run dir is answered for; and the
signal scopes the launchers stop with."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import FAST, read_metrics
from meshrun import jobs
from meshrun.app import composer
from meshrun.errors import RunFailed
from meshrun.hydra_sources import register_config_sources
from meshrun.launch import launchers
from meshrun.launch.invocation import Invocation, Job
from meshrun.launch.ownership import RunDir, remove_hydra_files
from meshrun.launch.spawn import ForwardedStop, Role
from meshrun.system.process import SignalHandlers
from meshrun.system.signals import StopSignals


def composed(overrides: list[str]) -> dict:
    """The job's config as Hydra composes it from meshrun's config tree."""
    register_config_sources()
    with composer() as compose:
        return compose(overrides)


def job_of(run_dir, overrides: list[str], number: int | None = None) -> Job:
    raw = composed(overrides)
    return Job(
        resolve=lambda: raw,
        run_dir=str(run_dir),
        name="train",
        number=number,
        choices={},
        overrides=overrides,
    )


def unreadable_job(run_dir) -> Job:
    """A job whose config this process must not read (its own process does)."""

    def resolve() -> dict:
        raise AssertionError("the config was read in the launching process")

    return Job(
        resolve=resolve, run_dir=str(run_dir), name="train", number=0, choices={}, overrides=["mesh=2x4"]
    )


def picked(invocation: Invocation, job: Job) -> launchers.Launcher:
    return jobs.launcher_for(
        invocation, job, RunDir(job, keeps_rejected=False, launched=False), started_at=0.0
    )


def test_a_job_runs_in_this_process_unless_its_config_or_its_multirun_says_otherwise(tmp_path):
    single = Invocation("train", ["mesh=2x4"])
    assert isinstance(picked(single, job_of(tmp_path, ["mesh=2x4"])), launchers.InProcess)
    local = picked(single, job_of(tmp_path, ["mesh=2x4", "distributed.local_processes=2"]))
    assert isinstance(local, launchers.LocalProcesses) and local.config.local_processes == 2
    isolated = Invocation("train", ["-m", "mesh=2x4,2x2"], isolate=True)
    assert isinstance(picked(isolated, unreadable_job(tmp_path)), launchers.OwnProcess)


def test_under_submitit_on_slurm_the_launcher_hands_submitits_signal_on(tmp_path, monkeypatch):
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    launcher = picked(Invocation("train", ["mesh=2x4"]), job_of(tmp_path, ["mesh=2x4"]))
    assert isinstance(launcher, launchers.Slurm) and isinstance(launcher.launcher, launchers.InProcess)
    assert launcher.requeue_signal == signal.SIGUSR2
    monkeypatch.setenv("SUBMITIT_PREEMPT_SIGNAL", "USR1")
    launcher = picked(Invocation("train", ["-m"], isolate=True), unreadable_job(tmp_path))
    assert isinstance(launcher.launcher, launchers.OwnProcess) and launcher.requeue_signal == signal.SIGUSR1


def test_a_rejected_config_is_a_multirun_jobs_row_and_leaves_nothing_of_a_single_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bad = ["mesh=2x4", "train.epochs=0"]
    row = tmp_path / "multirun" / "0"
    (row / ".hydra").mkdir(parents=True)
    multirun = Invocation("train", ["-m", *bad])
    jobs.run_job(multirun, job_of(row, bad, number=0))
    assert multirun.failures == [2] and multirun.runs == [str(row)]
    metrics = read_metrics(row)
    assert metrics["status"] == "error" and metrics["exit_status"] == 2 and "train.epochs" in metrics["error"]

    single_dir = tmp_path / "outputs" / "day" / "time"
    (single_dir / ".hydra").mkdir(parents=True)
    (single_dir / "train.log").write_text("")
    single = Invocation("train", bad)
    jobs.run_job(single, job_of(single_dir, bad))
    assert single.failures == [2] and not (tmp_path / "outputs").exists()


@pytest.mark.e2e
def test_a_job_in_a_process_of_its_own_trains_like_one_in_this_process(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    overrides = ["mesh=2x4", *FAST]
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    own_process = Invocation("train", ["-m", *overrides], isolate=True)
    jobs.run_job(own_process, job_of(there, overrides, number=0))  # first: no process forks after jax started
    in_process = Invocation("train", overrides)
    jobs.run_job(in_process, job_of(here, overrides))
    assert in_process.failures == own_process.failures == []
    assert (in_process.runs, own_process.runs) == ([str(here)], [str(there)])
    mine, theirs = read_metrics(here), read_metrics(there)
    assert mine["status"] == theirs["status"] == "ok"
    assert theirs["history"]["loss"] == pytest.approx(mine["history"]["loss"], abs=1e-6)
    assert theirs["devices"] == mine["devices"]


def catching(signum: int) -> bool:
    """Whether a StopSignals scope holds the handler of `signum`."""
    return isinstance(getattr(signal.getsignal(signum), "__self__", None), StopSignals)


def send_once_caught(signum: int) -> None:
    """Sends `signum` to this process, from another thread, once a StopSignals scope catches it."""

    def send() -> None:
        deadline = time.monotonic() + 60
        while not catching(signum) and time.monotonic() < deadline:
            time.sleep(0.005)
        os.kill(os.getpid(), signum)

    threading.Thread(target=send, daemon=True).start()


def test_a_job_stopped_by_submitits_signal_is_said_then_handed_on_as_it_began_then_counted(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    run_dir = tmp_path / "sweep" / "0"
    run_dir.mkdir(parents=True)
    invocation = Invocation("train", ["-m", "mesh=2x4", *FAST])
    handed_on = []

    def submitits_handler(signum, frame):  # submitit pickles the job as it is now, and requeues it
        handed_on.append(
            (
                signum,
                list(invocation.runs),
                list(invocation.failures),
                invocation.preempted,
                capsys.readouterr().err,
            )
        )

    with SignalHandlers({signal.SIGUSR2: submitits_handler}):
        send_once_caught(signal.SIGUSR2)
        jobs.run_job(invocation, job_of(run_dir, ["mesh=2x4", *FAST], number=0))
    [(signum, runs, failures, preempted, said)] = handed_on
    assert (signum, runs, failures, preempted) == (signal.SIGUSR2, [], [], False)
    last_line = said.strip().splitlines()[-1]
    assert last_line.startswith("meshrun: job 0: SIGUSR2 received: stopped after step")
    assert last_line.endswith("submitit requeues the job, which resumes from it")
    assert invocation.failures == [140] and invocation.preempted and invocation.exit_status() == 140
    assert read_metrics(run_dir)["status"] == "preempted"


def test_remove_hydra_files_of_a_job_not_run_keeps_a_log_with_lines_in_it(tmp_path):
    run_dir = tmp_path / "sweep" / "3"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text("mesh: {}\n")
    (run_dir / "train.log").write_text("")
    remove_hydra_files(str(run_dir), "train", rejected=False)
    assert not run_dir.exists() and (tmp_path / "sweep").is_dir()
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / "train.log").write_text("an earlier run's line\n")
    remove_hydra_files(str(run_dir), "train", rejected=False)
    assert [p.name for p in run_dir.iterdir()] == ["train.log"]


def test_remove_hydra_files_of_a_rejected_job_takes_its_log_and_empty_parents_below_the_working_dir(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "outputs" / "day" / "time"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / "train.log").write_text("config error\n")
    (tmp_path / "outputs" / "notes.txt").write_text("mine")
    remove_hydra_files(str(run_dir), "train", rejected=True)
    assert sorted(p.name for p in (tmp_path / "outputs").iterdir()) == ["notes.txt"]


class Complaining:
    """An object whose finalizer raises, as one an interrupt left half-built."""

    def __del__(self):
        raise AttributeError("'Complaining' object has no attribute '_thread'")


def test_stop_signals_nest_take_their_signals_back_and_each_ctrl_c_after_the_first_interrupts(
    monkeypatch, capfd
):
    before, before_int = signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGINT)
    hook_before = sys.unraisablehook
    monkeypatch.setattr(sys, "unraisablehook", hook_before)  # a second Ctrl-C quiets finalizers
    with StopSignals() as outer:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # as jax sets its own handler when it joins a job
        with StopSignals() as inner:
            assert inner is outer  # and it has taken SIGUSR1 back
            signal.raise_signal(signal.SIGUSR1)
        assert outer.received == signal.SIGUSR1
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        outer.catch()
        assert catching(signal.SIGUSR1)
        for _ in range(
            2
        ):  # a Ctrl-C that lands where Python swallows exceptions (a finalizer) is lost: the next one counts
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(signal.SIGINT)
        assert sys.unraisablehook is not hook_before
        half_built = Complaining()
        del half_built  # its finalizer's error goes to the debug log, not under the interrupt's line
    assert capfd.readouterr().err == ""
    assert signal.getsignal(signal.SIGUSR1) is before and signal.getsignal(signal.SIGINT) is before_int


def test_an_error_raised_while_a_ctrl_c_unwinds_is_the_interrupt_and_records_nothing(tmp_path):
    run_dir = RunDir(job_of(tmp_path, ["mesh=2x4"]), keeps_rejected=True, launched=False)

    def interrupted_cleanup():
        try:
            raise KeyboardInterrupt
        finally:
            raise RuntimeError("the write the interrupt cut short failed")  # as a library's wait in a finally

    with pytest.raises(KeyboardInterrupt), run_dir.answering():
        interrupted_cleanup()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RunFailed, match="training failed: RuntimeError: a real failure"), run_dir.answering():
        raise RuntimeError("a real failure")
    assert read_metrics(tmp_path)["status"] == "error"


def test_a_stop_signal_is_forwarded_to_the_process_group_it_stops(tmp_path):
    code = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(143)); "
        "print('ready', flush=True); time.sleep(60)"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert child.stdout.readline() == "ready\n"
    before = signal.getsignal(signal.SIGTERM)
    with ForwardedStop([child]) as forwarded:
        signal.raise_signal(signal.SIGTERM)
        status = child.wait(timeout=10)
    assert forwarded.signum == signal.SIGTERM and forwarded.stopped(status)
    assert forwarded.stopped_line(str(tmp_path)).startswith(
        "SIGTERM received: the job stopped before training began"
    )
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_sweep_job_in_its_own_process_records_a_rejected_config_and_a_local_process_leaves_it(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    bad = ["mesh=2x4", "train.epochs=0"]
    row = tmp_path / "sweep" / "1"
    row.mkdir(parents=True)
    sweep_job = Invocation("train", bad, role=Role.SWEEP_JOB)
    jobs.run_job(sweep_job, job_of(row, bad))
    assert sweep_job.failures == [2] and read_metrics(row)["status"] == "error"

    launched = tmp_path / "local" / "run"
    (launched / ".hydra").mkdir(parents=True)
    local_process = Invocation("train", bad, role=Role.LOCAL_PROCESS)
    jobs.run_job(local_process, job_of(launched, bad))
    assert local_process.failures == [2] and [p.name for p in launched.iterdir()] == [
        ".hydra"
    ]  # the launcher answers
