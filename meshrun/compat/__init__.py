"""The one place meshrun uses what its dependencies do not promise to keep: private attributes,
internal modules, patched methods and undocumented conventions of Keras, jax, Hydra, Orbax,
TensorFlow, TensorBoard and KerasHub, one module for each (meshrun.compat.keras, .jax, .hydra,
.orbax, .tensorflow, .tensorboard, .keras_hub).

Each such name is listed in its module with what meshrun needs it for (meshrun.compat.names), and
reached only through that module's functions. A group is checked once per process before its
first use (`ensure`), so a release that moves a name stops meshrun with one line naming the
package, its version, the name and the versions meshrun works with, instead of a traceback in the
middle of training.

Importing this package imports none of those dependencies.
"""

from __future__ import annotations

# Each module lists its names in the table as it is imported: importing them all here makes the
# table whole wherever meshrun.compat is used.
from meshrun.compat import hydra, jax, keras, keras_hub, orbax, tensorboard, tensorflow  # noqa: F401
from meshrun.compat.names import PRIVATE_NAMES, PrivateName, check, ensure, installed_distribution

__all__ = ["PRIVATE_NAMES", "PrivateName", "check", "ensure", "installed_distribution"]
