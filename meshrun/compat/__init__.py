"""The one place meshrun uses what its dependencies do not promise to keep: private attributes,
internal modules, patched methods and undocumented conventions of Keras, jax, Hydra, Orbax,
TensorFlow, TensorBoard and KerasHub, a module for each (meshrun.compat.jax, .hydra, .orbax,
.tensorflow, .tensorboard, .keras_hub) and for Keras a package of modules, one a concern
(meshrun.compat.keras).

Each module declares the names it uses (its PRIVATE_NAMES, with what meshrun needs each for and
the group that checks it), and reaches them only through its functions; meshrun.compat.names says
which modules make up each group. A group is checked once per process before its first use
(`names.ensure`), so a release that moves a name stops meshrun with one line naming the package,
its version, the name and the versions meshrun works with, instead of a traceback in the middle of
training.

Importing this package, or any module of it, imports none of those dependencies.
"""
