"""The flags of `meshrun k8s`, read out of its command line and checked before any config is composed:
a bad one is a ConfigError naming the flag, what it got and what is valid. What is left are the
overrides, which `meshrun train` takes as they are."""

from __future__ import annotations

import posixpath
import re
import time
from dataclasses import dataclass

from meshrun.compat.jax import k8s_coordinator_port
from meshrun.errors import ConfigError
from meshrun.files import unwritable
from meshrun.wording import not_a_flag, one_of

KINDS = ("trainjob", "indexed-job")
# Kubernetes names the pods after the job (NAME-node-0-3 under a TrainJob) within 63 characters.
NAME_LIMIT = 40
# The flags that take a value, with the value as help writes it, and the switches.
VALUE_FLAGS = {
    "--image": "IMAGE",
    "--nodes": "N",
    "--kind": "KIND",
    "--out": "FILE",
    "--volume": "CLAIM:PATH",
    "--name": "NAME",
    "--namespace": "NS",
    "--port": "PORT",
    "--user": "UID:GID",
    "--pull-secret": "SECRET",
}
SWITCHES = ("--no-network-policy", "--apply", "--simulate")
MULTIRUN_FLAGS = ("-m", "--multirun")

# The pods' user and group unless --user gives them: the first regular user of Debian and Ubuntu images.
DEFAULT_USER = (1000, 1000)
ID_LIMIT = 2**31 - 1  # the largest user or group id Kubernetes takes
# Where the pods' emptyDir is mounted: config dirs, caches without a volume, the run dir without one.
SCRATCH_PATH = "/tmp/meshrun"
# Where images keep programs, libraries and their config, and the kernel's filesystems: a volume
# mounted at or under one of them would hide what the pods' Python needs.
SYSTEM_DIRS = (
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/usr",
    "/etc",
    "/opt",
    "/proc",
    "/sys",
    "/dev",
)
# Home dirs, where `pip install --user` puts packages: a volume may go under one, not on it.
HOME_DIRS = ("/root", "/home")
DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


@dataclass(frozen=True)
class Volume:
    """A PersistentVolumeClaim (`claim`) mounted in every pod at `path` (absolute), where the run
    dir and the checkpoints live."""

    claim: str
    path: str

    def __str__(self) -> str:
        return f"{self.claim}:{self.path}"


@dataclass(frozen=True)
class User:
    """The numeric user and group the pods run as (never root: the restricted Pod Security
    Standard refuses it); the group also owns the volume's files (fsGroup)."""

    uid: int
    gid: int


@dataclass(frozen=True)
class KubeOptions:
    """What `meshrun k8s` renders and does: `nodes` pods (one meshrun process each) of `image`, as
    a Kubeflow TrainJob or a plain Indexed Job (`kind`) named `name`, in `namespace` (None: the
    kubeconfig context's), process 0 listening on `port`, runs kept on `volume`, each pod running as
    `user` and pulling the image with Secret `pull_secret` (None: as the namespace's default service
    account does), reachable by the job's own pods alone when `network_policy`; the YAML written to
    `out` (None: stdout), submitted (`apply`) or run here as local processes (`simulate`)."""

    image: str
    nodes: int
    port: int
    kind: str = KINDS[0]
    name: str = "meshrun"
    namespace: str | None = None
    volume: Volume | None = None
    user: User = User(*DEFAULT_USER)
    pull_secret: str | None = None
    network_policy: bool = True
    out: str | None = None
    apply: bool = False
    simulate: bool = False


