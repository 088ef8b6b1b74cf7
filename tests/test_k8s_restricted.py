"""`meshrun k8s` pods a cluster enforcing the restricted Pod Security Standard admits, and a coordinator
only the job can reach. The pods it renders (an Indexed Job's, and those the jax-distributed runtime
makes of a TrainJob with its runtimePatches) are checked field by field by a small checker of the
standard's rules (Kubernetes 1.31, baseline and restricted), which names the rule a field breaks; the
checker itself is shown to catch each rule. The NetworkPolicy is evaluated as a network plugin would
for pods of the job, of another job and of anything else."""

from __future__ import annotations

import copy

import pytest
import yaml

from conftest import K8S_CPU_JOB as CPU_JOB
from conftest import K8S_JOB_FLAGS as FLAGS
from conftest import cli_here
from conftest import k8s_rendered as rendered_list

KINDS = ("trainjob", "indexed-job")
VOLUMES = {"a volume": ["--volume", "runs:/runs"], "no volume": []}

# --- the restricted profile's rules ----------------------------------------------------------------

BASELINE_CAPABILITIES = {
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
}
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")


def containers(pod: dict):
    """(field path, container) of every container of a pod spec, init and ephemeral ones included."""
    for kind in CONTAINER_LISTS:
        for index, container in enumerate(pod.get(kind) or []):
            yield f"spec.{kind}[{index}]", container


def contexts(pod: dict):
    """(field path, securityContext) of the pod and of each of its containers (empty where unset)."""
    yield "spec.securityContext", pod.get("securityContext") or {}
    for path, container in containers(pod):
        yield f"{path}.securityContext", container.get("securityContext") or {}


def restricted_violations(pod: dict, service_account: dict | None = None) -> list[str]:
    """What of pod spec `pod` the restricted Pod Security Standard refuses, each as 'RULE: FIELD
    ...', and whether it mounts a service-account token (its own automountServiceAccountToken, else
    that of `service_account`, None: the namespace's default, which mounts one)."""
    found: list[str] = []

    def broken(rule: str, field: str, got, want: str) -> None:
        found.append(f"{rule}: {field} is {got!r}; {want}")

    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            broken("Host Namespaces", f"spec.{field}", pod[field], "must be unset or false")
    for index, volume in enumerate(pod.get("volumes") or []):
        kind = next(key for key in volume if key != "name")
        if kind == "hostPath":
            broken("HostPath Volumes", f"spec.volumes[{index}].hostPath", volume[kind], "must be unset")
        elif kind not in RESTRICTED_VOLUMES:
            broken(
                "Volume Types", f"spec.volumes[{index}]", kind, f"must be one of {sorted(RESTRICTED_VOLUMES)}"
            )
    for index, sysctl in enumerate((pod.get("securityContext") or {}).get("sysctls") or []):
        if sysctl["name"] not in SAFE_SYSCTLS:
            broken(
                "Sysctls",
                f"spec.securityContext.sysctls[{index}].name",
                sysctl["name"],
                "must be a safe sysctl",
            )
    pod_context = pod.get("securityContext") or {}
    container_contexts = [(p, c.get("securityContext") or {}) for p, c in containers(pod)]
    for path, context in contexts(pod):
        if (context.get("windowsOptions") or {}).get("hostProcess"):
            broken("HostProcess", f"{path}.windowsOptions.hostProcess", True, "must be unset or false")
        if (context.get("appArmorProfile") or {}).get("type") == "Unconfined":
            broken(
                "AppArmor",
                f"{path}.appArmorProfile.type",
                "Unconfined",
                "must be RuntimeDefault or Localhost",
            )
        selinux = context.get("seLinuxOptions") or {}
        if selinux.get("type", "") not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
            broken(
                "SELinux",
                f"{path}.seLinuxOptions",
                selinux,
                "type must be a container type, user and role unset",
            )
        if context.get("runAsUser") == 0:
            broken("Running as Non-root user", f"{path}.runAsUser", 0, "must not be 0")
        if context.get("runAsNonRoot") is False:
            broken("Running as Non-root", f"{path}.runAsNonRoot", False, "must be true or unset")
        seccomp = (context.get("seccompProfile") or {}).get("type")
        if seccomp is not None and seccomp not in ("RuntimeDefault", "Localhost"):
            broken("Seccomp", f"{path}.seccompProfile.type", seccomp, "must be RuntimeDefault or Localhost")
    if pod_context.get("runAsNonRoot") is not True:
        for path, context in container_contexts:
            if context.get("runAsNonRoot") is not True:
                broken(
                    "Running as Non-root",
                    f"{path}.runAsNonRoot",
                    context.get("runAsNonRoot"),
                    "must be true here or in spec.securityContext",
                )
    if (pod_context.get("seccompProfile") or {}).get("type") is None:
        for path, context in container_contexts:
            if (context.get("seccompProfile") or {}).get("type") is None:
                broken(
                    "Seccomp",
                    f"{path}.seccompProfile.type",
                    None,
                    "must be RuntimeDefault or Localhost here or in spec.securityContext",
                )
    for path, container in containers(pod):
        context = container.get("securityContext") or {}
        if context.get("privileged"):
            broken(
                "Privileged Containers", f"{path}.securityContext.privileged", True, "must be unset or false"
            )
        if context.get("procMount", "Default") != "Default":
            broken(
                "/proc Mount Type",
                f"{path}.securityContext.procMount",
                context["procMount"],
                "must be Default",
            )
        if context.get("allowPrivilegeEscalation") is not False:
            broken(
                "Privilege Escalation",
                f"{path}.securityContext.allowPrivilegeEscalation",
                context.get("allowPrivilegeEscalation"),
                "must be false",
            )
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            broken(
                "Capabilities",
                f"{path}.securityContext.capabilities.drop",
                capabilities.get("drop"),
                "must hold ALL",
            )
        for added in capabilities.get("add") or []:
            if added != "NET_BIND_SERVICE":
                rule = "Capabilities" if added in BASELINE_CAPABILITIES else "Capabilities (baseline)"
                broken(
                    rule, f"{path}.securityContext.capabilities.add", added, "may add NET_BIND_SERVICE alone"
                )
        for index, port in enumerate(container.get("ports") or []):
            if port.get("hostPort"):
                broken(
                    "Host Ports", f"{path}.ports[{index}].hostPort", port["hostPort"], "must be unset or 0"
                )
    token = pod.get("automountServiceAccountToken")
    if token is None:
        token = (service_account or {}).get("automountServiceAccountToken", True)
    if token is not False:
        found.append(
            f"No service-account token (meshrun's rule): the pod mounts one (serviceAccountName "
            f"{pod.get('serviceAccountName', 'default')!r}); training never uses it"
        )
    return found


