"""Loading a preset under a mesh (meshrun.compat.keras.sharded_loading.load_onto_shards,
meshrun.system.load_memory) on 8 emulated CPU devices: every weight lands on its shards with exactly
the values plain KerasHub reads, no device ever holds more than 1.3x the bytes the layout gives it
(plain Keras copies each weight whole onto one device first: 1.43x for the tiny Gemma here),
variables the files do not fill keep their initializers' values, Keras is itself again after the
block, and what the devices held before loading is not counted as the load's."""

import numpy as np
import pytest

from conftest import layout_rules

pytestmark = pytest.mark.integration


@pytest.fixture
def gemma_tp_on_2x4():
    """The distribution of mesh 2x4 under gemma_tp, in force for the test."""
    import jax
    import keras

    from meshrun.config.layout_schema import LayoutRule, MeshConfig
    from meshrun.placement import distribution as distribution_lib

    mesh = MeshConfig(shape=(2, 4), axis_names=("data", "model"), batch_axis="data")
    rules = tuple(LayoutRule(pattern, tuple(axes)) for pattern, axes in layout_rules("gemma_tp").items())
    keras.backend.clear_session()
    keras.distribution.set_distribution(distribution_lib.make_distribution(mesh, rules, jax.devices()))
    yield
    distribution_lib.reset()
    keras.backend.clear_session()


def test_a_preset_lands_on_its_shards_with_the_values_keras_hub_reads_and_no_device_holds_more(
    text_files, gemma_tp_on_2x4
):
    import jax
    import keras
    import keras_hub

    from meshrun.models.hub.build import build
    from meshrun.models.hub.options import KerasHubOptions
    from meshrun.system.load_memory import LoadWatch

    with LoadWatch(jax.devices()) as watch:
        task = build(KerasHubOptions(preset=str(text_files.gemma)))
    peaks = watch.peaks()
    loaded = {v.path: v.value for v in task.backbone.variables}
    keras.distribution.set_distribution(None)
    plain = keras_hub.models.CausalLM.from_preset(str(text_files.gemma), preprocessor=None, compile=False)
    expected = {v.path: np.asarray(v.value) for v in plain.backbone.variables}
    assert loaded.keys() == expected.keys()
    for path, value in loaded.items():
        np.testing.assert_array_equal(np.asarray(value), expected[path], err_msg=path)
    assert tuple(loaded["token_embedding/embeddings"].sharding.spec) == ("model", None)
    assert tuple(loaded["decoder_block_0/ffw_gating/kernel"].sharding.spec) == (None, "model")
    planned = max(
        sum(
            shard.data.nbytes
            for value in loaded.values()
            for shard in value.addressable_shards
            if shard.device == device
        )
        for device in jax.devices()
    )
    assert planned <= peaks.bytes_per_device <= 1.3 * planned, (peaks, planned)
    assert peaks.host_bytes is not None and 0 < peaks.host_bytes < 64 << 20


def test_variables_the_files_do_not_fill_get_their_initializers_values_and_keras_is_itself_after(
    gemma_tp_on_2x4,
):
    import keras
    from keras.src.backend.jax.core import JaxVariable

    from meshrun.compat.keras import sharded_loading as compat

    placed = []
    with compat.load_onto_shards(on_placed=lambda: placed.append(1)):
        filled = keras.layers.Dense(8, name="ffw_linear")
        left = keras.layers.Dense(8, bias_initializer="ones")
        filled.build((None, 4))
        left.build((None, 4))
        assert not np.asarray(left.kernel.value).any()  # zeros until the block ends
        kernel = np.arange(32, dtype="float32").reshape(4, 8)
        filled.kernel.assign(kernel)
    assert len(placed) == 1
    np.testing.assert_array_equal(np.asarray(filled.kernel.value), kernel)
    assert np.asarray(left.kernel.value).std() > 0.1  # glorot_uniform's values, not zeros
    np.testing.assert_array_equal(np.asarray(left.bias.value), np.ones(8))
    assert (
        "assign" not in JaxVariable.__dict__
        and JaxVariable._initialize_with_initializer.__module__ == "keras.src.backend.jax.core"
    )


def test_a_load_peak_counts_what_loading_added_not_what_the_devices_held_before():
    """Arrays a device held when loading began (a previous job's, in a multirun of one process) are
    not the load's: the peak is the bytes loading added."""
    import jax

    from meshrun.system.load_memory import LoadWatch

    device = jax.devices()[0]
    held_before = jax.device_put(np.zeros(4096, np.float32), device)
    with LoadWatch([device]) as watch:
        loaded = jax.device_put(np.ones(1024, np.float32), device)
    assert watch.peaks().bytes_per_device == loaded.nbytes == 4096
    assert held_before.nbytes == 16384
