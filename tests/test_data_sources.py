"""The data sources of the `data=` group on real files: .npy/.npz arrays (read row by row), TFRecord
shards (plain and GZIP) and the user's own `module:function` factories, trained end to end through
the real CLI in this process (Hydra overrides included) on 8 emulated CPU devices; the shared
pipeline reads the right rows; and every bad input is one line on stderr, exit status 2 and nothing
left in the working dir.

Data files live in their own temp dir, never in the (checked-empty) working dir. Models are tiny
(8x8x1 inputs, 32 hidden units) and runs take one epoch of a few steps.
"""

import itertools
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from conftest import train_here
from meshrun import cli
from meshrun.data import batches as batches_lib
from meshrun.data import tf_data

pytestmark = pytest.mark.integration

# A tiny classifier: the seeds' MLP on 8x8x1 inputs, 10 classes, trained on integer class indices.
MODEL = [
    "model=dense_model",
    "model.input_shape=[8,8,1]",
    "model.hidden=32",
    "model.dropout=0",
    "train.loss=sparse_categorical_crossentropy",
    "train.epochs=1",
    "train.verbose=0",
    "mesh=2x4",
]
# The feature spec as configs/data/tfrecord.yaml documents it (meshrun replaces the mapping).
FEATURES = "data.features={x:{dtype:float32,shape:[8,8,1]},y:{dtype:int64,shape:[]}}"
FACTORIES = "meshrun_test_data_factories"  # the module name of the factories written below


# --- writing real data files ------------------------------------------------------------------


def features(count: int, shape=(8, 8, 1), start: int = 0) -> np.ndarray:
    """Float32 rows whose every value is the row's number (start, start + 1, ...)."""
    rows = np.arange(start, start + count, dtype=np.float32)
    return np.broadcast_to(rows.reshape(-1, *[1] * len(shape)), (count, *shape)).copy()


def classes(count: int) -> np.ndarray:
    return (np.arange(count) % 10).astype(np.int64)


def write_npz(path: Path, count: int, compressed: bool = False, x=None, y=None) -> Path:
    save = np.savez_compressed if compressed else np.savez
    save(path, x=features(count) if x is None else x, y=classes(count) if y is None else y)
    return path


def example(values: dict) -> bytes:
    """A serialized tf.train.Example of name -> numpy array (float32 or int64)."""
    import tensorflow as tf

    feature = {}
    for name, value in values.items():
        flat = np.asarray(value).reshape(-1)
        if flat.dtype.kind == "f":
            feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=flat.tolist()))
        else:
            feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=flat.tolist()))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_tfrecords(
    folder: Path, prefix: str, shards: int, per_shard: int, compression=None, make=None
) -> list[Path]:
    """`shards` files `<prefix>-NNNNN.tfrecord` of `per_shard` records each: by default an 8x8x1
    float feature `x` and an int64 class `y`."""
    import tensorflow as tf

    make = make or (lambda i: {"x": features(1, start=i)[0], "y": np.int64(i % 10)})
    options = tf.io.TFRecordOptions(compression_type=compression) if compression else None
    paths = []
    for shard in range(shards):
        path = folder / f"{prefix}-{shard:05d}.tfrecord"
        with tf.io.TFRecordWriter(str(path), options=options) as writer:
            for i in range(per_shard):
                writer.write(example(make(shard * per_shard + i)))
        paths.append(path)
    return paths


FACTORIES_SOURCE = '''
"""Dataset factories for meshrun's data=python tests."""
import numpy as np
import tensorflow as tf


def _arrays(split, seed, n):
    rng = np.random.default_rng(seed + (split == "eval"))
    return rng.standard_normal((n, 8, 8, 1)).astype("float32"), (np.arange(n) % 10).astype("int64")


def dataset(split, seed, n=64):
    x, y = _arrays(split, seed, n)
    return tf.data.Dataset.from_tensor_slices((x, y))


def generator(split, seed, n=64):
    x, y = _arrays(split, seed, n)
    for i in range(n):
        yield x[i], y[i]


def grain_samples(split, seed, n=64, side=8, label_dtype="int64"):
    import grain

    x, y = _arrays(split, seed, n)
    x = np.resize(x, (n, side, side, 1))
    return grain.MapDataset.source([(x[i], y[i].astype(label_dtype)) for i in range(n)])


def number(split, seed):
    return 42


def broken(split, seed):
    raise RuntimeError("no data today")
'''


@pytest.fixture(scope="module")
def factory_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("factories")
    (folder / f"{FACTORIES}.py").write_text(textwrap.dedent(FACTORIES_SOURCE))
    return folder


@pytest.fixture
def factories(factory_dir, monkeypatch):
    """The factories module importable (its dir on sys.path); forgotten again afterwards."""
    monkeypatch.syspath_prepend(str(factory_dir))
    yield FACTORIES
    sys.modules.pop(FACTORIES, None)


@pytest.fixture
def data_dir(tmp_path_factory):
    """A fresh dir for data files, outside the working dir."""
    return tmp_path_factory.mktemp("data")


