"""Methods of Keras' classes replaced while a block runs, then put back: any class's
(`methods_replaced`: sharded loading's JAX variables, meshrun.compat.keras.sharded_loading), and
one method of the Dense and EinsumDense classes exactly (`dense_layers_patched`: a quantized base's
builds and loading, meshrun.compat.keras.quantized and meshrun.quantize). The names these patches
rely on are listed by the modules that make them. Importing this module imports no Keras."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def methods_replaced(cls, **methods):
    """While the block runs, each method `name` of `cls` is `methods[name]` (a function of the
    instance and the method's arguments); then `cls`'s own again, or, where `cls` had none of its
    own, the one it inherits."""
    own = {name: cls.__dict__[name] for name in methods if name in cls.__dict__}
    for name, method in methods.items():
        setattr(cls, name, method)
    try:
        yield
    finally:
        for name in methods:
            if name in own:
                setattr(cls, name, own[name])
            else:
                delattr(cls, name)


@contextlib.contextmanager
def dense_layers_patched(name: str, replacement):
    """While in force, method `name` of Keras' Dense and EinsumDense classes is
    `replacement(cls, keras_method)` (a function of the layer and the method's arguments), for
    those classes exactly (Keras' own `quantize` takes no subclass either)."""
    from keras import layers

    originals = {cls: cls.__dict__[name] for cls in (layers.Dense, layers.EinsumDense)}
    with contextlib.ExitStack() as patches:
        for cls, method in originals.items():
            patches.enter_context(methods_replaced(cls, **{name: replacement(cls, method)}))
        yield
