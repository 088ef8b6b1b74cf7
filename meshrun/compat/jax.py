"""jax, as meshrun uses it past its public API: the names of the loggers of its internal modules,
whose INFO lines meshrun keeps off the console.

jax's names are checked with Keras' (the keras group), which every run checks before it starts:
Keras runs on jax here, and nothing reads these names before the run sets the loggers' levels.
Importing this module imports no jax.
"""

from __future__ import annotations

from meshrun.compat.names import PrivateName, uses

JAX_PLATFORM_LOGGER = "jax._src.xla_bridge"
JAX_PROFILER_LOGGER = "jax._src.profiler"

# Each module logs through the logger of its own name.
uses(
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
