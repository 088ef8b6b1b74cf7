"""jax, as meshrun uses it past its public API: the names of the loggers of its internal modules,
whose INFO lines meshrun keeps off the console, and the coordinator port of its jobs on Kubernetes.

The loggers' names are checked with Keras' (the keras group), which every run checks before it
starts: Keras runs on jax here, and nothing reads these names before the run sets the loggers'
levels. The port is read from jax's source where `meshrun k8s` needs it, without importing jax; its
name is the jax group's, which the tests check.
Importing this module imports no jax.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from meshrun.compat.names import PrivateName, missing, uses

JAX_PLATFORM_LOGGER = "jax._src.xla_bridge"
JAX_PROFILER_LOGGER = "jax._src.profiler"

# Each module logs through the logger of its own name; checked with the keras group.
_LOGGERS = uses(
    "keras",
    PrivateName(
        "jax",
        JAX_PLATFORM_LOGGER,
        "",
        "the logger of jax's platform probes, kept off the console",
        source_contains="getLogger(__name__)",
    ),
    PrivateName(
        "jax",
        JAX_PROFILER_LOGGER,
        "",
        "the logger of the profiler, which names every file it converts",
        source_contains="getLogger(__name__)",
    ),
)

K8S_CLUSTER = "jax._src.clusters.k8s_cluster"
K8S_PORT = PrivateName(
    "jax",
    K8S_CLUSTER,
    "K8sCluster._coordinator_port",
    "the coordinator port of jax's jobs on Kubernetes, meshrun k8s' default --port",
    group="jax",
)
PRIVATE_NAMES = (*_LOGGERS, K8S_PORT)


def k8s_coordinator_port() -> int:
    """The port jax's own Kubernetes cluster detection puts process 0's coordinator on (its
    K8sCluster's); `meshrun k8s` uses it unless --port says otherwise. Read from jax's source, not
    imported: `meshrun k8s` reads its flags before the run's devices are chosen, which must come
    before jax's import (meshrun.placement.devices). A jax without it is a DependencyError."""
    source = _module_source(K8S_CLUSTER)
    port = _class_constant(source, *K8S_PORT.attribute.split(".")) if source else None
    if not isinstance(port, str | int) or not str(port).isdigit():
        raise missing(K8S_PORT)
    return int(port)


def _module_source(module: str) -> str | None:
    """The source of `module` of an installed package, found without importing the package."""
    top, *inner = module.split(".")
    spec = importlib.util.find_spec(top)  # a top-level package is found, not imported
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        return Path(spec.submodule_search_locations[0], *inner).with_suffix(".py").read_text()
    except OSError:
        return None


def _class_constant(source: str, cls: str, attribute: str):
    """The constant assigned to `attribute` in the body of class `cls` of `source` (None if none)."""
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.ClassDef) and node.name == cls):
            continue
        for item in node.body:
            targets = item.targets if isinstance(item, ast.Assign) else [getattr(item, "target", None)]
            named = any(isinstance(t, ast.Name) and t.id == attribute for t in targets)
            if named and isinstance(getattr(item, "value", None), ast.Constant):
                return item.value.value
    return None
