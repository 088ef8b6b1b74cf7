"""Multi-process jobs on localhost: `distributed.local_processes=2` runs 2 real meshrun processes of
4 emulated CPU devices each, joined by jax.distributed (gloo). They must train exactly like one
process, fail fast and cleanly when a process dies, and reject bad distributed settings in one
line. The config checks and the arithmetic of process layouts run in-process."""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import (
    FAST,
    cli_here,
    error_line_here,
    fast_run_in_process,
    one_error_line,
    read_metrics,
    run_meshrun,
)
from meshrun import cli
from meshrun.config.layout_schema import MeshConfig
from meshrun.config.parse import parse_distributed
from meshrun.config.schema import DistributedConfig
from meshrun.config.slices import with_dcn
from meshrun.errors import ConfigError
from meshrun.launch.join import free_port, listen_address
from meshrun.placement.identity import Identity, identify
from meshrun.placement.plan import process_layout

TWO = "distributed.local_processes=2"


def mesh(shape) -> MeshConfig:
    return MeshConfig(shape=tuple(shape), axis_names=("data", "model"), batch_axis="data")


# --- where a process stands ---------------------------------------------------------------------


def test_off_means_one_process_whatever_the_environment():
    assert (
        identify(DistributedConfig(), {"SLURM_JOB_ID": "1", "SLURM_NTASKS": "4", "SLURM_PROCID": "2"})
        == Identity()
    )


def test_explicit_settings_imply_explicit_mode():
    config = parse_distributed({"coordinator": "node01:1234", "num_processes": 4, "process_id": 3})
    assert config.mode == "explicit"
    assert identify(config, {}) == Identity(3, 4, "node01:1234", "distributed config")


def test_auto_reads_keras_then_jax_then_slurm_environments():
    auto = parse_distributed({"mode": "auto"})
    keras_env = {
        "KERAS_DISTRIBUTION_JOB_ADDRESSES": "10.0.0.1:1234,10.0.0.2:1234",
        "KERAS_DISTRIBUTION_NUM_PROCESSES": "2",
        "KERAS_DISTRIBUTION_PROCESS_ID": "1",
    }
    jax_env = {"JAX_COORDINATOR_ADDRESS": "head:99", "JAX_NUM_PROCESSES": "3", "JAX_PROCESS_ID": "2"}
    slurm = {
        "SLURM_JOB_ID": "7",
        "SLURM_STEP_NODELIST": "vm",
        "SLURM_NTASKS": "2",
        "SLURM_PROCID": "1",
        "SLURM_TASKS_PER_NODE": "2",
    }
    assert identify(auto, {**keras_env, **jax_env}) == Identity(
        1, 2, "10.0.0.1:1234", "KERAS_DISTRIBUTION_* environment"
    )
    assert identify(auto, {**jax_env, **slurm}) == Identity(2, 3, "head:99", "JAX_* environment")
    assert identify(auto, slurm) == Identity(1, 2, None, "SLURM", None)
    assert identify(auto, {}).num_processes == 1


def test_one_slurm_task_per_node_uses_every_gpu_of_the_node():
    auto = parse_distributed({"mode": "auto"})
    task = {
        "SLURM_JOB_ID": "7",
        "SLURM_STEP_NODELIST": "n[1-2]",
        "SLURM_NTASKS": "2",
        "SLURM_PROCID": "0",
        "SLURM_TASKS_PER_NODE": "1(x2)",
    }
    assert identify(auto, {**task, "SLURM_GPUS_ON_NODE": "8"}).local_device_ids == tuple(range(8))
    assert identify(auto, {**task, "CUDA_VISIBLE_DEVICES": "0,1,2,3"}).local_device_ids == (0, 1, 2, 3)
    assert (
        identify(auto, {**task, "SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_GPUS_ON_NODE": "8"}).local_device_ids
        is None
    )


