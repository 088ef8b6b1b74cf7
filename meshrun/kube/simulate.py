"""`meshrun k8s --simulate`: the rendered job's pods run here, each as a local meshrun process started and
watched as meshrun.launch.local does for distributed.local_processes, with the command and the
environment its pod spec gives it. Only what a cluster would add is filled in:

- the pods' DNS names under the job's service (NAME-0.NAME, NAME-node-0-0.NAME) point at 127.0.0.1;
- the volume's mount path is a local dir, ./k8s-volumes/CLAIM under the working dir, and the pods'
  emptyDir one they share, ./k8s-volumes/emptyDir-NAME, emptied first (each pod has its own on a
  cluster, empty when the pod starts);
- each pod's completion index (JOB_COMPLETION_INDEX, and the fieldRef of JAX_PROCESS_ID) is its number;
- under a TrainJob, the JAX_* environment the jax-distributed runtime gives its pods (`runtime_env`),
  with --port as the runtime's coordinator port.

The environment this process inherited is each pod's base (as an image's is), less what would place a
process in another job (SLURM_*, KERAS_DISTRIBUTION_*, JAX_*). The command exits with the job's status.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from meshrun.errors import ConfigError
from meshrun.kube.options import KubeOptions
from meshrun.kube.render import COMPLETION_INDEX_FIELD, RUNTIME_NODE
from meshrun.launch.join import check_port_free
from meshrun.launch.local import follow, logs_there, start_process
from meshrun.launch.spawn import Role

LOCAL_HOST = "127.0.0.1"
VOLUMES_DIR = "k8s-volumes"
RUN_DIR_KEY = "hydra.run.dir"
# What the inherited environment must not carry into a pod: another job's place in it.
FOREIGN_ENV = re.compile(
    r"SLURM_.*|KERAS_DISTRIBUTION_.*|JAX_COORDINATOR_.*|JAX_NUM_PROCESSES|JAX_PROCESS_ID|JOB_COMPLETION_INDEX"
)


@dataclass(frozen=True)
class Pods:
    """The pods of a rendered job as a simulation reads them: how many, the command and the env
    entries (a value or a fieldRef, as in a pod spec) of each, the volumes they mount (mount path:
    the pod spec's volume) and the DNS domain of their hostnames (the job's service)."""

    count: int
    command: list[str]
    env: list[dict]
    mounts: dict[str, dict]
    domain: str


@dataclass(frozen=True)
class Localizer:
    """Maps what a pod sees onto this machine: a host under the job's `domain` to 127.0.0.1, a path
    in a mounted volume to the same path in that volume's local dir (`volumes`: mount path -> dir)."""

    domain: str
    volumes: dict[str, Path]

    def arg(self, arg: str) -> str:
        """A command-line argument (an override's value where it is key=value) as seen here."""
        key, equals, value = arg.partition("=")
        return f"{key}={self.value(value)}" if equals else self.value(arg)

    def value(self, value: str) -> str:
        """A path or a host:port as seen here; any other value as it is."""
        for mount, local in self.volumes.items():
            if value == mount or value.startswith(mount + "/"):
                return str(local) + value[len(mount) :]
        host, colon, port = value.rpartition(":")
        if (
            colon
            and port.isdigit()
            and (host == self.domain or host.endswith(f".{self.domain}") or f".{self.domain}." in host)
        ):
            return f"{LOCAL_HOST}:{port}"
        return value


def run(documents: list[dict], options: KubeOptions) -> None:
    """Runs the job's pods here to their end; raises as meshrun.launch.local.follow does when they
    fail (ConfigError, RunFailed) or a stop signal stopped them (Preempted)."""
    pods = pods_of(documents, options.port)
    check_port_free(options.port, "--port", options.port)
    local = Localizer(
        pods.domain, {path: Path.cwd() / VOLUMES_DIR / local_name(v) for path, v in pods.mounts.items()}
    )
    command = [local.arg(arg) for arg in pods.command]
    run_dir = _run_dir(command)
    for path, volume in pods.mounts.items():
        if "emptyDir" in volume:
            shutil.rmtree(local.volumes[path], ignore_errors=True)
    for folder in (*local.volumes.values(), Path(run_dir)):
        folder.mkdir(parents=True, exist_ok=True)
    print(_saying(options, pods, local, run_dir), file=sys.stderr)
    logged_before = logs_there(run_dir, pods.count)
    started = [
        start_process(command[1:], Role.USER, index, run_dir, pod_environ(pods, index, local))
        for index in range(pods.count)
    ]
    follow(started, run_dir, logged_before)


def _run_dir(command: list[str]) -> str:
    """The run dir the pods' `meshrun train` command names."""
    return next(arg.partition("=")[2] for arg in command if arg.startswith(f"{RUN_DIR_KEY}="))


