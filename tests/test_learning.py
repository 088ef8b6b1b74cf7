"""Training learns: each model family's learnable synthetic task reaches a clear accuracy in a short
CPU run, and a real dataset (scikit-learn's bundled handwritten digits, read through data=arrays)
reaches its stated accuracy on held-out digits."""

import numpy as np
import pytest

from conftest import train_in_process

pytestmark = pytest.mark.integration

TASKS = {
    # name: (model, data, train, eval accuracy to reach; chance level in the comment)
    "cnn on class patterns": (
        {"name": "cnn"},
        {"num_samples": 1024, "eval_samples": 256},
        {"epochs": 2, "batch_size": 32},
        0.9,
    ),  # chance 0.1
    "dense_model on class patterns": (
        {"name": "dense_model", "dropout": 0.0},
        {"num_samples": 2048, "eval_samples": 256, "task": "classes"},
        {"epochs": 2, "batch_size": 32, "loss": "categorical_crossentropy"},
        0.9,
    ),  # chance 0.1
    "transformer on token sequences": (
        {"name": "transformer"},
        {"num_samples": 1024, "eval_samples": 256},
        {"epochs": 3, "batch_size": 32, "learning_rate": 0.003},
        0.3,
    ),  # chance 1/512
    "two_tower on id pairs": (
        {"name": "two_tower"},
        {"num_samples": 4096, "eval_samples": 512},
        {"epochs": 3, "batch_size": 64, "learning_rate": 0.003},
        0.9,
    ),  # chance 0.5
}


@pytest.mark.parametrize("name", sorted(TASKS))
def test_learnable_synthetic_tasks_reach_their_targets(name):
    model, data, train, target = TASKS[name]
    metrics = train_in_process(
        {"mesh": {"shape": "8x1"}, "model": model, "data": data, "train": {**train, "verbose": 0}}
    ).metrics
    assert metrics["eval"]["accuracy"] >= target, (name, metrics["eval"], metrics["history"])
    assert metrics["history"]["loss"][-1] < metrics["history"]["loss"][0]


def test_real_digits_through_arrays_reach_93_percent(tmp_path):
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[..., None]  # 1797 x 8 x 8 x 1
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(y))
    train, held_out = order[:1500], order[1500:]
    np.savez(tmp_path / "train.npz", x=x[train], y=y[train])
    np.savez(tmp_path / "eval.npz", x=x[held_out], y=y[held_out])
    metrics = train_in_process(
        {
            "mesh": {"shape": "2x4"},
            "layout": {"rules": {"d1/kernel": [None, "model"]}},
            "model": {"name": "dense_model", "input_shape": [8, 8, 1], "hidden": 64, "dropout": 0.0},
            "data": {
                "name": "arrays",
                "path": str(tmp_path / "train.npz"),
                "eval_path": str(tmp_path / "eval.npz"),
            },
            "train": {
                "epochs": 10,
                "batch_size": 32,
                "learning_rate": 0.003,
                "loss": "sparse_categorical_crossentropy",
                "verbose": 0,
            },
        }
    ).metrics
    assert metrics["data"]["read_by_rows"] is True
    assert (metrics["data"]["train_samples"], metrics["data"]["eval_samples"]) == (1500, 297)
    assert metrics["eval"]["accuracy"] >= 0.93, metrics["eval"]
