"""`meshrun k8s`: the job `meshrun train` would run, rendered for Kubernetes. The objects load into
Kubeflow Trainer's API models and pass Kubernetes' own schemas (kubernetes-validate, strict); what
the pods run, their resources, volume and failure policy are as docs/jobs/distributed.md says; every
bad input, what `meshrun plan` refuses of the pods' run included, is one line with exit status 2 and
writes nothing; a pod of an Indexed Job finds its place in the job; --apply talks to a stand-in API
server on this machine; and --simulate runs a 2-pod Indexed Job here, training exactly like one
process. No real cluster, GPU or Kubeflow runtime is involved."""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from conftest import FAST, cli_here, fast_run_in_process, read_metrics, run_meshrun
from conftest import K8S_CPU_JOB as CPU_JOB
from conftest import K8S_IMAGE as IMAGE
from conftest import K8S_JOB_FLAGS as FLAGS
from conftest import k8s_here as k8s
from conftest import k8s_rendered as rendered
from meshrun import cli
from meshrun.config.parse import parse_distributed
from meshrun.errors import ConfigError
from meshrun.launch.join import free_port
from meshrun.placement.identity import Identity, identify

INDEX_FIELD = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
# The env every pod gets after its JAX_* place: its output unbuffered, and where it writes (with a volume).
POD_ENV = [
    {"name": "PYTHONUNBUFFERED", "value": "1"},
    {"name": "XDG_CACHE_HOME", "value": "/runs/.cache"},
    {"name": "KAGGLEHUB_CACHE", "value": "/runs/.cache/kagglehub"},
    {"name": "XDG_CONFIG_HOME", "value": "/tmp/meshrun/config"},
    {"name": "KERAS_HOME", "value": "/tmp/meshrun/keras"},
    {"name": "MPLCONFIGDIR", "value": "/tmp/meshrun/matplotlib"},
]
SCRATCH_VOLUME = {"name": "scratch", "emptyDir": {}}
SCRATCH_MOUNT = {"name": "scratch", "mountPath": "/tmp/meshrun"}
POD_OVERRIDES = [
    "distributed.mode=auto",
    "distributed.timeout_s=600",
    "checkpoint.dir=/runs/exp1/checkpoints",
    "resume=auto",
]


def the(kind: str, documents: list[dict]) -> dict:
    """The one object of `kind` among `documents`."""
    [document] = [d for d in documents if d["kind"] == kind]
    return document


# --- trainjob -----------------------------------------------------------------------------------


def test_the_trainjob_loads_into_kubeflow_trainers_api_and_round_trips(in_tmp, capsys):
    from kubeflow_trainer_api.models import TrainerV1alpha1TrainJob

    documents = rendered(["mesh=2x4", "layout=dense_model", *FLAGS, "--volume", "runs:/runs"], capsys)
    assert [d["kind"] for d in documents] == ["NetworkPolicy", "ServiceAccount", "TrainJob"]
    document = the("TrainJob", documents)
    job = TrainerV1alpha1TrainJob.from_dict(document)
    assert job.to_dict() == document  # every field known to the API, none lost
    assert (job.api_version, job.kind, job.metadata.name) == (
        "trainer.kubeflow.org/v1alpha1",
        "TrainJob",
        "exp1",
    )
    runtime = job.spec.runtime_ref
    assert (runtime.name, runtime.kind, runtime.api_group) == (
        "jax-distributed",
        "ClusterTrainingRuntime",
        "trainer.kubeflow.org",
    )
    trainer = job.spec.trainer
    assert trainer.num_nodes == 2 and trainer.image == IMAGE
    assert trainer.command == [
        "meshrun",
        "train",
        "mesh=2x4",
        "layout=dense_model",
        *POD_OVERRIDES,
        "hydra.run.dir=/runs/exp1",
    ]
    assert trainer.resources_per_node.to_dict() == {
        "limits": {"nvidia.com/gpu": "4"}
    }  # 8 devices over 2 nodes
    assert [e.to_dict() for e in trainer.env] == POD_ENV  # the runtime gives the JAX_* env
    [patch] = job.spec.runtime_patches
    [node] = patch.training_runtime_spec.template.spec.replicated_jobs
    pod = node.template.spec.template.spec
    assert node.name == "node" and pod.termination_grace_period_seconds == 600
    assert pod.service_account_name == "exp1"  # the ServiceAccount rendered with it, which mounts no token
    assert [v.to_dict() for v in pod.volumes] == [
        SCRATCH_VOLUME,
        {"name": "runs", "persistentVolumeClaim": {"claimName": "runs"}},
    ]
    assert [(c.name, [m.to_dict() for m in c.volume_mounts]) for c in pod.containers] == [
        ("node", [SCRATCH_MOUNT, {"name": "runs", "mountPath": "/runs"}])
    ]