# --- the pods meshrun k8s makes ---------------------------------------------------------------------

# The pods of Kubeflow Trainer's jax-distributed ClusterTrainingRuntime (manifests/base/runtimes/
# jax_distributed.yaml): one replicated job `node`, its pods one container `node`.
RUNTIME_POD = {"containers": [{"name": "node", "image": "nvcr.io/nvidia/jax:25.10-py3"}]}


def trainjob_pod(train_job: dict) -> dict:
    """The pod the jax-distributed runtime makes of a TrainJob: its pod spec with the trainer's
    image, command, env and resources in the `node` container and the runtimePatches applied (fields
    set, containers patched by name, volumes and mounts added)."""
    pod = copy.deepcopy(RUNTIME_POD)
    trainer = train_job["spec"]["trainer"]
    [node] = pod["containers"]
    node |= {"image": trainer["image"], "command": trainer["command"], "env": trainer.get("env", [])}
    if "resourcesPerNode" in trainer:
        node["resources"] = trainer["resourcesPerNode"]
    for patch in train_job["spec"].get("runtimePatches", []):
        for job in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
            spec = job["template"]["spec"]["template"]["spec"]
            for field, value in spec.items():
                if field == "containers":
                    for patched in value:
                        container = next(c for c in pod["containers"] if c["name"] == patched["name"])
                        mounts = container.get("volumeMounts", []) + patched.get("volumeMounts", [])
                        container |= {**patched, "volumeMounts": mounts}
                elif field == "volumes":
                    pod["volumes"] = pod.get("volumes", []) + value
                else:
                    pod[field] = value
    return pod


def rendered(args, capsys) -> dict[str, dict]:
    """The objects `meshrun k8s ARGS` prints, by kind (asserting it succeeded)."""
    return {document["kind"]: document for document in rendered_list(args, capsys)}


