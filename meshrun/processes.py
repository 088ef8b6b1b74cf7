"""Multi-process jobs, seen from one process: its place in the job (from the config or from what
SLURM, Keras or JAX put in its environment), joining the job through `jax.distributed` with a
bounded wait and a one-line error, and sending the output of every process but the first to a
log file in the run dir.

Nothing here imports jax until `join` runs, after `meshrun.devices.prepare`.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from meshrun.errors import ConfigError
from meshrun.schema import DistributedConfig

log = logging.getLogger("meshrun")

# Set in the processes `distributed.local_processes` starts (meshrun.launch): they leave the
# verdict on the job, and the cleaning up of a rejected run, to the launcher.
LAUNCHED_ENV = "MESHRUN_LOCAL_LAUNCH"


@dataclass(frozen=True)
class Identity:
    """This process's place in the job: its id, how many processes there are, the coordinator's
    host:port (None: jax works it out from SLURM's environment), where that came from, and the
    accelerators this process uses (None: jax's default)."""

    process_id: int = 0
    num_processes: int = 1
    coordinator: Optional[str] = None
    source: str = "one process"
    local_device_ids: Optional[tuple[int, ...]] = None

    @property
    def is_first(self) -> bool:
        """Process 0: it hosts the coordinator, prints the report and writes the run's files."""
        return self.process_id == 0

    @property
    def several(self) -> bool:
        """Whether the job has more than one process."""
        return self.num_processes > 1

    def describe(self) -> dict:
        """What metrics.json says about the job's processes."""
        return {"process_id": self.process_id, "processes": self.num_processes, "coordinator": self.coordinator, "source": self.source}


ONE_PROCESS = Identity()


def identify(config: DistributedConfig, environ: Mapping[str, str]) -> Identity:
    """Where this process stands: one process (mode off), the config's explicit values, or with
    mode auto the first of KERAS_DISTRIBUTION_*, JAX_* and SLURM found in `environ` (one
    process when none is)."""
    if config.mode == "off":
        return ONE_PROCESS
    if config.mode == "explicit":
        source = "distributed.local_processes" if environ.get(LAUNCHED_ENV) else "distributed config"
        return Identity(config.process_id, config.num_processes, config.coordinator, source)
    for detect in (_from_keras_env, _from_jax_env, _from_slurm):
        found = detect(environ)
        if found is not None:
            return found
    if "SLURM_JOB_ID" in environ:
        return Identity(source="distributed=auto: a SLURM job but not a step of it; start meshrun with srun for one process per task")
    return Identity(source="distributed=auto found no SLURM, KERAS_DISTRIBUTION_* or JAX_* settings")


def job_size(config: DistributedConfig, environ: Mapping[str, str]) -> int:
    """How many processes the configured job has (for `meshrun plan`: nothing is joined)."""
    if config.launches_locally:
        return config.local_processes
    return identify(config, environ).num_processes


def _ints(environ: Mapping[str, str], *names: str) -> Optional[tuple[int, ...]]:
    values = [environ.get(name) for name in names]
    if any(v is None for v in values):
        return None
    try:
        return tuple(int(v) for v in values)
    except ValueError:
        bad = next(n for n, v in zip(names, values) if not v.strip().lstrip("-").isdigit())
        raise ConfigError("distributed.mode", f"auto read {bad}={environ[bad]!r} from the environment; expected an integer") from None


def _from_keras_env(environ: Mapping[str, str]) -> Optional[Identity]:
    numbers = _ints(environ, "KERAS_DISTRIBUTION_NUM_PROCESSES", "KERAS_DISTRIBUTION_PROCESS_ID")
    addresses = environ.get("KERAS_DISTRIBUTION_JOB_ADDRESSES")
    if numbers is None or not addresses:
        return None
    # Keras lists every process's address; the first is the coordinator (process 0).
    return Identity(numbers[1], numbers[0], addresses.split(",")[0].strip(), "KERAS_DISTRIBUTION_* environment")


def _from_jax_env(environ: Mapping[str, str]) -> Optional[Identity]:
    numbers = _ints(environ, "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")
    coordinator = environ.get("JAX_COORDINATOR_ADDRESS")
    if numbers is None or not coordinator:
        return None
    return Identity(numbers[1], numbers[0], coordinator, "JAX_* environment")


def _from_slurm(environ: Mapping[str, str]) -> Optional[Identity]:
    """A task of a SLURM job step (srun, or sbatch/submitit running srun). The coordinator is left
    to jax, which takes the step's first node and a port derived from the job id."""
    if "SLURM_JOB_ID" not in environ or "SLURM_STEP_NODELIST" not in environ:
        return None
    numbers = _ints(environ, "SLURM_NTASKS", "SLURM_PROCID")
    if numbers is None:
        return None
    return Identity(numbers[1], numbers[0], None, "SLURM", _slurm_local_devices(environ))


def _slurm_local_devices(environ: Mapping[str, str]) -> Optional[tuple[int, ...]]:
    """With one task on a node, that task uses every GPU of the node (jax would give a SLURM task
    one GPU, the one of its local rank); with several tasks per node, jax's choice stands."""
    tasks_here = environ.get("SLURM_NTASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE", "")
    if tasks_here.split("(")[0] != "1":
        return None
    gpus = environ.get("SLURM_GPUS_ON_NODE")
    if gpus and gpus.isdigit():
        return tuple(range(int(gpus)))
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    return tuple(range(len(visible.split(",")))) if visible else None


# Set once this process has joined a job: jax.distributed can be initialised once per process (a
# multirun inside an srun step runs every job in the same processes).
_JOINED: list[Identity] = []


def say_if_alone(config: DistributedConfig, identity: Identity) -> None:
    """Warns when distributed=auto found no job to join (the run goes on as one process)."""
    if config.mode == "auto" and not identity.several:
        log.warning(f"{identity.source}; running as one process")


def join(identity: Identity, timeout_s: int, on_timeout: Callable[[str], None]) -> None:
    """Joins the job: process 0 checks its port is free and starts the coordinator, the others
    wait for it to answer; then jax.distributed forms the job. If that takes longer than
    `timeout_s`, `on_timeout(message)` is called and the process exits with status 2 (jax would
    otherwise abort with a C++ stack trace)."""
    if not identity.several or _JOINED:
        return
    started = time.monotonic()
    if identity.coordinator is not None:
        host, port = split_address(identity.coordinator)
        if identity.is_first:
            check_port_free(port, "distributed.coordinator", identity.coordinator)
        else:
            _wait_for_coordinator(host, port, identity, timeout_s)
    left = max(1.0, timeout_s - (time.monotonic() - started))
    watchdog = threading.Timer(left, _give_up, args=(identity, timeout_s, on_timeout))
    watchdog.daemon = True
    watchdog.start()
    import jax

    log.info(f"process {identity.process_id} of {identity.num_processes} joining the job ({identity.source})")
    jax.distributed.initialize(
        coordinator_address=identity.coordinator,
        num_processes=identity.num_processes,
        process_id=identity.process_id,
        local_device_ids=list(identity.local_device_ids) if identity.local_device_ids else None,
        # Longer than the watchdog, so that meshrun, not jax's abort, reports a job that never forms.
        initialization_timeout=int(left) + 30,
    )
    watchdog.cancel()
    _JOINED.append(identity)


def joined() -> bool:
    """Whether this process has joined a multi-process job."""
    return bool(_JOINED)


def follows() -> bool:
    """Whether this process has joined a job as a process other than 0 (which reports for all)."""
    return bool(_JOINED) and not _JOINED[0].is_first


_EXIT_HOOKS: list[Callable[[], None]] = []


def on_exit_now(hook: Callable[[], None]) -> None:
    """Registers `hook` to run when exit_now ends the process (which skips atexit)."""
    _EXIT_HOOKS.append(hook)


def exit_now(status: int) -> None:
    """Ends the process at once, once its output and logs are flushed: the interpreter's own exit
    (jax's and TensorFlow's clean-up, about 1.5 s) is work nobody waits for. Also how a failed
    process of a job leaves: a normal exit would wait in jax's shutdown barrier for the other
    processes, which wait in a collective for this one, so nobody would ever exit."""
    for hook in _EXIT_HOOKS:
        hook()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _give_up(identity: Identity, timeout_s: int, on_timeout: Callable[[str], None]) -> None:
    where = identity.coordinator or "the coordinator SLURM's environment names"
    message = (
        f"distributed.num_processes: process {identity.process_id} of {identity.num_processes} waited {timeout_s} s "
        f"at {where} but the job did not form; start all {identity.num_processes} processes, each with its own "
        "distributed.process_id (or raise distributed.timeout_s)"
    )
    try:
        on_timeout(message)
    finally:
        exit_now(2)


def split_address(address: str) -> tuple[str, int]:
    """host:port (or [v6]:port) as (host, port)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def check_port_free(port: int, key: str, given: object) -> None:
    """ConfigError when something on this machine already listens on `port` (the coordinator
    binds every address on it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("", port))
        except OSError:
            raise ConfigError(
                key, f"got {given!r}, but port {port} is already in use on this machine; pick a free port"
                + (" or leave distributed.port unset to get one" if key == "distributed.port" else "")
            ) from None


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def _wait_for_coordinator(host: str, port: int, identity: Identity, timeout_s: int) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=2):
                return
        except OSError:
            if time.monotonic() >= deadline:
                raise ConfigError(
                    "distributed.coordinator",
                    f"got {identity.coordinator!r}, but nothing answered there within {timeout_s} s "
                    f"(process {identity.process_id} of {identity.num_processes}); start process 0 and give every "
                    "process its host:port",
                ) from None
            time.sleep(0.25)


def log_path(run_dir: str, process_id: int) -> Path:
    """The log file of process `process_id` in the run dir."""
    return Path(run_dir) / f"process-{process_id}.log"


def route_output(run_dir: str, process_id: int) -> Path:
    """Sends this process's stdout, stderr and log records to its own log file in the run dir
    (appending), for every process but the first; returns the file."""
    path = log_path(run_dir, process_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(descriptor, 1)
    os.dup2(descriptor, 2)
    os.close(descriptor)
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.FileHandler):  # the run's main log belongs to process 0
            root.removeHandler(handler)
            handler.close()
    return path
