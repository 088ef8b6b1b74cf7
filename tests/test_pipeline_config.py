"""Pipeline stages from the config (issue 33): a stage mesh axis turns them on; the layout rules
written for separate blocks place the stacked ones; the plan says which blocks each stage holds;
a pipelined run's losses equal the unpipelined run's; bad input is one line, exit 2."""

import json
import logging
import shutil
import tempfile
from pathlib import Path

import pytest

from conftest import (
    FAST,
    LogRecords,
    Trained,
    cli_here,
    error_line_here,
    layout_rules,
    run_meshrun,
    train_in_process,
)
from meshrun.config.layout_schema import LayoutRule, MeshConfig
from meshrun.config.parse import parse_run_config
from meshrun.config.schema import PipelineConfig
from meshrun.errors import ConfigError
from meshrun.placement.layout import TensorSpec
from meshrun.placement.stacking import per_block_view, pipeline_plan, stacked_rules

MESH = MeshConfig(shape=(2, 2, 2), axis_names=("stage", "data", "model"), batch_axis="data")
BLOCKS = tuple(f"block_{i}/mlp/kernel" for i in range(4))
TENSORS = [
    TensorSpec("embedding/embeddings", (64, 16)),
    TensorSpec("blocks/stacked_mlp_kernel", (4, 16, 32), blocks=BLOCKS),
    TensorSpec("blocks/stacked_norm_gamma", (4, 16), blocks=tuple(f"block_{i}/norm/gamma" for i in range(4))),
    TensorSpec("blocks/output", (None, 8, 16), is_output=True),
]


def _raw(mesh: str, names: list, batch_axis: str, **pipeline) -> dict:
    return {
        "mesh": {"shape": mesh, "axis_names": names, "batch_axis": batch_axis},
        "layout": {},
        "model": {"name": "transformer"},
        "train": {"batch_size": 16},
        "pipeline": pipeline,
    }


def test_the_pipeline_section_defaults_to_one_microbatch_per_stage():
    config = parse_run_config(_raw("4x2", ["stage", "data"], "data"))
    assert config.pipeline == PipelineConfig(axis="stage", microbatches=None, remat=False)
    assert (config.pipeline.stages(config.mesh), config.pipeline.microbatches_on(config.mesh)) == (4, 4)
    flat = parse_run_config(
        _raw("8", ["data"], "data", microbatches=3)
    )  # no stage axis: no pipeline, nothing to check
    assert flat.pipeline.stages(flat.mesh) == 0


STAGES_TYPO = (
    "pipeline.microbatches=4 and pipeline.remat=true do nothing: pipeline stages wait for a mesh axis named "
    "'stage' (pipeline.axis), and mesh 4x2's axes are stages, data ('stages' is close: a typo?), so the run "
    "has no stages; name an axis 'stage' in mesh.axis_names, or leave the pipeline keys out"
)


def test_pipeline_keys_on_a_mesh_without_the_stage_axis_are_a_warning_in_the_plan_and_the_run():
    from meshrun.run.prepare import place_for_plan

    typo = place_for_plan(
        parse_run_config(_raw("4x2", ["stages", "data"], "data", microbatches=4, remat=True))
    )
    assert STAGES_TYPO in typo.plan.warnings
    staged = place_for_plan(
        parse_run_config(_raw("2x4", ["stage", "data"], "data", microbatches=4, remat=True))
    )
    assert not any("pipeline." in w for w in staged.plan.warnings)
    logger, records = logging.getLogger("meshrun"), LogRecords()
    logger.addHandler(records)
    try:
        train_in_process(
            {
                "mesh": {"shape": "4x2", "axis_names": ["stages", "data"], "batch_axis": "data"},
                "model": {"name": "dense_model"},
                "data": {"name": "synthetic", "num_samples": 32, "eval_samples": 16},
                "train": {"epochs": 1, "verbose": 0},
                "pipeline": {"microbatches": 4, "remat": True},
            }
        )
    finally:
        logger.removeHandler(records)
    assert STAGES_TYPO in [r.getMessage() for r in records.records if r.levelno == logging.WARNING]


