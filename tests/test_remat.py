"""train.remat through the CLI on 8 emulated CPU devices (mesh 2x4): what the backward pass
recomputes leaves every step's loss as it was (within 1e-6) for the zoo transformer and a tiny
KerasHub Llama, cuts the compiled step's memory of a model whose activations dominate by more than
half, and its bad values are one line each."""

import json

import pytest

from conftest import cli_here, one_error_line, train_here

pytestmark = pytest.mark.integration

# Activations dominate: 128 tokens of width 64 in 16 sequences against 4 blocks' weights and a
# vocabulary of 64 (the logits, which no block holds, stay small). With 2 blocks, blocks saves 1.7x:
# what one block makes while it is recomputed is a larger share. Dropout: a recomputed block's seed
# state leaves jax.checkpoint, and its recomputation draws the same mask.
TRANSFORMER = [
    "model=transformer",
    "model.layers=4",
    "model.dropout=0.1",
    "model.seq_len=128",
    "model.vocab=64",
    "mesh=2x4",
    "train.batch_size=16",
    "train.epochs=1",
    "train.verbose=0",
    "data.num_samples=32",
    "data.eval_samples=16",
]
# test_keras_hub's Llama on 2x4 under its own layout map: the run without remat is its run.
LLAMA = [
    "model=keras_hub",
    "model.task=LlamaCausalLM",
    "model.backbone={vocabulary_size:256,num_layers:1,num_query_heads:8,num_key_value_heads:4,"
    "hidden_dim:64,intermediate_dim:128}",
    "layout=from_model",
    "mesh=2x4",
    "train.verbose=0",
    "train.epochs=2",
    "data.num_samples=64",
    "data.eval_samples=16",
    "model.seq_len=16",
]


def step_losses(run_dir) -> list[float]:
    """Each training step's loss, as log.jsonl has it."""
    lines = (run_dir / "log.jsonl").read_text().splitlines()
    return [
        record["loss"] for record in map(json.loads, lines) if "epoch_end" not in record and "loss" in record
    ]


def trained(args, policy: str, tmp_path) -> tuple[dict, list[float]]:
    run_dir = tmp_path / policy
    metrics = train_here([*args, f"train.remat={policy}"], run_dir)
    assert metrics["train"]["remat"] == policy
    return metrics, step_losses(run_dir)


def assert_same_losses(ours: tuple[dict, list[float]], theirs: tuple[dict, list[float]]) -> None:
    assert len(ours[1]) == len(theirs[1]) >= 2
    assert max(abs(a - b) for a, b in zip(ours[1], theirs[1], strict=True)) < 1e-6
    assert abs(ours[0]["eval"]["loss"] - theirs[0]["eval"]["loss"]) < 1e-6


@pytest.mark.hub
def test_recomputed_blocks_of_a_llama_train_the_same(in_tmp, tmp_path):
    recomputed, kept = trained(LLAMA, "blocks", tmp_path), trained(LLAMA, "none", tmp_path)
    assert_same_losses(recomputed, kept)
    temp_bytes = [run[0]["memory"]["compiled"]["temp_bytes"] for run in (recomputed, kept)]
    assert temp_bytes[0] < temp_bytes[1]  # its block was recomputed (1 of 1: 0.73x here)


def test_remat_keeps_the_losses_and_halves_the_step_memory(in_tmp, tmp_path):
    """blocks and full against none: the same losses; the compiled step's temporaries and its peak
    on a device less than half of what they are without."""
    kept = trained(TRANSFORMER, "none", tmp_path)
    for policy in ("blocks", "full"):
        recomputed = trained(TRANSFORMER, policy, tmp_path)
        assert_same_losses(recomputed, kept)
        memory, memory_kept = recomputed[0]["memory"], kept[0]["memory"]
        assert memory["compiled"]["temp_bytes"] * 2 < memory_kept["compiled"]["temp_bytes"], policy
        assert memory["peak_bytes_per_device"] * 2 < memory_kept["peak_bytes_per_device"], policy


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["model=transformer", "train.remat=block"],
            "train.remat: got 'block'; did you mean blocks? valid: none, blocks, full or activations",
        ),
        (
            ["model=dense_model", "train.remat=blocks"],
            "train.remat: got 'blocks' for dense_model, which has no repeated blocks to recompute (blocks "
            "made with meshrun.pipeline.repeated_blocks, a KerasHub backbone's transformer_layers); "
            "train.remat=full recomputes every layer",
        ),
    ],
    ids=["unknown policy", "no blocks"],
)
def test_bad_remat_is_one_line(args, expected, in_tmp, capsys):
    done = cli_here(["train", *args, "mesh=2x4"], capsys)
    assert one_error_line(done) == f"meshrun: error: {expected}"


def test_with_stages_blocks_recomputes_each_stacked_block(in_tmp, capsys):
    """train.remat=blocks on a mesh with a stage axis is pipeline.remat=true (the plan says so)."""
    args = [
        "plan",
        "--json",
        "model=transformer",
        "layout=transformer_fsdp",
        "mesh=2x4",
        "mesh.axis_names=[stage,data]",
    ]
    plans = {}
    for policy in ("none", "blocks"):
        done = cli_here([*args, "mesh.batch_axis=data", f"train.remat={policy}"], capsys)
        assert done.returncode == 0, done.stderr[-2000:]
        plans[policy] = json.loads(done.stdout)["pipeline"]
    assert (plans["none"]["remat"], plans["blocks"]["remat"]) == (False, True)
