"""meshrun as a library: one training run, `train(config, context)` (the phases are in meshrun.run).

    from meshrun.train import RunContext, train

Importing it imports jax and keras (Keras on its jax backend, without the optional packages it
would load for features meshrun does not use, see meshrun.compat.keras.startup.import_keras); set the device
count first (meshrun.placement.devices.prepare), as the `meshrun` command does.
"""

from meshrun.compat.keras.startup import import_keras

import_keras()

from meshrun.run.phases import RunContext, TrainedRun, train  # noqa: E402  (after keras is imported our way)

__all__ = ["RunContext", "TrainedRun", "train"]
