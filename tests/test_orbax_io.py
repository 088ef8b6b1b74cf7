"""Reading a checkpoint with TensorStore's stray tracebacks held back (meshrun.training.orbax_io):
what native code writes to stderr during a read that succeeds is written out after it; during one
that fails, it goes to the debug log instead of around meshrun's one line."""

import logging
import os

import pytest

from conftest import LogRecords
from meshrun.training.orbax_io import stderr_held_back


@pytest.fixture
def meshrun_records():
    """The records of meshrun's logger while the test runs, at every level, kept from the handlers
    earlier in-process runs left on the root logger."""
    logger, records = logging.getLogger("meshrun"), LogRecords()
    saved = logger.level, logger.propagate
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    logger.addHandler(records)
    yield records.records
    logger.removeHandler(records)
    logger.level, logger.propagate = saved


def test_what_a_successful_read_wrote_to_stderr_is_written_out_after_it(capfd, meshrun_records):
    with stderr_held_back():
        os.write(2, b"native line\n")
        assert capfd.readouterr().err == ""  # held back while the read runs
    assert capfd.readouterr().err == "native line\n"
    assert meshrun_records == []


def test_what_a_failed_read_wrote_to_stderr_goes_to_the_debug_log(capfd, meshrun_records):
    with pytest.raises(RuntimeError, match="unreadable"), stderr_held_back(quiet_s=0.05, wait_s=0.5):
        os.write(2, b"Event loop is closed\n")
        raise RuntimeError("unreadable")
    assert capfd.readouterr().err == ""
    assert [(r.levelno, r.getMessage()) for r in meshrun_records] == [
        (logging.DEBUG, "held back from stderr after a failed read: Event loop is closed\n")
    ]
