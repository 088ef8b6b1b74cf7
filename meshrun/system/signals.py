"""Stopping politely: the signals with which schedulers and users ask a job to stop, caught while a
run trains, so that it stops at a step boundary, saves a checkpoint there and exits with a status
the scheduler understands (128 + the signal's number, as a shell reports a process it ended).

- SIGTERM: SLURM's preemption and `scancel`, Kubernetes' grace period, `kill`;
- SIGUSR1: what `sbatch --signal=B:USR1@120` sends some seconds before the time limit;
- SIGINT: Ctrl-C, the first time; a second Ctrl-C interrupts at once;
- under Hydra's submitit launcher, also submitit's own signal (SIGUSR2 unless
  SUBMITIT_PREEMPT_SIGNAL names another), sent before the time limit or on preemption: once the
  checkpoint is saved, submitit's handler gets it and requeues the job (meshrun.launch.launchers.Slurm).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Mapping

from meshrun.system.process import SignalHandlers, on_main_thread
from meshrun.wording import ERROR_PREFIX

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


def exit_status(signum: int) -> int:
    """The exit status of a run stopped by signal `signum`: 143 for SIGTERM, 138 for SIGUSR1, 130
    for SIGINT, 140 for submitit's SIGUSR2."""
    return 128 + int(signum)


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


def scheduler_signal(environ: Mapping[str, str] = os.environ) -> int | None:
    """The signal with which submitit asks the SLURM job this process runs to checkpoint and be
    requeued (None outside a submitit job)."""
    if environ.get("SUBMITIT_EXECUTOR") != "slurm":
        return None
    return getattr(signal, "SIG" + environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"), None)


def caught_signals() -> tuple[int, ...]:
    """The signals a run stops on here: STOP_SIGNALS, and submitit's in a submitit job."""
    extra = scheduler_signal()
    return STOP_SIGNALS if extra is None or extra in STOP_SIGNALS else (*STOP_SIGNALS, extra)


class StopSignals:
    """While entered (on the main thread; elsewhere it catches nothing), catches the stop signals
    (`caught_signals`): the first is remembered in `received` for the run to stop at its next step
    boundary; a second SIGINT (and each one after it) stops at once (`interrupt`), ending the
    process where `ends_process` (the `meshrun` program's choice: meshrun.launch.launchers.InProcess).
    The handlers in force before are put back on leaving. Entered while another is, it is that one,
    its handlers set again: a signal caught while the job started up (before its training entered
    its own) stops the training at its first step."""

    def __init__(self, ends_process: bool = False):
        self.received: int | None = None
        self.ends_process = ends_process
        self._handlers = SignalHandlers({})
        self._outer: StopSignals | None = None

    def __enter__(self) -> StopSignals:
        outer = _in_force()
        if outer is not None:
            self._outer = outer
            outer.catch()
            return outer
        self._handlers = SignalHandlers({sig: self._handle for sig in caught_signals()}).__enter__()
        return self

    def catch(self) -> None:
        """Takes the signals back from whoever set handlers for them since (joining a
        multi-process job installs jax's own SIGTERM handler, which would swallow it)."""
        self._handlers.reinstall()

    def __exit__(self, *exc) -> None:
        if self._outer is not None:
            self._outer = None
            return
        self._handlers.__exit__(*exc)

    @property
    def active(self) -> bool:
        """Whether its handlers are set (entered on the main thread, not left yet)."""
        return self._handlers.active

    def _handle(self, signum, frame) -> None:
        if self.received is None:
            self.received = signum
        elif signum == signal.SIGINT:
            interrupt(self.ends_process)


def _in_force() -> StopSignals | None:
    """The StopSignals entered in this process whose handler is in force for a stop signal, None
    when there is none. Read from the signal table itself: which handler a signal runs is the
    process's own state (the OS delivers a signal to the process), kept by Python, not a copy here."""
    for signum in caught_signals():
        scope = getattr(signal.getsignal(signum), "__self__", None)
        if isinstance(scope, StopSignals) and scope.active:
            return scope
    return None


# What a Ctrl-C that stops a run at once says (with meshrun's error prefix), and its exit status
INTERRUPTED = (
    "interrupted; stopped at once (a first Ctrl-C during training stops at a step boundary with a checkpoint)"
)
INTERRUPTED_STATUS = 128 + signal.SIGINT


def interrupt(ends_process: bool = False) -> None:
    """A second Ctrl-C during training. In the program (`ends_process`) it ends the process at
    once: an exception unwinding from here could be swallowed where Python ignores exceptions (a
    finalizer, a weakref callback) or replaced by a library's failing clean-up. Elsewhere (a
    notebook or a test calling meshrun in its own process) it raises KeyboardInterrupt, each time
    one comes."""
    if ends_process:
        _end_interrupted()
    quiet_finalizers()
    raise KeyboardInterrupt


def _end_interrupted() -> None:
    """Says the one line and ends the process, from a signal handler: further Ctrl-Cs ignored
    first (on_the_way_out), the Python streams flushed where they are not mid-write (that flush
    would be a reentrant call), the line written straight to file descriptor 2."""
    on_the_way_out()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (RuntimeError, OSError, ValueError):
            pass
    os.write(2, f"{ERROR_PREFIX}{INTERRUPTED}\n".encode())
    os._exit(INTERRUPTED_STATUS)


def on_the_way_out() -> None:
    """Once interrupted (Ctrl-C) and on its way out, the process ends quietly: further Ctrl-Cs are
    ignored (one landing in the last lines would end it with a traceback) and what finalizers
    raise goes to the debug log (quiet_finalizers)."""
    if on_main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    quiet_finalizers()


def quiet_finalizers() -> None:
    """Sends what finalizers raise to the debug log instead of stderr: after an interrupt, objects
    it left half-built (an Orbax writer cut short in its constructor) complain when they are
    freed, and a Ctrl-C that lands in a finalizer is printed, not raised."""
    sys.unraisablehook = _to_debug_log


def _to_debug_log(unraisable) -> None:
    logging.getLogger(__name__).debug(
        f"after the interrupt, in {unraisable.object!r}: "
        f"{unraisable.exc_type.__name__}: {unraisable.exc_value}"
    )


def stopped_line(stopped: dict) -> str:
    """What a run stopped by a signal says (`stopped`: metrics.json's train.stopped): the signal,
    the step and the checkpoint to resume from."""
    where = (
        f"; checkpoint {stopped['checkpoint']}" if stopped.get("checkpoint") else "; no checkpoint was saved"
    )
    requeued = scheduler_signal()
    if requeued is not None and stopped["signal"] == signal_name(requeued):
        return (
            f"{stopped['signal']} received: stopped after step "
            f"{stopped['step']}{where}; submitit requeues the job, which resumes from it"
        )
    return (
        f"{stopped['signal']} received: stopped after step {stopped['step']}{where}; the same command "
        "resumes from it when checkpoint.dir is set (else add resume=<that checkpoint's dir>)"
    )
