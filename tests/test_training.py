"""Integration on 8 emulated CPU devices: placed shardings equal the rules, losses do not depend on
the mesh shape, and jobs in one process do not leak into each other."""

import pytest

from conftest import train_in_process
from meshrun.config.parse import parse_run_config
from meshrun.placement import devices

pytestmark = pytest.mark.integration

SEEDS_RULES = {"d1/kernel": [None, "model"], "d2/output": ["data", None]}


def train_run(shape, rules=SEEDS_RULES):
    raw = {
        "mesh": {"shape": shape},
        "layout": {"rules": rules},
        "model": {"name": "dense_model"},
        "data": {"num_samples": 256, "eval_samples": 64},
        "train": {"epochs": 2, "verbose": 0, "loss": "mse"},
    }
    return train_in_process(raw).metrics


@pytest.fixture(scope="module")
def runs():
    """The seeds' model and rules trained on the four 2-D shapes of 8 devices, in one process."""
    return {shape: train_run(shape) for shape in ("8x1", "4x2", "2x4", "1x8")}


def test_placed_shardings_equal_the_rules(runs):
    for shape, metrics in runs.items():
        sharding = metrics["sharding"]
        assert sharding["d1/kernel"]["spec"] == [None, "model"], shape
        assert sharding["d1/kernel"]["rule"] == "d1/kernel"
        assert sharding["d1/kernel"]["shape"] == [784, 200]
        for path in ("d2/kernel", "d2/bias"):
            assert all(axis is None for axis in sharding[path]["spec"]), (shape, path)
            assert sharding[path]["rule"] is None


def test_losses_do_not_depend_on_the_mesh_shape(runs):
    reference = runs["8x1"]["history"]["loss"]
    assert len(reference) == 2
    for shape, metrics in runs.items():
        assert metrics["history"]["loss"] == pytest.approx(reference, abs=1e-5), shape
        assert metrics["eval"]["loss"] == pytest.approx(runs["8x1"]["eval"]["loss"], abs=1e-5), shape


def test_jobs_in_one_process_keep_the_same_variable_paths(runs):
    paths = {shape: sorted(m["sharding"]) for shape, m in runs.items()}
    assert len({tuple(p) for p in paths.values()}) == 1
    assert "d1/kernel" in paths["1x8"]


def test_metrics_describe_mesh_devices_and_timing(runs):
    metrics = runs["2x4"]
    assert metrics["mesh"] == {
        "shape": [2, 4],
        "axis_names": ["data", "model"],
        "batch_axis": "data",
        "dcn": [1, 1],
    }  # one process
    assert metrics["devices"]["count"] == 8 and metrics["devices"]["platform"] == "cpu"
    assert metrics["train"]["steps_per_epoch"] == 16
    assert metrics["train"]["per_replica_batch_size"] == 8
    assert metrics["model"]["params"] == 784 * 200 + 200 * 10 + 10
    timing = metrics["timing"]
    assert 0 < timing["step_time_s"] <= timing["step_time_p90_s"]
    assert timing["compile_s"] > timing["step_time_s"]
    assert timing["steady_steps"] == 2 * 15
    # On CPU the loop fetches each step's logs itself (async fetching can deadlock XLA's CPU all-reduce).
    assert timing["async_log_fetch"] is False
    assert len(timing["epoch_s"]) == 2


def test_replicated_layout_on_a_2d_mesh_is_data_parallel(caplog):
    # keras 3.15's DataParallel raises on a 2-D mesh; meshrun's ModelParallel without rules does not.
    metrics = train_run("2x4", rules={})
    assert all(all(a is None for a in v["spec"]) for v in metrics["sharding"].values())
    assert metrics["history"]["loss"][-1] > 0
    idle = [r for r in caplog.records if "shards no variable" in r.message]
    assert [(r.name, r.levelname) for r in idle] == [("meshrun", "WARNING")]
    assert idle[0].message.startswith("mesh axis 'model' (size 4) shards no variable")


def test_a_mesh_smaller_than_the_process_uses_the_first_devices():
    metrics = train_run("2x2")
    assert metrics["devices"]["count"] == 4 and metrics["devices"]["available"] == 8


def test_a_mesh_of_one_device_trains_like_the_others_and_reports_its_variables_whole(runs):
    # One GPU is a 1x1 mesh: it trains without a Keras distribution (batches by device_put), and
    # Keras' arrays then carry a SingleDeviceSharding, which has no spec.
    metrics = train_run("1x1", rules={})
    assert metrics["devices"]["count"] == 1
    assert metrics["sharding"]["d1/kernel"]["spec"] == [None, None]
    assert metrics["sharding"]["d1/kernel"]["bytes_per_device"] == 784 * 200 * 4
    assert metrics["history"]["loss"] == pytest.approx(runs["8x1"]["history"]["loss"], abs=1e-5)
    assert metrics["eval"]["loss"] == pytest.approx(runs["8x1"]["eval"]["loss"], abs=1e-5)


def test_only_a_one_process_mesh_of_the_default_device_trains_without_a_keras_distribution():
    import jax

    from meshrun.config.layout_schema import MeshConfig
    from meshrun.placement import distribution

    def made(shape, devices):
        return distribution.make_distribution(
            MeshConfig(shape=shape, axis_names=("data", "model"), batch_axis="data"), (), devices
        )

    assert distribution.in_force(made((1, 1), jax.devices()[:1])) is None
    for shape, chosen in (((1, 1), jax.devices()[1:2]), ((2, 1), jax.devices()[:2])):
        kept = made(shape, chosen)
        assert distribution.in_force(kept) is kept, (shape, chosen)


def test_batch_axis_is_the_one_configured():
    from meshrun.placement import distribution

    parsed = parse_run_config(
        {"mesh": {"shape": "2x4", "batch_axis": "model"}, "model": {"name": "dense_model"}}
    )
    found = devices.discover(parsed.devices, parsed.mesh)
    dist = distribution.make_distribution(parsed.mesh, (), found.devices)
    try:
        assert dist.batch_dim_name == "model"
        assert tuple(dist.get_data_layout((16, 28, 28, 1)).axes)[0] == "model"
    finally:
        distribution.reset()


def test_describe_lists_variables_outputs_and_optimizer_slots_without_allocating():
    from meshrun.config.parse import parse_data
    from meshrun.models import get_model
    from meshrun.run import build

    spec = get_model("dense_model")
    abstract = build.describe(spec, spec.options(), parse_data({}), "adam", 1e-3)
    tensors = {t.path: t for t in abstract.tensors}
    assert tensors["d1/kernel"].shape == (784, 200) and not tensors["d1/kernel"].is_output
    assert tensors["d1/kernel"].dtype == "float32" and tensors["d1/kernel"].itemsize == 4
    assert tensors["d2/output"].shape == (None, 10) and tensors["d2/output"].is_output
    assert "dense_model/output" in tensors
    slots = {s.tensor.path: s.reference for s in abstract.slots}
    assert slots["adam/d1_kernel_momentum"] == "d1/kernel" and slots["adam/d1_kernel_velocity"] == "d1/kernel"
    assert slots["adam/iteration"] is None
    assert len(slots) == 2 + 2 * 3  # iteration, learning rate, and two slots per trainable variable