@pytest.mark.parametrize(
    "raw, key, words",
    [
        ({"mode": "sometimes"}, "distributed.mode", "valid: off, auto or explicit"),
        ({"coordinator": "node01:1234", "num_processes": 2}, "distributed.process_id", "is missing"),
        (
            {"coordinator": "node01", "num_processes": 2, "process_id": 0},
            "distributed.coordinator",
            "host:port",
        ),
        (
            {"coordinator": "n:1", "num_processes": 2, "process_id": 2},
            "distributed.process_id",
            "valid: 0 to 1",
        ),
        ({"local_processes": 0}, "distributed.local_processes", "positive integer"),
        ({"local_processes": 2, "mode": "auto"}, "distributed.local_processes", "leave distributed.mode off"),
        ({"port": 70000}, "distributed.port", "1 to 65535"),
        ({"timeout_s": 0}, "distributed.timeout_s", "positive"),
    ],
)
def test_bad_distributed_settings_name_the_key(raw, key, words):
    with pytest.raises(ConfigError) as caught:
        parse_distributed(raw)
    assert caught.value.key == key and words in str(caught.value)


def test_local_processes_emulate_cpu_devices_only():
    from meshrun.config.parse import parse_run_config

    raw = {"mesh": {"shape": "2x4"}, "model": {"name": "dense_model"}, "distributed": {"local_processes": 2}}
    assert parse_run_config(raw).distributed.local_processes == 2
    with pytest.raises(ConfigError, match="local processes emulate CPU devices only") as caught:
        parse_run_config({**raw, "devices": {"platform": "gpu"}})
    assert caught.value.key == "distributed.local_processes"


def test_yaml_off_reads_as_the_off_mode():
    assert parse_distributed({"mode": False}).mode == "off"


@pytest.mark.parametrize(
    "shape, processes, crossing, shares",
    [
        ((8, 1), 2, ["data"], 2),
        ((2, 4), 2, ["data"], 2),
        ((1, 8), 2, ["model"], 1),
        ((4, 2), 2, ["data"], 2),
        ((2, 4), 4, ["data", "model"], 2),
    ],
)
def test_process_layout_says_which_axes_cross_processes(shape, processes, crossing, shares):
    layout = process_layout(with_dcn(mesh(shape), processes), processes)
    assert layout == {
        "count": processes,
        "devices_per_process": 8 // processes,
        "axes_across_processes": crossing,
        "batch_shares": shares,
    }


# --- two processes on this machine --------------------------------------------------------------

# The one-process references, trained in this process once per mesh and layout (two cases share one).
single_process_run = functools.cache(fast_run_in_process)

# One two-process sweep a module (mesh=2x4,1x8 on dense_model, FAST; `meshrun train -m` by the CLI
# in this process, each job's two processes real ones): its jobs are two cases of
# test_two_processes_train_exactly_like_one, and test_a_sweep_of_two_process_jobs_and_their_plan
# reads it too.
SWEPT = {"2x4": "0", "1x8": "1"}
_two_process_sweep: dict = {}


def two_process_sweep(tmp_path_factory, capfd, monkeypatch) -> tuple[subprocess.CompletedProcess, Path]:
    """The sweep's outcome (as run_meshrun gives it) and its dir, run by the first test that asks."""
    if not _two_process_sweep:
        root = tmp_path_factory.mktemp("two-process-sweep")
        monkeypatch.chdir(root)
        sweep_dir = root / "sweep"
        done = cli_here(
            ["train", "-m", TWO, "mesh=2x4,1x8", "layout=dense_model", *FAST, f"hydra.sweep.dir={sweep_dir}"],
            capfd,
        )
        _two_process_sweep["run"] = (done, sweep_dir)
    return _two_process_sweep["run"]


