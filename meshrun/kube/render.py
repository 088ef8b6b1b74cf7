"""The Kubernetes objects of a `meshrun k8s` job, as plain dicts: pure functions of the checked config,
the command's options and the overrides the pods' `meshrun train` gets.

- `trainjob`: a Kubeflow Trainer v2 TrainJob (trainer.kubeflow.org/v1alpha1) on the `jax-distributed`
  ClusterTrainingRuntime, which starts `numNodes` pods and gives each JAX_COORDINATOR_ADDRESS,
  JAX_NUM_PROCESSES and JAX_PROCESS_ID. The volumes, the grace period, the security contexts and the
  service account (a ServiceAccount rendered with it) go in through `runtimePatches`, all
  kubeflow-trainer-api 2.3 lets a TrainJob change of the runtime's pods; the runtime's JobSet decides
  retries.
- `indexed-job`: plain Kubernetes: a headless Service and an Indexed Job whose pods find process 0 at
  `NAME-0.NAME:PORT` and their process id in the pod's completion index. Its podFailurePolicy
  retries pods stopped by a disruption or by SIGTERM (meshrun exits 143 after saving a checkpoint)
  without counting them, and fails the job at once on exit status 2 (a config error).

Every pod runs `meshrun train` with the user's overrides and `distributed.mode=auto`; with a volume,
the run dir is VOLUME/NAME and the checkpoints go to its checkpoints/ with resume=auto, so a pod
that is started again continues from the newest checkpoint. The pods meet the restricted Pod Security
Standard, and a NetworkPolicy (created first) lets only the job's pods reach them (kube/security.py).
"""

from __future__ import annotations

from collections.abc import Mapping

import yaml

from meshrun.config.checks import check_processes
from meshrun.config.schema import RunConfig
from meshrun.config.slices import with_dcn
from meshrun.errors import ConfigError
from meshrun.kube import security
from meshrun.kube.options import SCRATCH_PATH, KubeOptions
from meshrun.specs.rundir import CHECKPOINTS_DIR
from meshrun.wording import format_shape

TRAINER_API = "trainer.kubeflow.org/v1alpha1"
RUNTIME = "jax-distributed"
RUNTIME_KIND = "ClusterTrainingRuntime"
# The jax-distributed runtime's replicated job and container, both named `node`.
RUNTIME_NODE = "node"
CONTAINER = "meshrun"
VOLUME_NAME = "runs"
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"  # on each pod of a TrainJob's JobSet: the job's name
GPU_RESOURCE = "nvidia.com/gpu"
COMPLETION_INDEX_FIELD = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
# Long enough for a large model's checkpoint after SIGTERM (Kubernetes' default is 30 s).
GRACE_PERIOD_S = 600
# One crashed pod takes the others down with it: a few crashes of the whole job before it fails.
CRASHES_PER_POD = 3
PREEMPTED_STATUS = 143  # 128 + SIGTERM: meshrun stopped at a step with a checkpoint
CONFIG_ERROR_STATUS = 2
# Pods start at different times (scheduling, pulling the image): they wait this long for each other.
JOIN_TIMEOUT_S = 600
# The keys the pods' command sets; the user's own values for them are dropped.
OWN_KEYS = (
    "distributed.mode",
    "distributed.coordinator",
    "distributed.num_processes",
    "distributed.process_id",
    "distributed.port",
    "hydra.run.dir",
)
# The user's value wins for these; the job's is added when they give none.
DEFAULT_KEYS = ("distributed.timeout_s", "checkpoint.dir", "resume")
LOCAL_RUNS = f"{SCRATCH_PATH}/outputs"  # the run dir's parent without a volume: in the pod's emptyDir


