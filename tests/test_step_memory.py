"""The train step's memory in the plan (issue 68): with a device memory to fit
(devices.memory_gib), `meshrun plan` and a run's plan compile the real train step on abstract
inputs and count its peak; the run then measures the same program after fit. A plan whose step
does not fit is one line, exit 2, saying by how much and what would help; without a memory figure
the plan counts the state only and says so. An own model's case is in test_user_models.py."""

import json

import pytest

from conftest import HF_DATA, cli_here, one_error_line, train_here
from presets import corpus_text, gemma_preset, llama3_preset

MEMORY = "devices.memory_gib=1"
ZOO = ["model=transformer", "mesh=2x4", "train.verbose=0", "train.epochs=1", "data.num_samples=64"]
HUB = [
    "model=keras_hub",
    "mesh=2x4",
    "data=text",
    "train.verbose=0",
    "train.epochs=1",
    "train.batch_size=8",
]


@pytest.fixture(scope="module")
def presets_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("step_memory")
    text = corpus_text(size_bytes=8_000)
    (root / "corpus.txt").write_text(text)
    gemma_preset(root / "gemma", text, num_key_value_heads=4)
    llama3_preset(root / "llama", text)
    return root


def assert_planned_as_measured(run_dir) -> dict:
    """The run's plan counted its step, and its peak is the one measured after fit within 10%."""
    plan = json.loads((run_dir / "plan.json").read_text())
    memory = json.loads((run_dir / "metrics.json").read_text())["memory"]
    assert plan["step"]["method"] == "the whole train step compiled on 8 CPU devices"
    assert plan["device_memory"]["counts"] == "the step's peak" and plan["device_memory"]["fits"]
    planned = memory["planned_step_peak_bytes_per_device"]
    assert planned == plan["step"]["step_peak_bytes_per_device"]
    assert planned == pytest.approx(memory["peak_bytes_per_device"], rel=0.10)
    assert memory["planned_step_bytes_per_device"] == pytest.approx(
        memory["compiled"]["temp_bytes"], rel=0.10
    )
    return plan


@pytest.mark.integration
@pytest.mark.parametrize("seq_len", [32, 64])
def test_the_zoo_transformers_planned_step_peak_is_the_measured_one(tmp_path, seq_len):
    train_here([*ZOO, f"model.seq_len={seq_len}", MEMORY], tmp_path)
    plan = assert_planned_as_measured(tmp_path)
    assert plan["step"]["step_bytes_per_device"] > plan["per_device"]["total_bytes"]  # activations dominate


@pytest.mark.integration
@pytest.mark.parametrize(
    "family,extra",
    [
        ("llama", []),
        ("llama", ["model.lora.rank=4"]),
        ("gemma", ["model.quantize=int8", "model.lora.rank=4"]),
    ],
    ids=["llama", "llama lora", "gemma qlora"],
)
def test_a_keras_hub_presets_planned_step_peak_is_the_measured_one(presets_dir, tmp_path, family, extra):
    preset = [f"model.preset={presets_dir / family}", f"data.files={presets_dir / 'corpus.txt'}"]
    train_here([*HUB, *preset, "model.seq_len=32", *extra, MEMORY], tmp_path)
    assert_planned_as_measured(tmp_path)


@pytest.mark.integration
def test_a_transformers_checkpoints_planned_step_peak_is_the_measured_one(tmp_path):
    checkpoint = [f"model.preset={HF_DATA / 'qwen3'}", f"data.files={HF_DATA / 'corpus.txt'}"]
    train_here([*HUB, *checkpoint, "model.seq_len=32", "model.lora.rank=4", MEMORY], tmp_path)
    assert_planned_as_measured(tmp_path)


@pytest.mark.integration
def test_a_pipelined_models_planned_step_peak_is_the_measured_one(tmp_path):
    stages = ["mesh=2x2x2", "mesh.axis_names=[stage,data,model]", "mesh.batch_axis=data"]
    train_here(
        ["model=transformer", *stages, "train.verbose=0", "train.epochs=1", "data.num_samples=32", MEMORY],
        tmp_path,
    )
    plan = assert_planned_as_measured(tmp_path)
    assert plan["pipeline"]["stages"] == 2