@pytest.mark.e2e
@pytest.mark.parametrize(
    "mesh_name, layout, shares, dcn, given",
    [
        ("8x1", "replicated", 2, [2, 1], False),
        pytest.param("2x4", "dense_model", 2, [2, 1], False, marks=pytest.mark.smoke),
        ("1x8", "dense_model", 1, [1, 2], False),
        # the hybrid mesh: the model axis across the two processes, the data axis within each
        ("2x4", "dense_model", 1, [1, 2], True),
    ],
)
def test_two_processes_train_exactly_like_one(
    tmp_path, tmp_path_factory, capfd, monkeypatch, mesh_name, layout, shares, dcn, given
):
    """Each job's launcher is the CLI in this process (its two processes real ones): the jobs of
    the module's sweep where it has them, else one `meshrun train` of its own."""
    if layout == "dense_model" and not given:
        done, sweep_dir = two_process_sweep(tmp_path_factory, capfd, monkeypatch)
        run_dir = sweep_dir / SWEPT[mesh_name]
        # Process 0 of each job reports: once a job, each under its own mesh.
        assert done.stdout.count("meshrun: dense_model on mesh") == len(SWEPT)
        reports = done.stdout.count(f"meshrun: dense_model on mesh {mesh_name}")
    else:
        run_dir = tmp_path / "run"
        extra = [f"mesh.dcn=[{dcn[0]},{dcn[1]}]"] if given else []
        monkeypatch.chdir(tmp_path)
        done = cli_here(
            [
                "train",
                TWO,
                f"mesh={mesh_name}",
                f"layout={layout}",
                *extra,
                *FAST,
                f"hydra.run.dir={run_dir}",
            ],
            capfd,
        )
        reports = done.stdout.count("meshrun: dense_model on mesh")
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = read_metrics(run_dir)
    assert (
        metrics["devices"]["processes"] == 2
        and metrics["devices"]["per_process"] == 4
        and metrics["devices"]["count"] == 8
    )
    assert metrics["distributed"]["source"] == "distributed.local_processes"
    assert metrics["data"]["process_share"] == {"index": 0, "count": shares}
    assert metrics["data"]["process_batch_size"] == 16 // shares
    single = single_process_run(mesh_name, layout)
    for epoch, (multi, one) in enumerate(
        zip(metrics["history"]["loss"], single["history"]["loss"], strict=True)
    ):
        assert multi == pytest.approx(one, abs=1e-5), f"epoch {epoch}"
    assert metrics["eval"]["loss"] == pytest.approx(single["eval"]["loss"], abs=1e-5)
    assert {p: v["spec"] for p, v in metrics["sharding"].items()} == {
        p: v["spec"] for p, v in single["sharding"].items()
    }
    # Process 0 reports; process 1 logs into its own file and writes nothing else.
    assert reports == 1
    log = (run_dir / "process-1.log").read_text()
    assert "process 1 of 2 joining the job" in log
    listed = json.loads((run_dir / "processes.json").read_text())
    assert [p["process_id"] for p in listed["processes"]] == [0, 1]
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["processes"]["count"] == 2 and plan["processes"]["batch_shares"] == shares
    assert plan["mesh"]["dcn"] == metrics["mesh"]["dcn"] == dcn
    assert plan["mesh"]["across_processes"] == [
        name for name, slices in zip(["data", "model"], dcn, strict=True) if slices > 1
    ]


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def gone(pid: int) -> bool:
    """Whether process `pid` has ended (a zombie awaiting its reaper counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def start_long_job(tmp_path, *extra) -> tuple[subprocess.Popen, Path]:
    run_dir = tmp_path / "run"
    # 200 epochs of 64 steps: as long a job as 50 of 256, its first epoch (a process's first log line) 4 times
    # sooner
    command = [
        sys.executable,
        "-m",
        "meshrun",
        "train",
        TWO,
        "mesh=2x4",
        "train.epochs=200",
        "data.num_samples=1024",
        *extra,
        f"hydra.run.dir={run_dir}",
    ]
    launcher = subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    return launcher, run_dir


def finish(launcher: subprocess.Popen, timeout: float) -> tuple[int, str, float]:
    started = time.monotonic()
    _, stderr = launcher.communicate(timeout=timeout)
    return launcher.returncode, stderr, time.monotonic() - started


@pytest.mark.e2e
def test_a_time_budget_stops_every_process_at_the_same_step_with_a_checkpoint(tmp_path):
    """Process 0's clock decides, checked together every 20 steps: the job stops part-way through
    its 50 epochs, at a checked step, saves it and exits 0 (a disagreement would hang)."""
    run_dir = tmp_path / "run"
    done = run_meshrun(
        [
            "train",
            TWO,
            "mesh=2x4",
            "train.epochs=50",
            "data.num_samples=4096",
            "train.verbose=0",
            "train.max_time=8",
            f"hydra.run.dir={run_dir}",
        ],
        tmp_path,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = read_metrics(run_dir)
    stopped = metrics["train"]["stopped"]
    assert stopped["reason"] == "max_time" and (stopped["step"] - 1) % 20 == 0 and stopped["step"] < 50 * 256
    assert (
        metrics["checkpoint"]["saved_steps"] == [stopped["step"]]
        and (run_dir / "checkpoints" / str(stopped["step"])).is_dir()
    )
    assert metrics["timing"]["wall_s"] < 60


FAILING_FACTORY = """
import jax
import numpy as np


