"""A Keras weights file (`model.weights.h5`) read a weight slice at a time, past Keras' public API:
its h5 store hands over each weight as an H5Weight, read from the file only where indexed, so that
sharded loading (meshrun.compat.keras.sharded_loading) reads each device's slice alone. Importing
this module imports neither Keras, jax nor h5py."""

from __future__ import annotations

import contextlib

from meshrun.compat.names import PrivateName, uses

PRIVATE_NAMES = uses(
    "keras",
    PrivateName(
        "keras",
        "keras.src.saving.saving_lib",
        "H5IOStore.__getitem__",
        "reading a weight of a Keras weights file a slice at a time as it goes onto its shards "
        "(weights_read_a_slice_at_a_time): the store reads each whole, from its h5 group",
        source_contains="self._h5_entry_group",
    ),
)


@contextlib.contextmanager
def weights_read_a_slice_at_a_time():
    """While in force, a weight that Keras reads from a weights file (`model.weights.h5`, not a
    sharded one) is handed over as an H5Weight, read from the file only where indexed, instead of
    a whole array: load_onto_shards then reads each device's slice alone, and the host never holds
    a large weight whole."""
    import h5py
    from keras.src.saving.saving_lib import H5IOStore

    keras_getitem = H5IOStore.__getitem__

    def getitem(store, key):
        found = store._h5_entry_group.get(key) if type(store) is H5IOStore and "/" not in key else None
        if not isinstance(found, h5py.Dataset) or not found.shape:
            return keras_getitem(store, key)
        return H5Weight(found)

    H5IOStore.__getitem__ = getitem
    try:
        yield
    finally:
        H5IOStore.__getitem__ = keras_getitem


class H5Weight:
    """A weight in a Keras weights file, read only where indexed (`weight[index]`), or whole by
    numpy.asarray; bfloat16 as Keras reads it (stored with a dtype attribute)."""

    def __init__(self, dataset):
        import ml_dtypes
        import numpy as np

        self.dataset = dataset
        self.shape = tuple(dataset.shape)
        self.ndim = len(self.shape)
        stored = dataset.attrs.get("dtype") if "dtype" in dataset.attrs else None
        self.dtype = np.dtype(ml_dtypes.bfloat16) if stored == "bfloat16" else dataset.dtype

    def __getitem__(self, index):
        import numpy as np

        return np.array(self.dataset[index], dtype=self.dtype)

    def __array__(self, dtype=None, copy=None):
        whole = self[()]
        return whole if dtype is None else whole.astype(dtype)