@pytest.mark.integration
def test_a_plan_whose_step_does_not_fit_says_by_how_much_and_what_would(capsys):
    # The tiny transformer's state is 0.40 MiB a device on 2x4, its step's peak 2.19 MiB.
    done = cli_here(["plan", *ZOO, "devices.memory_gib=0.002"], capsys)
    line = one_error_line(done)
    assert "devices.memory_gib: does not fit: the plan puts 2.19 MiB on each device of mesh 2x4" in line
    assert (
        "(the train step's peak: 134.38 KiB parameters + 268.76 KiB adam state + 1.80 MiB of its own)" in line
    )
    assert "more than the 2.05 MiB of one device (devices.memory_gib=0.002)" in line
    assert (
        "a smaller train.batch_size or model.seq_len (meshrun plan --fit batch or --fit seq_len finds "
        "the largest that fits), recompute activations (train.remat=blocks), or shard more, or give "
        "the real memory"
    ) in line


@pytest.mark.integration
def test_without_a_memory_figure_the_plan_counts_the_state_only_and_says_so(capsys):
    done = cli_here(["plan", *ZOO, "--json"], capsys)
    assert done.returncode == 0, done.stderr
    assert "step" not in json.loads(done.stdout)
    table = cli_here(["plan", *ZOO, MEMORY], capsys)
    assert "train step's peak" in table.stdout and "2.19 MiB" in table.stdout
    assert "counts parameters and optimizer state only" not in table.stdout


@pytest.mark.integration
def test_the_plan_counts_what_train_remat_saves(capsys):
    """The plan compiles the step the run would: with train.remat=blocks its blocks recompute, so the
    step's own memory of an activation-heavy transformer falls by more than 2x."""
    shape = ["model.seq_len=128", "model.vocab=64", "model.layers=4", "train.batch_size=16", MEMORY]

    def step(remat: str) -> dict:
        done = cli_here(["plan", *ZOO, *shape, f"train.remat={remat}", "--json"], capsys)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["step"]

    kept, recomputed = step("none"), step("blocks")
    assert recomputed["step_bytes_per_device"] * 2 < kept["step_bytes_per_device"]


def plan_json(args: list[str], capsys) -> dict:
    done = cli_here(["plan", *ZOO, *args, "--json"], capsys)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.integration
def test_fit_batch_picks_exactly_the_batch_that_fits(capsys):
    """The memory figure is the step's peak at a global batch of 24 (a multiple of the batch axis
    of 2): the search from the configured 16 picks 24, and says what 26 would need."""
    peak_24 = plan_json(["train.batch_size=24", MEMORY], capsys)["step"]["step_peak_bytes_per_device"]
    memory_gib = (peak_24 + 512) / 2**30
    found = plan_json([f"devices.memory_gib={memory_gib!r}", "--fit", "batch"], capsys)["fit"]
    assert (found["key"], found["value"], found["step_peak_bytes_per_device"]) == (
        "train.batch_size",
        24,
        peak_24,
    )
    assert found["larger"] == 26 and found["larger_step_peak_bytes_per_device"] > found["device_memory_bytes"]
    assert [size for size, _ in found["tried"]] == [16, 24, 26, 28, 32]


@pytest.mark.integration
@pytest.mark.parametrize(
    "args,expected",
    [
        (
            [*ZOO, "--fit", "batch"],
            "--fit: got 'batch' but the plan has no device memory to fit: give devices.memory_gib "
            "(emulated CPU devices report none)",
        ),
        (
            ["model=dense_model", "mesh=2x4", MEMORY, "--fit", "seq_len"],
            "--fit: got 'seq_len' for dense_model, which has no model.seq_len to vary; valid for it: batch",
        ),
        (
            # The state (0.39 MiB a device) fits 0.0006 GiB, a step of 2 samples (0.72 MiB) does not.
            [*ZOO, "devices.memory_gib=0.0006", "--fit", "batch"],
            "devices.memory_gib: not even train.batch_size=2 fits: its train step needs 733.55 KiB per "
            "device, more than the 629.15 KiB of one device",
        ),
        ([*ZOO, "--fit", "depth"], "--fit: got 'depth'"),
    ],
    ids=["no memory", "no seq_len", "nothing fits", "unknown target"],
)
def test_bad_fit_input_is_one_line_exit_2(capsys, args, expected):
    done = cli_here(["plan", *args], capsys)
    assert expected in one_error_line(done)


@pytest.mark.unit
@pytest.mark.parametrize("limit,start", [(0, 4), (1, 4), (5, 4), (4, 4), (24, 4), (7, 1), (3, 100)])
def test_the_search_finds_the_largest_size_that_fits_with_few_tries(limit, start):
    from meshrun.run.fit_search import _largest

    tried = []

    def fits(n: int) -> bool:
        tried.append(n)
        return n <= limit

    assert _largest(fits, start) == limit
    assert len(tried) == len(set(tried)) and len(tried) <= 2 * max(limit, start).bit_length() + 2