def parse_options(args: list[str]) -> tuple[KubeOptions, list[str]]:
    """The options `args` give, checked, and the overrides left in them (in their order)."""
    given, overrides = _take_flags(args)
    multirun = next((a for a in overrides if a in MULTIRUN_FLAGS), None)
    if multirun:
        raise ConfigError(
            multirun, "got a multirun; meshrun k8s renders one job: run it once for each setting"
        )
    if given.get("--apply") and given.get("--simulate"):
        raise ConfigError(
            "--simulate", "got it with --apply; run the job here first (--simulate), then submit it (--apply)"
        )
    options = KubeOptions(
        image=_image(given.get("--image")),
        nodes=_positive(
            "--nodes", given.get("--nodes"), "the number of pods, one meshrun process each, e.g. --nodes 2"
        ),
        kind=_kind(given.get("--kind", KINDS[0])),
        name=_name(given.get("--name")),
        namespace=_namespace(given.get("--namespace")),
        port=_port(given.get("--port")),
        volume=_volume(given.get("--volume")),
        user=_user(given.get("--user")),
        pull_secret=_pull_secret(given.get("--pull-secret")),
        network_policy=not given.get("--no-network-policy"),
        out=_out(given.get("--out")),
        apply=bool(given.get("--apply")),
        simulate=bool(given.get("--simulate")),
    )
    return options, overrides


def _take_flags(args: list[str]) -> tuple[dict[str, str | bool], list[str]]:
    """The flags of `meshrun k8s` in `args` (`--flag VALUE` or `--flag=VALUE`; switches alone) and
    the other arguments; ConfigError for a flag it does not take."""
    given: dict[str, str | bool] = {}
    rest: list[str] = []
    index = 0
    while index < len(args):
        arg = args[index]
        flag, has_value, value = arg.partition("=")
        if flag in VALUE_FLAGS:
            if not has_value:
                following = args[index + 1] if index + 1 < len(args) else ""
                value = "" if following.startswith("--") else following
                index += 1 if value else 0
            given[flag] = value
        elif arg in SWITCHES:
            given[arg] = True
        elif arg.startswith("-") and arg not in MULTIRUN_FLAGS:
            shown = [*(f"{name} {value}" for name, value in VALUE_FLAGS.items()), *SWITCHES, "--help"]
            raise ConfigError(flag, not_a_flag(flag, "k8s", shown))
        else:
            rest.append(arg)
        index += 1
    return given, rest


def _image(value) -> str:
    if not value:
        raise ConfigError(
            "--image",
            f"got {_shown(value)}; give the container image the pods run, one with meshrun installed, "
            "e.g. --image registry.example.com/meshrun:0.1.0",
        )
    return value


def _positive(flag: str, value, what: str) -> int:
    if value is None or value == "":
        raise ConfigError(flag, f"got nothing; give {what}")
    if not str(value).isdigit() or int(value) < 1:
        raise ConfigError(flag, f"got {value!r}; expected a positive integer: {what}")
    return int(value)


def _kind(value) -> str:
    if value not in KINDS:
        raise ConfigError("--kind", f"got {_shown(value)}; valid: {one_of(KINDS)}")
    return value


def _name(value) -> str:
    if value is None:
        return f"meshrun-{time.strftime('%Y%m%d-%H%M%S')}"
    if len(value) > NAME_LIMIT or not DNS_LABEL.fullmatch(value):
        raise ConfigError(
            "--name",
            f"got {_shown(value)}; expected at most {NAME_LIMIT} lowercase letters, digits and '-', starting "
            "with a letter and ending with a letter or digit (the "
            "job's, its service's and its pods' name), e.g. --name exp1",
        )
    return value


def _namespace(value) -> str | None:
    if value is None:
        return None
    if len(value) > 63 or not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", value):
        raise ConfigError(
            "--namespace",
            f"got {_shown(value)}; expected a Kubernetes namespace: at most 63 lowercase letters, digits "
            "and '-', e.g. --namespace ml (leave it out for the kubeconfig context's)",
        )
    return value


def _port(value) -> int:
    if value is None:
        return k8s_coordinator_port()  # jax's own
    if not str(value).isdigit() or not 0 < int(value) < 65536:
        raise ConfigError(
            "--port",
            f"got {_shown(value)}; expected a TCP port, 1 to 65535, "
            f"for process 0's coordinator (default {k8s_coordinator_port()})",
        )
    return int(value)


