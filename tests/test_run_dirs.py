"""A run dir given again (hydra.run.dir, hydra.sweep.dir): a run never reads or reports another
run's files. A dir holding a finished run is refused with one line before anything is written;
a run that resumes its own checkpoint there continues it, each step logged once and in order; an
unfinished run with nothing to resume is moved aside, and the new run starts afresh. In this
process, on the seeds' model (4 steps an epoch); the processes of a job agree (tests/test_k8s.py)."""

import json
import shutil

import pytest

from meshrun import cli
from meshrun.errors import ConfigError

pytestmark = pytest.mark.integration

TINY = ["train.verbose=0", "data.num_samples=64", "data.eval_samples=32", "train.epochs=1"]


def train(args: list[str]) -> None:
    cli.main(["train", *TINY, *args])


def refused(args: list[str], capsys) -> str:
    """The one error line of a `meshrun train` that must exit 2."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as ended:
        train(args)
    lines = capsys.readouterr().err.strip().splitlines()
    assert ended.value.code == 2 and len(lines) == 1 and lines[0].startswith("meshrun: error: "), lines
    return lines[0]


def steps_logged(path) -> list[int]:
    """The steps of the step records of a log.jsonl, in their order."""
    return [
        record["step"]
        for record in map(json.loads, path.read_text().splitlines())
        if "epoch_end" not in record
    ]


def contents(run_dir) -> dict:
    return {
        p.relative_to(run_dir).as_posix(): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()
    }


def test_a_dir_holding_a_finished_run_is_refused_and_an_unfinished_one_moved_aside(in_tmp, capsys):
    """Training twice into one run dir: the second run is refused with one line naming the dir and
    the way out, and leaves every file of the first as it was (its .hydra/ included). With its
    metrics.json gone (a run killed before its end), the next run moves its files aside, says where,
    and starts afresh."""
    run_dir = in_tmp / "run"
    train(["hydra.run.dir=run"])
    first = contents(run_dir)
    line = refused(["hydra.run.dir=run", "train.seed=7"], capsys)
    assert line == (
        "meshrun: error: hydra.run.dir: got 'run', which holds a finished run (its metrics.json, status ok); "
        "give another hydra.run.dir (that run saved no checkpoint to continue from)"
    )
    assert contents(run_dir) == first and steps_logged(run_dir / "log.jsonl") == [1, 2, 3, 4]

    (run_dir / "metrics.json").unlink()
    train(["hydra.run.dir=run", "train.seed=7"])
    aside = run_dir / "unfinished-run-1"
    assert (
        "meshrun: warning: run held an unfinished run (no metrics.json) and this run resumes no checkpoint "
        f"of it: moved its files to {aside.relative_to(in_tmp)}; starting afresh"
    ) in capsys.readouterr().err
    assert sorted(contents(aside)) == [
        ".hydra/config.yaml",
        ".hydra/hydra.yaml",
        ".hydra/overrides.yaml",
        "log.jsonl",
        "plan.json",
    ]
    assert (
        contents(aside)["log.jsonl"] == first["log.jsonl"]
        and "seed: 7" not in contents(aside)[".hydra/config.yaml"].decode()
    )
    assert (
        steps_logged(run_dir / "log.jsonl") == [1, 2, 3, 4]
        and (run_dir / "log.jsonl").read_bytes() != first["log.jsonl"]
    )
    assert "seed: 7" in (run_dir / ".hydra" / "config.yaml").read_text()


def test_a_run_that_resumes_its_own_checkpoint_continues_its_logs_each_step_once(in_tmp, capsys):
    """A run killed after logging step 4 but before its checkpoint of step 4 was complete: the same
    command with resume=auto continues from step 2 in the same dir, and log.jsonl, steps.csv and
    epochs.csv hold each step once, in order. Without resume=auto it is refused, naming the way."""
    args = ["hydra.run.dir=run", "checkpoint.every_steps=2", "logging.csv=true"]
    train(args)
    run_dir = in_tmp / "run"
    assert "or continue that run from its newest checkpoint with resume=auto" in refused(args, capsys)
    for killed in (
        run_dir / "checkpoints" / "4",
        run_dir / "metrics.json",
    ):  # what the kill left: steps 1-4 logged, checkpoint 2
        killed.unlink() if killed.is_file() else shutil.rmtree(killed)
    train([*args, "resume=auto"])
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["checkpoint"]["resumed_at_step"] == 2 and metrics["status"] == "ok"
    assert steps_logged(run_dir / "log.jsonl") == [1, 2, 3, 4]
    assert [line.split(",")[0] for line in (run_dir / "steps.csv").read_text().splitlines()] == [
        "step",
        "1",
        "2",
        "3",
        "4",
    ]
    assert [line.split(",")[:3] for line in (run_dir / "epochs.csv").read_text().splitlines()] == [
        ["epoch_end", "step", "epoch_steps"],
        ["1", "4", "2"],
    ]
    assert not list(run_dir.glob("unfinished-run-*"))


def test_a_reused_sweep_dir_holding_a_finished_multirun_is_refused(in_tmp, capsys):
    """A multirun into a sweep dir that holds a finished one is refused before anything is written
    there. With resume=auto its jobs continue where they can; one with nothing to continue is
    refused on its own (after Hydra wrote its own files: the multirun's and the job's config),
    leaving the earlier job's files, and a multirun whose jobs were all refused compares nothing."""
    sweep = ["-m", "train.seed=1,2", "hydra.sweep.dir=sweep"]
    train(sweep)
    before = contents(in_tmp / "sweep")
    line = refused(sweep, capsys)
    assert line.startswith(
        "meshrun: error: hydra.sweep.dir: got 'sweep', which holds a finished multirun (sweep/summary"
    )
    assert contents(in_tmp / "sweep") == before
    with pytest.raises(SystemExit) as ended:  # every job refused: the multirun fails, and compares nothing
        train([*sweep, "resume=auto"])
    err = capsys.readouterr().err
    assert ended.value.code == 2 and err.count("which holds a finished run") == 2, err
    assert f"job 0: hydra.sweep.dir: got '{in_tmp / 'sweep' / '0'}', which holds a finished run" in err
    hydras = lambda name: name == "multirun.yaml" or ".hydra/" in name  # noqa: E731  Hydra writes its own before a job starts
    assert {n: d for n, d in contents(in_tmp / "sweep").items() if not hydras(n)} == {
        n: d for n, d in before.items() if not hydras(n)
    }


