"""What keeps a `meshrun k8s` job's pods within the restricted Pod Security Standard and its
coordinator within the job, as parts of the objects render.py makes:

- each pod runs as `--user UID:GID` (never root), its group owning the volume's files (fsGroup), with
  the runtime's default seccomp profile; its container cannot gain privileges and has no capabilities;
- no pod mounts a service-account token: an Indexed Job's pods say so themselves; a TrainJob, which
  cannot patch that field of its runtime's pods, gets a ServiceAccount of its own that mounts none;
- what meshrun and its libraries write outside the run dir goes to the volume (caches: XLA's
  compiled programs, the token cache, downloaded presets) or to an emptyDir (config dirs; the caches
  too without a volume), so that the pods need no writable home dir;
- a NetworkPolicy lets only the job's own pods connect to its pods.
"""

from __future__ import annotations

from meshrun.kube.options import SCRATCH_PATH, KubeOptions, User

SCRATCH_VOLUME = "scratch"
# The caches' dir in the volume, shared by the jobs that mount it (their entries are content-addressed).
VOLUME_CACHE = ".cache"


def pod_security_context(user: User) -> dict:
    """The pod-level securityContext: the user and group, the volume's group and the seccomp profile.
    The volume's files are given to the group only when its root is not already (OnRootMismatch), so a
    pod that starts again finds the caches as it left them: writable by their owner alone, as meshrun
    requires of a cache (meshrun.system.trust)."""
    return {
        "runAsNonRoot": True,
        "runAsUser": user.uid,
        "runAsGroup": user.gid,
        "fsGroup": user.gid,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict:
    """The meshrun container's securityContext: no privilege escalation, no capabilities."""
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def scratch_volume() -> dict:
    """The pod's emptyDir, for its config dirs (and its caches and run dir without a volume)."""
    return {"name": SCRATCH_VOLUME, "emptyDir": {}}


def scratch_mount() -> dict:
    return {"name": SCRATCH_VOLUME, "mountPath": SCRATCH_PATH}


def writable_dirs(options: KubeOptions) -> list[dict]:
    """The env that points the dirs meshrun and its libraries write to away from the home dir: the
    caches (XDG_CACHE_HOME: meshrun's XLA and token caches, Hugging Face's; KerasHub's Kaggle
    downloads) to the volume, else the emptyDir; the config dirs (XDG's, Keras', matplotlib's) to
    the emptyDir."""
    caches = (
        f"{options.volume.path}/{VOLUME_CACHE}" if options.volume is not None else f"{SCRATCH_PATH}/cache"
    )
    dirs = {
        "XDG_CACHE_HOME": caches,
        "KAGGLEHUB_CACHE": f"{caches}/kagglehub",
        "XDG_CONFIG_HOME": f"{SCRATCH_PATH}/config",
        "KERAS_HOME": f"{SCRATCH_PATH}/keras",
        "MPLCONFIGDIR": f"{SCRATCH_PATH}/matplotlib",
    }
    return [{"name": name, "value": value} for name, value in dirs.items()]


def service_account(metadata: dict) -> dict:
    """A TrainJob's own ServiceAccount, which mounts no token in its pods."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata,
        "automountServiceAccountToken": False,
    }


def network_policy(metadata: dict, pods: dict) -> dict:
    """The NetworkPolicy that lets only the job's pods (selected by the labels `pods`) connect to
    them, on any port: the coordinator's, and those the collectives (gloo, NCCL) pick at random.
    What the pods connect to is not restricted."""
    spec = {
        "podSelector": {"matchLabels": dict(pods)},
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"podSelector": {"matchLabels": dict(pods)}}]}],
    }
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": metadata, "spec": spec}


def network_policy_comment(coordinator: str) -> str:
    """The YAML comment above the NetworkPolicy: what it lets in, and how to let more in."""
    return (
        f"# Only the job's own pods may connect to its pods: to {coordinator} and to the\n"
        "# ports the collectives (gloo, NCCL) pick at random. Where the pods connect to is not restricted.\n"
        "# To let more in (a metrics scraper, a debugging pod), add entries to spec.ingress, e.g.\n"
        "#   - from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}}]\n"
        "#     ports: [{port: 9090}]\n"
        "# or leave the policy out (meshrun k8s --no-network-policy). The cluster's network plugin must\n"
        "# enforce NetworkPolicies (Calico, Cilium and most others do; kubenet and flannel alone do not).\n"
    )