@pytest.mark.parametrize(
    "raw, key, text",
    [
        (
            _raw("4x2", ["stage", "data"], "stage"),
            "mesh.batch_axis",
            "got 'stage', the pipeline's stage axis (pipeline.axis), whose devices hold different blocks, "
            "not copies of the model to split the batch over; valid: data",
        ),
        (
            _raw("2x4", ["stage", "data"], "data", microbatches=3),
            "pipeline.microbatches",
            "got 3, which does not divide the 4 rows of each data replica "
            "(train.batch_size=16 over 'data' of size 4); valid: 1, 2 or 4",
        ),
        (
            _raw("4x8", ["stage", "data"], "data"),
            "pipeline.microbatches",
            "left null, which means one per stage (4), which does not divide the 2 rows of each data replica",
        ),
        (
            _raw("2x4", ["pipe", "data"], "data", axis="pipe", microbatches=0),
            "pipeline.microbatches",
            "got 0; expected a positive integer",
        ),
        (
            _raw("2x4", ["stage", "data"], "data", repeats=0),
            "pipeline.repeats",
            "got 0; expected a positive integer",
        ),
        (
            _raw("4x2", ["stage", "data"], "data", microbatches=2, repeats=2),
            "pipeline.microbatches",
            "got 2 with pipeline.repeats=2: the circular schedule "
            "takes microbatches in groups of the 4 stages; valid: 4 or 8",
        ),
    ],
)
def test_pipeline_settings_that_cannot_work_name_the_key(raw, key, text):
    with pytest.raises(ConfigError) as raised:
        parse_run_config(raw)
    assert raised.value.key == key and text in str(raised.value)


def test_rules_for_separate_blocks_place_the_stacked_ones_over_the_stage_axis():
    rules = (
        LayoutRule("embedding/embeddings", ("model", None)),
        LayoutRule(r"block_\d+/mlp/kernel", (None, "model")),
    )
    placed, errors, bends = stacked_rules(rules, MESH, TENSORS, "stage")
    assert errors == () and bends == ()
    assert placed == (
        LayoutRule(
            "embedding/embeddings", ("model", None)
        ),  # kept as written: it places more than block weights
        LayoutRule(
            "blocks/stacked_mlp_kernel", ("stage", None, "model"), derived_from=r"block_\d+/mlp/kernel"
        ),  # carried over
        LayoutRule(
            "blocks/stacked_norm_gamma", ("stage", None), origin="pipeline"
        ),  # no rule: the stages alone
    )
    assert [t.path for t in per_block_view(TENSORS)[1:5]] == list(BLOCKS)


@pytest.mark.parametrize(
    "rules, key, text",
    [
        (
            (
                LayoutRule(r"block_\d+/mlp/kernel", (None, "model")),
                LayoutRule("block_3/mlp/kernel", ("data", None), origin="extra_rules"),
            ),
            "layout.extra_rules.block_3/mlp/kernel",
            "places 'block_3/mlp/kernel' as [data, null] but 'block_0/mlp/kernel' is placed as [null, "
            "model]; pipelined blocks are held stacked, so every block's weight must be placed alike",
        ),
        (
            (LayoutRule(r"block_\d+/mlp/kernel", ("stage", None)),),
            r"layout.rules.block_\d+/mlp/kernel",
            "puts a dimension of block weight 'block_0/mlp/kernel' on 'stage', the pipeline's stage axis",
        ),
        (
            (LayoutRule(r"block_\d+/mlp/kernel", (None, None, "model")),),
            r"layout.rules.block_\d+/mlp/kernel",
            "gives 3 axes [null, null, model] but variable 'block_0/mlp/kernel' has rank 2",
        ),  # in the terms of separate blocks
    ],
)
def test_rules_that_do_not_fit_stacked_blocks_say_so_in_the_blocks_terms(rules, key, text):
    _, errors, _ = stacked_rules(rules, MESH, TENSORS, "stage")
    assert errors and errors[0].key == key and text in str(errors[0]), errors


