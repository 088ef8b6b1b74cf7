"""The jobs of one `meshrun` invocation: what each kind of job does (`train_job`, `plan_job`,
`k8s_job`), which launcher runs a train job (`launcher_for`, the one place that chooses), and the
invocation's end (`finish`). The Hydra app (meshrun.app) hands every job here as a plain `Job`; nothing here
knows Hydra, and nothing imports jax before the job's devices are set. The invocation's state lives in
meshrun.launch.invocation, who answers for a run dir in meshrun.launch.ownership, and the launchers in
meshrun.launch.launchers.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from meshrun.compat.keras.startup import import_keras
from meshrun.config.parse import parse_run_config
from meshrun.config.schema import RunConfig
from meshrun.data import notes as data_notes
from meshrun.errors import ConfigError, DoesNotFit, Preempted, RunFailed
from meshrun.files import write_json, write_output
from meshrun.launch import join as join_lib
from meshrun.launch import launchers, reuse
from meshrun.launch.invocation import Invocation, Job, current, running, say_stopped
from meshrun.launch.ownership import RunDir, remove_hydra_files
from meshrun.launch.spawn import Role
from meshrun.placement import devices
from meshrun.placement.identity import Identity, identify, job_size
from meshrun.specs.rundir import METRICS_FILE, PLAN_FILE
from meshrun.system import signals
from meshrun.wording import say_error, say_warning

# What meshrun.app takes from here, the invocation's state included.
__all__ = ["Invocation", "Job", "check_run_dir", "check_sweep_dir", "current", "finish", "run_job", "running"]


def run_job(invocation: Invocation, job: Job) -> None:
    """Runs one job; a job that fails says why in one line and is counted, the others go on. Once
    a stop signal has stopped a job, the multirun's later jobs are not run."""
    if invocation.preempted:
        remove_hydra_files(job.run_dir, job.name, rejected=False)
        return
    try:
        if invocation.command == "plan":
            plan_job(invocation, job)
        elif invocation.command == "k8s":
            k8s_job(invocation, job)
        else:
            train_job(invocation, job)
    except ConfigError as err:
        _job_failed(invocation, job, str(err), status=2)
    except RunFailed as err:
        _job_failed(invocation, job, str(err), status=1)
    except Preempted as stop:
        say_stopped(job, stop)
        invocation.count_stop(stop)


def _job_failed(invocation: Invocation, job: Job, message: str, status: int) -> None:
    say_error(job.says(message))
    invocation.failures.append(status)


def train_job(invocation: Invocation, job: Job) -> None:
    """One job of `meshrun train`, run by the launcher `launcher_for` picks; in a multi-process job
    only process 0 reports and writes files. A multirun's job checks its dir for an earlier run
    first (a single run's was checked before Hydra wrote into it: `check_run_dir`); a job refused
    there is no run of this multirun, and leaves the earlier run's files as they are."""
    if job.number is not None and invocation.role is Role.USER:
        _check_dir(job.run_dir, job.resolve, key="hydra.sweep.dir", config_is_earlier=False)
    started_at = invocation.start_job(job.run_dir)
    run_dir = RunDir(
        job,
        keeps_rejected=job.number is not None or invocation.role is Role.SWEEP_JOB,
        launched=invocation.role is Role.LOCAL_PROCESS,
        earlier=reuse.earlier_run(job.run_dir) is not None,
    )
    launcher_for(invocation, job, run_dir, started_at).launch(job)


def check_run_dir(invocation: Invocation, run_dir: str, resolve: Callable[[], dict]) -> None:
    """Checks the run dir of a `meshrun train` run before Hydra writes into it (meshrun.app calls it
    first; `resolve()` gives the run's config): a finished run there that this run does not continue
    is a ConfigError, an unfinished one is moved aside (meshrun.launch.reuse). The processes meshrun
    starts for a job (its local processes, a multirun job's own process) leave that to the process
    that started them."""
    if invocation.command == "train" and invocation.role is Role.USER:
        _check_dir(run_dir, resolve)


def check_sweep_dir(
    invocation: Invocation, sweep_dir: str, resume: str | None, checkpoint_dir: str | None
) -> None:
    """Checks a multirun's sweep dir before Hydra writes into it (meshrun.app calls it first, with
    the multirun's `resume` and `checkpoint.dir`): one that holds a finished multirun is a
    ConfigError unless the multirun resumes."""
    if invocation.command in ("train", "sweep") and invocation.role is Role.USER:
        reuse.check_sweep_dir(
            sweep_dir, resumes=resume not in (None, "never") or (resume is None and bool(checkpoint_dir))
        )


