"""The errors meshrun reports to users as one line (their wording helpers are in meshrun.wording)."""

from __future__ import annotations


class ConfigError(Exception):
    """A bad config value, found before training: the CLI prints it as one line and exits 2.

    `key` is the dotted config key at fault; the message says what was received and what is valid.
    """

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key


class DependencyError(ConfigError):
    """An installed dependency lacks something meshrun relies on (a private name that moved in a
    new release): reported like a config error, naming the package, its version and what is
    missing, before anything is built."""


class DoesNotFit(ConfigError):
    """A job whose planned bytes per device exceed a device's memory: it is not run. A multirun
    records it as a `does not fit` row with the figures (`needed` and `available` bytes)."""

    def __init__(self, key: str, message: str, needed: int, available: int):
        super().__init__(key, message)
        self.needed = needed
        self.available = available


class RunFailed(Exception):
    """Training started but failed; the run dir holds metrics.json (status: error) and the log."""


class Preempted(Exception):
    """Training was stopped by a stop signal (SIGTERM, SIGUSR1, Ctrl-C) and saved a checkpoint: the
    job ends with `exit_status` (128 + the signal's number) and one line saying where it stopped."""

    def __init__(self, message: str, exit_status: int):
        super().__init__(message)
        self.exit_status = exit_status

    @property
    def signum(self) -> int:
        return self.exit_status - 128


def chain_of(err: BaseException):
    """`err` and the exceptions it was raised from or while handling, outermost first."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def raised_while_interrupted(err: BaseException) -> bool:
    """Whether `err` was raised while a KeyboardInterrupt unwound (a clean-up that failed because
    of it, such as a library's wait for a write the interrupt cut short): the interrupt is what
    happened, not a failure."""
    return any(isinstance(e, KeyboardInterrupt) for e in chain_of(err))