def pod_of(objects: dict[str, dict]) -> tuple[dict, dict | None]:
    """The pod spec of a rendered job, and the ServiceAccount it names (None: none rendered)."""
    if "TrainJob" in objects:
        return trainjob_pod(objects["TrainJob"]), objects.get("ServiceAccount")
    return objects["Job"]["spec"]["template"]["spec"], None


@pytest.mark.parametrize("volume", sorted(VOLUMES))
@pytest.mark.parametrize("kind", KINDS)
def test_every_pod_meets_the_restricted_profile_and_mounts_no_token(kind, volume, in_tmp, capsys):
    objects = rendered([*CPU_JOB, *FLAGS, "--kind", kind, *VOLUMES[volume]], capsys)
    pod, account = pod_of(objects)
    assert restricted_violations(pod, account) == []
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "fsGroup": 1000,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if kind == "trainjob":  # its runtime's pods take the token setting of the ServiceAccount it names
        assert pod["serviceAccountName"] == account["metadata"]["name"] == "exp1"
        assert account["automountServiceAccountToken"] is False
    [container] = pod["containers"]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == ({"/tmp/meshrun", "/runs"} if volume == "a volume" else {"/tmp/meshrun"})


def test_user_sets_the_pods_user_and_group_and_the_volumes_group(in_tmp, capsys):
    for kind in KINDS:
        pod, _ = pod_of(rendered([*CPU_JOB, *FLAGS, "--kind", kind, "--user", "2000:0"], capsys))
        context = pod["securityContext"]
        assert (context["runAsUser"], context["runAsGroup"], context["fsGroup"]) == (2000, 0, 0)


def test_the_pods_write_their_caches_to_the_volume_and_their_config_to_the_empty_dir(in_tmp, capsys):
    for args, caches in ((["--volume", "runs:/data/runs"], "/data/runs/.cache"), ([], "/tmp/meshrun/cache")):
        pod, _ = pod_of(rendered([*CPU_JOB, *FLAGS, "--kind", "indexed-job", *args], capsys))
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert {
            k: env[k]
            for k in ("XDG_CACHE_HOME", "KAGGLEHUB_CACHE", "XDG_CONFIG_HOME", "KERAS_HOME", "MPLCONFIGDIR")
        } == {
            "XDG_CACHE_HOME": caches,
            "KAGGLEHUB_CACHE": f"{caches}/kagglehub",
            "XDG_CONFIG_HOME": "/tmp/meshrun/config",
            "KERAS_HOME": "/tmp/meshrun/keras",
            "MPLCONFIGDIR": "/tmp/meshrun/matplotlib",
        }
        assert "HOME" not in env  # the image's, where pip install --user may have put meshrun
        command = pod["containers"][0]["command"]
        assert command[-1] == (
            "hydra.run.dir=/data/runs/exp1" if args else "hydra.run.dir=/tmp/meshrun/outputs/exp1"
        )


# --- the checker catches each rule ------------------------------------------------------------------


def with_container(**context) -> dict:
    return {"containers": [{"name": "c", "securityContext": {**COMPLIANT_CONTAINER, **context}}]}


COMPLIANT_CONTAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
COMPLIANT = {
    "automountServiceAccountToken": False,
    "securityContext": {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    },
    **with_container(),
}
BROKEN = {
    "Privilege Escalation": with_container(allowPrivilegeEscalation=None),
    "Capabilities": with_container(capabilities={"drop": ["NET_RAW"]}),
    "Capabilities (baseline)": with_container(capabilities={"drop": ["ALL"], "add": ["SYS_ADMIN"]}),
    "Privileged Containers": with_container(privileged=True),
    "Running as Non-root": {"securityContext": {"runAsNonRoot": None}},
    "Running as Non-root user": with_container(runAsUser=0),
    "Seccomp": {"securityContext": {"seccompProfile": {"type": "Unconfined"}}},
    "Host Namespaces": {"hostNetwork": True},
    "HostPath Volumes": {"volumes": [{"name": "v", "hostPath": {"path": "/"}}]},
    "Volume Types": {"volumes": [{"name": "v", "nfs": {"server": "s", "path": "/"}}]},
    "Host Ports": {
        "containers": [{"name": "c", "securityContext": COMPLIANT_CONTAINER, "ports": [{"hostPort": 80}]}]
    },
    "No service-account token (meshrun's rule)": {"automountServiceAccountToken": None},
}