def _check_dir(run_dir: str, resolve: Callable[[], dict], **how) -> None:
    if reuse.earlier_run(run_dir) is None:
        return
    config = parse_run_config(resolve())
    owner = identify(config.distributed, os.environ).is_first
    reuse.check_run_dir(config, run_dir, requeued=requeued(), moves=owner, **how)


def requeued() -> bool:
    """Whether the scheduler started this job again (SLURM_RESTART_COUNT): it then resumes by default."""
    return int(os.environ.get("SLURM_RESTART_COUNT") or 0) > 0


def launcher_for(invocation: Invocation, job: Job, run_dir: RunDir, started_at: float) -> launchers.Launcher:
    """The launcher of a train job: a process of its own for each job of a multirun whose jobs need
    different device counts (that process reads the job's config); else, as the job's config says
    (a config error is the job's, answered by its run dir), its distributed.local_processes started
    from here, or this process. Under Hydra's submitit launcher, that launcher wrapped in the SLURM
    one, which hands submitit's signal on."""
    if invocation.isolate:
        launcher = launchers.OwnProcess(invocation, run_dir)
    else:
        with run_dir.answering():
            config = parse_run_config(job.resolve())
        if config.distributed.launches_locally:
            launcher = launchers.LocalProcesses(config.distributed, run_dir)
        else:
            launcher = launchers.InProcess(
                config,
                run_dir,
                train=lambda identity: _train(config, invocation, job, identity, started_at),
                publish=lambda trained: publish(trained, job.run_dir),
                ends_process_on_interrupt=invocation.as_program,
            )
    requeue_signal = signals.scheduler_signal()
    return launcher if requeue_signal is None else launchers.Slurm(launcher, invocation, requeue_signal)


def _train(config: RunConfig, invocation: Invocation, job: Job, identity: Identity, started_at: float):
    from meshrun.train import RunContext, train  # imports jax and keras: only after devices.prepare

    context = RunContext(
        run_dir=job.run_dir,
        choices=job.choices,
        overrides=job.overrides,
        started_at=started_at,
        identity=identity,
        process_ends_after=invocation.as_program and job.number is None,
        requeued=requeued(),
        said_once=invocation.said_once,
    )
    return train(config, context)


def publish(trained, run_dir: str) -> None:
    """Writes the run's plan.json and metrics.json and prints its report."""
    from meshrun.report.render import render

    write_json(trained.plan.to_dict(), run_dir, PLAN_FILE)
    write_json(trained.metrics.to_json(), run_dir, METRICS_FILE)
    render(trained.metrics)


def plan_job(invocation: Invocation, job: Job) -> None:
    """One `meshrun plan` job: check the config (a data=text run's tokenizer and chat template too,
    as training would), plan from shapes alone, print (JSON with the job's config choices and
    overrides, so the lines of `plan -m` can be told apart); lint errors exit 2."""
    config = parse_run_config(job.resolve())
    processes = job_size(config.distributed, os.environ)
    planned = planned_here(config, processes)
    from meshrun.report.render import render_plan  # imports rich only
    from meshrun.run.prepare import check_without_devices
    from meshrun.run.sampling import check_text_tokenizer

    plan = planned.plan
    errors = [
        *plan.errors,
        *_errors_of(lambda: check_without_devices(config, planned, processes)),
        *_errors_of(lambda: check_text_tokenizer(config, planned)),
    ]
    found = _fit_found(invocation, config, planned, processes)
    if found is not None:  # the search answers whether the configured size fits
        errors = [e for e in errors if not isinstance(e, DoesNotFit)]
    data = {
        **plan.to_dict(),
        "status": "error" if errors else "ok",
        "errors": [str(e) for e in errors],
        "layout": job.choices.get("layout"),
        "choices": job.choices,
        "overrides": job.overrides,
        "data": {"source": config.data.name, "notes": data_notes(config.data)},
        **({"fit": found.to_dict()} if found else {}),
    }
    if invocation.as_json:
        print(json.dumps(data) if job.number is not None else json.dumps(data, indent=2))
    else:
        render_plan(data, full=invocation.full)
        if found is not None:
            print(found.line())
    if errors:
        for error in errors[:-1]:
            say_error(str(error))
        raise errors[-1]
    if invocation.save_layout:
        from meshrun.placement.layout_file import save_layout

        rules = (
            planned.written_rules
        )  # for separate blocks: the same file serves a run with stages and one without
        save_layout(invocation.save_layout, rules, plan, job.overrides)
        print(
            f"wrote {invocation.save_layout} ({len(rules)} "
            f"rules); load it with layout={invocation.save_layout}",
            file=sys.stderr if invocation.as_json else sys.stdout,
        )


