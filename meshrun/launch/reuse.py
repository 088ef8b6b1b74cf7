"""A run dir that already holds a run: what it holds (`earlier_run`) and what a run started there does
(`check_run_dir`), decided before the run builds or writes anything, Hydra's own files included, and
alike in every process of a job (each decides from the same files; only the one that owns the dir
moves any). A run never reads or reports another run's files:

- no run there (no dir, an empty one, only Hydra's and the launchers' files, or files of the user's:
  none of meshrun.specs.rundir.RUN_RECORDS): the run starts;
- the run resumes its own checkpoint there (resume=auto, its default with checkpoint.dir or in a
  requeued job, finding one in the checkpoint dir it saves into; or resume= naming that dir or one
  of its steps): it continues that run, its step log after the checkpoint's step;
- else a finished run there (a metrics.json, whatever its status) is refused: one line naming the
  dir and the way out (another run dir, or resume=auto where that run saved a checkpoint);
- an unfinished run (its files, no metrics.json: killed, or still running) with no checkpoint to
  resume: its files are moved aside into unfinished-run-N/ in the dir, said in one line (nothing is
  deleted: its log and any trace stay readable, and a move within the dir is a rename), and the run
  starts afresh.

Nothing here imports jax: the run dir is checked before the devices are set.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from meshrun.compat.orbax import steps_on_disk
from meshrun.config.schema import RunConfig
from meshrun.errors import ConfigError
from meshrun.specs.rundir import (
    HYDRA_DIR,
    METRICS_FILE,
    RUN_OUTPUTS,
    RUN_RECORDS,
    SUMMARY_FILES,
    UNFINISHED_PREFIX,
)
from meshrun.wording import say_warning


@dataclass(frozen=True)
class EarlierRun:
    """A run a run dir holds: the dir, the run's own files there (meshrun.specs.rundir.RUN_OUTPUTS)
    and its status as its metrics.json says (None: no metrics.json, the run did not finish)."""

    path: Path
    files: tuple[Path, ...]
    status: str | None

    @property
    def finished(self) -> bool:
        return self.status is not None


def earlier_run(run_dir: str | Path) -> EarlierRun | None:
    """The run `run_dir` holds (one of RUN_RECORDS is there), None where it holds none."""
    path = Path(run_dir)
    if not any((path / name).is_file() for name in RUN_RECORDS):
        return None
    files = tuple(path / name for name in RUN_OUTPUTS if (path / name).exists())
    return EarlierRun(path, files, _status(path / METRICS_FILE))


def _status(metrics: Path) -> str | None:
    if not metrics.is_file():
        return None
    try:
        return str(json.loads(metrics.read_text()).get("status") or "unknown")
    except (OSError, ValueError, AttributeError):
        return "unreadable"


def resumes_own_checkpoint(config: RunConfig, run_dir: str | Path, requeued: bool) -> bool:
    """Whether the run resumes a complete checkpoint of the dir it saves its checkpoints into."""
    root = config.checkpoint.directory(run_dir)
    mode = config.resume_mode(requeued)
    if mode == "never":
        return False
    steps = steps_on_disk(root)
    if mode == "auto":
        return bool(steps)
    named = Path(mode).expanduser().resolve()
    return (named == root and bool(steps)) or (
        named.parent == root and named.name.isdigit() and int(named.name) in steps
    )


def check_run_dir(
    config: RunConfig,
    run_dir: str | Path,
    *,
    requeued: bool,
    moves: bool,
    key: str = "hydra.run.dir",
    config_is_earlier: bool = True,
) -> None:
    """Checks `run_dir` for a run before the run of `config` starts there (the module doc says what
    follows). Raises ConfigError under `key` for a finished run it does not continue. `moves`: this
    process owns the dir (process 0), and moves an unfinished run's files aside;
    `config_is_earlier`: the dir's .hydra/ is still that run's (Hydra has not written this run's
    yet), and a copy goes aside with them."""
    earlier = earlier_run(run_dir)
    if earlier is None or resumes_own_checkpoint(config, run_dir, requeued):
        return
    if earlier.finished:
        raise ConfigError(key, refusal(earlier, config, run_dir, key))
    if moves:
        aside = move_aside(earlier, with_config=config_is_earlier)
        say_warning(
            f"{run_dir} held an unfinished run (no metrics.json) and this run resumes no checkpoint of it: "
            f"moved its files to {aside}; starting afresh"
        )


def refusal(earlier: EarlierRun, config: RunConfig, run_dir: str | Path, key: str) -> str:
    """Why a run does not start in a dir holding a finished run, and the way out (another `key`)."""
    said = f"got {str(run_dir)!r}, which holds a finished run (its metrics.json, status {earlier.status}); "
    if steps_on_disk(config.checkpoint.directory(run_dir)):
        return said + f"give another {key}, or continue that run from its newest checkpoint with resume=auto"
    return said + f"give another {key} (that run saved no checkpoint to continue from)"


def move_aside(earlier: EarlierRun, with_config: bool) -> Path:
    """Moves the run's files into a new unfinished-run-N/ in its dir (with a copy of .hydra/ where
    `with_config`); returns that dir."""
    taken = [p.name.removeprefix(UNFINISHED_PREFIX) for p in earlier.path.glob(f"{UNFINISHED_PREFIX}*")]
    aside = earlier.path / f"{UNFINISHED_PREFIX}{1 + max((int(n) for n in taken if n.isdigit()), default=0)}"
    aside.mkdir()
    for file in earlier.files:
        os.replace(file, aside / file.name)
    if with_config and (earlier.path / HYDRA_DIR).is_dir():
        shutil.copytree(earlier.path / HYDRA_DIR, aside / HYDRA_DIR)
    return aside


def check_sweep_dir(sweep_dir: str | Path, resumes: bool) -> None:
    """Before a multirun writes into `sweep_dir`: ConfigError when it holds a finished multirun (its
    comparison, or a job's metrics.json) and the multirun does not resume (`resumes`: resume=auto,
    its default with checkpoint.dir, or a path); each job's dir is then checked as it starts."""
    path = Path(sweep_dir)
    if resumes or not path.is_dir():
        return
    finished = [path / name for name in SUMMARY_FILES if (path / name).is_file()] or list(
        path.glob(f"*/{METRICS_FILE}")
    )
    if finished:
        raise ConfigError(
            "hydra.sweep.dir",
            f"got {str(sweep_dir)!r}, which holds a finished multirun ({finished[0]}); give another "
            "hydra.sweep.dir, or continue its jobs from their checkpoints with resume=auto",
        )
