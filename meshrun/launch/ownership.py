"""Who answers for a job's run dir (`RunDir`): the job's verdict written there, what goes wrong
while the job runs answered in one place (`RunDir.answering`), and what Hydra wrote there removed
when the job did not run (`remove_hydra_files`)."""

from __future__ import annotations

import contextlib
import itertools
import shutil
import traceback
from dataclasses import dataclass
from pathlib import Path

from meshrun.errors import ConfigError, DoesNotFit, Preempted, RunFailed, raised_while_interrupted
from meshrun.files import write_json
from meshrun.launch import join as join_lib
from meshrun.launch.invocation import Job
from meshrun.placement.identity import ONE_PROCESS, Identity
from meshrun.specs.metrics import RunMetrics
from meshrun.specs.rundir import ERROR_LOG, HYDRA_DIR, METRICS_FILE, job_log
from meshrun.wording import error_text


@dataclass
class RunDir:
    """A job's run dir and who answers for it. The process that owns it writes the job's verdict
    there and cleans up after a rejected config: a multirun (or a sweep job in a process of its own)
    keeps the job with its reason (metrics.json, status error), a single run leaves nothing behind.
    A process started by the local launcher owns nothing (the launcher does), and once a
    multi-process job has formed only process 0 owns it. `identity` is this process's place in the
    job once it has taken it (one process until then). `earlier`: the dir held a run when the job
    began (one it continues, or one it was refused for): a rejected job leaves that run's files as
    they are (meshrun.launch.reuse)."""

    job: Job
    keeps_rejected: bool
    launched: bool
    identity: Identity = ONE_PROCESS
    earlier: bool = False

    @property
    def path(self) -> str:
        return self.job.run_dir

    def owned(self, identity: Identity) -> bool:
        return not self.launched and (identity.is_first or not join_lib.joined())

    @contextlib.contextmanager
    def answering(self):
        """Answers for the job's failures in the block, then lets them go on: a config error is
        rejected, a failed job's verdict (from the local launcher) replaces process 0's, and any
        other error is a failure during training, recorded by process 0 (the others print their
        traceback into their log) and raised as RunFailed. A stop signal's Preempted passes (process
        0's metrics.json says where the job stopped). An error raised while a second Ctrl-C
        unwound (a clean-up it cut short) is that interrupt."""
        try:
            yield
        except ConfigError as err:
            self.reject(err, self.identity)
            raise
        except RunFailed as err:
            self.record(str(err), exit_status=1)
            raise
        except Preempted:
            raise
        except Exception as err:
            if raised_while_interrupted(err):
                raise KeyboardInterrupt from err
            if not self.identity.is_first:
                traceback.print_exception(err)
                raise RunFailed(f"training failed: {error_text(err)}") from err
            raise self.record_failure(err) from err

    def reject(self, err: ConfigError | str, identity: Identity) -> None:
        """A config error of the job, met by process `identity`: recorded or cleaned up, as the
        owner decides (a job that does not fit a device's memory is recorded as such, with its
        figures)."""
        if not self.owned(identity) or self.earlier:
            return
        if not self.keeps_rejected:
            remove_hydra_files(self.path, self.job.name, rejected=True)
        elif isinstance(err, DoesNotFit):
            metrics = RunMetrics.not_fitting(
                str(err), self.path, self.job.choices, self.job.overrides, err.needed, err.available
            )
            write_json(metrics.to_json(), self.path, METRICS_FILE)
        else:
            self.record(str(err), exit_status=2)

    def record(self, message: str, exit_status: int | None = None) -> None:
        """Writes metrics.json with status error and `message`."""
        metrics = RunMetrics.failed(message, self.path, self.job.choices, self.job.overrides, exit_status)
        write_json(metrics.to_json(), self.path, METRICS_FILE)

    def record_failure(self, err: Exception) -> RunFailed:
        """A failure during training: metrics.json (status error) and the traceback in error.log."""
        trace = Path(self.path) / ERROR_LOG
        trace.write_text("".join(traceback.format_exception(err)))
        self.record(error_text(err))
        return RunFailed(f"training failed: {error_text(err)} (traceback in {trace})")


def remove_hydra_files(run_dir: str, job_name: str, *, rejected: bool) -> None:
    """Removes what Hydra wrote into the run dir of a job that did not run (`.hydra/` and the job's
    log), then the dir if that left it empty. A job not run at all (a stop signal ended its
    multirun first) keeps a log that is not empty; a job whose config was `rejected` loses its log,
    and its empty parents below the working dir go too. Nothing else goes."""
    path = Path(run_dir).resolve() if rejected else Path(run_dir)
    shutil.rmtree(path / HYDRA_DIR, ignore_errors=True)
    log_file = job_log(path, job_name)
    if rejected or _is_empty_file(log_file):
        log_file.unlink(missing_ok=True)
    for folder in (path, *(_parents_below_cwd(path) if rejected else ())):
        try:
            folder.rmdir()
        except OSError:  # not empty: it holds something that is not ours
            break


def _is_empty_file(path: Path) -> bool:
    return path.is_file() and path.stat().st_size == 0


def _parents_below_cwd(path: Path) -> list[Path]:
    cwd = Path.cwd().resolve()
    return list(itertools.takewhile(lambda folder: cwd in folder.parents, path.parents))