def pod_overrides(overrides: list[str], options: KubeOptions) -> list[str]:
    """The overrides every pod's `meshrun train` gets, but its run dir (`run_dir`): the user's (but
    the keys the job sets, OWN_KEYS), `distributed.mode=auto`, a join timeout for pods that start
    apart and, with a volume, the checkpoint dir on it and resume=auto (the user's win)."""
    given = {_key(o) for o in overrides}
    kept = [o for o in overrides if _key(o) not in OWN_KEYS]
    defaults = {"distributed.timeout_s": str(JOIN_TIMEOUT_S)}
    if options.volume is not None:
        defaults |= {"checkpoint.dir": f"{run_dir(options)}/{CHECKPOINTS_DIR}", "resume": "auto"}
    return [
        *kept,
        "distributed.mode=auto",
        *(f"{key}={value}" for key, value in defaults.items() if key not in given),
    ]


def _key(override: str) -> str:
    return override.lstrip("+~").partition("=")[0]


def run_dir(options: KubeOptions) -> str:
    """The pods' run dir: NAME in the volume, else outputs/NAME in the pod's emptyDir (gone with the
    pod)."""
    parent = options.volume.path if options.volume is not None else LOCAL_RUNS
    return f"{parent}/{options.name}"


def check_one_process_per_pod(raw: Mapping) -> None:
    """ConfigError when the composed config asks for several local processes: each pod runs one."""
    distributed = raw.get("distributed") or {}
    local = distributed.get("local_processes") if isinstance(distributed, Mapping) else None
    if isinstance(local, int) and local > 1:
        raise ConfigError(
            "distributed.local_processes",
            f"got {local}; meshrun k8s runs one process in each pod: leave it at 1 "
            f"and give the number of pods with --nodes (e.g. --nodes {local})",
        )


def check_job(config: RunConfig, options: KubeOptions) -> None:
    """ConfigError unless the config's mesh splits over the pods: its whole shape given (no -1: the
    pods' devices are not known here), its devices an equal share per pod, mesh.dcn one slice per
    pod; and the platform one meshrun k8s asks devices for."""
    mesh = config.mesh
    if mesh.size is None:
        raise ConfigError(
            "mesh",
            f"got {format_shape(mesh.shape)}; meshrun k8s needs the whole shape (no -1), which sets how many "
            f"devices each of the --nodes {options.nodes} pods asks for, e.g. mesh=2x4",
        )
    check_processes(mesh, config.devices, options.nodes, "--nodes")
    with_dcn(
        mesh, options.nodes, (config.pipeline.axis,), "--nodes"
    )  # mesh.dcn, or its default, one slice per pod
    if config.devices.platform not in ("auto", "gpu", "cpu"):
        raise ConfigError(
            "devices.platform",
            f"got {config.devices.platform!r}; meshrun k8s asks for NVIDIA GPUs ({GPU_RESOURCE}) or, "
            "with devices.platform=cpu, none; valid: auto, gpu or cpu",
        )


def gpus_per_pod(config: RunConfig, options: KubeOptions) -> int:
    """The GPUs each pod asks for: its share of the mesh's devices; none on CPU."""
    return 0 if config.devices.platform == "cpu" else config.mesh.size // options.nodes


def command(overrides: list[str], options: KubeOptions) -> list[str]:
    """What every pod runs: `meshrun train` with the pods' overrides and run dir."""
    return ["meshrun", "train", *overrides, f"hydra.run.dir={run_dir(options)}"]


def render(config: RunConfig, options: KubeOptions, overrides: list[str]) -> list[dict]:
    """The job's Kubernetes objects, in the order they are created: its NetworkPolicy (unless
    --no-network-policy), then a ServiceAccount and a TrainJob, or a headless Service and an Indexed
    Job. `overrides` are the pods' (`pod_overrides`)."""
    pods = command(overrides, options)
    gpus = gpus_per_pod(config, options)
    policy = (
        [security.network_policy(metadata(options), pod_labels(options))] if options.network_policy else []
    )
    if options.kind == "trainjob":
        return [*policy, security.service_account(metadata(options)), train_job(options, pods, gpus)]
    return [*policy, headless_service(options), indexed_job(options, pods, gpus)]


def metadata(options: KubeOptions) -> dict:
    """An object's name, namespace (where given) and labels."""
    meta = {"name": options.name, **({"namespace": options.namespace} if options.namespace else {})}
    return {**meta, "labels": labels(options)}


