"""Pipeline stages (meshrun.pipeline): the GPipe schedule over a `stage` mesh axis gives the same
losses and gradients as running the blocks one after another, with the data and model axes still
there, and a Keras model whose blocks are one PipelinedBlocks layer trains exactly as the same model
with its blocks as separate layers."""

import contextlib
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from meshrun.pipeline.bubble import bubble_fraction, stage_of_block
from meshrun.pipeline.schedule import check_split, gpipe

BLOCKS, WIDTH, BATCH = 8, 16, 32


def _stage(weights, x, side=None):
    """Blocks x -> tanh(x W) + x, one per leading slice of `weights`; with a side input `scale`
    (one number per row), x -> tanh(x W) * scale + x."""
    scale = side["scale"][:, None] if side else 1.0
    return lax.scan(lambda h, w: (jnp.tanh(h @ w) * scale + h, None), x, weights)[0]


# The blocks run one after another: the reference each case of a test compares its schedule with.
# It does not depend on the case, so it is compiled once for all of them, not once a case: with
# side inputs, one jitted function for every case of both tests that have them; without, the loss
# against the test's one target, computed by its first case.
_IN_TURN = {}


def _in_turn_once(test: str, compute):
    """The loss and gradients `compute()` gives for `test`'s blocks run in turn, computed on first use."""
    if test not in _IN_TURN:
        _IN_TURN[test] = compute()
    return _IN_TURN[test]


@jax.jit
@jax.value_and_grad
def _scaled_in_turn(w, x, scale):
    return jnp.mean(_stage(w, x, {"scale": scale}) ** 2)