def _fit_found(invocation: Invocation, config: RunConfig, planned, processes: int):
    """`plan --fit`'s answer (meshrun.run.fit_search.FitFound), None without --fit. A ConfigError
    (exit 2) where it cannot search: no device memory, a plan error, nothing fits."""
    if invocation.fit is None:
        return None
    from meshrun.run.plan_memory import fit_for_plan

    return fit_for_plan(config, planned, invocation.fit, processes)


def _errors_of(check: Callable[[], object]) -> list[ConfigError]:
    """The ConfigError `check()` raises, as a list (empty where it passes)."""
    try:
        check()
    except ConfigError as err:
        return [err]
    return []


def planned_here(config: RunConfig, processes: int):
    """The run's planned model (meshrun.run.prepare.PlannedModel) for a job of `processes`
    processes, worked out in this process from shapes alone, on devices this machine need not have."""
    devices.prepare_for_plan(config.devices, config.mesh)
    import_keras()
    from meshrun.run.plan_memory import counted_for_plan
    from meshrun.run.prepare import place_for_plan

    return counted_for_plan(config, place_for_plan(config, processes), processes)


def k8s_job(invocation: Invocation, job: Job) -> None:
    """The `meshrun k8s` job: the config its pods' `meshrun train` composes (the invocation's
    overrides are theirs; the run dir here is a scratch one) checked as train checks it, against
    the pods, and as `meshrun plan` checks it (check_pods_run), rendered for Kubernetes, then
    written out (stdout or --out), run here as local processes (--simulate) or submitted (--apply).
    Nothing is written before every check passed."""
    from meshrun.kube import render

    options = invocation.kube
    raw = job.resolve()
    render.check_one_process_per_pod(raw)
    config = parse_run_config(raw)
    render.check_job(config, options)
    warnings = check_pods_run(config, options.nodes)
    documents = render.render(config, options, invocation.overrides)
    for warning in [*warnings, *([render.no_volume_warning(options)] if options.volume is None else [])]:
        say_warning(warning)
    text = render.to_yaml(documents, options)
    if options.out:
        write_output(options.out, text.encode())
        print(f"meshrun k8s: wrote {options.out}", file=sys.stderr)
    if options.simulate:
        from meshrun.kube import simulate

        simulate.run(documents, options)
    elif options.apply:
        from meshrun.kube import submit

        print(submit.apply(documents, options))
    elif not options.out:
        print(text, end="")


def check_pods_run(config: RunConfig, processes: int) -> list[str]:
    """Checks the run of a `meshrun k8s` job's pods as `meshrun plan` would, for their mesh and
    `processes` (one a pod), here, where neither their devices nor their files need be: the plan's
    errors (the layout's lint, the pipeline's stages, devices.memory_gib) and the checks that need
    neither (meshrun.run.prepare.check_without_devices). Returns the plan's warnings. The pods of
    --simulate inherit this process's environment, which the plan's device set-up leaves as it was."""
    saved = dict(os.environ)
    try:
        planned = planned_here(config, processes)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    from meshrun.run.prepare import check_without_devices

    planned.plan.raise_first_error()
    check_without_devices(config, planned, processes)
    return list(planned.plan.warnings)


def finish(invocation: Invocation) -> int:
    """After the jobs: a multirun's comparison (table and summary files in its sweep dir); returns
    the invocation's exit status. Jobs that ran elsewhere (Hydra's submitit launcher runs them on
    SLURM nodes) are known by the metrics.json files in the sweep dir."""
    if not invocation.multirun or invocation.command == "plan" or join_lib.follows():
        return invocation.exit_status()
    from meshrun.report import sweep

    if invocation.runs:
        sweep.compare(sweep.find_runs(invocation.runs), invocation.sweep_dir)
        return invocation.exit_status()
    if invocation.failures:  # every job was refused before it ran: nothing of this multirun to compare
        return invocation.exit_status()
    sweep_dir = invocation.sweep_dir
    rows = (
        sweep.compare(sweep.find_runs([sweep_dir]), sweep_dir)
        if sweep_dir and Path(sweep_dir).is_dir()
        else []
    )
    if any(row["status"] == "ok" for row in rows):
        return 0
    say_error(f"no job of the multirun succeeded (their files: {sweep_dir})")
    return 1