def labels(options: KubeOptions) -> dict:
    """The labels of the job's objects and pods (the Service selects its pods by them)."""
    return {"app.kubernetes.io/name": "meshrun", "app.kubernetes.io/instance": options.name}


def pod_labels(options: KubeOptions) -> dict:
    """The labels that pick out the job's pods: ours on an Indexed Job's, JobSet's on a TrainJob's
    (which meshrun cannot label)."""
    return {JOBSET_LABEL: options.name} if options.kind == "trainjob" else labels(options)


def resources(gpus: int) -> dict:
    """A pod's resources: its GPUs, as limits (Kubernetes sets the requests the same)."""
    return {"limits": {GPU_RESOURCE: str(gpus)}} if gpus else {}


def env(options: KubeOptions, extra: list[dict] = ()) -> list[dict]:
    """The environment meshrun needs in a pod, after `extra`: its output unbuffered, so that
    `kubectl logs` follows the run as it goes, and the dirs it writes to (security.writable_dirs)."""
    return [*extra, {"name": "PYTHONUNBUFFERED", "value": "1"}, *security.writable_dirs(options)]


def pull_secrets(options: KubeOptions) -> dict:
    """The pod's imagePullSecrets, from --pull-secret. Without it a TrainJob's pods, which run as its
    own ServiceAccount, get none; an Indexed Job's get the namespace's default service account's."""
    return {"imagePullSecrets": [{"name": options.pull_secret}]} if options.pull_secret else {}


def volumes(options: KubeOptions) -> list[dict]:
    """The pod's volumes: its emptyDir, and the claim of --volume."""
    claim = options.volume
    return [
        security.scratch_volume(),
        *([{"name": VOLUME_NAME, "persistentVolumeClaim": {"claimName": claim.claim}}] if claim else []),
    ]


def volume_mounts(options: KubeOptions) -> list[dict]:
    """Where the meshrun container mounts the pod's volumes."""
    claim = options.volume
    return [security.scratch_mount(), *([{"name": VOLUME_NAME, "mountPath": claim.path}] if claim else [])]


# --- trainjob ---------------------------------------------------------------------------------------


def train_job(options: KubeOptions, pods: list[str], gpus: int) -> dict:
    """A Kubeflow Trainer TrainJob of `options.nodes` pods on the jax-distributed runtime."""
    trainer = {"image": options.image, "command": pods, "numNodes": options.nodes, "env": env(options)}
    if gpus:
        trainer["resourcesPerNode"] = resources(gpus)
    spec = {
        "runtimeRef": {"apiGroup": TRAINER_API.split("/")[0], "kind": RUNTIME_KIND, "name": RUNTIME},
        "trainer": trainer,
        "runtimePatches": [runtime_patch(options)],
    }
    return {"apiVersion": TRAINER_API, "kind": "TrainJob", "metadata": metadata(options), "spec": spec}


def runtime_patch(options: KubeOptions) -> dict:
    """What the TrainJob changes of the runtime's pods (runtimePatches, keyed by manager): its
    service account, their security contexts, a long grace period for the checkpoint after SIGTERM,
    and the volumes mounted in the `node` container."""
    node = {
        "name": RUNTIME_NODE,
        "securityContext": security.container_security_context(),
        "volumeMounts": volume_mounts(options),
    }
    pod_spec = {
        "serviceAccountName": options.name,
        "securityContext": security.pod_security_context(options.user),
        "terminationGracePeriodSeconds": GRACE_PERIOD_S,
        **pull_secrets(options),
        "volumes": volumes(options),
        "containers": [node],
    }
    pod_template = {"spec": {"template": {"spec": pod_spec}}}
    job_set = {"spec": {"replicatedJobs": [{"name": RUNTIME_NODE, "template": pod_template}]}}
    return {"manager": "meshrun", "trainingRuntimeSpec": {"template": job_set}}


# --- indexed-job ------------------------------------------------------------------------------------


def coordinator(options: KubeOptions) -> str:
    """Process 0's host:port: the DNS name the headless service gives pod 0 of the Indexed Job."""
    return f"{options.name}-0.{options.name}:{options.port}"