def test_the_checker_passes_a_compliant_pod():
    assert restricted_violations(COMPLIANT) == []


@pytest.mark.parametrize("rule", sorted(BROKEN))
def test_the_checker_names_the_rule_a_field_breaks(rule):
    pod = copy.deepcopy(COMPLIANT)
    for field, value in BROKEN[rule].items():
        pod[field] = {**pod[field], **value} if field == "securityContext" else value
    found = restricted_violations(pod)
    assert [line.split(":")[0] for line in found] == [rule], found


def test_a_pod_without_its_own_token_setting_takes_its_service_accounts():
    pod = {key: value for key, value in COMPLIANT.items() if key != "automountServiceAccountToken"}
    assert restricted_violations(pod, {"automountServiceAccountToken": False}) == []
    assert len(restricted_violations(pod, None)) == 1  # the namespace's default service account mounts one


# --- the NetworkPolicy --------------------------------------------------------------------------------


def admitted(policy: dict, target: dict, source: dict) -> bool:
    """Whether a network plugin enforcing `policy` lets a pod labelled `source` of the policy's
    namespace connect to one labelled `target` (on any port: the policy names none)."""

    def selects(selector: dict, labels: dict) -> bool:
        return selector.get("matchLabels", {}).items() <= labels.items()

    spec = policy["spec"]
    if "Ingress" not in spec["policyTypes"] or not selects(spec["podSelector"], target):
        return True  # a pod no policy selects takes any connection
    return any(
        selects(peer["podSelector"], source)
        for rule in spec.get("ingress", [])
        for peer in rule.get("from", [])
        if "podSelector" in peer and "namespaceSelector" not in peer
    )


@pytest.mark.parametrize("kind", KINDS)
def test_only_the_jobs_own_pods_reach_its_pods(kind, in_tmp, capsys):
    objects = rendered([*CPU_JOB, *FLAGS, "--kind", kind, "--volume", "runs:/runs"], capsys)
    policy = objects["NetworkPolicy"]
    if kind == "indexed-job":
        job_pod = objects["Job"]["spec"]["template"]["metadata"]["labels"]
    else:  # JobSet labels the pods of a TrainJob's JobSet with its name
        job_pod = {"jobset.sigs.k8s.io/jobset-name": "exp1", "batch.kubernetes.io/job-completion-index": "0"}
    other_job = {**job_pod, **{k: "exp2" for k in job_pod if k.endswith(("instance", "jobset-name"))}}
    assert admitted(policy, job_pod, job_pod)
    assert not admitted(policy, job_pod, other_job)
    assert not admitted(policy, job_pod, {"app": "anything"})
    assert not admitted(policy, job_pod, {})
    assert admitted(policy, {"app": "anything"}, {})  # other pods are left as they were
    assert policy["spec"]["policyTypes"] == ["Ingress"] and "ports" not in policy["spec"]["ingress"][0]


def test_the_network_policy_says_how_to_widen_it_and_can_be_left_out(in_tmp, capsys):
    done = cli_here(["k8s", *CPU_JOB, *FLAGS, "--kind", "indexed-job", "--port", "7777"], capsys)
    documents = done.stdout.split("---\n")[1:]
    assert [yaml.safe_load(text)["kind"] for text in documents] == ["NetworkPolicy", "Service", "Job"]
    comment = [line for line in documents[0].splitlines() if line.startswith("#")]
    assert comment[0] == (
        "# Only the job's own pods may connect to its pods: to the jax coordinator (port 7777) and to the"
    )
    assert (
        "#   - from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}}]"
        in comment
    )
    assert any("--no-network-policy" in line for line in comment)
    for kind, kinds in (("indexed-job", ["Service", "Job"]), ("trainjob", ["ServiceAccount", "TrainJob"])):
        done = cli_here(["k8s", *CPU_JOB, *FLAGS, "--kind", kind, "--no-network-policy"], capsys)
        assert [d["kind"] for d in yaml.safe_load_all(done.stdout)] == kinds


def test_the_network_policy_and_service_account_pass_kubernetes_schemas(in_tmp, capsys):
    import kubernetes_validate

    for kind in KINDS:
        objects = rendered([*CPU_JOB, *FLAGS, "--kind", kind, "--namespace", "ml"], capsys)
        for document in objects.values():
            if document["kind"] != "TrainJob":
                kubernetes_validate.validate(document, "1.31", strict=True)
