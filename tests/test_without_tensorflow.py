"""meshrun without TensorFlow, as its default install has it (TensorFlow is the `tf` extra): in a venv
that sees every package installed here but TensorFlow, the README's main job runs (with the
TensorBoard sink on), a KerasHub model trains on the Grain feed, a KerasHub preset fine-tunes on
text, completes its sample prompts and `meshrun generate` completes them from its export as a
process with TensorFlow does, KerasHub preset tokenizers encode as they do with TensorFlow, and
every source that needs TensorFlow (data=tfrecord, a tf.data factory, a tokenizer that splits text
its own way) says so in one line, exit 2, with the command that installs it. The TensorBoard sink's
record writer, written without TensorFlow, writes the bytes TensorFlow's TFRecordWriter writes."""

import json
import subprocess
from pathlib import Path

import pytest

from conftest import FAST, one_error_line, read_metrics
from meshrun.logs.sinks.tensorboard_events import TFRecordFile
from meshrun.measure import venv_without_tensorflow

INSTALL = "pip install 'meshrun[tf]'"
LLAMA = [
    "model=keras_hub",
    "model.task=LlamaCausalLM",
    "model.seq_len=16",
    "layout=from_model",
    "model.backbone={vocabulary_size:256,num_layers:2,num_query_heads:8,num_key_value_heads:4,hidden_dim:64,intermediate_dim:128}",
]