def test_a_cpu_trainjob_asks_for_no_gpus_and_warns_without_a_volume(in_tmp, capsys):
    status, out, err = k8s([*CPU_JOB, *FLAGS], capsys)
    assert status == 0
    document = the("TrainJob", yaml.safe_load_all(out))
    assert "resourcesPerNode" not in document["spec"]["trainer"]
    assert err.splitlines() == [
        "meshrun: warning: no --volume: the run dir (/tmp/meshrun/outputs/exp1) and the checkpoints stay in "
        "each pod and "
        "die with it, and a preempted job starts over; give --volume "
        "CLAIM:/PATH (a PersistentVolumeClaim every pod mounts)"
    ]
    command = document["spec"]["trainer"]["command"]
    assert command[-1] == "hydra.run.dir=/tmp/meshrun/outputs/exp1" and not any(
        a.startswith(("checkpoint.dir=", "resume=")) for a in command
    )
    pod = document["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][
        0
    ]["template"]["spec"]["template"]["spec"]
    assert pod["volumes"] == [SCRATCH_VOLUME] and pod["containers"][0]["volumeMounts"] == [SCRATCH_MOUNT]


# --- indexed-job --------------------------------------------------------------------------------


def test_the_indexed_job_and_its_service_pass_kubernetes_schemas(in_tmp, capsys):
    import kubernetes_validate

    documents = rendered(
        [*CPU_JOB, *FLAGS, "--kind", "indexed-job", "--volume", "runs:/runs", "--namespace", "ml"], capsys
    )
    assert [d["kind"] for d in documents] == ["NetworkPolicy", "Service", "Job"]
    for document in documents:
        kubernetes_validate.validate(document, "1.31", strict=True)
    with pytest.raises(kubernetes_validate.ValidationError):  # strict: an unknown field would be caught
        kubernetes_validate.validate(
            {**documents[1], "spec": {**documents[1]["spec"], "completionsMode": "Indexed"}},
            "1.31",
            strict=True,
        )


def test_the_indexed_job_runs_meshrun_in_every_pod_with_its_place_volume_and_failure_policy(in_tmp, capsys):
    _, service, job = rendered(
        [
            "mesh=2x4",
            "layout=dense_model",
            *FLAGS,
            "--kind",
            "indexed-job",
            "--volume",
            "runs:/runs",
            "--port",
            "7777",
        ],
        capsys,
    )
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"], spec["backoffLimit"]) == (
        "Indexed",
        2,
        2,
        6,
    )
    pod = spec["template"]["spec"]
    assert service["spec"]["selector"].items() <= spec["template"]["metadata"]["labels"].items()
    assert pod["subdomain"] == service["metadata"]["name"] == "exp1"
    assert pod["restartPolicy"] == "Never" and pod["terminationGracePeriodSeconds"] == 600
    [container] = pod["containers"]
    assert container["command"] == [
        "meshrun",
        "train",
        "mesh=2x4",
        "layout=dense_model",
        *POD_OVERRIDES,
        "hydra.run.dir=/runs/exp1",
    ]
    assert container["env"] == [
        {"name": "JAX_COORDINATOR_ADDRESS", "value": "exp1-0.exp1:7777"},
        {"name": "JAX_NUM_PROCESSES", "value": "2"},
        {"name": "JAX_PROCESS_ID", "valueFrom": {"fieldRef": {"fieldPath": INDEX_FIELD}}},
        *POD_ENV,
    ]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "4"}}
    assert container["ports"] == [{"name": "coordinator", "containerPort": 7777}]
    assert container["volumeMounts"] == [SCRATCH_MOUNT, {"name": "runs", "mountPath": "/runs"}]
    assert pod["volumes"] == [
        SCRATCH_VOLUME,
        {"name": "runs", "persistentVolumeClaim": {"claimName": "runs"}},
    ]
    assert spec["podFailurePolicy"]["rules"] == [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {"action": "Ignore", "onExitCodes": {"containerName": "meshrun", "operator": "In", "values": [143]}},
        {"action": "FailJob", "onExitCodes": {"containerName": "meshrun", "operator": "In", "values": [2]}},
    ]


