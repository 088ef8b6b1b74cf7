"""Process plumbing meshrun does in several places, each written once: pointing a file descriptor
elsewhere for a block (native code prints straight to fd 2, past Python's sys.stderr), sending a
process's output to a log file for good, signal handlers set for a block and put back after, and
what lives to a process's end kept out of the garbage collector's walks."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import BinaryIO


def _flush_python_streams() -> None:
    sys.stdout.flush()
    sys.stderr.flush()


@contextlib.contextmanager
def fd_redirected(fd: int, target: int) -> Iterator[None]:
    """Points file descriptor `fd` at the file of descriptor `target` while the block runs, then
    back (Python's own buffered output is flushed first on both sides, so it lands where it was
    written)."""
    _flush_python_streams()
    saved = os.dup(fd)
    os.dup2(target, fd)
    try:
        yield
    finally:
        _flush_python_streams()
        os.dup2(saved, fd)
        os.close(saved)


@contextlib.contextmanager
def stderr_silenced() -> Iterator[None]:
    """Drops everything written to file descriptor 2 while the block runs."""
    with open(os.devnull, "wb") as devnull, fd_redirected(2, devnull.fileno()):
        yield


class Captured:
    """What `stderr_captured` collected: `file`, the temporary file it goes to while the block
    runs (to watch it grow), and `data`, all of it, once the block has ended."""

    def __init__(self, file: BinaryIO):
        self.file = file
        self.data = b""


@contextlib.contextmanager
def stderr_captured() -> Iterator[Captured]:
    """Collects what is written to file descriptor 2 while the block runs (native code's too);
    the Captured yielded holds it in `data` once the block has ended, whether or not it raised."""
    with tempfile.TemporaryFile() as file:
        captured = Captured(file)
        try:
            with fd_redirected(2, file.fileno()):
                yield captured
        finally:
            file.seek(0)
            captured.data = file.read()


@contextlib.contextmanager
def native_info_lines_dropped() -> Iterator[None]:
    """Runs the block with the INFO lines native code prints straight to stderr left out; every
    other line it prints (warnings, errors) is printed after the block. The SentencePiece built into
    TensorFlow Text prints `normalizer.cc(51) LOG(INFO) precompiled_charsmap is empty` when a
    process first loads a model such as Gemma's, and has no log level a caller can set (unlike the
    sentencepiece package, which prints none)."""
    held = None
    try:
        with stderr_captured() as held:
            yield
    finally:
        if held is not None:
            kept = [
                line
                for line in held.data.decode("utf-8", "replace").splitlines(keepends=True)
                if "LOG(INFO)" not in line
            ]
            sys.stderr.write("".join(kept))


def output_to_file(path: Path) -> None:
    """Sends this process's stdout and stderr (file descriptors 1 and 2, native code's included)
    to `path` for the rest of its life, appending."""
    _flush_python_streams()
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(descriptor, 1)
    os.dup2(descriptor, 2)
    os.close(descriptor)


def on_main_thread() -> bool:
    """Whether this is the main thread, the only one that may set signal handlers."""
    return threading.current_thread() is threading.main_thread()


class SignalHandlers:
    """A scope of signal handlers: entered on the main thread, sets `handlers` ({signal: handler})
    and on leaving puts back the handlers in force before; elsewhere it sets nothing (`active` is
    False). `reinstall()` sets them again, over handlers someone else set meanwhile."""

    def __init__(self, handlers: Mapping[int, Callable]):
        self.handlers = dict(handlers)
        self._previous: dict[int, object] = {}

    @property
    def active(self) -> bool:
        """Whether the handlers are set (entered, on the main thread)."""
        return bool(self._previous)

    def __enter__(self) -> SignalHandlers:
        if on_main_thread():
            self._previous = {sig: signal.signal(sig, handler) for sig, handler in self.handlers.items()}
        return self

    def reinstall(self) -> None:
        """Sets the handlers again (while active), taking the signals back from whoever set theirs since."""
        if self.active and on_main_thread():
            for sig, handler in self.handlers.items():
                signal.signal(sig, handler)

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}


def kept_to_the_end() -> None:
    """Tells Python's cyclic garbage collector that every object alive now lives until the process
    ends (gc.freeze), so its walks skip them: with jax and Keras imported a walk covers a quarter of
    a million objects (half a million with TensorFlow and KerasHub), 0.2 to 0.9 s each, and a run
    walks several times (Keras' clear_session among them). Only for a process that ends after
    its run: a frozen object that becomes garbage later is never freed."""
    gc.freeze()


def collectable_again() -> None:
    """Undoes kept_to_the_end: what it froze is walked, and freed when garbage, again."""
    gc.unfreeze()
