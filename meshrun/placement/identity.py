"""A process's place in a multi-process job: its id, the job's size and coordinator, read from the
config or from what SLURM, Keras, JAX or a Kubernetes Indexed Job put in its environment. Nothing here
imports jax."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from meshrun.config.schema import DistributedConfig
from meshrun.errors import ConfigError

log = logging.getLogger("meshrun")


@dataclass(frozen=True)
class Identity:
    """This process's place in the job: its id, how many processes there are, the coordinator's
    host:port (None: jax works it out from SLURM's environment), where that came from, and the
    accelerators this process uses (None: jax's default)."""

    process_id: int = 0
    num_processes: int = 1
    coordinator: str | None = None
    source: str = "one process"
    local_device_ids: tuple[int, ...] | None = None

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
        return {
            "process_id": self.process_id,
            "processes": self.num_processes,
            "coordinator": self.coordinator,
            "source": self.source,
        }


ONE_PROCESS = Identity()


def identify(
    config: DistributedConfig, environ: Mapping[str, str], launched_locally: bool = False
) -> Identity:
    """Where this process stands: one process (mode off), the config's explicit values (given by
    meshrun's local launcher when `launched_locally`), or with mode auto the first of
    KERAS_DISTRIBUTION_*, JAX_* (the process id from JOB_COMPLETION_INDEX where JAX_PROCESS_ID is
    not set) and SLURM found in `environ` (one process when none is)."""
    if config.mode == "off":
        return ONE_PROCESS
    if config.mode == "explicit":
        source = "distributed.local_processes" if launched_locally else "distributed config"
        return Identity(config.process_id, config.num_processes, config.coordinator, source)
    for detect in (_from_keras_env, _from_jax_env, _from_slurm):
        found = detect(environ)
        if found is not None:
            return found
    if "SLURM_JOB_ID" in environ:
        return Identity(
            source="distributed=auto: a SLURM job but not a step of "
            "it; start meshrun with srun for one process per task"
        )
    return Identity(source="distributed=auto found no SLURM, KERAS_DISTRIBUTION_* or JAX_* settings")


def job_size(config: DistributedConfig, environ: Mapping[str, str]) -> int:
    """How many processes the configured job has (for `meshrun plan`: nothing is joined)."""
    if config.launches_locally:
        return config.local_processes
    return identify(config, environ).num_processes


def _ints(environ: Mapping[str, str], *names: str) -> tuple[int, ...] | None:
    values = [environ.get(name) for name in names]
    if any(v is None for v in values):
        return None
    try:
        return tuple(int(v) for v in values)
    except ValueError:
        bad = next(n for n, v in zip(names, values, strict=False) if not v.strip().lstrip("-").isdigit())
        raise ConfigError(
            "distributed.mode", f"auto read {bad}={environ[bad]!r} from the environment; expected an integer"
        ) from None


def _from_keras_env(environ: Mapping[str, str]) -> Identity | None:
    numbers = _ints(environ, "KERAS_DISTRIBUTION_NUM_PROCESSES", "KERAS_DISTRIBUTION_PROCESS_ID")
    addresses = environ.get("KERAS_DISTRIBUTION_JOB_ADDRESSES")
    if numbers is None or not addresses:
        return None
    # Keras lists every process's address; the first is the coordinator (process 0).
    return Identity(
        numbers[1], numbers[0], addresses.split(",")[0].strip(), "KERAS_DISTRIBUTION_* environment"
    )


def _from_jax_env(environ: Mapping[str, str]) -> Identity | None:
    """JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID; without JAX_PROCESS_ID, in a
    pod of a Kubernetes Indexed Job, the pod's completion index (JOB_COMPLETION_INDEX) is its id."""
    coordinator = environ.get("JAX_COORDINATOR_ADDRESS")
    from_index = "JAX_PROCESS_ID" not in environ and "JOB_COMPLETION_INDEX" in environ
    numbers = _ints(environ, "JAX_NUM_PROCESSES", "JOB_COMPLETION_INDEX" if from_index else "JAX_PROCESS_ID")
    if numbers is None or not coordinator:
        return None
    return Identity(
        numbers[1],
        numbers[0],
        coordinator,
        "JAX_* environment, JOB_COMPLETION_INDEX" if from_index else "JAX_* environment",
    )


def _from_slurm(environ: Mapping[str, str]) -> Identity | None:
    """A task of a SLURM job step (srun, or sbatch/submitit running srun). The coordinator is left
    to jax, which takes the step's first node and a port derived from the job id."""
    if "SLURM_JOB_ID" not in environ or "SLURM_STEP_NODELIST" not in environ:
        return None
    numbers = _ints(environ, "SLURM_NTASKS", "SLURM_PROCID")
    if numbers is None:
        return None
    return Identity(numbers[1], numbers[0], None, "SLURM", _slurm_local_devices(environ))


def _slurm_local_devices(environ: Mapping[str, str]) -> tuple[int, ...] | None:
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


def say_if_alone(config: DistributedConfig, identity: Identity) -> None:
    """Warns when distributed=auto found no job to join (the run goes on as one process)."""
    if config.mode == "auto" and not identity.several:
        log.warning(f"{identity.source}; running as one process")
