"""The seeds' MLP trained with keras.distribution by hand, no meshrun: the baseline that
scripts/bench_vs_handwritten.py compares `meshrun train layout=dense_model` against.

It does what a user would write for the same job: a (data, model) DeviceMesh on 8 CPU-emulated
devices, ModelParallel with the seeds' LayoutMap, the same model, data, loss and optimizer as
meshrun, then fit and evaluate. It writes the time from process start to the first train step,
the wall time and the per-epoch losses as JSON.

    python scripts/handwritten_seeds.py --mesh 2x4 --epochs 3 --json-out /tmp/handwritten.json
"""

import os

# Must be set before keras, jax or tensorflow is imported.
os.environ["KERAS_BACKEND"] = "jax"
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["JAX_NUM_CPU_DEVICES"] = "8"
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"

import argparse
import json
import statistics
import time


def process_start_time() -> float:
    """Wall-clock time (time.time()) at which this process started, from /proc (as meshrun does)."""
    with open("/proc/self/stat") as stat:
        start_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
    with open("/proc/uptime") as uptime:
        uptime_s = float(uptime.read().split()[0])
    return time.time() - max(uptime_s - start_ticks / os.sysconf("SC_CLK_TCK"), 0.0)


STARTED_AT = process_start_time()

import keras
import numpy as np
import tensorflow as tf


class FirstStep(keras.callbacks.Callback):
    """Records the wall time at which the first train batch begins."""

    at = None

    def on_train_batch_begin(self, batch, logs=None):
        if self.at is None:
            self.at = time.time()


class SyncLogs(keras.callbacks.Callback):
    """Overriding on_train_batch_end makes Keras fetch each step's logs in the training loop instead
    of its worker threads. Without it (Keras' default) runs on 8 emulated CPU devices intermittently
    deadlock in XLA's all-reduce and abort after 40 s; meshrun does the same on CPU.
    It also times steps the way meshrun does: gaps between step ends within an epoch."""

    def __init__(self):
        super().__init__()
        self.ends = []

    def on_epoch_begin(self, epoch, logs=None):
        self.ends.append([])

    def on_train_batch_end(self, batch, logs=None):
        self.ends[-1].append(time.perf_counter())

    def median_step_s(self):
        gaps = [b - a for epoch in self.ends for a, b in zip(epoch, epoch[1:], strict=False)]
        return statistics.median(gaps) if gaps else None


def dataset(count, seed, batch_size, shuffle):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((count, 28, 28, 1), dtype=np.float32)
    y = rng.standard_normal((count, 10), dtype=np.float32)
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    if shuffle:
        ds = ds.shuffle(count, seed=seed, reshuffle_each_iteration=True)
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mesh", default="2x4", help="data x model, e.g. 8x1, 2x4, 1x8")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--num-samples", type=int, default=1024)
    parser.add_argument("--eval-samples", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--no-shuffle", action="store_true", help="like meshrun's data.shuffle=false")
    parser.add_argument(
        "--keras-async",
        action="store_true",
        help="leave Keras' asynchronous log fetching on (may deadlock on CPU devices)",
    )
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()

    shape = tuple(int(n) for n in args.mesh.split("x"))
    mesh = keras.distribution.DeviceMesh(shape, ["data", "model"])
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map["d1/kernel"] = (None, "model")
    layout_map["d2/output"] = ("data", None)
    keras.distribution.set_distribution(
        keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="data")
    )
    keras.utils.set_random_seed(args.seed)

    inputs = keras.Input(shape=(28, 28, 1), name="inputs")
    x = keras.layers.Flatten(name="flatten")(inputs)
    x = keras.layers.Dense(200, activation="relu", use_bias=False, name="d1")(x)
    x = keras.layers.Dropout(0.4, name="dropout")(x)
    outputs = keras.layers.Dense(10, activation="softmax", name="d2")(x)
    model = keras.Model(inputs, outputs, name="dense_model")
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")

    train = dataset(args.num_samples, args.seed, args.batch_size, not args.no_shuffle)
    test = dataset(args.eval_samples, args.seed + 1, args.batch_size, shuffle=False)
    first_step = FirstStep()
    sync_logs = SyncLogs()
    callbacks = [first_step] if args.keras_async else [first_step, sync_logs]
    history = model.fit(train, epochs=args.epochs, verbose=0, shuffle=False, callbacks=callbacks)
    eval_loss = model.evaluate(test, verbose=0)
    result = {
        "time_to_first_step_s": first_step.at - STARTED_AT,
        "wall_s": time.time() - STARTED_AT,
        "step_time_s": None if args.keras_async else sync_logs.median_step_s(),
        "history": {"loss": [float(v) for v in history.history["loss"]]},
        "eval_loss": float(eval_loss),
    }
    if args.json_out:
        with open(args.json_out, "w") as out:
            json.dump(result, out, indent=2)
    else:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
