"""The numpy pipeline (meshrun.data.batches) reads exactly what tf.data would: the seeded shuffle
order of meshrun.data.order against tf.data's own shuffle, and whole pipelines (shares of global
batches, passes, sample weights, dict features, skipping to a step) against the tf.data pipeline
meshrun builds for the same elements. That is what keeps a run's losses where they were before
the synthetic and arrays sources stopped importing TensorFlow.
"""

import itertools

import numpy as np
import pytest

from meshrun.data import order, tf_data
from meshrun.data.batches import ArraySpec, Batches, element_batches, indexed_batches

SEEDS = [0, 1, 42, order.SEED_MODULUS, order.SEED_MODULUS + 3, 2**40 + 5]


def tf_shuffled(count: int, buffer: int, seed: int, passes: int) -> list[list[int]]:
    """0..count-1 through tf.data's shuffle, as meshrun's tf.data pipelines seed it, pass by pass."""
    tf = tf_data.seeded_tensorflow(seed)
    stream = tf_data.passes(
        lambda p: tf.data.Dataset.range(count).shuffle(
            buffer, seed=order.pass_seed(seed, p), reshuffle_each_iteration=False
        ),
        endless=True,
    )
    values = [int(v) for v in stream.take(count * passes).as_numpy_iterator()]
    return [values[p * count : (p + 1) * count] for p in range(passes)]


@pytest.mark.parametrize("seed", SEEDS)
def test_a_full_buffer_shuffle_is_tf_datas_permutation_in_every_pass(seed):
    expected = tf_shuffled(257, 257, seed, passes=3)
    got = [order.shuffled_indices(257, order.seed_pair(seed, p)).tolist() for p in range(3)]
    assert got == expected
    assert got[0] != got[1] and sorted(got[0]) == list(range(257))


@pytest.mark.parametrize(
    "seed, count, buffer",
    [(0, 100, 30), (7, 100, 1), (42, 50, 7), (order.SEED_MODULUS, 64, 64), (3, 10, 100)],
)
def test_a_buffer_shuffle_of_a_stream_is_tf_datas(seed, count, buffer):
    expected = tf_shuffled(count, buffer, seed, passes=2)
    got = [list(order.buffer_shuffled(range(count), buffer, order.seed_pair(seed, p))) for p in range(2)]
    assert got == expected


def test_the_seed_pairs_follow_tensorflows_truncation():
    assert order.seed_pair(5, 2) == (5, 5 * order.PASS_SEED_STRIDE + 2)
    assert order.seed_pair(order.SEED_MODULUS, 0) == (order.DEFAULT_GRAPH_SEED, 0)
    assert order.seed_pair(2**40, 1)[1] < order.SEED_MODULUS
    assert order.tensorflow_global_seed(0) is None and order.tensorflow_global_seed(9) == 9


def columns(count: int, weights: bool = False, named: bool = False):
    """Features whose every value is the row number (a dict of two inputs if `named`), int labels
    10 * row, and per-row weights row / 100."""
    rows = np.arange(count)
    x = np.broadcast_to(rows.reshape(-1, 1, 1).astype(np.float32), (count, 3, 2)).copy()
    if named:
        x = {"a": x, "b": rows.astype(np.int32)}
    return x, (rows * 10).astype(np.int64), ((rows / 100).astype(np.float32) if weights else None)


def tf_reference(x, y, w, batch_size: int, shuffle: bool, seed: int, share, endless: bool):
    """The same rows through meshrun's tf.data pipeline (each row an element, a full buffer)."""
    tf = tf_data.seeded_tensorflow(seed)
    elements = tf.data.Dataset.from_tensor_slices((x, y) if w is None else (x, y, w))
    return tf_data.element_batches(
        elements, batch_size, shuffle, seed, buffer=len(y), share=share, endless=endless
    )


def assert_same_batches(numpy_batches, tf_batches, count: int):
    got = list(itertools.islice(numpy_batches, count))
    expected = list(itertools.islice(tf_batches.as_numpy_iterator(), count))
    assert len(got) == len(expected) == count
    for ours, theirs in zip(got, expected, strict=True):
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs, strict=True):
            if isinstance(a, dict):
                assert sorted(a) == sorted(b)
                for name in a:
                    np.testing.assert_array_equal(a[name], b[name])
                    assert a[name].dtype == b[name].dtype
            else:
                np.testing.assert_array_equal(a, b)
                assert a.dtype == b.dtype