def _volume(value) -> Volume | None:
    if value is None:
        return None
    claim, _, path = value.partition(":")
    normal = posixpath.normpath(path) if path else ""
    if (
        not (claim and len(claim) <= 253 and DNS_SUBDOMAIN.fullmatch(claim))
        or not normal.startswith("/")
        or normal == "/"
    ):
        raise ConfigError(
            "--volume",
            f"got {_shown(value)}; expected CLAIM:PATH, a PersistentVolumeClaim's name (lowercase letters, "
            "digits, '-' and '.') and the absolute path to mount "
            "it at in every pod (not /), e.g. --volume runs:/runs",
        )
    clash = _mount_clash(normal)
    if clash:
        raise ConfigError(
            "--volume",
            f"got {_shown(value)}; {clash}; mount the volume at a path of its own, e.g. --volume runs:/runs",
        )
    return Volume(claim, normal)


def _mount_clash(path: str) -> str | None:
    """Why a volume may not be mounted at `path` (None: it may): it would hide a system dir of the
    image or a home dir (where the pods' Python and meshrun live), or meet the pods' scratch dir."""
    system = next((d for d in SYSTEM_DIRS if path == d or path.startswith(d + "/")), None)
    if system:
        where = "" if path == system else f"in {system}, "
        return (
            f"{path} is {where}where images keep programs and libraries: a volume there would hide the "
            "image's Python"
        )
    if path in HOME_DIRS or posixpath.dirname(path) == "/home":
        return f"{path} is a home dir: a volume there would hide what pip install --user put in it"
    if path == SCRATCH_PATH or SCRATCH_PATH.startswith(path + "/") or path.startswith(SCRATCH_PATH + "/"):
        return f"{path} meets the pods' scratch dir {SCRATCH_PATH} (an emptyDir for their config dirs)"
    return None


def _pull_secret(value) -> str | None:
    if value is None:
        return None
    if not (value and len(value) <= 253 and DNS_SUBDOMAIN.fullmatch(value)):
        raise ConfigError(
            "--pull-secret",
            f"got {_shown(value)}; expected the name of a Secret of the namespace that holds the registry's "
            "credentials (lowercase letters, digits, '-' and '.'), e.g. --pull-secret regcred",
        )
    return value


def _user(value) -> User:
    """`--user UID:GID`: numeric ids, the user not root."""
    if value is None:
        return User(*DEFAULT_USER)
    uid, colon, gid = str(value).partition(":")
    if not (colon and uid.isdigit() and gid.isdigit() and int(uid) <= ID_LIMIT and int(gid) <= ID_LIMIT):
        raise ConfigError(
            "--user",
            f"got {_shown(value)}; expected UID:GID, the numeric user and group the pods run as, each 0 to "
            f"{ID_LIMIT}, e.g. --user 1000:1000 (the default)",
        )
    if int(uid) == 0:
        raise ConfigError(
            "--user",
            f"got {_shown(value)}; user 0 is root, which the restricted Pod Security Standard refuses "
            "(runAsNonRoot): give a user the image can run as, e.g. --user 1000:1000 (the default)",
        )
    return User(int(uid), int(gid))


def _out(value) -> str | None:
    """`--out FILE`: a file path that can be written, its missing dirs made when it is (checked before any
    work)."""
    if value is None:
        return None
    if not value:
        raise ConfigError("--out", "got nothing; give the file to write the YAML to, e.g. --out job.yaml")
    reason = unwritable(value)
    if reason:
        raise ConfigError(
            "--out",
            f"got {_shown(value)}, which cannot be written ({reason}); give a file path where you can write, "
            "e.g. --out job.yaml",
        )
    return value


def _shown(value) -> str:
    """A flag's value as messages quote it; `nothing` for a flag given without one."""
    return "nothing" if value is None or value == "" or value is True else repr(value)