def test_the_plan_of_the_stages_says_which_blocks_each_holds_and_the_bubble():
    plan = pipeline_plan(TENSORS, MESH, PipelineConfig(microbatches=4), batch_size=16)
    assert plan.stage_blocks == (("block_0", "block_1"), ("block_2", "block_3"))
    assert (plan.microbatch_rows, plan.microbatch_rows_per_replica, plan.bubble_fraction) == (
        4,
        2,
        pytest.approx(1 / 5),
    )
    # 5 ticks x 2 blocks a stage x 2 rows x one 8x16 float32 activation
    assert plan.kept_activation_bytes_per_device == 5 * 2 * 2 * 8 * 16 * 4
    circular = pipeline_plan(TENSORS, MESH, PipelineConfig(microbatches=4, repeats=2), batch_size=16)
    assert circular.stage_blocks == (("block_0", "block_2"), ("block_1", "block_3"))
    assert circular.bubble_fraction == pytest.approx(1 / 9)
    assert circular.kept_activation_bytes_per_device == 9 * 1 * 2 * 8 * 16 * 4  # 9 ticks of one block each


def test_the_circular_schedules_stacks_keep_their_rounds_whole_and_split_the_stages():
    tensors = [TensorSpec("blocks/stacked_mlp_kernel", (2, 2, 16, 32), blocks=BLOCKS)]
    placed, errors, _ = stacked_rules(
        (LayoutRule(r"block_\d+/mlp/kernel", (None, "model")),), MESH, tensors, "stage"
    )
    assert errors == () and placed == (
        LayoutRule(
            "blocks/stacked_mlp_kernel", (None, "stage", None, "model"), derived_from=r"block_\d+/mlp/kernel"
        ),
    )
    assert [t.shape for t in per_block_view(tensors)] == [(16, 32)] * 4


def test_a_lenient_rule_leaves_the_same_dimension_whole_in_every_stacked_block_and_elsewhere():
    """Stacked blocks get the written rule's axes with the indivisible dimension whole; a variable
    outside the blocks that the rule bends keeps an exact rule of its own; every bend is reported."""
    tensors = [
        TensorSpec("embedding/embeddings", (6, 3)),
        TensorSpec("head/kernel", (6, 4)),
        TensorSpec("blocks/stacked_mlp_kernel", (4, 16, 3), blocks=BLOCKS),
    ]  # 3 columns: 'model' (2) does not divide
    lenient = LayoutRule(
        r"(embedding|head)/\w+|block_\d+/mlp/kernel", (None, "model"), replicate_if_indivisible=True
    )
    placed, errors, bends = stacked_rules((lenient,), MESH, tensors, "stage")
    assert errors == ()
    assert placed == (
        LayoutRule(
            "embedding/embeddings", (None, None), derived_from=lenient.pattern
        ),  # exact: Keras looks it up first
        lenient,  # as written, for head/kernel, whose 4 columns split
        LayoutRule("blocks/stacked_mlp_kernel", ("stage", None, None), derived_from=lenient.pattern),
    )
    assert [bend.path for bend in bends] == ["embedding/embeddings", *BLOCKS]


_RUNS: dict[str, tuple[Trained, Path]] = {}


def _trained(raw: dict) -> tuple[Trained, Path]:
    """The run `raw` and its run dir, trained once per test session (several tests compare with the
    same run); one the checkpoint tests resume from (RESUMED_FROM) with a checkpoint at the end of
    each epoch (checkpoints/4 and checkpoints/8)."""
    if raw in RESUMED_FROM:
        raw = {**raw, "checkpoint": {"every_epoch": True}}
    key = json.dumps(raw, sort_keys=True)
    if key not in _RUNS:
        run_dir = Path(tempfile.mkdtemp(prefix="meshrun-pipeline-run-"))
        _RUNS[key] = train_in_process(raw, run_dir), run_dir
    return _RUNS[key]


def _reference_metrics(raw: dict) -> dict:
    """The metrics of the unpipelined run `raw` (_trained)."""
    return _trained(raw)[0].metrics