def make(split, seed):
    rng = np.random.default_rng(0)
    for i in range(512):
        if split == "train" and jax.process_index() == 1 and i == 300:
            raise RuntimeError("reader broke in process 1")
        yield rng.normal(size=(28, 28, 1)).astype("float32"), rng.normal(size=(10,)).astype("float32")
"""


@pytest.mark.e2e
def test_an_exception_in_one_process_ends_the_job_naming_it(in_tmp, capfd):
    """The job's launcher is the CLI in this process; its two processes are real ones."""
    (in_tmp / "failing_reader.py").write_text(FAILING_FACTORY)
    run_dir = in_tmp / "run"
    done = cli_here(
        [
            "train",
            TWO,
            "mesh=2x4",
            "data=python",
            "data.factory=failing_reader:make",
            "data.num_samples=512",
            "data.eval_samples=64",
            "train.verbose=0",
            f"hydra.run.dir={run_dir}",
        ],
        capfd,
    )
    errors = [line for line in done.stderr.splitlines() if line.startswith("meshrun: error:")]
    assert done.returncode == 1, done.stderr[-2000:]
    assert len(errors) == 1 and errors[0].startswith(
        "meshrun: error: process 1 of 2 failed with exit status 1"
    ), done.stderr[-2000:]
    assert "reader broke in process 1" in errors[0] and str(run_dir / "process-1.log") in errors[0]
    assert "Traceback" in (run_dir / "process-1.log").read_text()
    assert read_metrics(run_dir)["status"] == "error"


def listening_port() -> socket.socket:
    taken = socket.socket()
    taken.bind(("", 0))
    taken.listen()
    return taken


@pytest.mark.integration
def test_processes_that_do_not_divide_the_mesh_are_rejected(in_tmp, capsys):
    line = error_line_here(["train", "distributed.local_processes=3", "mesh=2x4"], capsys)
    assert (
        line == "meshrun: error: distributed.local_processes: got 3, but mesh 2x4's "
        "8 devices do not split evenly over 3 processes; valid: 1, 2, 4 or 8"
    )
    assert list(in_tmp.iterdir()) == []


@pytest.mark.integration
def test_a_port_in_use_is_rejected_before_anything_starts(in_tmp, capsys):
    with listening_port() as taken:
        port = taken.getsockname()[1]
        line = error_line_here(["train", TWO, f"distributed.port={port}", "mesh=2x4"], capsys)
        assert f"distributed.port: got {port}, but port {port} is already in use" in line
        explicit = [
            "distributed.num_processes=2",
            "distributed.process_id=0",
            f"distributed.coordinator=localhost:{port}",
        ]
        line = error_line_here(["train", *explicit, "mesh=2x4"], capsys)
        assert f"distributed.coordinator: got 'localhost:{port}', but port {port} is already in use" in line
    assert list(in_tmp.iterdir()) == []


# --- where the coordinator listens --------------------------------------------------------------

