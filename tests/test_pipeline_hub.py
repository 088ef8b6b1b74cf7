"""KerasHub decoder-only LMs as pipeline stages (issue 33): their backbone's transformer_layers run
as stages through the CLI on 8 emulated CPU devices, with meshrun's own layouts inside a stage; a
pipelined run trains as the unpipelined one (losses, a preset's LoRA fine-tune, its samples and
export); its checkpoint resumes without stages and `meshrun generate` completes from it; blocks
that differ or keep state are one line, exit 2."""

import json
import shutil

import numpy as np
import pytest

from conftest import cli_here, read_metrics, run_meshrun, train_here
from meshrun import cli

pytestmark = pytest.mark.integration

LLAMA = [
    "model=keras_hub",
    "model.task=LlamaCausalLM",
    "model.backbone={vocabulary_size:256,num_layers:4,num_query_heads:8,num_key_value_heads:4,hidden_dim:64,intermediate_dim:128}",
    "train.verbose=0",
    "train.epochs=2",
    "data.num_samples=64",
    "data.eval_samples=16",
    "model.seq_len=16",
    "layout=llama_tp",
]
STAGES = ["mesh=2x2x2", "mesh.axis_names=[stage,data,model]", "mesh.batch_axis=data"]
PROMPT = "The cat"


@pytest.fixture(scope="module")
def separate(tmp_path_factory):
    """The Llama without stages, on 4x2 (data, model), checkpointed every epoch."""
    run_dir = tmp_path_factory.mktemp("hub-stages") / "separate"
    return train_here([*LLAMA, "mesh=4x2", "checkpoint.every_epoch=true"], run_dir), run_dir


def test_a_llamas_layers_run_as_stages_with_tensor_parallelism_inside_and_the_same_losses(separate, tmp_path):
    reference = separate[0]
    staged = train_here([*LLAMA, *STAGES, "pipeline.microbatches=2"], tmp_path / "staged")
    assert staged["history"]["loss"] == pytest.approx(reference["history"]["loss"], rel=2e-5)
    assert staged["eval"]["loss"] == pytest.approx(reference["eval"]["loss"], rel=2e-5)
    query = staged["sharding"]["transformer_layers/stacked_self_attention_query_kernel"]
    assert (query["shape"], query["spec"]) == (
        [4, 64, 8, 8],
        ["stage", None, "model", None],
    )  # llama_tp's heads split inside a stage
    assert query["rule"] == r"transformer_layer_\d+/self_attention/(query|key|value)/kernel"
    assert staged["sharding"]["token_embedding/embeddings"]["spec"] == [
        "model",
        None,
    ]  # the task's own layers, as laid out
    plan = json.loads((tmp_path / "staged" / "plan.json").read_text())["pipeline"]
    assert plan["stage_blocks"] == [
        ["transformer_layer_0", "transformer_layer_1"],
        ["transformer_layer_2", "transformer_layer_3"],
    ]
    assert plan["kept_activation_bytes_per_device"] > 0  # the sequence length is known: model.seq_len


def test_the_circular_schedule_with_remat_trains_a_llama_as_separate_blocks_do(separate, tmp_path):
    circular = train_here(
        [*LLAMA, *STAGES, "pipeline.microbatches=4", "pipeline.repeats=2", "pipeline.remat=true"],
        tmp_path / "circular",
    )
    assert circular["history"]["loss"] == pytest.approx(separate[0]["history"]["loss"], rel=2e-5)
    assert circular["sharding"]["transformer_layers/stacked_feedforward_gate_dense_kernel"]["spec"] == [
        None,
        "stage",
        None,
        "model",
    ]