def test_a_pull_secret_goes_into_the_pods_of_either_kind(in_tmp, capsys):
    from kubeflow_trainer_api.models import TrainerV1alpha1TrainJob

    secret = [{"name": "regcred"}]
    train_job = the("TrainJob", rendered([*CPU_JOB, *FLAGS, "--pull-secret", "regcred"], capsys))
    assert TrainerV1alpha1TrainJob.from_dict(train_job).to_dict() == train_job
    patched = train_job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    assert patched["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["imagePullSecrets"] == secret
    job = the(
        "Job", rendered([*CPU_JOB, *FLAGS, "--kind", "indexed-job", "--pull-secret", "regcred"], capsys)
    )
    assert job["spec"]["template"]["spec"]["imagePullSecrets"] == secret
    without = the("Job", rendered([*CPU_JOB, *FLAGS, "--kind", "indexed-job"], capsys))
    assert "imagePullSecrets" not in without["spec"]["template"]["spec"]  # the default service account's


def test_the_pods_set_their_own_distributed_keys_and_keep_the_users_others(in_tmp, capsys):
    user = [
        "distributed.coordinator=x:1",
        "distributed.num_processes=9",
        "distributed.process_id=3",
        "hydra.run.dir=mine",
        "checkpoint.dir=/runs/elsewhere",
        "resume=never",
        "distributed.timeout_s=60",
        "train.epochs=3",
    ]
    document = the("TrainJob", rendered([*CPU_JOB, *user, *FLAGS, "--volume", "runs:/runs"], capsys))
    assert document["spec"]["trainer"]["command"][2:] == [
        *CPU_JOB,
        "checkpoint.dir=/runs/elsewhere",
        "resume=never",
        "distributed.timeout_s=60",
        "train.epochs=3",
        "distributed.mode=auto",
        "hydra.run.dir=/runs/exp1",
    ]


def test_out_writes_the_yaml_instead_of_printing_it(in_tmp, capsys):
    status, out, err = k8s(
        [*CPU_JOB, *FLAGS, "--kind", "indexed-job", "--volume", "runs:/runs", "--out", "job.yaml"], capsys
    )
    assert status == 0 and out == ""
    assert err.strip() == "meshrun k8s: wrote job.yaml"
    text = (in_tmp / "job.yaml").read_text()
    assert text.startswith(
        "# meshrun k8s: indexed-job exp1, 2 pods; submit with kubectl apply -f <this file>\n"
    )
    assert [d["kind"] for d in yaml.safe_load_all(text)] == ["NetworkPolicy", "Service", "Job"]


def test_out_makes_the_dirs_it_needs_and_refuses_a_path_it_cannot_write(in_tmp, capsys):
    status, out, err = k8s(
        [*CPU_JOB, *FLAGS, "--volume", "runs:/runs", "--out", "jobs/exp1/job.yaml"], capsys
    )
    assert status == 0 and err.strip() == "meshrun k8s: wrote jobs/exp1/job.yaml"
    assert [d["kind"] for d in yaml.safe_load_all((in_tmp / "jobs" / "exp1" / "job.yaml").read_text())] == [
        "NetworkPolicy",
        "ServiceAccount",
        "TrainJob",
    ]
    (in_tmp / "taken").write_text("a file")
    status, out, err = k8s([*CPU_JOB, *FLAGS, "--out", "taken/job.yaml"], capsys)
    assert status == 2 and err.splitlines() == [
        f"meshrun: error: --out: got 'taken/job.yaml', which cannot be written ({in_tmp / 'taken'} is a "
        "file, not a directory); give a file path where you can write, e.g. --out job.yaml"
    ]


def test_the_checks_leave_the_environment_the_simulated_pods_inherit_as_it_was(in_tmp, monkeypatch, capsys):
    # The plan's device set-up (one CPU device) sets JAX_PLATFORMS=cpu, which would keep the pods of
    # --simulate off the GPUs; jax is set up already in this process, so nothing else changes here.
    monkeypatch.delenv("JAX_PLATFORMS")
    # What any command sets before this one's checks (so that the test alone sees what it sees after
    # other tests): jax's import-time settings, and Hydra's whole errors (meshrun.app.run).
    import jax  # noqa: F401

    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    before = dict(os.environ)
    rendered(["mesh=2x4", "layout=dense_model", *FLAGS, "--volume", "runs:/runs"], capsys)
    assert dict(os.environ) == before


def test_the_plans_warnings_are_said_before_the_job_is_written(in_tmp, capsys):
    stages_typo = [
        "model=transformer",
        "mesh=4x2",
        "mesh.axis_names=[stages,data]",
        "mesh.batch_axis=data",
        "layout=replicated",
        "pipeline.microbatches=4",
    ]
    status, out, err = k8s([*stages_typo, "devices.platform=cpu", *FLAGS, "--volume", "runs:/runs"], capsys)
    assert status == 0 and [d["kind"] for d in yaml.safe_load_all(out)][-1] == "TrainJob"
    assert [line for line in err.splitlines() if "pipeline" in line] == [
        "meshrun: warning: pipeline.microbatches=4 does nothing: pipeline stages wait for a mesh axis named "
        "'stage' (pipeline.axis), and mesh 4x2's axes are stages, data ('stages' is close: a typo?), so the "
        "run has no stages; name an axis 'stage' in mesh.axis_names, or leave the pipeline keys out"
    ]


def test_help_names_the_flags_and_the_config_groups(capsys):
    cli.main(["k8s", "--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: meshrun k8s [OVERRIDE ...] --image IMAGE --nodes N")
    assert all(
        flag in out
        for flag in (
            "--kind KIND",
            "--volume CLAIM:PATH",
            "--user UID:GID",
            "--pull-secret SECRET",
            "--no-network-policy",
            "--apply",
            "--simulate",
            "config groups (group=option):",
        )
    )


# --- bad input ----------------------------------------------------------------------------------

OUT = ["--out", "job.yaml"]
SIMULATE = ["--volume", "runs:/runs", "--simulate"]
K8S_FLAGS = (
    "--image IMAGE, --nodes N, --kind KIND, --out FILE, --volume CLAIM:PATH, --name NAME, --namespace NS, "
    "--port PORT, --user UID:GID, --pull-secret SECRET, --no-network-policy, --apply, --simulate or --help"
)
BAD = {
    "no image": (
        [*CPU_JOB, "--nodes", "2", *OUT],
        "--image: got nothing; give the container image the pods run, one with "
        "meshrun installed, e.g. --image registry.example.com/meshrun:0.1.0",
    ),
    "no nodes": (
        [*CPU_JOB, "--image", IMAGE, *OUT],
        "--nodes: got nothing; give the number of pods, one meshrun process each, e.g. --nodes 2",
    ),
    "zero nodes": (
        [*CPU_JOB, "--image", IMAGE, "--nodes", "0", *OUT],
        "--nodes: got '0'; expected a positive integer: the "
        "number of pods, one meshrun process each, e.g. --nodes 2",
    ),
    "nodes not a number": (
        [*CPU_JOB, "--image", IMAGE, "--nodes=two", *OUT],
        "--nodes: got 'two'; expected a positive integer: the "
        "number of pods, one meshrun process each, e.g. --nodes 2",
    ),
    "nodes not dividing the mesh": (
        [*CPU_JOB, "--image", IMAGE, "--nodes", "3", *OUT],
        "--nodes: got 3, but mesh 2x4's 8 devices do not split evenly over 3 processes; valid: 1, 2, 4 or 8",
    ),
    "a mesh left to fill": (
        ["devices.platform=cpu", "mesh=2x-1", "--image", IMAGE, "--nodes", "2", *OUT],
        "mesh: got 2x-1; meshrun k8s needs the whole shape (no -1), which sets how many devices each of the "
        "--nodes 2 pods asks for, e.g. mesh=2x4",
    ),
    "local processes": (
        [*CPU_JOB, "distributed.local_processes=2", *FLAGS, *OUT],
        "distributed.local_processes: got 2; meshrun k8s runs one process in each pod: leave it at 1 and "
        "give the number of pods with --nodes (e.g. --nodes 2)",
    ),
    "unknown kind": (
        [*CPU_JOB, *FLAGS, "--kind", "jobset", *OUT],
        "--kind: got 'jobset'; valid: trainjob or indexed-job",
    ),
    "volume without a path": (
        [*CPU_JOB, *FLAGS, "--volume", "runs", *OUT],
        "--volume: got 'runs'; expected CLAIM:PATH, a PersistentVolumeClaim's name (lowercase letters, "
        "digits, '-' and '.') and the absolute path to mount "
        "it at in every pod (not /), e.g. --volume runs:/runs",
    ),
    "volume at a relative path": (
        [*CPU_JOB, *FLAGS, "--volume", "runs:data/runs", *OUT],
        "--volume: got 'runs:data/runs'; expected CLAIM:PATH, a PersistentVolumeClaim's name (lowercase "
        "letters, digits, '-' and '.') and the absolute path to "
        "mount it at in every pod (not /), e.g. --volume runs:/runs",
    ),
    "user without a group": (
        [*CPU_JOB, *FLAGS, "--user", "1000", *OUT],
        "--user: got '1000'; expected UID:GID, the numeric user and group the pods run as, each 0 to "
        "2147483647, e.g. --user 1000:1000 (the default)",
    ),
    "user by name": (
        [*CPU_JOB, *FLAGS, "--user=meshrun:meshrun", *OUT],
        "--user: got 'meshrun:meshrun'; expected UID:GID, the numeric user and group the pods run as, each 0 "
        "to 2147483647, e.g. --user 1000:1000 (the default)",
    ),
    "user root": (
        [*CPU_JOB, *FLAGS, "--user", "0:1000", *OUT],
        "--user: got '0:1000'; user 0 is root, which the restricted Pod Security Standard refuses "
        "(runAsNonRoot): give a user the image can run as, e.g. --user 1000:1000 (the default)",
    ),
    "a pull secret Kubernetes rejects": (
        [*CPU_JOB, *FLAGS, "--pull-secret", "Reg_Cred", *OUT],
        "--pull-secret: got 'Reg_Cred'; expected the name of a Secret of the namespace that holds the "
        "registry's credentials (lowercase letters, digits, '-' and '.'), e.g. --pull-secret regcred",
    ),
    "volume over the image's Python": (
        [*CPU_JOB, *FLAGS, "--volume", "runs:/usr/local", *OUT],
        "--volume: got 'runs:/usr/local'; /usr/local is in /usr, where images keep programs and libraries: a "
        "volume there would hide the image's Python; mount the volume at a path of its own, e.g. --volume "
        "runs:/runs",
    ),
    "volume over /opt": (
        [*CPU_JOB, *FLAGS, "--volume", "runs:/opt/", *OUT],
        "--volume: got 'runs:/opt/'; /opt is where images keep programs and libraries: a volume there "
        "would hide the image's Python; mount the volume at a path of its own, e.g. --volume runs:/runs",
    ),
    "volume over a home dir": (
        [*CPU_JOB, *FLAGS, "--volume", "runs:/home/me", *OUT],
        "--volume: got 'runs:/home/me'; /home/me is a home dir: a volume there would hide what pip install "
        "--user put in it; mount the volume at a path of its own, e.g. --volume runs:/runs",
    ),
    "volume over the scratch dir": (
        [*CPU_JOB, *FLAGS, "--volume", "runs:/tmp", *OUT],
        "--volume: got 'runs:/tmp'; /tmp meets the pods' scratch dir /tmp/meshrun (an emptyDir for their "
        "config dirs); mount the volume at a path of its own, e.g. --volume runs:/runs",
    ),
    "dcn not one slice per pod": (
        [*CPU_JOB, "mesh.dcn=[2,1]", "--image", IMAGE, "--nodes", "4", *OUT],
        "mesh.dcn: got [2, 1], 2 slices, but the job has 4 processes (--nodes); give slice counts whose "
        "product is 4, one slice per process",
    ),
    "a TPU platform": (
        ["devices.platform=tpu", "mesh=2x4", *FLAGS, *OUT],
        "devices.platform: got 'tpu'; meshrun k8s asks for NVIDIA GPUs (nvidia.com/gpu) or, with "
        "devices.platform=cpu, none; valid: auto, gpu or cpu",
    ),
    "a config error": (
        [*CPU_JOB, "train.epochs=0", *FLAGS, *OUT],
        "train.epochs: got 0; expected a positive integer",
    ),
    "a flag of another command": (
        [*CPU_JOB, *FLAGS, "--json", *OUT],
        f"--json: not a flag of meshrun k8s; valid: {K8S_FLAGS} (see meshrun k8s --help)",
    ),
    "a misspelt flag": (
        [*CPU_JOB, *FLAGS, "--volumes", "runs:/runs", *OUT],
        "--volumes: not a flag of meshrun k8s; did you mean "
        f"--volume? valid: {K8S_FLAGS} (see meshrun k8s --help)",
    ),
    "a short flag": (
        [*CPU_JOB, *FLAGS, "-n", "2", *OUT],
        f"-n: not a flag of meshrun k8s; valid: {K8S_FLAGS} (see meshrun k8s --help)",
    ),
    "a multirun": (
        [*CPU_JOB, "-m", *FLAGS, *OUT],
        "-m: got a multirun; meshrun k8s renders one job: run it once for each setting",
    ),
    "apply and simulate": (
        [*CPU_JOB, *FLAGS, "--apply", "--simulate", *OUT],
        "--simulate: got it with --apply; run the job here first (--simulate), then submit it (--apply)",
    ),
    "a name Kubernetes rejects": (
        [*CPU_JOB, "--image", IMAGE, "--nodes", "2", "--name", "Exp_1", *OUT],
        "--name: got 'Exp_1'; expected at most 40 lowercase letters, digits and '-', starting with a letter "
        "and ending with a letter or digit (the job's, its service's and its pods' name), e.g. --name exp1",
    ),
    "port out of range": (
        [*CPU_JOB, *FLAGS, "--port", "70000", *OUT],
        "--port: got '70000'; expected a TCP port, 1 to 65535, for process 0's coordinator (default 55527)",
    ),
    "out without a path": (
        [*CPU_JOB, *FLAGS, "--out"],
        "--out: got nothing; give the file to write the YAML to, e.g. --out job.yaml",
    ),
    # What `meshrun plan` refuses, for the pods' mesh and processes (run here with --simulate: no pod starts,
    # no volume dir is made)
    "a rule that matches nothing": (
        [*CPU_JOB, "layout.rules={d3/kernel:[null,model]}", *FLAGS, *SIMULATE],
        "layout.rules.d3/kernel: matches no variable or output of the model (patterns must match the whole "
        "path); closest real paths: d2/kernel, d1/kernel",
    ),
    "a rule of the wrong rank": (
        [*CPU_JOB, "layout.rules={d1/kernel:[null,model,null]}", *FLAGS, *SIMULATE],
        "layout.rules.d1/kernel: gives 3 axes [null, model, null] but variable 'd1/kernel' has rank 2 (shape "
        "(784, 200)); give exactly 2 entries, one mesh axis or null per dimension",
    ),
    "stages that do not divide the blocks": (
        [
            "devices.platform=cpu",
            "model=transformer",
            "model.layers=6",
            "mesh=4x2",
            "mesh.axis_names=[stage,data]",
            "mesh.batch_axis=data",
            "layout=replicated",
            *FLAGS,
            *SIMULATE,
        ],
        "mesh.shape: got 4x2: the stage axis 'stage' of size 4 does not split transformer's 6 blocks "
        "into stages of equal length; valid sizes for 'stage': 1, 2, 3 or 6",
    ),
    "a misspelt metric": (
        [*CPU_JOB, "train.metrics=[acuracy]", *FLAGS, *SIMULATE],
        "train.metrics: got 'acuracy', which is not a Keras metric; e.g. accuracy, mae, auc",
    ),
    "an export from two pods": (
        [*CPU_JOB, "checkpoint.export=true", *FLAGS, *SIMULATE],
        "checkpoint.export: got true with several processes; a .keras file is written by one process, so "
        "export from a one-process run (resume from the checkpoint there)",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input_is_one_line_with_exit_2_and_writes_nothing(name, in_tmp, capsys):
    args, message = BAD[name]
    status, out, err = k8s(args, capsys)
    assert status == 2, err
    assert err.splitlines() == [f"meshrun: error: {message}"]
    assert "Traceback" not in err and out == ""
    assert list(in_tmp.iterdir()) == [], "a rejected job wrote files"


# --- where a pod stands -------------------------------------------------------------------------

AUTO = parse_distributed({"mode": "auto"})
INDEXED_POD = {
    "JAX_COORDINATOR_ADDRESS": "exp1-0.exp1:7777",
    "JAX_NUM_PROCESSES": "4",
    "JOB_COMPLETION_INDEX": "3",
}


def test_a_pod_of_an_indexed_job_takes_its_completion_index_as_its_process_id():
    assert identify(AUTO, INDEXED_POD) == Identity(
        3, 4, "exp1-0.exp1:7777", "JAX_* environment, JOB_COMPLETION_INDEX"
    )


def test_jax_process_id_wins_over_the_completion_index_and_keras_and_slurm_keep_their_order():
    keras = {
        "KERAS_DISTRIBUTION_JOB_ADDRESSES": "k0:1,k1:1",
        "KERAS_DISTRIBUTION_NUM_PROCESSES": "2",
        "KERAS_DISTRIBUTION_PROCESS_ID": "1",
    }
    slurm = {
        "SLURM_JOB_ID": "7",
        "SLURM_STEP_NODELIST": "vm",
        "SLURM_NTASKS": "2",
        "SLURM_PROCID": "1",
        "SLURM_TASKS_PER_NODE": "2",
    }
    assert identify(AUTO, {**INDEXED_POD, "JAX_PROCESS_ID": "1"}) == Identity(
        1, 4, "exp1-0.exp1:7777", "JAX_* environment"
    )
    assert identify(AUTO, {**INDEXED_POD, **keras}) == Identity(
        1, 2, "k0:1", "KERAS_DISTRIBUTION_* environment"
    )
    assert identify(AUTO, {**INDEXED_POD, **slurm}).source == "JAX_* environment, JOB_COMPLETION_INDEX"
    assert identify(AUTO, {**slurm, "JOB_COMPLETION_INDEX": "0"}) == Identity(
        1, 2, None, "SLURM", None
    )  # no JAX_*: SLURM's
    assert identify(AUTO, {"JOB_COMPLETION_INDEX": "1"}).num_processes == 1  # an index alone is no job
    with pytest.raises(
        ConfigError, match=r"auto read JOB_COMPLETION_INDEX='x' from the environment; expected an integer"
    ):
        identify(AUTO, {**INDEXED_POD, "JOB_COMPLETION_INDEX": "x"})


def test_each_simulated_pod_of_the_rendered_indexed_job_finds_its_place(in_tmp, capsys):
    from meshrun.kube import simulate

    documents = rendered(
        [*CPU_JOB, *FLAGS, "--kind", "indexed-job", "--volume", "runs:/runs", "--port", "7777"], capsys
    )
    pods = simulate.pods_of(documents, 7777)
    local = simulate.Localizer(pods.domain, {"/runs": in_tmp / "k8s-volumes" / "runs"})
    for index in range(2):
        environ = simulate.pod_environ(pods, index, local)
        assert environ["JOB_COMPLETION_INDEX"] == environ["JAX_PROCESS_ID"] == str(index)
        assert identify(AUTO, environ) == Identity(index, 2, "127.0.0.1:7777", "JAX_* environment")
    assert [local.arg(a) for a in pods.command][-3:] == [
        f"checkpoint.dir={in_tmp}/k8s-volumes/runs/exp1/checkpoints",
        "resume=auto",
        f"hydra.run.dir={in_tmp}/k8s-volumes/runs/exp1",
    ]


def test_a_simulated_trainjob_runs_the_command_and_jax_env_its_runtime_would_give(in_tmp, capsys):
    from meshrun.kube import simulate

    indexed = simulate.pods_of(
        rendered(
            [*CPU_JOB, *FLAGS, "--kind", "indexed-job", "--volume", "runs:/runs", "--port", "7777"], capsys
        ),
        7777,
    )
    trainjob = simulate.pods_of(rendered([*CPU_JOB, *FLAGS, "--volume", "runs:/runs"], capsys), 7777)
    assert (
        (trainjob.count, trainjob.command, trainjob.mounts)
        == (indexed.count, indexed.command, indexed.mounts)
        == (
            2,
            indexed.command,
            {
                "/tmp/meshrun": SCRATCH_VOLUME,
                "/runs": {"name": "runs", "persistentVolumeClaim": {"claimName": "runs"}},
            },
        )
    )
    local = simulate.Localizer(trainjob.domain, {"/runs": in_tmp / "runs"})
    for index in range(2):
        environ = simulate.pod_environ(trainjob, index, local)
        assert {
            k: environ[k]
            for k in (
                "JAX_COORDINATOR_ADDRESS",
                "JAX_NUM_PROCESSES",
                "JAX_PROCESS_ID",
                "JAX_COORDINATOR_PORT",
            )
        } == {
            "JAX_COORDINATOR_ADDRESS": "127.0.0.1:7777",
            "JAX_NUM_PROCESSES": "2",
            "JAX_PROCESS_ID": str(index),
            "JAX_COORDINATOR_PORT": "7777",
        }
        assert identify(AUTO, environ) == identify(AUTO, simulate.pod_environ(indexed, index, local))
    runtime = {e["name"]: e.get("value") for e in simulate.runtime_env("exp1", 2, 7777)}
    assert runtime["JAX_COORDINATOR_ADDRESS"] == "exp1-node-0-0.exp1:7777"  # pod 0 of the JobSet's `node` job


def test_the_inherited_environment_of_a_simulated_pod_places_it_in_no_other_job(monkeypatch):
    from meshrun.kube import simulate

    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("KERAS_DISTRIBUTION_PROCESS_ID", "5")
    monkeypatch.setenv("JAX_PROCESS_ID", "5")
    pods = simulate.Pods(2, ["meshrun", "train"], [{"name": "JAX_NUM_PROCESSES", "value": "2"}], {}, "exp1")
    environ = simulate.pod_environ(pods, 1, simulate.Localizer("exp1", {}))
    assert not {"SLURM_JOB_ID", "KERAS_DISTRIBUTION_PROCESS_ID", "JAX_PROCESS_ID"} & environ.keys()
    assert environ["JOB_COMPLETION_INDEX"] == "1" and environ["JAX_NUM_PROCESSES"] == "2"


# --- --apply ------------------------------------------------------------------------------------


def test_apply_without_a_kubeconfig_is_one_line(in_tmp, monkeypatch, capsys):
    missing = in_tmp / "no" / "config"
    monkeypatch.setenv("KUBECONFIG", str(missing))
    status, out, err = k8s([*CPU_JOB, *FLAGS, "--volume", "runs:/runs", "--apply"], capsys)
    assert status == 2 and out == ""
    assert err.splitlines() == [
        f"meshrun: error: --apply: got kubeconfig {missing}, which gives no cluster to submit to (Invalid "
        "kube-config file. No configuration found.); point KUBECONFIG at your cluster's config (kubectl "
        "config current-context must name one), or leave "
        "--apply out and submit the YAML with kubectl apply -f"
    ]


class StandInApiServer(BaseHTTPRequestHandler):
    """Answers the object creations a Kubernetes API server would: 201 with the object, or, for
    paths in `refused`, 409 AlreadyExists with a Status as the real one words it; notes each request."""

    requests: list = []
    refused: tuple = ()

    def do_POST(self):  # noqa: N802 (the name http.server calls)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.requests.append((self.path, body))
        if any(self.path.endswith(path) for path in self.refused):
            name = body["metadata"]["name"]
            answer = {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "reason": "AlreadyExists",
                "code": 409,
                "message": f'jobs.batch "{name}" already exists',
            }
            self._answer(409, answer)
        else:
            self._answer(201, body)

    def _answer(self, status: int, document: dict) -> None:
        data = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def api_server(in_tmp, monkeypatch):
    """A stand-in API server on 127.0.0.1 and a kubeconfig whose current context (namespace ml) is it."""
    StandInApiServer.requests, StandInApiServer.refused = [], ()
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandInApiServer)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "stand-in",
        "clusters": [
            {"name": "local", "cluster": {"server": f"http://127.0.0.1:{server.server_address[1]}"}}
        ],
        "users": [{"name": "me", "user": {"token": "t"}}],
        "contexts": [{"name": "stand-in", "context": {"cluster": "local", "user": "me", "namespace": "ml"}}],
    }
    (in_tmp / "kubeconfig").write_text(yaml.safe_dump(config))
    monkeypatch.setenv("KUBECONFIG", str(in_tmp / "kubeconfig"))
    yield StandInApiServer
    server.shutdown()
    server.server_close()


def test_apply_creates_the_policy_the_service_then_the_job_and_says_how_to_follow_it(api_server, capsys):
    args = [*CPU_JOB, *FLAGS, "--kind", "indexed-job", "--volume", "runs:/runs"]
    documents = rendered(args, capsys)
    status, out, err = k8s([*args, "--apply"], capsys)
    assert status == 0, err
    assert api_server.requests == [
        ("/apis/networking.k8s.io/v1/namespaces/ml/networkpolicies", documents[0]),
        ("/api/v1/namespaces/ml/services", documents[1]),
        ("/apis/batch/v1/namespaces/ml/jobs", documents[2]),
    ]
    selector = "app.kubernetes.io/name=meshrun,app.kubernetes.io/instance=exp1"
    assert out.splitlines() == [
        "meshrun k8s: created NetworkPolicy exp1, Service exp1 and Job exp1 in namespace ml (context "
        "stand-in); follow it:",
        "  its status:   kubectl -n ml get job exp1",
        f"  its pods:     kubectl -n ml get pods -l {selector} -w",
        f"  their output: kubectl -n ml logs -f -l {selector} --prefix --max-log-requests 2",
        "  to stop it:   kubectl -n ml delete job exp1 --cascade=foreground && kubectl -n ml delete "
        "networkpolicy,service exp1   (the pods get SIGTERM and save a checkpoint first)",
    ]


def test_apply_of_a_trainjob_creates_the_custom_object(api_server, capsys):
    status, out, err = k8s(
        [*CPU_JOB, *FLAGS, "--volume", "runs:/runs", "--namespace", "team", "--apply"], capsys
    )
    assert status == 0, err
    assert [(path, body["kind"]) for path, body in api_server.requests] == [
        ("/apis/networking.k8s.io/v1/namespaces/team/networkpolicies", "NetworkPolicy"),
        ("/api/v1/namespaces/team/serviceaccounts", "ServiceAccount"),
        ("/apis/trainer.kubeflow.org/v1alpha1/namespaces/team/trainjobs", "TrainJob"),
    ]
    assert "kubectl -n team get trainjob exp1" in out and "-l jobset.sigs.k8s.io/jobset-name=exp1" in out
    assert (
        "kubectl -n team delete trainjob exp1 --cascade=foreground && kubectl -n team delete "
        "networkpolicy,serviceaccount exp1"
    ) in out


def test_an_object_the_api_server_refuses_is_one_line_naming_what_was_created(api_server, capsys):
    api_server.refused = ("/jobs",)
    status, out, err = k8s(
        [*CPU_JOB, *FLAGS, "--kind", "indexed-job", "--volume", "runs:/runs", "--apply"], capsys
    )
    assert status == 2 and out == ""
    assert err.splitlines() == [
        "meshrun: error: --apply: got an error from the cluster of "
        "context 'stand-in' creating Job exp1 in namespace 'ml': 409 "
        'Conflict: jobs.batch "exp1" already exists (already created: NetworkPolicy exp1, Service exp1)'
    ]


# --- --simulate ---------------------------------------------------------------------------------


@pytest.mark.e2e
def test_a_simulated_two_pod_indexed_job_trains_exactly_like_one_process_and_reruns_in_its_run_dir(
    tmp_path, capfd, monkeypatch
):
    # A home dir that does not exist, as for a user the image does not know: the pods write nothing there.
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    port = free_port()
    done = run_meshrun(
        [
            "k8s",
            *CPU_JOB,
            *FAST,
            "distributed.timeout_s=120",
            *FLAGS,
            "--kind",
            "indexed-job",
            "--volume",
            "runs:/runs",
            "--port",
            str(port),
            "--simulate",
        ],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    volumes = tmp_path / "k8s-volumes"
    run_dir = volumes / "runs" / "exp1"
    assert (
        "meshrun k8s --simulate: 2 pods of indexed-job exp1 as local processes; *.exp1 -> 127.0.0.1, "
        f"emptyDir scratch:/tmp/meshrun -> {volumes / 'emptyDir-scratch'}, volume runs:/runs -> "
        f"{volumes / 'runs'}; run dir {run_dir}, each pod's output in its process-<i>.log"
    ) in done.stderr
    assert not (tmp_path / "home").exists()
    assert any((volumes / "runs" / ".cache" / "meshrun" / "xla").iterdir())  # XLA's cache, on the volume
    assert (volumes / "emptyDir-scratch" / "keras" / "keras.json").is_file()
    metrics = read_metrics(run_dir)
    assert (
        metrics["distributed"]["source"] == "JAX_* environment"
        and metrics["distributed"]["coordinator"] == f"127.0.0.1:{port}"
    )
    assert metrics["devices"]["processes"] == 2 and metrics["devices"]["per_process"] == 4
    assert metrics["checkpoint"]["dir"] == str(run_dir / "checkpoints")
    single = fast_run_in_process("2x4", "dense_model")
    for epoch, (pods, one) in enumerate(
        zip(metrics["history"]["loss"], single["history"]["loss"], strict=True)
    ):
        assert pods == pytest.approx(one, abs=1e-5), f"epoch {epoch}"
    assert metrics["eval"]["loss"] == pytest.approx(single["eval"]["loss"], abs=1e-5)
    assert "process 1 of 2 joining the job (JAX_* environment)" in (run_dir / "process-1.log").read_text()

    # Run again into the pods' run dir, which holds a finished run: the pods, each deciding from the
    # same files, agree. Told not to resume, both refuse it before anything is written there...
    again = [
        "k8s",
        *CPU_JOB,
        *FAST,
        "distributed.timeout_s=120",
        *FLAGS,
        "--kind",
        "indexed-job",
        "--volume",
        "runs:/runs",
        "--port",
        str(free_port()),
        "--simulate",
    ]
    files = {
        p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and not p.name.startswith("process-")
    }
    # (These two simulations by the CLI in this process, their pods real processes as before.)
    monkeypatch.chdir(tmp_path)
    refused = cli_here([*again, "resume=never"], capfd)
    assert (
        refused.returncode == 2
        and f"meshrun: error: hydra.run.dir: got '{run_dir}', which holds a finished run" in refused.stderr
    )
    assert {
        p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and not p.name.startswith("process-")
    } == files
    # ... and with a third epoch (resume=auto, the pods' default) both continue it from its checkpoint, each
    # step logged once.
    done = cli_here([*again, "train.epochs=3"], capfd)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = read_metrics(run_dir)
    assert metrics["checkpoint"]["resumed_at_step"] == 16 and len(metrics["history"]["loss"]) == 3
    steps = [
        json.loads(line)["step"]
        for line in (run_dir / "log.jsonl").read_text().splitlines()
        if '"epoch_end"' not in line
    ]
    assert steps == list(range(1, 25))
