"""meshrun.system.process: file descriptors pointed elsewhere for a block and back, and signal
handlers set for a block and put back."""

import os
import signal
import subprocess
import sys
import threading

from meshrun.system import process


def test_stderr_captured_takes_native_writes_and_gives_fd_2_back(capfd):
    with process.stderr_captured() as captured:
        os.write(2, b"from C\n")
    os.write(2, b"after\n")
    assert captured.data == b"from C\n"
    assert capfd.readouterr().err == "after\n"


def test_stderr_captured_keeps_what_a_failing_block_wrote(capfd):
    try:
        with process.stderr_captured() as captured:
            os.write(2, b"traceback from C\n")
            raise OSError("read failed")
    except OSError:
        pass
    assert captured.data == b"traceback from C\n" and capfd.readouterr().err == ""


def test_stderr_silenced_drops_the_blocks_writes_only(capfd):
    with process.stderr_silenced():
        os.write(2, b"dropped\n")
    os.write(2, b"kept\n")
    assert capfd.readouterr().err == "kept\n"


def test_output_to_file_sends_both_streams_of_a_process_there(tmp_path):
    log = tmp_path / "process-1.log"
    code = (
        "import os, sys; from pathlib import Path; from meshrun.system import process; "
        f"process.output_to_file(Path({str(log)!r})); print('out'); os.write(2, b'err\\n')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert (done.stdout, done.stderr) == ("", "")
    assert log.read_text().splitlines() == ["out", "err"]


def test_signal_handlers_are_set_for_the_block_reinstalled_on_demand_and_put_back():
    def mine(signum, frame):
        pass

    def theirs(signum, frame):
        pass

    before = signal.getsignal(signal.SIGUSR1)
    with process.SignalHandlers({signal.SIGUSR1: mine}) as scope:
        assert scope.active and signal.getsignal(signal.SIGUSR1) is mine
        signal.signal(signal.SIGUSR1, theirs)
        scope.reinstall()
        assert signal.getsignal(signal.SIGUSR1) is mine
    assert signal.getsignal(signal.SIGUSR1) is before and not scope.active


def test_signal_handlers_off_the_main_thread_set_nothing():
    seen = {}

    def enter():
        with process.SignalHandlers({signal.SIGUSR1: lambda *_: None}) as scope:
            seen["active"] = scope.active
            seen["handler"] = signal.getsignal(signal.SIGUSR1)

    before = signal.getsignal(signal.SIGUSR1)
    thread = threading.Thread(target=enter)
    thread.start()
    thread.join()
    assert seen == {"active": False, "handler": before}