def test_a_checkpoint_without_stages_resumes_with_them_as_the_run_it_stands_for(separate, tmp_path):
    reference, run_dir = separate
    checkpoints = tmp_path / "checkpoints"
    shutil.copytree(run_dir / "checkpoints", checkpoints)
    shutil.rmtree(checkpoints / "8")  # the first epoch's checkpoint (4 steps) is left
    resumed = train_here(
        [*LLAMA, *STAGES, "pipeline.microbatches=2", f"checkpoint.dir={checkpoints}"], tmp_path / "resumed"
    )
    assert resumed["checkpoint"]["resumed_at_step"] == 4
    assert resumed["history"]["loss"][1] == pytest.approx(
        reference["history"]["loss"][1], rel=2e-5
    )  # the optimizer's state came along


@pytest.mark.e2e
def test_two_processes_each_holding_a_stage_of_a_llama_train_as_one_process_without_stages(
    separate, tmp_path
):
    """Each block's weights are made on its own stage's process alone, and stacked there."""
    done = run_meshrun(
        [
            "train",
            *LLAMA,
            *STAGES,
            "distributed.local_processes=2",
            "pipeline.microbatches=2",
            "hydra.run.dir=run",
        ],
        cwd=tmp_path,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = read_metrics(tmp_path / "run")
    assert metrics["distributed"]["processes"] == 2
    assert metrics["history"]["loss"] == pytest.approx(separate[0]["history"]["loss"], rel=2e-5)


@pytest.fixture(scope="module")
def gemma_runs(text_files, tmp_path_factory):
    """A LoRA fine-tune of the tiny Gemma preset with samples, checkpoints and an export: with 2
    stages (its 2 decoder blocks) and without, same batch."""
    out = tmp_path_factory.mktemp("gemma-stages")
    common = [
        "model=keras_hub",
        f"model.preset={text_files.gemma}",
        "layout=gemma_tp",
        "model.seq_len=32",
        "train.epochs=1",
        "train.verbose=0",
        "data.num_samples=32",
        "data.eval_samples=16",
        "model.lora.rank=4",
        "checkpoint.every_epoch=true",
        "checkpoint.export=true",
        f"train.sample_prompts=['{PROMPT}']",
        "train.sample_max_length=24",
    ]
    return {
        "staged": (train_here([*common, *STAGES], out / "staged"), out / "staged"),
        "separate": (train_here([*common, "mesh=2x4"], out / "separate"), out / "separate"),
    }


def test_a_presets_lora_fine_tune_with_stages_trains_samples_and_exports_as_without(gemma_runs):
    import keras_hub

    staged, staged_dir = gemma_runs["staged"]
    separate, separate_dir = gemma_runs["separate"]
    assert staged["history"]["loss"] == pytest.approx(separate["history"]["loss"], rel=2e-5)
    assert (
        staged["model"]["trainable_params"] == separate["model"]["trainable_params"]
    )  # the adapters alone train, stacked
    assert (
        staged["sharding"]["transformer_layers/stacked_attention_query_lora_kernel_a"]["spec"][0] == "stage"
    )
    assert staged["samples"] == separate["samples"] and staged["samples"][0]["prompt"] == PROMPT
    # Each block's weights were loaded onto its stage's devices alone. Loaded into every device first, the
    # peak was 3.5 times the parameters a device holds; 1.12 times now (what other runs of this process
    # left on the devices is not the load's).
    memory = staged["memory"]
    assert memory["load_peak_bytes_per_device"] < 1.3 * memory["params_bytes_per_device"]
    assert sorted(
        p.name for p in staged_dir.iterdir() if p.name in ("model.keras", "preset", "adapter.lora.h5")
    ) == ["adapter.lora.h5", "model.keras", "preset"]
    exported = keras_hub.models.CausalLM.from_preset(
        str(staged_dir / "preset"), preprocessor=None
    )  # separate blocks, as KerasHub writes them
    reference = keras_hub.models.CausalLM.from_preset(str(separate_dir / "preset"), preprocessor=None)
    mine = {v.path: np.asarray(v) for v in exported.backbone.variables}
    assert len(exported.backbone.transformer_layers) == 2 and mine.keys() == {
        v.path for v in reference.backbone.variables
    }
    for variable in reference.backbone.variables:
        np.testing.assert_allclose(
            mine[variable.path], np.asarray(variable), atol=2e-6, err_msg=variable.path
        )


def test_a_pipelined_gemma_counts_the_flops_of_the_same_model_without_stages_and_its_bubble_apart(gemma_runs):
    from meshrun.specs.metrics import RunMetrics

    staged, separate = gemma_runs["staged"][0], gemma_runs["separate"][0]
    flops = staged["flops"]
    # XLA counts a loop's body once: the schedule's loops had the pipelined step counted 1.9x short here.
    assert flops["per_step"] == pytest.approx(separate["flops"]["per_step"], rel=0.01)
    assert flops["analytic_over_xla"] == pytest.approx(separate["flops"]["analytic_over_xla"], rel=0.01)
    # 2 stages, 2 microbatches (one per stage): 1 of each stage's 3 ticks is the bubble's, which computes half
    # the blocks' work more; the blocks are most of this model's
    assert (
        flops["bubble_fraction"] == pytest.approx(1 / 3)
        and 0.25 * flops["per_step"] < flops["bubble_per_step"] < 0.5 * flops["per_step"]
    )
    row = dict(RunMetrics.from_json(staged).summary())["flops"]
    assert row.endswith(
        f"\npipeline bubble: 33.3% of each stage's ticks, {flops['bubble_per_step']:.3g} FLOPs more "
        "(discarded, not counted above)"
    ), row
    assert (
        separate["flops"]["bubble_per_step"] is None
        and "bubble" not in dict(RunMetrics.from_json(separate).summary())["flops"]
    )


def test_meshrun_generate_completes_from_a_pipelined_runs_checkpoint(gemma_runs, in_tmp, capsys):
    staged, staged_dir = gemma_runs["staged"]
    run_dir = in_tmp / "run"
    shutil.copytree(staged_dir, run_dir)
    shutil.rmtree(run_dir / "preset")  # no export to read: the checkpoint holds the stacked weights
    # The CLI in this process (test_generate starts `meshrun generate` processes): the same output, the same
    # exit status.
    done = cli_here(["generate", str(run_dir), "--prompt", PROMPT, "--max-length", "24", "--json"], capsys)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == staged["samples"]


GEMMA_SLIDING = (
    "model.backbone={vocabulary_size:256,num_layers:2,num_query_heads:8,num_key_value_heads:4,hidden_dim:64,"
    "intermediate_dim:128,head_dim:8,use_sliding_window_attention:true}"
)


@pytest.mark.parametrize(
    "args, text",
    [
        (
            ["model.task=GemmaCausalLM", GEMMA_SLIDING],
            "but its blocks differ: use_sliding_window_attention is False in decoder_block_1 and True in "
            "decoder_block_0; stages run one block repeated",
        ),
        (
            [
                "model.task=GPT2CausalLM",
                "model.backbone={vocabulary_size:256,num_layers:2,num_heads:4,hidden_dim:64,intermediate_dim:128,max_sequence_length:32}",
            ],
            "but its blocks keep state besides their weights (self_attention/seed_generator",
        ),
    ],
)
def test_hub_blocks_that_differ_or_keep_state_are_one_line(args, text, in_tmp, capsys):
    with pytest.raises(
        SystemExit
    ) as exit_info:  # the CLI in this process: the same line, the same exit status
        cli.main(
            [
                "train",
                "model=keras_hub",
                *args,
                "model.seq_len=16",
                "mesh=2x4",
                "mesh.axis_names=[stage,data]",
                "mesh.batch_axis=data",
                "layout=replicated",
            ]
        )
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1 and lines[0].startswith("meshrun: error: "), err[
        -2000:
    ]
    line = lines[0]
    assert line.startswith("meshrun: error: mesh.axis_names: got a stage axis 'stage' for ") and text in line
    assert not list(in_tmp.glob("outputs/*/*/model.keras"))