# --- running meshrun in this process ----------------------------------------------------------


def rejected(args: list[str], in_tmp: Path, capsys, model=MODEL) -> str:
    """Runs `meshrun train MODEL ARGS`, which must be rejected: exit 2, exactly one line
    `meshrun: error: ...` on stderr and no traceback, nothing left in the working dir. The line."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", *model, *args])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert exit_info.value.code == 2, err
    assert len(lines) == 1, err
    assert lines[0].startswith("meshrun: error: "), err
    assert "Traceback" not in err
    assert list(in_tmp.iterdir()) == [], "a rejected run left files behind"
    return lines[0]


# --- data=arrays ------------------------------------------------------------------------------


def test_uncompressed_npz_trains_read_by_rows(data_dir, in_tmp):
    path = write_npz(data_dir / "train.npz", 128)
    metrics = train_here([*MODEL, "data=arrays", f"data.path={path}"], in_tmp / "run")
    data = metrics["data"]
    assert data["source"] == "arrays" and data["read_by_rows"] is True
    assert (data["train_samples"], data["eval_samples"], data["eval_source"]) == (128, 128, "training data")
    assert metrics["train"]["steps_per_epoch"] == 8
    assert len(metrics["history"]["loss"]) == 1 and np.isfinite(metrics["eval"]["loss"])


def test_npy_with_labels_path_and_eval_path(data_dir, in_tmp):
    np.save(data_dir / "x.npy", features(96))
    np.save(data_dir / "y.npy", classes(96))
    np.save(data_dir / "eval_x.npy", features(48, start=1000))
    np.save(data_dir / "eval_y.npy", classes(48))
    args = [
        "data=arrays",
        f"data.path={data_dir / 'x.npy'}",
        f"data.labels_path={data_dir / 'y.npy'}",
        f"data.eval_path={data_dir / 'eval_x.npy'}",
        f"data.eval_labels_path={data_dir / 'eval_y.npy'}",
    ]
    data = train_here([*MODEL, *args], in_tmp / "run")["data"]
    assert data["read_by_rows"] is True
    assert (data["train_samples"], data["eval_samples"]) == (96, 48)
    assert data["eval_source"] == str(data_dir / "eval_x.npy")


def test_npz_eval_path(data_dir, in_tmp):
    train_file = write_npz(data_dir / "train.npz", 64)
    eval_file = write_npz(data_dir / "eval.npz", 32)
    data = train_here(
        [*MODEL, "data=arrays", f"data.path={train_file}", f"data.eval_path={eval_file}"], in_tmp / "run"
    )["data"]
    assert (data["train_samples"], data["eval_samples"]) == (64, 32)


def test_validation_split_holds_out_the_last_rows(data_dir, in_tmp):
    path = write_npz(data_dir / "all.npz", 160)
    metrics = train_here(
        [*MODEL, "data=arrays", f"data.path={path}", "data.validation_split=0.2"], in_tmp / "run"
    )
    assert (metrics["data"]["train_samples"], metrics["data"]["eval_samples"]) == (128, 32)
    assert metrics["train"]["steps_per_epoch"] == 8
    assert "last 20%" in metrics["data"]["eval_source"]


def test_compressed_npz_still_trains(data_dir, in_tmp):
    path = write_npz(data_dir / "small.npz", 64, compressed=True)
    data = train_here([*MODEL, "data=arrays", f"data.path={path}"], in_tmp / "run")["data"]
    assert data["read_by_rows"] is False
    assert data["train_samples"] == 64


def test_arrays_are_read_row_by_row_where_they_lie(data_dir):
    """.npy files and stored .npz members are read in place, any rows in any order; compressed
    members and Fortran-ordered arrays are read whole."""
    from meshrun.data.arrays import FileRows, open_array

    x = features(40) + np.arange(64, dtype=np.float32).reshape(1, 8, 8, 1)  # every value distinct
    y = np.arange(40, dtype=np.int32) * 3
    np.savez(data_dir / "d.npz", x=x, y=y)
    np.save(data_dir / "x.npy", x)
    np.savez_compressed(data_dir / "c.npz", x=x, y=y)
    np.save(data_dir / "f.npy", np.asfortranarray(x))
    in_place = [
        (open_array(str(data_dir / "d.npz"), "data.path", "x", "data.features_key"), x),
        (open_array(str(data_dir / "d.npz"), "data.path", "y", "data.labels_key"), y),
        (open_array(str(data_dir / "x.npy"), "data.path"), x),
    ]
    rows = np.array([0, 1, 2, 7, 9, 10, 11, 39])  # runs and single rows, first and last
    for array, expected in in_place:
        assert isinstance(array, FileRows) and len(array) == 40 and array.shape == expected.shape
        np.testing.assert_array_equal(array[rows], expected[rows])
        np.testing.assert_array_equal(array[5:12], expected[5:12])
        np.testing.assert_array_equal(array[np.arange(40)], expected)
    for path in ("c.npz", "f.npy"):
        whole = open_array(str(data_dir / path), "data.path", "x", "data.features_key")
        assert isinstance(whole, np.ndarray), path
        np.testing.assert_array_equal(whole, x)


def element_pipeline(kind: str, share: tuple[int, int] = (0, 1)):
    """Batches of 8 of the elements (i, 10 i), i < 100, shuffled in a buffer of all of them, by the
    numpy pipeline (a Python iterable's) or the tf.data one (a tf.data.Dataset's)."""
    x, y = np.arange(100), np.arange(100) * 10
    if kind == "tf":
        import tensorflow as tf

        elements = tf.data.Dataset.from_tensor_slices((x, y))
        return tf_data.element_batches(elements, 8, shuffle=True, seed=4, buffer=100, share=share)
    return batches_lib.element_batches(
        lambda: zip(x, y, strict=True),
        8,
        shuffle=True,
        seed=4,
        buffer=100,
        share=(0, 1),
        per_pass=12,
        first_element=(x[0], y[0]),
    )


@pytest.mark.parametrize("count", [1, 2, 4])
def test_shares_of_every_batch_side_by_side_are_the_one_process_batches(count):
    whole = collect(element_pipeline("tf"))
    shares = [collect(element_pipeline("tf", share=(i, count))) for i in range(count)]
    assert len(whole) == 12 and all(len(s) == 12 for s in shares)
    for k, (bx, by) in enumerate(whole):
        assert all(s[k][0].shape == (8 // count,) for s in shares)
        np.testing.assert_array_equal(np.concatenate([s[k][0] for s in shares]), bx)
        np.testing.assert_array_equal(np.concatenate([s[k][1] for s in shares]), by)


def test_an_iterable_and_a_tf_dataset_of_the_same_elements_make_the_same_batches():
    numpy_batches, tf_batches = collect(element_pipeline("numpy")), collect(element_pipeline("tf"))
    assert len(numpy_batches) == len(tf_batches) == 12
    for (nx, ny), (tx, ty) in zip(numpy_batches, tf_batches, strict=True):
        np.testing.assert_array_equal(nx, tx)
        np.testing.assert_array_equal(ny, ty)
        assert nx.dtype == tx.dtype


def collect(dataset) -> list:
    """Every batch of a numpy or tf.data pipeline, as numpy arrays."""
    return list(dataset) if isinstance(dataset, batches_lib.Batches) else list(dataset.as_numpy_iterator())


@pytest.mark.parametrize("shuffle", [False, True])
def test_indexed_batches_pair_each_row_with_its_label(data_dir, shuffle):
    count = 100
    path = data_dir / "rows.npz"
    np.savez(path, x=features(count, shape=(3, 2)), y=np.arange(count, dtype=np.int64))
    from meshrun.data.arrays import open_array

    x = open_array(str(path), "data.path", "x", "data.features_key")
    y = open_array(str(path), "data.path", "y", "data.labels_key")
    indices = np.arange(count)[7:95:2]  # 44 rows, not from the start, not contiguous
    batches = collect(batches_lib.indexed_batches(x, y, indices, batch_size=8, shuffle=shuffle, seed=3))
    assert len(batches) == len(indices) // 8
    seen = []
    for bx, by in batches:
        assert bx.shape == (8, 3, 2) and bx.dtype == np.float32 and by.dtype == np.int64
        np.testing.assert_array_equal(bx, features(8, shape=(3, 2)) * 0 + by.reshape(-1, 1, 1))
        seen += by.tolist()
    assert len(set(seen)) == len(seen) and set(seen) <= set(indices.tolist())
    assert len(seen) == 8 * (len(indices) // 8)
    if not shuffle:
        assert seen == indices[: len(seen)].tolist()


def test_indexed_batches_of_a_dict_of_features():
    count = 32
    x = {"a": np.arange(count, dtype=np.int32), "b": np.arange(count, dtype=np.float32) * 2}
    y = np.arange(count, dtype=np.int64)
    batches = collect(batches_lib.indexed_batches(x, y, np.arange(count), batch_size=4, shuffle=True, seed=0))
    assert len(batches) == 8
    for bx, by in batches:
        np.testing.assert_array_equal(bx["a"], by)
        np.testing.assert_array_equal(bx["b"], by * 2)


def test_arrays_shares_of_two_processes_make_the_one_process_batches(data_dir):
    """The pipelines of `load` itself: two processes each read their half of every global batch
    (reshuffled each pass, rows paired with their labels), and side by side the halves are the
    one-process batches."""
    from meshrun.data import DataContext, make_datasets
    from meshrun.data.arrays import ArraysOptions
    from meshrun.models import get_model

    count = 64
    np.savez(data_dir / "p.npz", x=features(count), y=np.arange(count, dtype=np.int64))
    options = ArraysOptions(path=str(data_dir / "p.npz"), validation_split=0.25)

    def labels(shard_index: int, shard_count: int) -> tuple[list, list]:
        context = DataContext(
            get_model("dense_model"),
            None,
            batch_size=16,
            seed=5,
            shard_index=shard_index,
            shard_count=shard_count,
        )
        datasets = make_datasets("arrays", options, context)
        assert datasets.steps_per_epoch == 3 and datasets.info["train_samples"] == 48
        train = []
        for bx, by in itertools.islice(datasets.train, 2 * 3):  # two passes over 48 rows
            assert bx.shape == (16 // shard_count, 8, 8, 1)
            np.testing.assert_array_equal(bx[:, 0, 0, 0], by)
            train.append(by)
        return train, [by for _, by in datasets.eval]

    (whole, whole_eval), (first, first_eval), (second, second_eval) = labels(0, 1), labels(0, 2), labels(1, 2)
    for k in range(6):
        np.testing.assert_array_equal(np.concatenate([first[k], second[k]]), whole[k])
    assert (
        sorted(np.concatenate(whole[:3]).tolist())
        == sorted(np.concatenate(whole[3:]).tolist())
        == list(range(48))
    )
    assert np.concatenate(whole[:3]).tolist() != np.concatenate(whole[3:]).tolist(), "not reshuffled"
    assert first_eval[0].tolist() == list(range(48, 56)) and second_eval[0].tolist() == list(range(56, 64))
    np.testing.assert_array_equal(np.concatenate(whole_eval), np.arange(48, 64))


# --- data=tfrecord ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tfrecord_run_with_eval_files(tmp_path_factory) -> tuple[dict, str]:
    """One run on 3 TFRecord shards with eval files of their own, read by the tests below: its
    metrics and the eval_files pattern it was given."""
    data_dir, work = tmp_path_factory.mktemp("data"), tmp_path_factory.mktemp("work")
    write_tfrecords(data_dir, "train", shards=3, per_shard=48)
    write_tfrecords(data_dir, "eval", shards=1, per_shard=40)
    pattern = f"{data_dir}/eval-*.tfrecord"
    args = [
        "data=tfrecord",
        f"data.files={data_dir}/train-*.tfrecord",
        f"data.eval_files={pattern}",
        FEATURES,
    ]
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(work)
        return train_here([*MODEL, *args], work / "run"), pattern


def test_tfrecord_shards_train_with_eval_files(tfrecord_run_with_eval_files):
    metrics, _ = tfrecord_run_with_eval_files
    data = metrics["data"]
    assert (data["train_samples"], data["eval_samples"]) == (144, 40)
    assert (data["train_file_count"], data["eval_file_count"]) == (3, 1)
    assert metrics["train"]["steps_per_epoch"] == 9
    assert np.isfinite(metrics["eval"]["loss"])


@pytest.mark.parametrize("source", ["synthetic", "tfrecord"])
def test_a_run_seeded_0_trains_with_either_pipeline(source, data_dir, in_tmp):
    """Seed 0 (0 modulo 2**31-1) is one TensorFlow cannot key a per-pass shuffle with: both
    pipelines fall back to its default graph seed, and both reshuffle each pass."""
    if source == "tfrecord":
        write_tfrecords(data_dir, "train", shards=1, per_shard=48)
        args = ["data=tfrecord", f"data.files={data_dir}/train-*.tfrecord", FEATURES]
    else:
        args = ["data=synthetic", "data.num_samples=48", "data.eval_samples=16", "train.loss=mse"]
    metrics = train_here([*MODEL, *args, "train.seed=0", "train.epochs=2"], in_tmp / "run")
    assert len(metrics["history"]["loss"]) == 2 and np.isfinite(metrics["eval"]["loss"])


def test_tfrecord_metrics_keep_the_eval_files_setting(tfrecord_run_with_eval_files):
    metrics, pattern = tfrecord_run_with_eval_files
    assert metrics["data"]["eval_files"] == pattern


def test_tfrecord_feature_spec_by_keys(data_dir, in_tmp):
    """The spec may also be given feature by feature."""
    write_tfrecords(data_dir, "train", shards=2, per_shard=16)
    args = [
        "data=tfrecord",
        f"data.files={data_dir}/train-*.tfrecord",
        "+data.features.x={dtype:float32,shape:[8,8,1]}",
        "+data.features.y={dtype:int64,shape:[]}",
    ]
    assert train_here([*MODEL, *args], in_tmp / "run")["data"]["train_samples"] == 32


def test_tfrecord_gzip(data_dir, in_tmp):
    write_tfrecords(data_dir, "train", shards=2, per_shard=32, compression="GZIP")
    args = ["data=tfrecord", f"data.files={data_dir}/train-*.tfrecord", FEATURES, "data.compression=GZIP"]
    data = train_here([*MODEL, *args], in_tmp / "run")["data"]
    assert data["train_samples"] == 64 and data["compression"] == "GZIP"


def test_tfrecord_features_appended_with_plus(data_dir, in_tmp):
    """`+data.features={...}` (Hydra's append onto the empty default) works as well."""
    write_tfrecords(data_dir, "train", shards=1, per_shard=16)
    args = ["data=tfrecord", f"data.files={data_dir}/train-*.tfrecord", "+" + FEATURES]
    assert train_here([*MODEL, *args], in_tmp / "run")["data"]["train_samples"] == 16


# --- data=python ------------------------------------------------------------------------------


def test_python_factory_returning_a_dataset_gets_its_kwargs(factories, in_tmp):
    metrics = train_here(
        [*MODEL, "data=python", f"data.factory={factories}:dataset", "+data.kwargs.n=48"], in_tmp / "run"
    )
    data = metrics["data"]
    assert (data["train_samples"], data["eval_samples"]) == (48, 48)  # n=48 reached both splits
    assert data["kwargs"] == {"n": 48} and data["factory"] == f"{factories}:dataset"
    assert metrics["train"]["steps_per_epoch"] == 3


def test_python_kwargs_as_a_mapping(factories, in_tmp):
    data = train_here(
        [*MODEL, "data=python", f"data.factory={factories}:dataset", "data.kwargs={n:32}"], in_tmp / "run"
    )["data"]
    assert data["kwargs"] == {"n": 32} and data["train_samples"] == 32


def test_python_factory_returning_a_generator(factories, in_tmp):
    """A generator can be read once: every pass (two epochs here) calls the factory again."""
    args = [
        "data=python",
        f"data.factory={factories}:generator",
        "data.num_samples=64",
        "data.eval_samples=32",
        "train.epochs=2",
    ]
    metrics = train_here([*MODEL, *args], in_tmp / "run")
    assert (metrics["data"]["train_samples"], metrics["data"]["eval_samples"]) == (64, 32)
    assert len(metrics["history"]["loss"]) == 2 and metrics["timing"]["steady_steps"] == 6


def test_python_factory_returning_a_grain_dataset(factories, in_tmp):
    """A Grain MapDataset of samples knows its size; it is read as an iterable (the PyDataset feeds
    this model)."""
    metrics = train_here(
        [*MODEL, "data=python", f"data.factory={factories}:grain_samples", "+data.kwargs.n=48"],
        in_tmp / "run",
    )
    assert (metrics["data"]["train_samples"], metrics["data"]["eval_samples"]) == (48, 48)
    assert metrics["data"]["loader"] == "pydataset" and metrics["data"]["allocator_restored"] is False


def test_python_generator_pipeline_knows_its_elements(factories):
    """What the source makes of a generator before training: the declared sizes and the samples,
    made again for each pass."""
    from meshrun.data.python_source import PythonOptions, make_split
    from meshrun.data.registry import DataContext

    context = DataContext(model=None, model_options=None, batch_size=16, seed=1)
    options = PythonOptions(factory=f"{factories}:generator", num_samples=64, kwargs={"n": 20})
    made = make_split(options, "train", context, options.num_samples)
    assert made.count == 64 and made.dataset is None
    samples = list(made.make())
    assert len(samples) == 20 and samples[0][0].shape == (8, 8, 1) and made.first[0].shape == (8, 8, 1)
    assert [int(y) for _, y in samples] == [i % 10 for i in range(20)]
    assert [int(y) for _, y in made.make()] == [int(y) for _, y in samples]


# --- bad inputs -------------------------------------------------------------------------------


def npz_args(folder: Path, count: int = 64, **arrays) -> list[str]:
    path = write_npz(folder / "bad.npz", count, **arrays)
    return ["data=arrays", f"data.path={path}"]


def tfrecord_args(folder: Path, count: int = 32, make=None, spec=FEATURES, raw_bytes=None) -> list[str]:
    if raw_bytes is not None:
        write_tfrecords(folder, "train", shards=1, per_shard=count, make=make)
        (folder / "train-00001.tfrecord").write_bytes(raw_bytes)
    else:
        write_tfrecords(folder, "train", shards=2, per_shard=count // 2, make=make)
    return ["data=tfrecord", f"data.files={folder}/train-*.tfrecord", spec]


def ids_record(i: int) -> dict:
    """A two_tower record whose ids were written as floats."""
    return {"user_id": np.float32(i), "item_id": np.float32(i + 1), "label": np.float32([i % 2])}


TWO_TOWER = ["model=two_tower", "mesh=2x4", "train.epochs=1", "train.verbose=0"]
IDS_SPEC = (
    "data.features={user_id:{dtype:float32,shape:[]},item_id:{dtype:float32,shape:[]},"
    "label:{dtype:float32,shape:[1]}}"
)
RANDOM_BYTES = np.random.default_rng(0).bytes(4096)

# name -> (args from a data dir and the factories' module name, fragments of the one error line[, model args])
BAD = {
    "missing file": (
        lambda d, f: ["data=arrays", f"data.path={d}/nothing.npz"],
        ["meshrun: error: data.path: got", "nothing.npz", "which is not a file"],
    ),
    "missing eval file": (
        lambda d, f: [*npz_args(d), f"data.eval_path={d}/none.npz"],
        ["data.eval_path: got", "none.npz", "not a file"],
    ),
    "not a numpy file": (
        lambda d, f: (
            (d / "text.npy").write_text("hello"),
            ["data=arrays", f"data.path={d}/text.npy", f"data.labels_path={d}/text.npy"],
        )[1],
        ["data.path: cannot read", "text.npy", "as a numpy file"],
    ),
    "features in a file that is neither .npz nor .npy": (
        lambda d, f: (
            np.save(d / "x.npy", features(64)),
            np.save(d / "y.npy", classes(64)),
            (d / "x.npy").rename(d / "x.dat"),
            ["data=arrays", f"data.path={d}/x.dat", f"data.labels_path={d}/y.npy"],
        )[-1],
        ["data.path: got", "x.dat'; data=arrays reads .npz files (np.savez) or a .npy of features (np.save)"],
    ),
    "labels in a .npz": (
        lambda d, f: (
            np.save(d / "x.npy", features(64)),
            ["data=arrays", f"data.path={d}/x.npy", f"data.labels_path={npz_args(d)[1][10:]}"],
        )[1],
        ["data.labels_path: got", "bad.npz'; expected a .npy file of labels"],
    ),
    "npz key not present": (
        lambda d, f: [*npz_args(d), "data.features_key=images"],
        ["data.features_key: got 'images'", "bad.npz", "keys present: x or y"],
    ),
    "npz labels key not present": (
        lambda d, f: [*npz_args(d), "data.labels_key=labels"],
        ["data.labels_key: got 'labels'", "keys present: x or y"],
    ),
    "npy without labels_path": (
        lambda d, f: (np.save(d / "x.npy", features(64)), ["data=arrays", f"data.path={d}/x.npy"])[1],
        ["data.labels_path: is required with a .npy file", "x.npy", "holds the features only"],
    ),
    "features and labels of different lengths": (
        lambda d, f: npz_args(d, y=classes(60)),
        ["data.path:", "has 64 rows of features but 60 labels"],
    ),
    "feature shape does not fit the model": (
        lambda d, f: npz_args(d, x=features(64, shape=(28, 28, 1))),
        [
            "data: features of shape (28, 28, 1) do not fit the model's input of shape (8, 8, 1); "
            "set model.input_shape=[28,28,1] to build the model for this data"
        ],
    ),
    "int features into dense_model": (
        lambda d, f: npz_args(d, x=features(64).astype(np.int32)),
        ["data: features of dtype int32 do not fit the model's input of dtype float32"],
    ),
    "float ids into two_tower": (
        lambda d, f: [
            *tfrecord_args(d, make=ids_record, spec=IDS_SPEC),
            "data.inputs=[user_id,item_id]",
            "data.label=label",
        ],
        ["data: features of dtype float32 do not fit the model's input", "of dtype int32"],
        TWO_TOWER,
    ),
    "one-hot labels under a sparse loss": (
        lambda d, f: npz_args(d, y=np.eye(10, dtype=np.float32)[classes(64)]),
        [
            "data: labels of shape (10) do not fit the loss sparse_categorical_crossentropy",
            "output of shape (10)",
            "expects labels of shape () (class indices); for "
            "one-hot labels set train.loss=categorical_crossentropy",
        ],
    ),
    "class labels under the default mse loss": (
        lambda d, f: [*npz_args(d), "train.loss=mean_squared_error"],
        [
            "data: labels of shape () do not fit the loss mean_squared_error",
            "; for integer class labels set train.loss=sparse_categorical_crossentropy",
        ],
    ),
    "int labels of the wrong shape": (
        lambda d, f: npz_args(d, y=np.zeros((64, 3), dtype=np.int64)),
        ["data: labels of shape (3) do not fit the loss sparse_categorical_crossentropy"],
    ),
    "float class labels under a sparse loss": (
        lambda d, f: npz_args(d, y=classes(64).astype(np.float32)),
        [
            "data: labels of dtype float32 do not fit the loss sparse_categorical_crossentropy",
            "integer class indices",
        ],
    ),
    "class labels under a dense loss": (
        lambda d, f: [*npz_args(d), "train.loss=categorical_crossentropy"],
        [
            "data: labels of shape () do not fit the loss categorical_crossentropy",
            "expects labels of shape (10); for integer class "
            "labels set train.loss=sparse_categorical_crossentropy",
        ],
    ),
    "arrays fewer samples than one global batch": (
        lambda d, f: npz_args(d, count=8),
        ["data.path:", "bad.npz", "holds 8 samples, fewer than one global batch (train.batch_size=16)"],
    ),
    "validation split smaller than one global batch": (
        lambda d, f: [*npz_args(d, count=64), "data.validation_split=0.1"],
        ["data.validation_split: the evaluation data", "holds 6 samples, fewer than one global batch"],
    ),
    "validation split out of range": (
        lambda d, f: [*npz_args(d), "data.validation_split=1.5"],
        ["data.validation_split: got 1.5", "0 <= validation_split < 1"],
    ),
    "tfrecord fewer samples than one global batch": (
        lambda d, f: tfrecord_args(d, count=10),
        [
            "data.files:",
            "train-*.tfrecord",
            "holds 10 samples, fewer than one global batch (train.batch_size=16)",
        ],
    ),
    "empty glob": (
        lambda d, f: ["data=tfrecord", f"data.files={d}/nothing-*.tfrecord", FEATURES],
        ["data.files: got", "nothing-*.tfrecord", "which matches no file"],
    ),
    "empty eval glob": (
        lambda d, f: [*tfrecord_args(d), f"data.eval_files={d}/none-*.tfrecord"],
        ["data.eval_files: got", "none-*.tfrecord", "matches no file"],
    ),
    "corrupt tfrecord": (
        lambda d, f: tfrecord_args(d, raw_bytes=RANDOM_BYTES),
        ["data.files:", "train-00001.tfrecord", "is corrupt or not a TFRecord file"],
    ),
    "truncated tfrecord": (
        lambda d, f: (
            write_tfrecords(d, "train", 1, 32),
            _truncate(d / "train-00000.tfrecord"),
            ["data=tfrecord", f"data.files={d}/train-*.tfrecord", FEATURES],
        )[-1],
        ["data.files:", "train-00000.tfrecord", "is corrupt or not a TFRecord file"],
    ),
    "plain tfrecord read as GZIP": (
        lambda d, f: [*tfrecord_args(d), "data.compression=GZIP"],
        ["data.files:", "is corrupt or not a TFRecord file"],
    ),
    "feature spec of the wrong shape": (
        lambda d, f: tfrecord_args(
            d, spec="data.features={x:{dtype:float32,shape:[4,4,1]},y:{dtype:int64,shape:[]}}"
        ),
        ["data.features: does not parse the records of", "train-00000.tfrecord"],
    ),
    "feature spec of the wrong dtype": (
        lambda d, f: tfrecord_args(
            d, spec="data.features={x:{dtype:int64,shape:[8,8,1]},y:{dtype:int64,shape:[]}}"
        ),
        ["data.features: does not parse the records of"],
    ),
    "feature spec naming a missing feature": (
        lambda d, f: (
            tfrecord_args(
                d, spec="data.features={x:{dtype:float32,shape:[8,8,1]},label:{dtype:int64,shape:[]}}"
            )
            + ["data.label=label"]
        ),
        ["data.features: does not parse the records of"],
    ),
    "feature spec without a dtype": (
        lambda d, f: tfrecord_args(d, spec="data.features={x:{shape:[8,8,1]},y:{dtype:int64,shape:[]}}"),
        ["data.features.x: got", "expected {dtype: float32 | int64 | string, shape: [..]}"],
    ),
    "label not in the spec": (
        lambda d, f: [*tfrecord_args(d), "data.label=target"],
        ["data.label: got 'target', which is not in data.features (x or y)"],
    ),
    "unknown compression": (
        lambda d, f: [*tfrecord_args(d), "data.compression=zip"],
        ["data.compression: got 'zip'", "GZIP or ZLIB"],
    ),
    "factory that does not import": (
        lambda d, f: ["data=python", "data.factory=meshrun_no_such_module:make"],
        [
            "data.factory: got 'meshrun_no_such_module:make': no "
            "module 'meshrun_no_such_module' in the working dir",
            "PYTHONPATH",
        ],
    ),
    "factory naming a missing function": (
        lambda d, f: ["data=python", f"data.factory={f}:nope"],
        [f"data.factory: got '{FACTORIES}:nope': module '{FACTORIES}' has no function 'nope'"],
    ),
    "factory without a colon": (
        lambda d, f: ["data=python", f"data.factory={f}.dataset"],
        ["data.factory: got", "expected module:function"],
    ),
    "factory returning no dataset": (
        lambda d, f: [
            "data=python",
            f"data.factory={f}:number",
            "data.num_samples=64",
            "data.eval_samples=32",
        ],
        [
            "data.factory:",
            f"{FACTORIES}:number(split='train') returned int, not a tf.data.Dataset or an iterable",
        ],
    ),
    "grain source of the wrong shape": (
        lambda d, f: ["data=python", f"data.factory={f}:grain_samples", "+data.kwargs.side=7"],
        ["data: features of shape (7, 7, 1) do not fit the model's input of shape (8, 8, 1)"],
    ),
    "grain source of the wrong dtype": (
        lambda d, f: ["data=python", f"data.factory={f}:grain_samples", "+data.kwargs.label_dtype=float32"],
        [
            "data: labels of dtype float32 do not fit the loss "
            "sparse_categorical_crossentropy: it expects integer class indices"
        ],
    ),
    "factory that raises": (
        lambda d, f: ["data=python", f"data.factory={f}:broken"],
        ["data.factory:", "broken(split='train') raised RuntimeError: no data today"],
    ),
    "generator without either size": (
        lambda d, f: ["data=python", f"data.factory={f}:generator"],
        [
            "data.num_samples, data.eval_samples: are required: the train and eval datasets from",
            "do not know their size; set both",
            "(data.num_samples=N data.eval_samples=M), or return a list",
        ],
    ),
    "generator without num_samples": (
        lambda d, f: ["data=python", f"data.factory={f}:generator", "data.eval_samples=32"],
        [
            "data.num_samples: is required: the train dataset from",
            "does not know its size; set data.num_samples=N",
            "or return a list",
        ],
    ),
    "generator without eval_samples": (
        lambda d, f: ["data=python", f"data.factory={f}:generator", "data.num_samples=64"],
        ["data.eval_samples: is required: the eval dataset from", "set data.eval_samples=N"],
    ),
    "python fewer samples than one global batch": (
        lambda d, f: ["data=python", f"data.factory={f}:dataset", "+data.kwargs.n=8"],
        ["data.num_samples: the train dataset from", "holds 8 samples, fewer than one global batch"],
    ),
    "unknown factory kwarg": (
        lambda d, f: ["data=python", f"data.factory={f}:dataset", "+data.kwargs.rows=8"],
        ["data.kwargs: got 'rows', which", "does not take; it takes: n"],
    ),
    "missing data.path": (lambda d, f: ["data=arrays"], ["data.path: is required for data=arrays"]),
    "missing data.files": (
        lambda d, f: ["data=tfrecord", FEATURES],
        ["data.files: is required for data=tfrecord"],
    ),
    "missing data.features": (
        lambda d, f: ["data=tfrecord", f"data.files={d}/x-*.tfrecord"],
        ["data.features: is required"],
    ),
    "missing data.factory": (
        lambda d, f: ["data=python"],
        ["data.factory: got None; expected module:function"],
    ),
    "unknown data.name": (
        lambda d, f: ["data.name=nope"],
        ["data.name: got 'nope'; available data sources: arrays, python, synthetic, text or tfrecord"],
    ),
    "unknown data option": (
        lambda d, f: ["data=nope"],
        ["data: unknown option 'nope'", "arrays", "python", "tfrecord"],
    ),
    "key of another source": (
        lambda d, f: ["data=arrays", f"data.path={d}/x.npz", "+data.files=x"],
        ["data.files: unknown key", "data.path"],
    ),
}


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_data_is_one_line_with_exit_2(name, data_dir, factories, in_tmp, capsys):
    make_args, expected, *model = BAD[name]
    line = rejected(make_args(data_dir, factories), in_tmp, capsys, model=model[0] if model else MODEL)
    for fragment in expected:
        assert fragment in line, f"{fragment!r} not in {line!r}"


def test_string_features_into_a_float_input_are_a_config_error(data_dir, in_tmp, capsys):
    import tensorflow as tf

    with tf.io.TFRecordWriter(str(data_dir / "train-00000.tfrecord")) as writer:
        for i in range(32):
            feature = {
                "x": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"a"] * 64)),
                "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 10])),
            }
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    spec = "data.features={x:{dtype:string,shape:[8,8,1]},y:{dtype:int64,shape:[]}}"
    line = rejected(["data=tfrecord", f"data.files={data_dir}/train-*.tfrecord", spec], in_tmp, capsys)
    assert "data: features of dtype string do not fit" in line