NOT_OURS = "203.0.113.7"  # TEST-NET-3: no host has it


def own_address() -> str | None:
    """A non-loopback IPv4 address of this machine, or None."""
    try:
        found = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
    except OSError:
        return None
    return next((info[4][0] for info in found if not info[4][0].startswith("127.")), None)


def first(coordinator: str | None) -> Identity:
    return Identity(process_id=0, num_processes=2, coordinator=coordinator)


def test_the_coordinator_listens_no_wider_than_the_job():
    assert listen_address(first("127.0.0.1:1234"), None, local=True) == "127.0.0.1:1234"
    assert listen_address(first("localhost:1234"), None, local=False) == "127.0.0.1:1234"  # a loopback name
    assert listen_address(first("[::1]:1234"), None, local=False) == "[::1]:1234"  # IPv6's loopback alone
    assert (
        listen_address(first(f"{NOT_OURS}:1234"), None, local=False) == "[::]:1234"
    )  # another host's: every interface
    assert listen_address(first(None), None, local=False) is None  # SLURM: jax finds the coordinator
    assert (
        listen_address(first(f"{NOT_OURS}:1234"), "0.0.0.0:1234", local=False) == "0.0.0.0:1234"
    )  # the user's choice
    own = own_address()
    if own is not None:  # the coordinator named by one of this host's addresses: that interface alone
        assert listen_address(first(f"{own}:1234"), None, local=False) == f"{own}:1234"


@pytest.mark.parametrize(
    "given, coordinator, message",
    [
        (
            f"{NOT_OURS}:1234",
            "127.0.0.1:1234",
            f"got '{NOT_OURS}:1234', but {NOT_OURS} is not an address of this host",
        ),
        (
            "127.0.0.1:999",
            "127.0.0.1:1234",
            "got '127.0.0.1:999', but the coordinator is 127.0.0.1:1234; listen on its port, 1234",
        ),
    ],
)
def test_a_bind_address_this_host_cannot_listen_on_is_one_error(given, coordinator, message):
    with pytest.raises(ConfigError) as caught:
        listen_address(first(coordinator), given, local=False)
    assert caught.value.key == "distributed.bind_address" and message in str(caught.value)


def test_a_bind_address_that_is_not_host_port_is_one_error():
    with pytest.raises(ConfigError) as caught:
        parse_distributed({"bind_address": "everywhere"})
    assert str(caught.value) == (
        "distributed.bind_address: got 'everywhere'; expected HOST:PORT where process 0's coordinator "
        "listens, an address of its host, e.g. 10.0.0.5:12345, 127.0.0.1:12345 or [::]:12345"
    )


