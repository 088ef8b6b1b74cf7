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
}
SWITCHES = ("--apply", "--simulate")
MULTIRUN_FLAGS = ("-m", "--multirun")

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
class KubeOptions:
    """What `meshrun k8s` renders and does: `nodes` pods (one meshrun process each) of `image`, as
    a Kubeflow TrainJob or a plain Indexed Job (`kind`) named `name`, in `namespace` (None: the
    kubeconfig context's), process 0 listening on `port`, runs kept on `volume`; the YAML written to
    `out` (None: stdout), submitted (`apply`) or run here as local processes (`simulate`)."""

    image: str
    nodes: int
    port: int
    kind: str = KINDS[0]
    name: str = "meshrun"
    namespace: str | None = None
    volume: Volume | None = None
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
    return Volume(claim, normal)


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
