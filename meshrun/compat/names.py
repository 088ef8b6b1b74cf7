"""The table of the private names meshrun uses, and the check that stops a run when a release has
moved one: each module of meshrun.compat lists its names here (`uses`), beside the functions that
reach them, by the group that `ensure(group)` checks before the first use.

Importing this module imports none of the packages it names.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import inspect
import re
from dataclasses import dataclass

from meshrun.errors import DependencyError


@dataclass(frozen=True)
class PrivateName:
    """A name of a dependency that is not its public API: the distribution that ships it, the
    module, the attribute path inside it ('' for the module itself), what meshrun needs it for,
    and, for a convention rather than a name, text its source must contain."""

    package: str
    module: str
    attribute: str
    purpose: str
    source_contains: str = ""

    @property
    def dotted(self) -> str:
        return f"{self.module}.{self.attribute}" if self.attribute else self.module


# group -> its names, in the order the modules of meshrun.compat list them (meshrun.compat imports
# every one of them, so the table is whole wherever meshrun.compat is imported)
PRIVATE_NAMES: dict[str, tuple[PrivateName, ...]] = {}

# Distributions that ship the same modules: the error names the one installed (meshrun[tf] installs
# tensorflow-cpu; keras-hub's tensorflow-text, and so meshrun[dev], the full tensorflow).
SAME_MODULES = {"tensorflow": ("tensorflow", "tensorflow-cpu")}

NOT_INSTALLED = "(not installed)"


def uses(group: str, *names: PrivateName) -> tuple[PrivateName, ...]:
    """Adds `names` to the names `check(group)` looks for; returns them."""
    PRIVATE_NAMES[group] = PRIVATE_NAMES.get(group, ()) + names
    return names


def check(group: str) -> None:
    """Raises DependencyError for the first name of `group` (keras, hydra, orbax, tensorflow, ...)
    that the installed package lacks."""
    for name in PRIVATE_NAMES[group]:
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
    """`check(group)`, once per process."""
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