def _mesh(stages: int, data: int) -> jax.sharding.Mesh:
    devices = np.array(jax.devices()).reshape(stages, data, 8 // (stages * data))
    return jax.sharding.Mesh(devices, ("stage", "data", "model"))


def test_the_bubble_is_the_gpipe_formula_and_the_circular_one():
    assert bubble_fraction(1, 8) == 0
    assert bubble_fraction(4, 1) == pytest.approx(3 / 4)
    assert bubble_fraction(4, 12) == pytest.approx(3 / 15)
    assert bubble_fraction(4, 8, repeats=2) == pytest.approx(3 / 19)


def test_the_circular_schedule_gives_each_stage_every_sth_run_of_blocks():
    assert [stage_of_block(b, 8, 2) for b in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [stage_of_block(b, 8, 2, repeats=2) for b in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert [stage_of_block(b, 8, 4, repeats=2) for b in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]


def test_blocks_and_microbatches_that_do_not_split_say_what_would():
    with pytest.raises(
        ValueError,
        match="6 blocks do not split into 4 stages of equal length; use a stage count that divides 6",
    ):
        check_split(6, 4, 32, 2)
    with pytest.raises(ValueError, match="3 microbatches do not divide the batch of 32; use a divisor of 32"):
        check_split(8, 4, 32, 3)
    with pytest.raises(ValueError, match="8 blocks do not split into 16 stages of equal length"):
        check_split(8, 4, 32, 4, repeats=4)
    with pytest.raises(
        ValueError,
        match="the circular schedule takes microbatches in groups of the 4 stages; 2 is not a multiple of 4",
    ):
        check_split(8, 4, 32, 2, repeats=2)


@pytest.mark.integration
@pytest.mark.parametrize(
    "stages, data, microbatches", [(2, 2, 4), (4, 2, 8), (4, 1, 1), (2, 4, 2), (1, 8, 4)]
)
def test_the_schedule_gives_the_losses_and_gradients_of_the_blocks_in_turn(stages, data, microbatches):
    rng = np.random.default_rng(0)
    weights = jnp.asarray(rng.normal(size=(BLOCKS, WIDTH, WIDTH)) * 0.3, jnp.float32)
    x = jnp.asarray(rng.normal(size=(BATCH, WIDTH)), jnp.float32)
    target = jnp.asarray(rng.normal(size=(BATCH, WIDTH)), jnp.float32)
    mesh = _mesh(stages, data)

    def pipelined(w, x):
        return jnp.mean((gpipe(_stage, w, x, mesh, "stage", microbatches) - target) ** 2)

    def in_turn(w, x):
        return jnp.mean((_stage(w, x) - target) ** 2)

    staged = jax.device_put(weights, NamedSharding(mesh, P("stage")))
    loss, grads = jax.jit(jax.value_and_grad(pipelined))(
        staged, jax.device_put(x, NamedSharding(mesh, P("data")))
    )
    expected_loss, expected_grads = _in_turn_once(
        "schedule", lambda: jax.jit(jax.value_and_grad(in_turn))(weights, x)
    )
    assert float(loss) == pytest.approx(float(expected_loss), rel=1e-6)
    np.testing.assert_allclose(np.asarray(grads), np.asarray(expected_grads), atol=1e-6)
    assert grads.sharding.spec == P("stage")  # each stage holds its own blocks' gradients


@pytest.mark.integration
@pytest.mark.parametrize(
    "stages, data, microbatches, repeats", [(2, 2, 4, 2), (4, 2, 4, 2), (2, 4, 2, 4), (1, 8, 2, 2)]
)
def test_the_circular_schedule_gives_the_losses_and_gradients_of_the_blocks_in_turn(
    stages, data, microbatches, repeats
):
    rng = np.random.default_rng(5)
    weights = jnp.asarray(rng.normal(size=(BLOCKS, WIDTH, WIDTH)) * 0.3, jnp.float32)
    x = jnp.asarray(rng.normal(size=(BATCH, WIDTH)), jnp.float32)
    scale = jnp.asarray(rng.uniform(0, 2, size=(BATCH,)), jnp.float32)
    mesh = _mesh(stages, data)

    def pipelined(
        w, x, scale
    ):  # rounds in the first dimension, stages in the second: blocks in order when read as one
        return jnp.mean(
            gpipe(_stage, w, x, mesh, "stage", microbatches, {"scale": scale}, repeats=repeats) ** 2
        )

    staged = jax.device_put(
        weights.reshape(repeats, BLOCKS // repeats, WIDTH, WIDTH), NamedSharding(mesh, P(None, "stage"))
    )
    rows = NamedSharding(mesh, P("data"))
    loss, grads = jax.jit(jax.value_and_grad(pipelined))(
        staged, jax.device_put(x, rows), jax.device_put(scale, rows)
    )
    expected_loss, expected_grads = _scaled_in_turn(weights, x, scale)
    assert float(loss) == pytest.approx(float(expected_loss), rel=1e-6)
    np.testing.assert_allclose(
        np.asarray(grads).reshape(BLOCKS, WIDTH, WIDTH), np.asarray(expected_grads), atol=1e-6
    )


@pytest.mark.integration
@pytest.mark.parametrize("stages, data, microbatches", [(2, 2, 4), (4, 2, 2)])
def test_inputs_beside_the_activations_reach_each_stage_with_its_microbatch_rows(stages, data, microbatches):
    rng = np.random.default_rng(3)
    weights = jnp.asarray(rng.normal(size=(BLOCKS, WIDTH, WIDTH)) * 0.3, jnp.float32)
    x = jnp.asarray(rng.normal(size=(BATCH, WIDTH)), jnp.float32)
    scale = jnp.asarray(rng.uniform(0, 2, size=(BATCH,)), jnp.float32)  # a different number for every row
    mesh = _mesh(stages, data)

    def pipelined(w, x, scale):
        return jnp.mean(gpipe(_stage, w, x, mesh, "stage", microbatches, {"scale": scale}) ** 2)

    staged = jax.device_put(weights, NamedSharding(mesh, P("stage")))
    rows = NamedSharding(mesh, P("data"))
    loss, grads = jax.jit(jax.value_and_grad(pipelined))(
        staged, jax.device_put(x, rows), jax.device_put(scale, rows)
    )
    expected_loss, expected_grads = _scaled_in_turn(weights, x, scale)
    assert float(loss) == pytest.approx(float(expected_loss), rel=1e-6)
    np.testing.assert_allclose(np.asarray(grads), np.asarray(expected_grads), atol=1e-6)


def _keras_models(width: int, blocks: int):
    import keras

    class Block(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.dense = keras.layers.Dense(width, activation="tanh", name="dense")

        def build(self, shape):
            self.dense.build(shape)

        def call(self, x):
            return self.dense(x) + x

    def separate():
        inputs = keras.Input((width,))
        hidden = inputs
        for i in range(blocks):
            hidden = Block(name=f"block_{i}")(hidden)
        return keras.Model(inputs, keras.layers.Dense(width, name="head")(hidden))

    def pipelined(microbatches):
        from meshrun.pipeline.stack import PipelinedBlocks

        inputs = keras.Input((width,))
        hidden = PipelinedBlocks(
            lambda name: Block(name=name), blocks, microbatches=microbatches, name="blocks"
        )(inputs)
        return keras.Model(inputs, keras.layers.Dense(width, name="head")(hidden))

    return separate, pipelined


@pytest.mark.integration
def test_a_keras_model_with_pipelined_blocks_trains_as_the_one_with_separate_blocks():
    import keras

    separate, pipelined = _keras_models(WIDTH, 4)
    rng = np.random.default_rng(1)
    x, y = (
        rng.normal(size=(4 * BATCH, WIDTH)).astype("float32"),
        rng.normal(size=(4 * BATCH, WIDTH)).astype("float32"),
    )

    def fit(model):
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        return model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history["loss"]

    keras.backend.clear_session()
    keras.utils.set_random_seed(1)
    mesh = keras.distribution.DeviceMesh((8,), ("data",))
    keras.distribution.set_distribution(
        keras.distribution.ModelParallel(layout_map=keras.distribution.LayoutMap(mesh), batch_dim_name="data")
    )
    reference = separate()
    start = {v.path: keras.ops.convert_to_numpy(v) for v in reference.weights}
    expected = fit(reference)
    try:
        for stages, data, microbatches in [(2, 2, 4), (4, 2, 2)]:
            keras.backend.clear_session()
            mesh = keras.distribution.DeviceMesh(
                (stages, data, 8 // (stages * data)), ("stage", "data", "model")
            )
            layouts = keras.distribution.LayoutMap(mesh)
            layouts["blocks/stacked_.*kernel"] = ("stage", None, None)
            layouts["blocks/stacked_.*bias"] = ("stage", None)
            keras.distribution.set_distribution(
                keras.distribution.ModelParallel(layout_map=layouts, batch_dim_name="data")
            )
            model = pipelined(microbatches)
            model.build((None, WIDTH))
            stack = model.get_layer("blocks")
            for stacked, weight in zip(stack.stacked, stack.template.trainable_variables, strict=True):
                name = weight.path.split(f"{stack.template.name}/", 1)[1]  # dense/kernel
                stacked.assign(np.stack([start[f"block_{i}/{name}"] for i in range(4)]))
            model.get_layer("head").set_weights([start["head/kernel"], start["head/bias"]])
            assert [v.value.sharding.spec for v in stack.stacked] == [
                P("stage", None, None),
                P("stage", None),
            ]
            assert len(model.weights) == 4  # the stacked kernel and bias, the head's: not the template's
            np.testing.assert_allclose(fit(model), expected, rtol=1e-5)
    finally:
        keras.distribution.set_distribution(None)
        keras.backend.clear_session()


def test_each_stacked_block_starts_as_a_block_of_its_own_would():
    import keras

    from meshrun.pipeline.stack import PipelinedBlocks

    keras.backend.clear_session()
    stack = PipelinedBlocks(lambda name: keras.layers.Dense(WIDTH, name=name), 4, name="blocks")
    stack.build((None, WIDTH))
    kernel = keras.ops.convert_to_numpy(stack.stacked[0])
    limit = np.sqrt(6 / (WIDTH + WIDTH))  # glorot_uniform of one 16x16 kernel, not of the 4x16x16 stack
    assert kernel.shape == (4, WIDTH, WIDTH)
    assert np.abs(kernel).max() <= limit and np.abs(kernel).max() > 0.9 * limit
    assert not np.allclose(kernel[0], kernel[1])  # each block draws its own
    assert [v.path for v in stack.weights] == ["blocks/stacked_kernel", "blocks/stacked_bias"]
    x = np.random.default_rng(2).normal(size=(2, WIDTH)).astype("float32")
    expected = x
    for block in range(4):  # with no stage axis in force, the blocks run one after another
        expected = expected @ kernel[block] + keras.ops.convert_to_numpy(stack.stacked[1])[block]
    np.testing.assert_allclose(keras.ops.convert_to_numpy(stack(x)), expected, rtol=1e-5, atol=1e-5)
    assert all(v._value is None for v in stack.template.weights)  # the template's own weights are never made


def test_a_block_with_non_trainable_weights_cannot_be_pipelined():
    import keras

    from meshrun.pipeline.stack import BlockNotPipelinable, PipelinedBlocks

    stack = PipelinedBlocks(lambda name: keras.layers.BatchNormalization(name="norm"), 2, name="blocks")
    with pytest.raises(
        BlockNotPipelinable,
        match=r"its blocks keep state besides their weights \(moving_mean, moving_variance\), "
        "which pipeline stages cannot hand on yet",
    ):
        stack.build((None, WIDTH))


@pytest.mark.integration
def test_repeated_blocks_pass_keyword_tensors_to_every_block_pipelined_or_not():
    import keras

    from meshrun.pipeline import repeated_blocks

    def build():
        x = keras.Input((4, WIDTH))
        scale = keras.Input((4,))
        hidden = repeated_blocks(lambda name: _scaled(name=name), 4)(x, scale=scale)
        return keras.Model([x, scale], hidden)

    rng = np.random.default_rng(4)
    x, scale = (
        rng.normal(size=(BATCH, 4, WIDTH)).astype("float32"),
        (rng.uniform(size=(BATCH, 4)) > 0.5).astype("float32"),
    )
    with _separate_then_pipelined(
        build, lambda model: keras.ops.convert_to_numpy(model([x, scale])), microbatches=4
    ) as (expected, model):
        assert [v.path for v in model.weights] == ["blocks/stacked_dense_kernel", "blocks/stacked_dense_bias"]
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(model([x, scale])), expected, rtol=1e-5, atol=1e-5
        )


@functools.cache
def _scaled_class():
    """A residual block x + tanh(x W) * scale * gain (scale by keyword, one number per row and
    position; gain a setting)."""
    import keras

    class Scaled(keras.layers.Layer):
        def __init__(self, gain=1.0, **kwargs):
            super().__init__(**kwargs)
            self.gain = gain
            self.dense = keras.layers.Dense(WIDTH, activation="tanh", name="dense")

        def build(self, x_shape):
            self.dense.build(x_shape)

        def call(self, x, scale=None):
            return x + self.dense(x) * scale[:, :, None] * self.gain

    return Scaled


def _scaled(gain: float = 1.0, **kwargs):
    return _scaled_class()(gain, **kwargs)


def _model_holding_blocks(blocks: list, chained: bool = True):
    """A functional model that calls a nested functional 'backbone' (embedding-like Dense, then
    `blocks` in turn with a scale by keyword) and a head on its output, as KerasHub's tasks do."""
    import keras

    x, scale = keras.Input((4, WIDTH), name="x"), keras.Input((4,), name="scale")
    hidden = keras.layers.Dense(WIDTH, name="embed")(x)
    for block in blocks:
        hidden = block(hidden if chained else x, scale=scale)
    backbone = keras.Model({"x": x, "scale": scale}, hidden, name="backbone")
    outer = {"x": keras.Input((4, WIDTH), name="x"), "scale": keras.Input((4,), name="scale")}
    return keras.Model(outer, keras.layers.Dense(3, name="head")(backbone(outer)))


@pytest.mark.integration
def test_a_functional_model_holding_its_blocks_runs_them_as_stages_with_its_own_weights():
    import keras

    from meshrun.config.schema import PipelineConfig
    from meshrun.pipeline.functional import with_pipelined_blocks

    rng = np.random.default_rng(5)
    inputs = {
        "x": rng.normal(size=(BATCH, 4, WIDTH)).astype("float32"),
        "scale": (rng.uniform(size=(BATCH, 4)) > 0.5).astype("float32"),
    }

    def build():
        """The model's output with its blocks as they are, and the model rebuilt with them pipelined."""
        blocks = [_scaled(name=f"layer_{i}") for i in range(4)]
        model = _model_holding_blocks(blocks)
        output = keras.ops.convert_to_numpy(model(inputs))
        return output, with_pipelined_blocks(model, blocks, PipelineConfig(microbatches=4), name="blocks")

    with _separate_then_pipelined(build, lambda built: built[0], microbatches=4) as (expected, built):
        pipelined = built[1]
        assert [v.path for v in pipelined.weights] == [
            "embed/kernel",
            "embed/bias",
            "blocks/stacked_dense_kernel",
            "blocks/stacked_dense_bias",
            "head/kernel",
            "head/bias",
        ]
        stack = pipelined.get_layer("blocks")
        assert stack.block_paths(stack.stacked[0]) == tuple(f"layer_{i}/dense/kernel" for i in range(4))
        assert tuple(stack.stacked[0].value.sharding.spec)[:1] == ("stage",)
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(pipelined(inputs)), expected, rtol=1e-5, atol=1e-5
        )


@pytest.mark.integration
def test_while_built_for_stages_each_blocks_weights_live_on_its_stages_devices_and_stack_there():
    import keras

    from meshrun.config.schema import PipelineConfig
    from meshrun.pipeline.functional import with_pipelined_blocks
    from meshrun.placement.distribution import blocks_on_their_stages

    mesh = keras.distribution.DeviceMesh((2, 4), ("stage", "data"))
    layouts = keras.distribution.LayoutMap(mesh)
    layouts["blocks/stacked_dense_kernel"] = ("stage", None, "data")
    stacks = {
        "blocks/stacked_dense_kernel": tuple(f"layer_{i}/dense/kernel" for i in range(4)),
        "blocks/stacked_dense_bias": tuple(f"layer_{i}/dense/bias" for i in range(4)),
    }
    devices = np.array(jax.devices()).reshape(2, 4)
    try:
        keras.backend.clear_session()
        keras.distribution.set_distribution(
            keras.distribution.ModelParallel(layout_map=layouts, batch_dim_name="data")
        )
        with blocks_on_their_stages(stacks, PipelineConfig()):
            blocks = [_scaled(name=f"layer_{i}") for i in range(4)]
            model = _model_holding_blocks(blocks)
            for index, block in enumerate(
                blocks
            ):  # blocks 0-1: stage 0's devices; 2-3: stage 1's; split as their rows will be
                kernel, bias = block.dense.kernel.value, block.dense.bias.value
                assert kernel.sharding.device_set == bias.sharding.device_set == set(devices[index // 2])
                assert (tuple(kernel.sharding.spec), tuple(bias.sharding.spec)) == ((None, "data"), (None,))
            assert model.get_layer("head").kernel.value.sharding.device_set == set(
                devices.flat
            )  # not a block: the whole mesh
            values = [np.asarray(block.dense.kernel.value) for block in blocks]
            pipelined = with_pipelined_blocks(model, blocks, PipelineConfig(), name="blocks")
        stacked = pipelined.get_layer("blocks").stacked[0].value
        assert tuple(stacked.sharding.spec) == ("stage", None, "data")
        np.testing.assert_array_equal(np.asarray(stacked), np.stack(values))
        assert all(block.dense.kernel._value is None for block in blocks)  # the blocks' own arrays are gone
    finally:
        keras.distribution.set_distribution(None)
        keras.backend.clear_session()


@pytest.mark.parametrize(
    "blocks, chained, text",
    [
        (
            lambda: [_scaled(name="layer_0"), _scaled(0.5, name="layer_1")],
            True,
            "its blocks differ: gain is 0.5 in layer_1 and 1.0 in layer_0; stages run one block repeated",
        ),
        (
            lambda: [_scaled(name="layer_0"), _scaled(name="layer_2")],
            True,
            "its blocks are not named by their place (layer_0, "
            "layer_2, ...); stages need block i named <name>_i",
        ),
        (
            lambda: [_scaled(name=f"layer_{i}") for i in range(2)],
            False,
            "its blocks are not applied one after another (layer_1 does "
            "not take layer_0's output and the same tensors beside it)",
        ),
    ],
)
def test_blocks_a_model_holds_that_are_not_one_block_repeated_in_a_chain_are_refused(blocks, chained, text):
    import keras

    from meshrun.config.schema import PipelineConfig
    from meshrun.pipeline.functional import with_pipelined_blocks
    from meshrun.pipeline.stack import BlockNotPipelinable

    keras.backend.clear_session()
    made = blocks()
    with pytest.raises(BlockNotPipelinable) as raised:
        with_pipelined_blocks(_model_holding_blocks(made, chained), made, PipelineConfig(), name="blocks")
    assert str(raised.value) == text


@pytest.mark.integration
def test_frozen_block_weights_are_stacked_as_frozen_and_stay_as_they_were():
    import keras

    from meshrun.pipeline import repeated_blocks

    class HalfFrozen(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.fixed = keras.layers.Dense(WIDTH, activation="tanh", name="fixed")
            self.tuned = keras.layers.Dense(WIDTH, name="tuned")
            self.fixed.trainable = False  # as LoRA leaves a kernel

        def build(self, x_shape):
            self.fixed.build(x_shape)
            self.tuned.build(x_shape)

        def call(self, x):
            return x + self.tuned(self.fixed(x))

    def build():
        inputs = keras.Input((WIDTH,))
        outputs = keras.layers.Dense(1, name="head")(
            repeated_blocks(lambda name: HalfFrozen(name=name), 4)(inputs)
        )
        model = keras.Model(inputs, outputs)
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        return model

    rng = np.random.default_rng(6)
    x, y = (
        rng.normal(size=(4 * BATCH, WIDTH)).astype("float32"),
        rng.normal(size=(4 * BATCH, 1)).astype("float32"),
    )

    def fit(model):
        return model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history["loss"]

    with _separate_then_pipelined(build, fit, microbatches=2) as (expected, model):
        stack = model.get_layer("blocks")
        assert [v.path for v in stack.trainable_weights] == [
            "blocks/stacked_tuned_kernel",
            "blocks/stacked_tuned_bias",
        ]
        assert [v.path for v in stack.non_trainable_weights] == [
            "blocks/stacked_fixed_kernel",
            "blocks/stacked_fixed_bias",
        ]
        before = keras.ops.convert_to_numpy(stack.non_trainable_weights[0])
        tuned_before = keras.ops.convert_to_numpy(stack.trainable_weights[0])
        np.testing.assert_allclose(fit(model), expected, rtol=1e-5)
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(stack.non_trainable_weights[0]), before)
        assert not np.allclose(keras.ops.convert_to_numpy(stack.trainable_weights[0]), tuned_before)


@contextlib.contextmanager
def _separate_then_pipelined(build, use, microbatches: int):
    """Yields what `use` gives for `build()` with separate blocks, and the same model (same seed)
    built for pipeline stages on a (stage 2, data 4) mesh, the stacked block weights split over the
    stages; the distribution is cleared after."""
    import keras

    from meshrun.config.schema import PipelineConfig
    from meshrun.pipeline import stages

    try:
        keras.backend.clear_session()
        keras.utils.set_random_seed(7)
        expected = use(build())
        keras.backend.clear_session()
        keras.utils.set_random_seed(7)
        mesh = keras.distribution.DeviceMesh((2, 4), ("stage", "data"))
        layouts = keras.distribution.LayoutMap(mesh)
        layouts["blocks/stacked_.*"] = ("stage",)
        keras.distribution.set_distribution(
            keras.distribution.ModelParallel(layout_map=layouts, batch_dim_name="data")
        )
        with stages(PipelineConfig(microbatches=microbatches)):
            model = build()
        yield expected, model
    finally:
        keras.distribution.set_distribution(None)
        keras.backend.clear_session()


def test_the_fit_of_step_times_recovers_the_idle_share_of_a_known_schedule():
    from meshrun.pipeline.bubble import fit_bubble

    def step(m, stages=4, repeats=1, fixed=2.0, work=8.0, per_tick=0.5):  # a schedule of known costs
        return fixed + (repeats * m + stages - 1) * (work / (repeats * m) + per_tick)

    fit = fit_bubble(4, 1, {m: step(m) for m in (1, 2, 4, 8, 16)})
    assert (fit.fixed, fit.work, fit.per_tick) == (pytest.approx(2.0), pytest.approx(8.0), pytest.approx(0.5))
    assert fit.shares[4] == pytest.approx(
        3 * (8 / 4 + 0.5) / step(4)
    )  # below the formula's 3/7: the fixed cost is no wait
    circular = fit_bubble(4, 2, {m: step(m, repeats=2) for m in (4, 8, 16)})
    assert circular.shares[8] == pytest.approx(3 * (8 / 16 + 0.5) / step(8, repeats=2))
    assert fit_bubble(4, 1, {8: 1.0}) is None and fit_bubble(1, 1, {1: 1.0, 2: 1.0}) is None