@pytest.fixture(scope="module")
def python_without_tensorflow(tmp_path_factory) -> Path:
    """The python of a venv that links in every entry of this interpreter's site-packages but
    TensorFlow's: the packages installed here (meshrun's editable install included), TensorFlow not
    installed, as `import tensorflow` and importlib.util.find_spec("tensorflow") both find."""
    python = venv_without_tensorflow(tmp_path_factory.mktemp("no-tensorflow"))
    done = subprocess.run(
        [
            python,
            "-c",
            "import importlib.util, meshrun, keras; print(importlib.util.find_spec('tensorflow'))",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip() == "None", done.stderr[-2000:]
    return python


def meshrun(python: Path, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [python, "-m", "meshrun", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


@pytest.mark.e2e
def test_the_main_job_runs_and_writes_tensorboard_events_without_tensorflow(
    python_without_tensorflow, tmp_path
):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    done = meshrun(
        python_without_tensorflow,
        [
            "train",
            "mesh=2x4",
            "layout=dense_model",
            *FAST,
            "logging.tensorboard=true",
            f"hydra.run.dir={run}",
        ],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = read_metrics(run)
    assert metrics["status"] == "ok"
    events = EventAccumulator(
        str(run / "tensorboard"), size_guidance={"scalars": 0}
    )  # TensorFlow's reader here: CRCs checked
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == list(range(1, 17))
    assert [e.value for e in events.Scalars("epoch/loss")] == pytest.approx(metrics["history"]["loss"])


@pytest.mark.e2e
@pytest.mark.integration
def test_a_keras_hub_model_trains_on_the_grain_feed_without_tensorflow(python_without_tensorflow, tmp_path):
    run = tmp_path / "run"
    done = meshrun(
        python_without_tensorflow,
        [
            "train",
            *LLAMA,
            "mesh=2x4",
            "train.verbose=0",
            "train.epochs=1",
            "data.num_samples=64",
            "data.eval_samples=16",
            f"hydra.run.dir={run}",
        ],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert read_metrics(run)["status"] == "ok"


TFRECORD = [
    "data=tfrecord",
    "data.files=*.tfrecord",
    "data.features={x:{dtype:float32,shape:[784]},y:{dtype:int64,shape:[]}}",
]


@pytest.mark.e2e
@pytest.mark.parametrize(
    "args, expected",
    [
        (
            TFRECORD,
            f"meshrun: error: data: data=tfrecord needs TensorFlow, which is not installed: {INSTALL}",
        ),
        (
            ["data=python", "data.factory=tf_factory:dataset"],
            "meshrun: error: data.factory: tf_factory:dataset(split='train') raised ModuleNotFoundError: No "
            f"module named 'tensorflow'; TensorFlow is not installed: {INSTALL}",
        ),
    ],
    ids=["tfrecord", "tf.data factory"],
)
def test_a_source_that_needs_tensorflow_says_how_to_install_it(
    python_without_tensorflow, tmp_path, args, expected
):
    (tmp_path / "train.tfrecord").write_bytes(b"")
    (tmp_path / "tf_factory.py").write_text(
        "def dataset(split, seed):\n    import tensorflow as tf\n    return tf.data.Dataset.range(8)\n"
    )
    run = tmp_path / "run"
    done = meshrun(
        python_without_tensorflow, ["train", *args, "train.verbose=0", f"hydra.run.dir={run}"], tmp_path
    )
    assert one_error_line(done) == expected
    assert not run.exists()


LOAD_TOKENIZERS = """
import json, sys
from meshrun.errors import ConfigError
from meshrun.text.tokenizer import load_tokenizer
texts, outcome = json.loads(sys.argv[1]), {}
for source in sys.argv[2:]:
    try:
        tokenizer = load_tokenizer(source, "data.tokenizer")
        outcome[source] = [tokenizer.backend, [[int(i) for i in ids] for ids in tokenizer.encode(texts)]]
    except ConfigError as error:
        outcome[source] = str(error)
print(json.dumps(outcome))
"""
TEXTS = [
    "a cat",
    "Instruction: Reverse the words: red blue\nResponse: ",
    "  two  spaces,   three and 3.14159 in 2024 ",
    "café 東京 🙂",
]


@pytest.mark.e2e
def test_hub_preset_tokenizers_encode_as_with_tensorflow_and_one_splitting_its_own_way_says_it_needs_it(
    python_without_tensorflow, text_files, tmp_path
):
    """Gemma's SentencePiece and GPT-2's byte-level BPE load from their presets and encode as this
    process (with TensorFlow, so checked against KerasHub's graph) does; a tokenizer.json as well;
    Mistral's Tekken, which only KerasHub's graph encodes right, is one line naming TensorFlow."""
    from meshrun.text.tokenizer import load_tokenizer
    from presets import hf_tokenizer_json, mistral_tekken_preset

    text = text_files.corpus.read_text()
    hf, tekken = hf_tokenizer_json(tmp_path / "hf", text), mistral_tekken_preset(tmp_path / "tekken", text)
    sources = [str(text_files.gemma), str(text_files.gpt2), str(hf)]
    done = subprocess.run(
        [python_without_tensorflow, "-c", LOAD_TOKENIZERS, json.dumps(TEXTS), *sources, str(tekken)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    for source in sources:
        tokenizer = load_tokenizer(source, "data.tokenizer")
        assert outcome[source] == [tokenizer.backend, [ids.tolist() for ids in tokenizer.encode(TEXTS)]], (
            source
        )
    assert [outcome[source][0] for source in sources] == ["sentencepiece", "tokenizers", "tokenizers"]
    assert outcome[str(tekken)] == (
        f"data.tokenizer: MistralTekkenTokenizer of {tekken.resolve()} splits text its own way, which "
        "meshrun encodes with KerasHub's TensorFlow graph: "
        f"needs TensorFlow, which is not installed: {INSTALL}"
    )


FEW_PROMPTS = ["The cat", "Every morning the farmer"]


@pytest.mark.e2e
@pytest.mark.integration
def test_a_preset_fine_tunes_on_text_samples_and_generates_without_tensorflow(
    python_without_tensorflow, text_files, tmp_path, capsys
):
    """A Gemma preset fine-tuned with data=text, its sample prompts completed at the end and
    exported, then meshrun generate, both without TensorFlow: the completions are those this
    process (TensorFlow installed) generates from the same run, and they are not empty."""
    from meshrun import cli

    (tmp_path / "few_rows.txt").write_text(text_files.corpus.read_text()[:2000])
    run = tmp_path / "run"
    trained = meshrun(
        python_without_tensorflow,
        [
            "train",
            "model=keras_hub",
            f"model.preset={text_files.gemma}",
            "mesh=2x1",
            "layout=replicated",
            "model.seq_len=16",
            "data=text",
            "data.files=[few_rows.txt]",
            f"data.cache_dir={tmp_path / 'tokens'}",
            "train.epochs=1",
            "train.verbose=0",
            "train.batch_size=8",
            "checkpoint.export=true",
            f"train.sample_prompts={json.dumps(FEW_PROMPTS)}",
            "train.sample_max_length=24",
            f"hydra.run.dir={run}",
        ],
        tmp_path,
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    metrics = read_metrics(run)
    assert metrics["status"] == "ok" and metrics["data"]["tokenizer"].startswith(
        "GemmaTokenizer (SentencePiece)"
    )
    prompts = [f"--prompt={prompt}" for prompt in FEW_PROMPTS]
    generated = meshrun(
        python_without_tensorflow, ["generate", str(run), *prompts, "--max-length", "24", "--json"], tmp_path
    )
    assert generated.returncode == 0 and not generated.stderr.strip(), generated.stderr[-3000:]
    capsys.readouterr()
    cli.main(["generate", str(run), *prompts, "--max-length", "24", "--json"])
    with_tensorflow = json.loads(capsys.readouterr().out)
    assert json.loads(generated.stdout) == metrics["samples"] == with_tensorflow
    assert all(sample["completion"] for sample in with_tensorflow)


def test_the_record_writer_writes_the_bytes_tensorflows_does(tmp_path):
    tf = pytest.importorskip(
        "tensorflow", reason="TensorFlow's TFRecordWriter is the reference (meshrun[tf], meshrun[dev])"
    )
    records = [b"", b"x", bytes(range(256)) * 40, "événement".encode()]
    ours = TFRecordFile(tmp_path / "ours")
    with tf.io.TFRecordWriter(str(tmp_path / "tensorflows")) as theirs:
        for record in records:
            ours.write(record)
            theirs.write(record)
    ours.close()
    assert (tmp_path / "ours").read_bytes() == (tmp_path / "tensorflows").read_bytes()
    assert [r.numpy() for r in tf.data.TFRecordDataset(str(tmp_path / "ours"))] == records