@pytest.mark.parametrize("seed", [0, 3])
@pytest.mark.parametrize("share", [(0, 1), (1, 2), (3, 4)])
@pytest.mark.parametrize("weights, named", [(False, False), (True, True)])
def test_indexed_batches_are_the_tf_data_pipelines_batches_over_passes(seed, share, weights, named):
    x, y, w = columns(70, weights, named)  # 70 rows, batches of 16: 4 a pass, 6 rows dropped
    ours = indexed_batches(
        x, y, np.arange(70), 16, shuffle=True, seed=seed, share=share, endless=True, weights=w
    )
    assert ours.per_pass == 4 and ours.num_batches is None
    assert_same_batches(ours, tf_reference(x, y, w, 16, True, seed, share, endless=True), count=4 * 3)


def test_an_evaluation_pass_is_in_row_order_and_ends():
    x, y, _ = columns(70)
    ours = indexed_batches(x, y, np.arange(70), 16, shuffle=False, seed=1, share=(1, 2))
    assert ours.num_batches == 4
    assert [b[1].tolist() for b in ours] == [[(16 * k + 8 + i) * 10 for i in range(8)] for k in range(4)]
    assert len(list(ours)) == 4, "a second iteration starts again"


@pytest.mark.parametrize("step", [0, 3, 4, 9, 13])
def test_skipping_to_a_step_reads_what_reading_through_reads(step):
    x, y, _ = columns(70)
    stream = indexed_batches(x, y, np.arange(70), 16, shuffle=True, seed=5, share=(0, 2), endless=True)
    through = list(itertools.islice(stream, step + 6))[step:]
    skipped = list(itertools.islice(stream.skip(step), 6))
    for a, b in zip(through, skipped, strict=True):
        np.testing.assert_array_equal(a[1], b[1])


def test_element_batches_skip_and_share_like_the_tf_pipeline():
    """A Python iterable's elements: every second one for process 1 of 2, shuffled in a buffer of
    10, batches of 4; the stream from step 5 on equals the tf.data pipeline's."""
    x, y = np.arange(60, dtype=np.float32), np.arange(60) * 10
    stream = element_batches(
        lambda: zip(x.tolist(), y.tolist(), strict=True),
        4,
        True,
        11,
        10,
        share=(1, 2),
        per_pass=7,
        first_element=(x[0].item(), y[0].item()),
        endless=True,
    )
    tf = tf_data.seeded_tensorflow(11)
    elements = tf.data.Dataset.from_tensor_slices((x, y.astype(np.int32))).shard(2, 1)
    reference = tf_data.element_batches(elements, 4, True, 11, 10, endless=True)
    assert stream.element_spec == (
        ArraySpec((None,), np.dtype(np.float32)),
        ArraySpec((None,), np.dtype(np.int32)),
    )
    assert_same_batches(stream.skip(5), reference.skip(5), count=12)


def test_a_mapped_stream_carries_its_new_spec():
    x, y, _ = columns(32)
    stream = indexed_batches(x, y, np.arange(32), 8, shuffle=False, seed=0)
    weighted = stream.map(
        lambda b: (*b, np.ones(len(b[1]), np.float32)),
        (*stream.element_spec, ArraySpec((None,), np.dtype(np.float32))),
    )
    assert len(weighted.element_spec) == 3 and len(next(iter(weighted))) == 3
    assert isinstance(weighted, Batches) and len(stream.element_spec) == 2


