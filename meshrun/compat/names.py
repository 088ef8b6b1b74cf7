"""The table of the private names meshrun uses, and the check that stops a run when a release has
moved one. Each module of meshrun.compat declares its names in a tuple of its own, PRIVATE_NAMES
(made with `uses`, beside the functions that reach them), each name with the group that
`ensure(group)` checks before the first use; GROUPS here says which modules declare the names of
each group, so `check(group)` imports those modules and reads their tuples, whatever was imported
before (tests/test_compat.py keeps GROUPS and the modules in agreement).

Importing this module imports none of the packages it names, nor the modules of meshrun.compat.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import inspect
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from meshrun.errors import DependencyError


@dataclass(frozen=True)
class PrivateName:
    """A name of a dependency that is not its public API: the distribution that ships it, the
    module, the attribute path inside it ('' for the module itself), what meshrun needs it for,
    and, for a convention rather than a name, text its source must contain; `group`, the group of
    GROUPS that checks it (set by `uses`)."""

    package: str
    module: str
    attribute: str
    purpose: str
    source_contains: str = ""
    group: str = ""

    @property
    def dotted(self) -> str:
        return f"{self.module}.{self.attribute}" if self.attribute else self.module


# group -> the modules of meshrun.compat that declare its names (their PRIVATE_NAMES), in the order
# `check(group)` reads them. The keras group holds jax's logger names too: every run checks it.
GROUPS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "keras": (
            "meshrun.compat.keras.startup",
            "meshrun.compat.keras.jax_trainer",
            "meshrun.compat.keras.models",
            "meshrun.compat.keras.callbacks",
            "meshrun.compat.keras.variable_values",
            "meshrun.compat.keras.lora",
            "meshrun.compat.keras.variable_layouts",
            "meshrun.compat.keras.sharded_loading",
            "meshrun.compat.keras.h5_weights",
            "meshrun.compat.keras.remat",
            "meshrun.compat.jax",
        ),
        # Keras' int8 and int4 layers: checked only by runs that quantize, so that a Keras that
        # lays them out otherwise still runs everything else.
        "keras_quantize": ("meshrun.compat.keras.quantized",),
        "jax": ("meshrun.compat.jax",),
        "hydra": ("meshrun.compat.hydra",),
        "orbax": ("meshrun.compat.orbax",),
        "tensorflow": ("meshrun.compat.tensorflow",),
        "tensorboard": ("meshrun.compat.tensorboard",),
        "keras_hub": ("meshrun.compat.keras_hub",),
    }
)

# Distributions that ship the same modules: the error names the one installed (meshrun[tf] installs
# tensorflow-cpu; keras-hub's tensorflow-text, and so meshrun[dev], the full tensorflow).
SAME_MODULES = {"tensorflow": ("tensorflow", "tensorflow-cpu")}

NOT_INSTALLED = "(not installed)"


def uses(group: str, *names: PrivateName) -> tuple[PrivateName, ...]:
    """`names` as names of `group`, for a module's PRIVATE_NAMES (changes nothing else: the module
    must be among GROUPS[group] for `check(group)` to read them)."""
    return tuple(replace(name, group=group) for name in names)


def names_of(group: str) -> tuple[PrivateName, ...]:
    """The names of `group` (a key of GROUPS), from the PRIVATE_NAMES of each of its modules."""
    return tuple(
        name
        for module in GROUPS[group]
        for name in importlib.import_module(module).PRIVATE_NAMES
        if name.group == group
    )


def check(group: str) -> None:
    """Raises DependencyError for the first name of `group` (keras, hydra, orbax, tensorflow, ...)
    that the installed package lacks."""
    for name in names_of(group):
        check_name(name)


def check_name(name: PrivateName) -> None:
    """Raises DependencyError when the installed package lacks `name` (or its source no longer
    reads what the name's convention needs)."""
    found = _lookup(name)
    if found is None:
        raise missing(name)
    if name.source_contains and name.source_contains not in inspect.getsource(found):
        raise missing(name, f"no longer reads {name.source_contains!r}")


@functools.cache
def ensure(group: str) -> None:
    """`check(group)`, once per process: the installed packages do not change while it runs (the
    cache is the one process-wide state here; tests clear it with ensure.cache_clear())."""
    check(group)


def _lookup(name: PrivateName):
    try:
        found = importlib.import_module(name.module)
    except ImportError:
        return None
    for part in filter(None, name.attribute.split(".")):
        found = getattr(found, part, None)
        if found is None:
            return None
    return found


def missing(name: PrivateName, what: str = "") -> DependencyError:
    """The one-line error for a release that lacks `name` (or reads `what` of it)."""
    package = installed_distribution(name.package)
    version = _installed(package)
    wanted = _required(package)
    advice = f"; meshrun works with {package}{wanted} (pip install '{package}{wanted}')" if wanted else ""
    problem = f"{name.dotted} {what}" if what else f"has no {name.dotted}"
    return DependencyError(
        package,
        f"{package} {version} {problem}, which meshrun uses for {name.purpose}{advice}",
    )


def installed_distribution(package: str) -> str:
    """The distribution of `package`'s modules that is installed (SAME_MODULES), else `package`."""
    for candidate in SAME_MODULES.get(package, ()):
        if _installed(candidate) != NOT_INSTALLED:
            return candidate
    return package


def _installed(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return NOT_INSTALLED


def _required(package: str) -> str:
    """The version range meshrun's own metadata asks for `package` ('' when it names none)."""
    try:
        requirements = importlib.metadata.requires("meshrun") or []
    except importlib.metadata.PackageNotFoundError:
        return ""
    for requirement in requirements:
        found = re.match(rf"^{re.escape(package)}\s*([<>=!~][^;]*)", requirement)
        if found:
            return found.group(1).strip()
    return ""