def test_which_runs_a_run_dir_holds_continue_and_which_are_refused(tmp_path, monkeypatch):
    """The decision alone, on files laid out as runs leave them: a requeued job (SLURM_RESTART_COUNT)
    continues its preempted run from the checkpoint in its dir, as does resume= naming that
    checkpoint; a checkpoint of another dir does not make the run that one's; a dir holding only
    the user's own checkpoints/ holds no run."""
    from meshrun.config.parse import parse_run_config
    from meshrun.launch import reuse

    run_dir, elsewhere = tmp_path / "run", tmp_path / "other" / "checkpoints"
    for steps in (run_dir / "checkpoints", elsewhere):
        (steps / "8").mkdir(parents=True)
        (steps / "8" / "_CHECKPOINT_METADATA").write_text("{}")
    assert reuse.earlier_run(run_dir) is None  # checkpoints alone: no run's record
    (run_dir / "metrics.json").write_text('{"status": "preempted"}')

    def check(requeued=False, **raw):
        config = parse_run_config(
            {"mesh": {"shape": "2x4"}, "layout": {}, "model": {"name": "dense_model"}, **raw}
        )
        reuse.check_run_dir(config, run_dir, requeued=requeued, moves=True)

    check(requeued=True)
    check(resume=str(run_dir / "checkpoints" / "8"))
    with pytest.raises(
        ConfigError,
        match="holds a finished run .* status preempted.*or continue that run from its newest checkpoint",
    ):
        check()
    with pytest.raises(ConfigError, match="holds a finished run"):
        check(resume=str(elsewhere))
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoints", "metrics.json"]
