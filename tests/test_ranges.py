"""Data out of the model's range never trains silently: class labels at or above the model's output
width and token ids at or above a language model's vocabulary are one line with exit 2, naming the
largest value and the limit, whether they sit in the first batch (found before training) or
further on in the stream (found as the batch passes)."""

import numpy as np
import pytest

from meshrun import cli
from meshrun.data import ranges
from meshrun.data.batches import indexed_batches
from meshrun.errors import ConfigError
from meshrun.models.registry import InputSpec
from meshrun.run.build import Signature

pytestmark = pytest.mark.integration

LM = Signature(
    inputs=(InputSpec("padding_mask", (8,), "int32"), InputSpec("token_ids", (8,), "int32")),
    outputs=(InputSpec(None, (8, 50), "float32"),),
)
CLASSIFIER = Signature(
    inputs=(InputSpec(None, (4,), "float32"),), outputs=(InputSpec(None, (10,), "float32"),)
)


def test_limits_come_from_the_output_width_and_the_loss():
    lm = ranges.limits(LM, "sparse_categorical_crossentropy", language_model=True, source="arrays")
    assert (lm.token_input, lm.vocabulary, lm.classes) == ("token_ids", 50, 50)
    classifier = ranges.limits(
        CLASSIFIER, "sparse_categorical_crossentropy", language_model=False, source="arrays"
    )
    assert (classifier.vocabulary, classifier.classes) == (None, 10)
    assert not ranges.limits(CLASSIFIER, "mean_squared_error", language_model=False, source="arrays").checks


def test_a_bad_id_deep_in_the_stream_stops_the_batch_that_holds_it():
    limits = ranges.limits(LM, "sparse_categorical_crossentropy", language_model=True, source="arrays")
    tokens = np.random.default_rng(0).integers(0, 50, (64, 9)).astype(np.int32)
    tokens[50, 3] = 77
    x = {"token_ids": tokens[:, :-1], "padding_mask": np.ones((64, 8), np.int32)}
    batches = ranges.checked(
        indexed_batches(x, tokens[:, 1:], np.arange(64), 8, shuffle=False, seed=0), limits
    )
    read = []
    with pytest.raises(ConfigError) as caught:
        for batch in batches:
            read.append(batch)
    assert len(read) == 6  # rows 48-55 hold the bad id: the seventh batch
    assert str(caught.value) == (
        "data: data=arrays: token ids reach 77, but the model's vocabulary holds 50 ids (valid: 0 to 49); "
        "tokenize with the model's own tokenizer, or give a model whose vocabulary covers them"
    )


def run_error(args, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", "train.verbose=0", "train.epochs=1", *args])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("meshrun")]
    assert exit_info.value.code == 2 and len(lines) == 1, lines
    return lines[0]


def test_class_labels_beyond_the_outputs_are_one_line_with_exit_2(in_tmp, capsys):
    np.savez(in_tmp / "d.npz", x=np.zeros((64, 4), np.float32), y=np.arange(64) % 20)
    line = run_error(
        [
            "data=arrays",
            "data.path=d.npz",
            "model.input_shape=[4]",
            "train.loss=sparse_categorical_crossentropy",
            "train.batch_size=32",
            "mesh=8x1",
        ],
        capsys,
    )
    assert line == (
        "meshrun: error: data: data=arrays: class labels reach 19, but the model's output has 10 classes "
        "(valid: 0 to 9); give a model with as many outputs as there "
        "are classes (model.num_classes), or relabel them from 0"
    )


def test_token_ids_beyond_the_vocabulary_are_found_mid_stream(in_tmp, capsys):
    tokens = np.random.default_rng(1).integers(0, 256, (64, 17)).astype(np.int32)
    tokens[40, 5] = 300  # not in the first batches
    np.savez(
        in_tmp / "t.npz", token_ids=tokens[:, :-1], padding_mask=np.ones((64, 16), np.int32), y=tokens[:, 1:]
    )
    line = run_error(
        [
            "model=keras_hub",
            "model.task=LlamaCausalLM",
            "model.seq_len=16",
            "data=arrays",
            "data.path=t.npz",
            "model.backbone={vocabulary_size:256,num_layers:1,num_query_heads:2,num_key_value_heads:2,hidden_dim:16,intermediate_dim:32}",
            "data.features_key=[token_ids,padding_mask]",
            "data.shuffle=false",
            "train.batch_size=8",
            "mesh=8x1",
        ],
        capsys,
    )
    assert line.startswith(
        "meshrun: error: data: data=arrays: token ids reach 300, "
        "but the model's vocabulary holds 256 ids (valid: 0 to 255)"
    )