def _transformer(mesh: str, names: list, layout: str, layers: int = 2, **pipeline) -> dict:
    return {
        "mesh": {"shape": mesh, "axis_names": names, "batch_axis": "data"},
        "layout": {"rules": layout_rules(layout)},
        "model": {"name": "transformer", "layers": layers},
        "data": {"name": "synthetic", "num_samples": 64, "eval_samples": 16},
        "train": {"epochs": 2, "verbose": 0, "batch_size": 16},
        "pipeline": pipeline,
    }


STAGES_TP = ["stage", "data", "model"]
PIPELINED = _transformer("2x2x2", STAGES_TP, "transformer_tp", microbatches=2)
CIRCULAR = _transformer("2x2x2", STAGES_TP, "transformer_tp", layers=4, microbatches=2, repeats=2)
SEPARATE = _transformer("2x2", ["data", "model"], "transformer_tp")
SEPARATE_4 = _transformer("2x2", ["data", "model"], "transformer_tp", layers=4)
RESUMED_FROM = (
    PIPELINED,
    CIRCULAR,
    SEPARATE,
    SEPARATE_4,
)  # (the losses of each are compared with another's too)


@pytest.mark.integration
def test_a_pipelined_plan_shards_stacked_blocks_over_the_stages(in_tmp, capsys):
    """By the CLI in this process (the plan, not the process, is the point)."""
    done = cli_here(
        [
            "plan",
            "--json",
            "model=transformer",
            "model.layers=4",
            "mesh=2x2x2",
            "mesh.axis_names=[stage,data,model]",
            "mesh.batch_axis=data",
            "layout=transformer_tp",
            "pipeline.microbatches=4",
        ],
        capsys,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    plan = json.loads(done.stdout)
    spec = {v["path"]: v["spec"] for v in plan["variables"]}
    assert spec["blocks/stacked_mlp_up_kernel"] == ["stage", None, "model"]
    assert spec["blocks/stacked_attention_query_kernel"] == ["stage", None, "model", None]
    assert spec["blocks/stacked_ln_1_gamma"] == ["stage", None]
    assert not any(path.startswith("block_") for path in spec)
    rule = {v["path"]: (v["rule"], v.get("origin")) for v in plan["variables"]}
    assert rule["blocks/stacked_mlp_up_kernel"] == (
        r"block_\d+/mlp_up/kernel",
        "rules",
    )  # the rule written for the blocks
    assert rule["blocks/stacked_ln_1_gamma"] == (
        "blocks/stacked_ln_1_gamma",
        "pipeline",
    )  # no rule: the stages alone
    pipeline = plan["pipeline"]
    assert pipeline["stage_blocks"] == [["block_0", "block_1"], ["block_2", "block_3"]]
    assert (pipeline["microbatches"], pipeline["bubble_fraction"]) == (4, pytest.approx(0.2))
    by_path = {v["path"]: v for v in plan["variables"]}  # each stage device holds its own half of the blocks
    assert by_path["blocks/stacked_mlp_up_kernel"]["bytes_per_device"] == 4 * 64 * 256 * 4 // 4


def _mixed(raw: dict) -> dict:
    return {**raw, "train": {**raw["train"], "precision": "mixed_bfloat16"}}


@pytest.mark.integration
@pytest.mark.parametrize(
    "pipelined, reference, rel",
    [
        (PIPELINED, SEPARATE, 2e-5),
        (
            _transformer("4x2", ["stage", "data"], "replicated", layers=4, remat=True),
            _transformer("2", ["data"], "replicated", layers=4),
            2e-5,
        ),
        (CIRCULAR, SEPARATE_4, 2e-5),
        # bfloat16 activations: XLA's CPU compiler aborted on the stage sums in bfloat16 until they were made
        # in float32
        (_mixed(PIPELINED), _mixed(SEPARATE), 1e-3),
    ],
    ids=["2 stages, tensor parallel inside", "4 stages, remat", "circular, 2 rounds", "mixed_bfloat16"],
)
def test_a_pipelined_run_trains_and_counts_flops_as_the_same_model_with_separate_blocks(
    pipelined, reference, rel
):
    staged = _trained(pipelined)[0]
    expected = _reference_metrics(reference)
    assert staged.metrics["history"]["loss"] == pytest.approx(expected["history"]["loss"], rel=rel)
    assert staged.metrics["history"]["loss"][1] < staged.metrics["history"]["loss"][0]
    assert staged.plan.pipeline.stages == int(pipelined["mesh"]["shape"][0])
    # XLA counts a loop's body once: the schedule's loops had the pipelined step counted 2.3 to 4.9 times
    # short here (remat and the circular schedule's recomputation are the run's choice, not counted).
    flops = staged.metrics["flops"]
    assert flops["per_step"] == pytest.approx(expected["flops"]["per_step"], rel=0.01)
    assert (
        flops["bubble_fraction"] == staged.plan.pipeline.bubble_fraction
        and 0 < flops["bubble_per_step"] < flops["per_step"]
    )
    assert flops["per_step_per_device"] is None and expected["flops"]["bubble_per_step"] is None


@pytest.mark.integration
@pytest.mark.parametrize(
    "overrides, text",
    [
        (
            ["model.layers=3", "mesh=2x4", "mesh.axis_names=[stage,data]"],
            "mesh.shape: got 2x4: the stage axis 'stage' of size 2 does not split transformer's 3 blocks "
            "into stages of equal length; valid sizes for 'stage': 1 or 3",
        ),
        (
            ["pipeline.repeats=2", "mesh=2x4", "mesh.axis_names=[stage,data]"],
            "mesh.shape: got 2x4: the stage axis 'stage' of size 2 times pipeline.repeats=2 does not split "
            "transformer's 2 blocks into stages of equal length; valid sizes for 'stage': 1",
        ),
        (
            ["model=dense_model", "mesh=2x4", "mesh.axis_names=[stage,data]"],
            "mesh.axis_names: got ['stage', 'data']: axis 'stage' asks for pipeline stages (pipeline.axis), "
            "but dense_model has no repeated blocks to split",
        ),
        (
            ["mesh=2x4", "mesh.axis_names=[stage,data]", "pipeline.microbatches=3"],
            "pipeline.microbatches: got 3, which does not divide",
        ),
        (
            ["mesh=2x4", "mesh.axis_names=[stage,data]", "mesh.batch_axis=stage"],
            "mesh.batch_axis: got 'stage', the pipeline's stage axis",
        ),
        (
            ["model.dropout=0.1", "mesh=2x4", "mesh.axis_names=[stage,data]"],
            "mesh.axis_names: got a stage axis 'stage' for transformer, but its blocks keep state besides "
            "their weights (attention/seed_generator_2/seed_generator_state, "
            "blocks/seed_generator/seed_generator_state) (dropout's random state: set the model's "
            "dropout to 0), which pipeline stages cannot hand on yet; train it without a stage axis",
        ),
    ],
)
def test_bad_pipeline_input_is_one_line_and_exit_2(in_tmp, capsys, overrides, text):
    base = ["train", "model=transformer", "layout=replicated", "mesh.batch_axis=data", *FAST]
    assert text in error_line_here([*base, *overrides, "hydra.run.dir=run"], capsys)
    assert not (in_tmp / "run" / "metrics.json").exists()


STACKS = {"blocks/stacked_mlp_kernel": ("block_0/mlp/kernel", "block_1/mlp/kernel")}


def test_a_checkpoint_recasts_stacked_variables_and_their_slots_from_the_blocks_and_back():
    from meshrun.training.restack import Recast, recasts

    separate = {
        "block_0/mlp/kernel",
        "block_1/mlp/kernel",
        "adam/block_0_mlp_kernel_momentum",
        "adam/block_1_mlp_kernel_momentum",
    }
    stacked = {"blocks/stacked_mlp_kernel", "adam/blocks_stacked_mlp_kernel_momentum"}
    assert recasts(sorted(stacked), separate, STACKS) == {
        "blocks/stacked_mlp_kernel": Recast(("block_0/mlp/kernel", "block_1/mlp/kernel")),
        "adam/blocks_stacked_mlp_kernel_momentum": Recast(
            ("adam/block_0_mlp_kernel_momentum", "adam/block_1_mlp_kernel_momentum")
        ),
    }
    assert recasts(sorted(separate), stacked, STACKS) == {
        "block_0/mlp/kernel": Recast(("blocks/stacked_mlp_kernel",), row=0),
        "block_1/mlp/kernel": Recast(("blocks/stacked_mlp_kernel",), row=1),
        "adam/block_0_mlp_kernel_momentum": Recast(("adam/blocks_stacked_mlp_kernel_momentum",), row=0),
        "adam/block_1_mlp_kernel_momentum": Recast(("adam/blocks_stacked_mlp_kernel_momentum",), row=1),
    }
    assert (
        recasts(["block_1/mlp/kernel"], {"block_0/mlp/kernel"}, STACKS) == {}
    )  # nothing to make it from: not recast


def _with(raw: dict, **changes) -> dict:
    return {**raw, **changes, "train": {**raw["train"], **changes.get("train", {})}}


@pytest.mark.integration
@pytest.mark.parametrize(
    "first, second",
    [
        ("pipelined", "separate"),
        ("separate", "pipelined"),
        ("circular", "separate"),
        ("separate", "circular"),
        ("circular", "gpipe"),
    ],
)
def test_a_checkpoint_resumes_with_and_without_stages_as_the_run_it_stands_for(tmp_path, first, second):
    """Either form into the other; and a circular run's stacks, (2, 2, ...), into a GPipe run's, (4, ...)."""
    import keras
    import numpy as np

    runs = {
        "pipelined": PIPELINED,
        "circular": CIRCULAR,
        "gpipe": _transformer("2x2x2", STAGES_TP, "transformer_tp", microbatches=2, layers=4),
        "separate": SEPARATE_4 if "circular" in (first, second) else SEPARATE,
    }
    whole = _reference_metrics(runs["separate"])["history"]["loss"]
    checkpoints = tmp_path / "checkpoints"
    shutil.copytree(_trained(runs[first])[1] / "checkpoints", checkpoints)
    shutil.rmtree(
        checkpoints / "8"
    )  # the first epoch's checkpoint (4 steps) is left, as a run of 1 epoch leaves
    resumed = train_in_process(
        _with(runs[second], checkpoint={"dir": str(checkpoints), "export": True}), tmp_path / "resumed"
    ).metrics
    assert resumed["checkpoint"]["resumed_at_step"] == 4
    assert resumed["history"]["loss"][1] == pytest.approx(
        whole[1], rel=2e-5
    )  # the optimizer's state came along too

    import meshrun.models.transformer_layers  # noqa: F401 (registers the zoo transformer's layers)

    exported = keras.saving.load_model(tmp_path / "resumed" / "model.keras")
    assert not any("stacked" in v.path for v in exported.weights)  # separate blocks, whatever the run held
    tokens = np.arange(64).reshape(2, 32) % 512
    logits = exported.predict(tokens, verbose=0)
    assert logits.shape == (2, 32, 512) and np.isfinite(logits).all()


# The factory of docs/jobs/pipeline.md ("Your own model"), in a module of the test's own.
FACTORY = """
import keras
from meshrun.pipeline import repeated_blocks

class Residual(keras.layers.Layer):
    def __init__(self, width, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(width, activation="gelu", name="dense")

    def build(self, shape):
        self.dense.build(shape)

    def call(self, x):
        return x + self.dense(x)

def deep_mlp(width=256, depth=8):
    inputs = keras.Input((width,))
    x = repeated_blocks(lambda name: Residual(width, name=name), depth)(inputs)
    return keras.Model(inputs, keras.layers.Dense(10, name="head")(x))
"""


@pytest.mark.integration
def test_a_python_factory_opts_in_with_repeated_blocks_as_the_readme_shows(in_tmp):
    (in_tmp / "pipelined_mlps.py").write_text(FACTORY)

    def run(mesh: str, names: list) -> Trained:
        return train_in_process(
            {
                "mesh": {"shape": mesh, "axis_names": names, "batch_axis": "data"},
                "layout": {},
                "model": {
                    "name": "python",
                    "factory": "pipelined_mlps:deep_mlp",
                    "kwargs": {"width": 32, "depth": 4},
                },
                "data": {"name": "synthetic", "num_samples": 64, "eval_samples": 16},
                "train": {"epochs": 2, "verbose": 0, "batch_size": 16, "loss": "mse"},
                "pipeline": {"microbatches": 2},
            }
        )

    staged, separate = run("4x2", ["stage", "data"]), run("2", ["data"])
    assert staged.metrics["history"]["loss"] == pytest.approx(separate.metrics["history"]["loss"], rel=2e-5)
    assert staged.plan.pipeline.stage_blocks == (("block_0",), ("block_1",), ("block_2",), ("block_3",))
    assert {p.path for p in separate.plan.variables} >= {"block_3/dense/kernel", "head/kernel"}
    assert {p.path: p.spec for p in staged.plan.variables}["blocks/stacked_dense_kernel"] == (
        "stage",
        None,
        None,
    )


@pytest.mark.e2e
def test_stages_across_two_processes_train_as_one_process_with_separate_blocks(tmp_path):
    """Each of 2 local processes holds one stage (mesh 2x4: the stage axis crosses processes), so the
    hand-on between stages leaves the process."""
    done = run_meshrun(
        [
            "train",
            "distributed.local_processes=2",
            "model=transformer",
            "mesh=2x4",
            "mesh.axis_names=[stage,data]",
            "mesh.batch_axis=data",
            "layout=replicated",
            "pipeline.microbatches=2",
            "data.num_samples=64",
            "data.eval_samples=16",
            "train.epochs=2",
            "train.verbose=0",
            "hydra.run.dir=run",
        ],
        cwd=tmp_path,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["distributed"]["processes"] == 2
    reference = _reference_metrics(_transformer("4", ["data"], "replicated"))["history"]["loss"]
    assert metrics["history"]["loss"] == pytest.approx(reference, rel=2e-5)


@pytest.mark.integration
def test_a_layout_saved_from_a_pipelined_plan_is_written_for_separate_blocks(in_tmp, capsys):
    stage_mesh = ["mesh=2x2x2", "mesh.axis_names=[stage,data,model]", "mesh.batch_axis=data"]
    done = cli_here(
        ["plan", "model=transformer", *stage_mesh, "layout=transformer_tp", "--save-layout", "saved.yaml"],
        capsys,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    text = (in_tmp / "saved.yaml").read_text()
    assert "block_\\d+/mlp_up/kernel: [null, model]" in text and "stacked" not in text
    for mesh in (stage_mesh, ["mesh=2x4"]):  # the same file serves a run with stages and one without
        done = cli_here(["plan", "--json", "model=transformer", *mesh, "layout=saved.yaml"], capsys)
        assert done.returncode == 0, done.stderr[-2000:]
        assert json.loads(done.stdout)["status"] == "ok"


@pytest.mark.e2e
def test_a_sweep_over_microbatches_reports_the_idle_share_by_the_formula_and_fitted(in_tmp, capsys):
    # PIPELINED's model and mesh (2 stages; the job of 2 microbatches finds its step compiled)
    done = cli_here(
        [
            "train",
            "-m",
            "model=transformer",
            "model.layers=2",
            "mesh=2x2x2",
            "mesh.axis_names=[stage,data,model]",
            "mesh.batch_axis=data",
            "layout=transformer_tp",
            "pipeline.microbatches=1,2,4",
            "train.epochs=2",
            "train.verbose=0",
            "train.batch_size=16",
            "data.num_samples=64",
            "data.eval_samples=16",
            "hydra.sweep.dir=sweep",
        ],
        capsys,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {
        row["microbatches"]: row
        for row in json.loads((in_tmp / "sweep" / "summary.json").read_text())["rows"]
    }
    assert sorted(rows) == [1, 2, 4]
    assert [rows[m]["bubble_formula"] for m in (1, 2, 4)] == [
        pytest.approx(1 / 2),
        pytest.approx(1 / 3),
        pytest.approx(1 / 5),
    ]
    assert all(0 <= rows[m]["bubble_fit"] < 1 and rows[m]["stages"] == 2 for m in rows)
    assert "idle (formula, fit)" in done.stdout