def test_keras_reads_batches_in_order_and_from_anywhere():
    from meshrun.run.feed import BatchesForKeras, keras_input

    x, y, _ = columns(48)
    stream = indexed_batches(x, y, np.arange(48), 8, shuffle=True, seed=2, endless=True)
    expected = [b[1].tolist() for b in itertools.islice(stream, 14)]
    feed = keras_input(stream, model=None)
    assert isinstance(feed, BatchesForKeras) and feed.num_batches is None
    assert [feed[i][1].tolist() for i in (0, 1, 2, 13, 7, 8, 0)] == [
        expected[i] for i in (0, 1, 2, 13, 7, 8, 0)
    ]
    evaluation = keras_input(indexed_batches(x, y, np.arange(48), 8, shuffle=False, seed=2), model=None)
    assert evaluation.num_batches == len(evaluation) == 6


def test_a_source_that_runs_short_of_its_declared_samples_says_so():
    from meshrun.run.feed import keras_input

    short = element_batches(
        lambda: iter([(1.0, 1)] * 10), 4, False, 0, 1, share=(0, 1), per_pass=5, first_element=(1.0, 1)
    )
    feed = keras_input(short, model=None)
    assert feed[1][0].tolist() == [1.0] * 4
    with pytest.raises(RuntimeError, match="the data ran out at batch 2"):
        feed[2]


def assert_equal_batches(got: list, expected: list):
    assert len(got) == len(expected)
    for ours, theirs in zip(got, expected, strict=True):
        for a, b in zip(ours, theirs, strict=True):
            for name in sorted(a) if isinstance(a, dict) else [None]:
                np.testing.assert_array_equal(a if name is None else a[name], b if name is None else b[name])


def test_a_keras_hub_task_gets_the_same_batches_as_a_grain_dataset():
    """KerasHub's fit takes tf.data or Grain datasets only: the stream goes as a Grain one, read
    in its order, its state the position (a restored iterator reads on from there), and as Keras
    reads it."""
    from keras.src.trainers.data_adapters import get_data_adapter

    from meshrun.run.grain_feed import BatchesDataset

    x, y, w = columns(80, weights=True, named=True)
    stream = indexed_batches(x, y, np.arange(80), 8, shuffle=True, seed=2, weights=w, endless=True)
    expected = list(itertools.islice(stream, 25))
    iterator = iter(BatchesDataset(stream))
    assert_equal_batches(list(itertools.islice(iterator, 7)), expected[:7])
    state = iterator.get_state()
    assert state == {"position": 7}
    restored = iter(BatchesDataset(stream))
    restored.set_state(state)
    assert_equal_batches(list(itertools.islice(restored, 18)), expected[7:])
    adapter = get_data_adapter(BatchesDataset(stream))
    assert_equal_batches(list(itertools.islice(adapter.get_jax_iterator(), 3)), expected[:3])


def test_a_finite_stream_as_a_grain_dataset_repeats_pass_after_pass():
    """Keras reads validation data from one iterator across a fit's validations, `steps` at a time."""
    from meshrun.run.grain_feed import BatchesDataset

    x, y, _ = columns(48)
    evaluation = indexed_batches(x, y, np.arange(48), 8, shuffle=False, seed=2)
    one_pass = list(evaluation)
    iterator = iter(BatchesDataset(evaluation))
    assert_equal_batches(list(itertools.islice(iterator, 15)), (one_pass * 3)[:15])
    iterator.set_state({"position": 8})
    assert_equal_batches([next(iterator)], [one_pass[2]])
    empty = indexed_batches(x[:4], y[:4], np.arange(4), 8, shuffle=False, seed=2)
    assert list(BatchesDataset(empty)) == []


def test_a_generator_dataset_is_found_at_any_depth_of_a_tf_data_pipeline():
    """What meshrun looks for before training a tf.data pipeline (TensorFlow's generator dataset sets
    glibc's mmap threshold for the whole process; meshrun.system.allocator)."""
    tf = tf_data.seeded_tensorflow(0)
    generated = tf.data.Dataset.from_generator(
        lambda: iter(range(4)), output_signature=tf.TensorSpec((), tf.int64)
    )
    sliced = tf.data.Dataset.from_tensor_slices(np.arange(4))
    assert tf_data.has_generator(generated.shuffle(4).batch(2).prefetch(1))
    assert tf_data.has_generator(tf.data.Dataset.range(3).interleave(lambda _: generated, cycle_length=2))
    assert not tf_data.has_generator(sliced.map(lambda v: v * 2).batch(2))