def test_the_fit_check_takes_sizes_a_model_leaves_open_as_any_size():
    """A model input of shape (None,) (a KerasHub backbone's sequence) fits data of any length; a
    fixed size still has to match; labels and sample weights are checked against the output."""
    import tensorflow as tf

    from meshrun.data.pipeline import check_fits_model
    from meshrun.errors import ConfigError
    from meshrun.models.registry import InputSpec
    from meshrun.run.build import Signature

    open_length = Signature(
        inputs=(InputSpec("token_ids", (None,), "int32"), InputSpec("padding_mask", (None,), "int32")),
        outputs=(InputSpec(None, (None, 512)),),
    )
    ints = tf.TensorSpec((8, 32), tf.int32)
    check_fits_model(
        ({"token_ids": ints, "padding_mask": ints}, ints, tf.TensorSpec((8, 32), tf.float32)),
        open_length,
        "sparse_categorical_crossentropy",
    )
    with pytest.raises(
        ConfigError, match=r"sample weights of shape \(31\) do not fit labels of shape \(32\)"
    ):
        check_fits_model(
            ({"token_ids": ints, "padding_mask": ints}, ints, tf.TensorSpec((8, 31), tf.float32)),
            open_length,
            "sparse_categorical_crossentropy",
        )
    fixed = Signature(inputs=(InputSpec(None, (16,), "float32"),), outputs=(InputSpec(None, (4,)),))
    with pytest.raises(
        ConfigError, match=r"features of shape \(15\) do not fit the model's input of shape \(16\)"
    ):
        check_fits_model(
            (tf.TensorSpec((8, 15), tf.float32), tf.TensorSpec((8,), tf.int32)),
            fixed,
            "sparse_categorical_crossentropy",
        )
    with pytest.raises(
        ConfigError,
        match=r"the data's features \(\['x'\]\) do not fit the model's inputs \(one unnamed tensor\)",
    ):
        check_fits_model(
            ({"x": tf.TensorSpec((8, 16), tf.float32)}, tf.TensorSpec((8,), tf.int32)),
            fixed,
            "sparse_categorical_crossentropy",
        )
