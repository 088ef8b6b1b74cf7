"""Training steps do not fault their buffers in afresh (meshrun.system.allocator, meshrun.run.feed): a
KerasHub Llama fed through Grain on one device and on 2x4 emulated devices, the zoo transformer fed
by the user's tf.data pipeline built from a generator (whose first iterator sets glibc's mmap
threshold for the whole process), and an own model each take fewer than 100 minor page faults per
steady step after the first 50 steps. Page faults, not a clock: a shared machine's load does not
move them. Before meshrun fed KerasHub through Grain and held its allocator policy, these steps
took about 2,900 (Llama, one device), 9,400 (Llama, 2x4) and 16,800 (generator) faults.

Every run is a fresh `meshrun train` process, since the allocator's policy is the process's."""

import textwrap

import pytest

from conftest import read_metrics, run_meshrun

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

MAX_FAULTS_PER_STEP = 100
LLAMA = [
    "model=keras_hub",
    "model.task=LlamaCausalLM",
    "model.seq_len=32",
    "model.backbone={vocabulary_size:512,num_layers:2,num_query_heads:8,num_key_value_heads:4,hidden_dim:64,intermediate_dim:128}",
]
# 110 steps of 8 sequences: the median of the 59 steady steps after the first 50 is counted (a run of
# fewer than 101 steps would count the second half of its steps instead, after a shorter warm-up).
LLAMA_RUN = [*LLAMA, "train.batch_size=8", "data.num_samples=880", "data.eval_samples=64", "train.epochs=1"]

DATA_MODULE = "meshrun_test_generator_data"
DATA_SOURCE = '''
"""Token sequences (t_i = start + i * stride mod vocab) as a tf.data pipeline built from a generator."""
import numpy as np
import tensorflow as tf


def sequences(split, seed, samples=1024, seq_len=64, vocab=256):
    rng = np.random.default_rng(seed + (split == "eval"))
    start, stride = rng.integers(0, vocab, size=(samples, 1)), rng.integers(1, 8, size=(samples, 1))
    rows = ((start + stride * np.arange(seq_len + 1)) % vocab).astype(np.int32)

    def each():
        for row in rows:
            yield row[:-1], row[1:]

    spec = tf.TensorSpec((seq_len,), tf.int32)
    return tf.data.Dataset.from_generator(each, output_signature=(spec, spec))
'''

MODEL_MODULE = "meshrun_test_own_model"
MODEL_SOURCE = """
import keras


def wide_mlp(width=1024):
    inputs = keras.Input((512,), name="features")
    x = keras.layers.Dense(width, activation="relu", name="up")(inputs)
    x = keras.layers.Dense(width, activation="relu", name="mid")(x)
    return keras.Model(inputs, keras.layers.Dense(10, name="out")(x))
"""


def trained(args: list[str], cwd) -> dict:
    """The metrics of `meshrun train ARGS` run in a fresh process in `cwd`."""
    done = run_meshrun(["train", "train.verbose=0", *args, f"hydra.run.dir={cwd / 'run'}"], cwd, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = read_metrics(cwd / "run")
    assert metrics["status"] == "ok", metrics["error"]
    return metrics


def assert_few_faults(metrics: dict) -> None:
    faults = metrics["timing"]["minor_faults_per_step"]
    assert faults is not None and faults < MAX_FAULTS_PER_STEP, (
        f"{faults:.0f} minor page faults per steady step"
    )


@pytest.mark.parametrize("mesh", ["1x1", "2x4"])
def test_a_keras_hub_llama_fed_through_grain_faults_no_buffer_in_afresh(mesh, tmp_path):
    metrics = trained([*LLAMA_RUN, f"mesh={mesh}"], tmp_path)
    assert metrics["data"]["loader"] == "grain" and metrics["data"]["allocator_restored"] is False
    assert metrics["timing"]["steady_steps"] == 109
    assert_few_faults(metrics)


def test_a_generator_pipeline_gets_the_allocator_policy_back_over_epochs_and_evaluations(tmp_path):
    """The zoo transformer fed by a tf.data.Dataset.from_generator: three epochs, each followed by a
    validation, and a final evaluation, every one a new iterator of the pipeline. 40 steps an epoch:
    the faults counted are those of the steps after the first 50, every one of them after an
    evaluation (the second and third epochs')."""
    (tmp_path / f"{DATA_MODULE}.py").write_text(textwrap.dedent(DATA_SOURCE))
    args = [
        "model=transformer",
        "model.vocab=256",
        "model.seq_len=64",
        "mesh=1x1",
        "data=python",
        f"data.factory={DATA_MODULE}:sequences",
        "+data.kwargs.samples=640",
        "data.num_samples=640",
        "data.eval_samples=640",
        "train.epochs=3",
        "train.eval_every=1",
    ]
    metrics = trained(args, tmp_path)
    assert metrics["data"]["loader"] == "tf.data" and metrics["data"]["allocator_restored"] is True
    assert len(metrics["history"]["val_loss"]) == 3 and metrics["timing"]["steady_steps"] == 3 * 39
    assert_few_faults(metrics)
    log = (tmp_path / "run" / "train.log").read_text()
    assert log.count("holds a tf.data.Dataset.from_generator") == 1, log


def test_an_own_model_faults_no_buffer_in_afresh(tmp_path):
    (tmp_path / f"{MODEL_MODULE}.py").write_text(textwrap.dedent(MODEL_SOURCE))
    args = [
        "model=python",
        f"model.factory={MODEL_MODULE}:wide_mlp",
        "train.loss=mse",
        "mesh=2x4",
        "train.batch_size=64",
        "data.num_samples=7040",
        "data.eval_samples=64",
        "train.epochs=1",
    ]
    metrics = trained(args, tmp_path)
    assert (
        metrics["data"]["loader"] == "pydataset" and metrics["timing"]["steady_steps"] == 109
    )  # 110 steps, as the Llama's
    assert_few_faults(metrics)