def headless_service(options: KubeOptions) -> dict:
    """The headless Service that gives each pod of the job a DNS name (NAME-INDEX.NAME), listed
    before its pod is ready so that the others find process 0 while it starts."""
    spec = {
        "clusterIP": "None",
        "selector": labels(options),
        "publishNotReadyAddresses": True,
        "ports": [{"name": "coordinator", "port": options.port, "targetPort": options.port}],
    }
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata(options), "spec": spec}


def indexed_job(options: KubeOptions, pods: list[str], gpus: int) -> dict:
    """The Indexed Job: `nodes` pods at once, each process `JOB_COMPLETION_INDEX` of the job."""
    spec = {
        "completionMode": "Indexed",
        "completions": options.nodes,
        "parallelism": options.nodes,
        "backoffLimit": CRASHES_PER_POD * options.nodes,
        "podReplacementPolicy": "Failed",  # a pod's replacement starts once it is gone, its port free
        "podFailurePolicy": failure_policy(),
        "template": {"metadata": {"labels": labels(options)}, "spec": pod_spec(options, pods, gpus)},
    }
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata(options), "spec": spec}


def failure_policy() -> dict:
    """Which failed pods count against backoffLimit: one evicted or preempted (DisruptionTarget) or
    stopped by SIGTERM with a checkpoint (143) is started again without counting; a config error
    (2) fails the job at once, since a new pod would fail the same way."""
    return {
        "rules": [
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            {
                "action": "Ignore",
                "onExitCodes": {"containerName": CONTAINER, "operator": "In", "values": [PREEMPTED_STATUS]},
            },
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": CONTAINER,
                    "operator": "In",
                    "values": [CONFIG_ERROR_STATUS],
                },
            },
        ]
    }


def pod_spec(options: KubeOptions, pods: list[str], gpus: int) -> dict:
    """The pods of the Indexed Job: named on the headless service, one meshrun container each."""
    jax_env = [
        {"name": "JAX_COORDINATOR_ADDRESS", "value": coordinator(options)},
        {"name": "JAX_NUM_PROCESSES", "value": str(options.nodes)},
        {"name": "JAX_PROCESS_ID", "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX_FIELD}}},
    ]
    container = {
        "name": CONTAINER,
        "image": options.image,
        "command": pods,
        "env": env(options, jax_env),
        "ports": [{"name": "coordinator", "containerPort": options.port}],
        "securityContext": security.container_security_context(),
        "volumeMounts": volume_mounts(options),
    }
    if gpus:
        container["resources"] = resources(gpus)
    return {
        "subdomain": options.name,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": GRACE_PERIOD_S,
        "automountServiceAccountToken": False,
        "securityContext": security.pod_security_context(options.user),
        **pull_secrets(options),
        "containers": [container],
        "volumes": volumes(options),
    }


# --- text -------------------------------------------------------------------------------------------


def to_yaml(documents: list[dict], options: KubeOptions) -> str:
    """The objects as one multi-document YAML text, after a comment saying how to submit it; the
    NetworkPolicy after one saying what it lets in and how to widen it."""
    head = (
        f"# meshrun k8s: {options.kind} {options.name}, {options.nodes} "
        "pods; submit with kubectl apply -f <this file>\n"
    )
    coordinator = (
        "the runtime's jax coordinator"
        if options.kind == "trainjob"
        else f"the jax coordinator (port {options.port})"
    )
    comments = {"NetworkPolicy": security.network_policy_comment(coordinator)}
    return head + "".join(
        f"---\n{comments.get(document['kind'], '')}"
        + yaml.safe_dump(document, sort_keys=False, default_flow_style=False, width=1000)
        for document in documents
    )


def no_volume_warning(options: KubeOptions) -> str:
    """The one line said when the job has no volume."""
    return (
        f"no --volume: the run dir ({run_dir(options)}) and the checkpoints stay in each pod and die with "
        "it, and a preempted job starts over; give --volume "
        "CLAIM:/PATH (a PersistentVolumeClaim every pod mounts)"
    )
