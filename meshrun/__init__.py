"""meshrun: a config-driven training launcher for Keras 3 distribution on JAX.

Importing this package is cheap and imports neither jax nor keras: the device count has to be set
before they load, which happens in `meshrun.placement.devices`.
"""

import time

__version__ = "0.1.0"
IMPORTED_AT = time.time()  # fallback for the process start time where /proc is missing