def _saying(options: KubeOptions, pods: Pods, local: Localizer, run_dir: str) -> str:
    """The one line that says what the simulation maps where."""
    volumes = ", ".join(
        f"{_described(volume)}:{path} -> {local.volumes[path]}" for path, volume in pods.mounts.items()
    )
    return (
        f"meshrun k8s --simulate: {pods.count} pods of {options.kind} {options.name} as local processes; "
        f"*.{pods.domain} -> {LOCAL_HOST}, {volumes}; run dir "
        f"{run_dir}, each pod's output in its process-<i>.log"
    )


def local_name(volume: dict) -> str:
    """The name of a pod's volume's dir under ./k8s-volumes: a claim's name, or emptyDir-NAME (which no
    claim can be named: claims are lowercase)."""
    if "persistentVolumeClaim" in volume:
        return volume["persistentVolumeClaim"]["claimName"]
    if "emptyDir" in volume:
        return f"emptyDir-{volume['name']}"
    raise ConfigError("--simulate", f"got volume {volume}; a simulation mounts only claims and emptyDirs")


def _described(volume: dict) -> str:
    if "persistentVolumeClaim" in volume:
        return f"volume {volume['persistentVolumeClaim']['claimName']}"
    return f"emptyDir {volume['name']}"


def pods_of(documents: list[dict], port: int) -> Pods:
    """The pods the rendered objects make: those of the Indexed Job, or of the TrainJob (with the
    env its runtime adds, its coordinator on `port`)."""
    for document in documents:
        if document["kind"] == "Job":
            return _indexed_job_pods(document)
        if document["kind"] == "TrainJob":
            return _train_job_pods(document, port)
    raise ConfigError(
        "--simulate", f"got objects of kinds {[d['kind'] for d in documents]}; expected a Job or a TrainJob"
    )


def _indexed_job_pods(job: dict) -> Pods:
    spec = job["spec"]
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    mounts = _mounts(pod, container)
    return Pods(spec["completions"], container["command"], container.get("env", []), mounts, pod["subdomain"])


def _train_job_pods(train_job: dict, port: int) -> Pods:
    name, spec = train_job["metadata"]["name"], train_job["spec"]
    trainer = spec["trainer"]
    pod = {}
    for patch in spec.get("runtimePatches", []):
        for replicated in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
            if replicated["name"] == RUNTIME_NODE:
                pod |= replicated["template"]["spec"]["template"]["spec"]
    node = next((c for c in pod.get("containers", []) if c["name"] == RUNTIME_NODE), {})
    mounts = _mounts(pod, node)
    env = [*trainer.get("env", []), *runtime_env(name, trainer["numNodes"], port)]
    return Pods(trainer["numNodes"], trainer["command"], env, mounts, name)


def _mounts(pod: dict, container: dict) -> dict[str, dict]:
    """The volumes `container` of `pod` mounts, by mount path."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    return {m["mountPath"]: volumes[m["name"]] for m in container.get("volumeMounts", [])}


def runtime_env(name: str, nodes: int, port: int) -> list[dict]:
    """The environment the jax-distributed runtime gives each pod of TrainJob `name` (Kubeflow
    Trainer's JAX plugin: after the TrainJob's own env), its coordinator's port being `port`."""
    return [
        {"name": "JAX_NUM_PROCESSES", "value": str(nodes)},
        {"name": "JAX_PROCESS_ID", "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX_FIELD}}},
        {"name": "JAX_COORDINATOR_ADDRESS", "value": f"{name}-{RUNTIME_NODE}-0-0.{name}:{port}"},
        {"name": "JAX_COORDINATOR_PORT", "value": str(port)},
        {"name": "JAX_DISTRIBUTED_BACKEND", "value": "gloo"},
    ]


def pod_environ(pods: Pods, index: int, local: Localizer) -> dict[str, str]:
    """The environment of pod `index`: this process's (less another job's place), the completion
    index Kubernetes gives an Indexed Job's pods, then the pod spec's env, localized."""
    inherited = {k: v for k, v in os.environ.items() if not FOREIGN_ENV.fullmatch(k)}
    given = {entry["name"]: local.value(env_value(entry, index)) for entry in pods.env}
    return {**inherited, "JOB_COMPLETION_INDEX": str(index), **given}


def env_value(entry: dict, index: int) -> str:
    """The value of one env entry of a pod spec in pod `index`: its value, or what its fieldRef
    reads (the completion index; the only one meshrun renders)."""
    if "value" in entry:
        return entry["value"]
    field = entry.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
    if field != COMPLETION_INDEX_FIELD:
        raise ConfigError(
            "--simulate",
            f"got env {entry['name']} from {entry.get('valueFrom')}; "
            f"a simulation fills in only {COMPLETION_INDEX_FIELD}",
        )
    return str(index)