def listening_on(port: int) -> list[str]:
    """The local addresses with a socket listening on TCP `port`, from /proc/net/tcp and tcp6 (IPv6
    addresses as the kernel writes them, in hex)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.rpartition(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.append(address)
    return found


LOOPBACK = {
    "0100007F",
    "0000000000000000FFFF00000100007F",
    "00000000000000000000000001000000",
}  # 127.0.0.1, v4-mapped, ::1


@pytest.mark.e2e
def test_a_local_coordinator_is_on_loopback_only_and_a_killed_process_ends_the_job_fast_in_a_line_no_orphans(
    tmp_path,
):
    """One long job: where its coordinator listens while it trains, then process 1 killed."""
    port = free_port()
    launcher, run_dir = start_long_job(tmp_path, f"distributed.port={port}")
    try:
        wait_for(lambda: listening_on(port), 120, "the coordinator to listen")
        assert set(listening_on(port)) <= LOOPBACK, listening_on(port)
        own = own_address()
        if own is not None:
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection((own, port), timeout=5).close()
        wait_for(
            lambda: (run_dir / "train.log").exists() and "listens on" in (run_dir / "train.log").read_text(),
            60,
            "the log line",
        )
        log = (run_dir / "train.log").read_text()
        assert f"coordinator 127.0.0.1:{port}, listening on 127.0.0.1:{port}, loopback only" in log
        assert f"its coordinator listens on 127.0.0.1:{port}" in log

        listed = wait_for(
            lambda: (
                (run_dir / "processes.json").exists() and json.loads((run_dir / "processes.json").read_text())
            ),
            120,
            "processes.json",
        )
        wait_for(
            lambda: "epoch 1/200:" in (run_dir / "process-1.log").read_text(),
            120,
            "process 1 to train an epoch",
        )
        pids = [p["pid"] for p in listed["processes"]]
        os.kill(pids[1], signal.SIGKILL)
        status, stderr, seconds = finish(launcher, timeout=90)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate(timeout=60)
    errors = [line for line in stderr.splitlines() if line.startswith("meshrun: error:")]
    assert status == 1 and seconds < 60, (status, seconds, stderr[-2000:])
    assert errors == [
        f"meshrun: error: process 1 of 2 was killed by SIGKILL; its log: {run_dir / 'process-1.log'}"
    ], stderr[-2000:]
    assert "Traceback" not in stderr
    assert all(gone(pid) for pid in pids), "a process outlived the job"
    metrics = read_metrics(run_dir)
    assert metrics["status"] == "error" and "process 1 of 2 was killed" in metrics["error"]


@pytest.mark.integration
def test_a_bind_address_not_of_this_host_is_one_line_before_any_process_starts(in_tmp, capsys):
    line = error_line_here(["train", TWO, f"distributed.bind_address={NOT_OURS}:45678", "mesh=2x4"], capsys)
    assert line.startswith(
        "meshrun: error: distributed.bind_address: got "
        f"'{NOT_OURS}:45678', but {NOT_OURS} is not an address of this host"
    )
    assert list(in_tmp.iterdir()) == []


def alone_in_a_job(process_id: int, timeout_s: int, in_tmp) -> str:
    """Starts one process of a 2-process job whose other process never comes; returns its one
    error line, checking it came within bounded time and left nothing behind."""
    explicit = [
        "distributed.num_processes=2",
        f"distributed.process_id={process_id}",
        f"distributed.coordinator=localhost:{free_port()}",
        f"distributed.timeout_s={timeout_s}",
    ]
    started = time.monotonic()
    line = one_error_line(run_meshrun(["train", *explicit, "mesh=2x4"], in_tmp, timeout=60))
    assert time.monotonic() - started < 30
    assert list(in_tmp.iterdir()) == []
    return line


@pytest.mark.e2e
def test_a_coordinator_that_never_answers_fails_in_bounded_time(in_tmp):
    line = alone_in_a_job(1, 1, in_tmp)
    assert "distributed.coordinator: got 'localhost:" in line and "nothing answered there within 1 s" in line


@pytest.mark.e2e
def test_too_few_processes_for_num_processes_fail_in_bounded_time(in_tmp):
    """Process 0 of a job said to have 2 processes, started alone: the job never forms."""
    line = alone_in_a_job(0, 2, in_tmp)
    assert (
        line.startswith("meshrun: error: distributed.num_processes: process 0 of 2 waited 2 s")
        and "start all 2 processes" in line
    )


@pytest.mark.e2e
def test_a_sweep_of_two_process_jobs_and_their_plan(tmp_path_factory, in_tmp, capfd, monkeypatch):
    done, sweep_dir = two_process_sweep(tmp_path_factory, capfd, monkeypatch)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads((sweep_dir / "summary.json").read_text())["rows"]
    assert sorted(r["mesh"] for r in rows) == ["1x8", "2x4"] and all(r["status"] == "ok" for r in rows)
    assert all(read_metrics(sweep_dir / job)["devices"]["processes"] == 2 for job in ("0", "1"))
    capfd.readouterr()
    cli.main(["plan", TWO, "mesh=1x8", "layout=dense_model", "--json"])  # the plan, in this process
    assert json.loads(capfd.readouterr().out)["processes"] == {
        "count": 2,
        "devices_per_process": 4,
        "axes_across_processes": ["model"],
        "batch_shares": 1,
    }
