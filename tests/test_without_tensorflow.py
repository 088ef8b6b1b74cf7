"""meshrun without TensorFlow, as its default install has it (TensorFlow is the `tf` extra): in a venv
that sees every package installed here but TensorFlow, the README's main job runs (with the
TensorBoard sink on), a KerasHub model trains on the Grain feed, and every source that needs
TensorFlow (data=tfrecord, a tf.data factory, a KerasHub preset's tokenizer) says so in one line,
exit 2, with the command that installs it. The TensorBoard sink's record writer, written without
TensorFlow, writes the bytes TensorFlow's TFRecordWriter writes."""

import json
import subprocess
from pathlib import Path

import pytest

from conftest import FAST, one_error_line, read_metrics
from meshrun.logs.sinks.tensorboard_events import TFRecordFile
from meshrun.measure import venv_without_tensorflow

INSTALL = "pip install 'meshrun[tf]'"
LLAMA = ["model=keras_hub", "model.task=LlamaCausalLM", "model.seq_len=16", "layout=from_model",
         "model.backbone={vocabulary_size:256,num_layers:2,num_query_heads:8,num_key_value_heads:4,hidden_dim:64,intermediate_dim:128}"]


@pytest.fixture(scope="module")
def python_without_tensorflow(tmp_path_factory) -> Path:
    """The python of a venv that links in every entry of this interpreter's site-packages but
    TensorFlow's: the packages installed here (meshrun's editable install included), TensorFlow not
    installed, as `import tensorflow` and importlib.util.find_spec("tensorflow") both find."""
    python = venv_without_tensorflow(tmp_path_factory.mktemp("no-tensorflow"))
    done = subprocess.run([python, "-c", "import importlib.util, meshrun, keras; print(importlib.util.find_spec('tensorflow'))"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "None", done.stderr[-2000:]
    return python


def meshrun(python: Path, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", "meshrun", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.e2e
def test_the_main_job_runs_and_writes_tensorboard_events_without_tensorflow(python_without_tensorflow, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    done = meshrun(python_without_tensorflow, ["train", "mesh=2x4", "layout=dense_model", *FAST, "logging.tensorboard=true",
                                               f"hydra.run.dir={run}"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = read_metrics(run)
    assert metrics["status"] == "ok"
    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})  # TensorFlow's reader here: CRCs checked
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == list(range(1, 17))
    assert [e.value for e in events.Scalars("epoch/loss")] == pytest.approx(metrics["history"]["loss"])


@pytest.mark.e2e
@pytest.mark.integration
def test_a_keras_hub_model_trains_on_the_grain_feed_without_tensorflow(python_without_tensorflow, tmp_path):
    run = tmp_path / "run"
    done = meshrun(python_without_tensorflow, ["train", *LLAMA, "mesh=2x4", "train.verbose=0", "train.epochs=1", "data.num_samples=64",
                                               "data.eval_samples=16", f"hydra.run.dir={run}"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert read_metrics(run)["status"] == "ok"


TFRECORD = ["data=tfrecord", "data.files=*.tfrecord", "data.features={x:{dtype:float32,shape:[784]},y:{dtype:int64,shape:[]}}"]


@pytest.mark.e2e
@pytest.mark.parametrize("args, expected", [
    (TFRECORD, f"meshrun: error: data: data=tfrecord needs TensorFlow, which is not installed: {INSTALL}"),
    (["data=python", "data.factory=tf_factory:dataset"],
     "meshrun: error: data.factory: tf_factory:dataset(split='train') raised ModuleNotFoundError: No module named 'tensorflow'; "
     f"TensorFlow is not installed: {INSTALL}"),
], ids=["tfrecord", "tf.data factory"])
def test_a_source_that_needs_tensorflow_says_how_to_install_it(python_without_tensorflow, tmp_path, args, expected):
    (tmp_path / "train.tfrecord").write_bytes(b"")
    (tmp_path / "tf_factory.py").write_text("def dataset(split, seed):\n    import tensorflow as tf\n    return tf.data.Dataset.range(8)\n")
    run = tmp_path / "run"
    done = meshrun(python_without_tensorflow, ["train", *args, "train.verbose=0", f"hydra.run.dir={run}"], tmp_path)
    assert one_error_line(done) == expected
    assert not run.exists()


LOAD_TOKENIZERS = """
import json, sys
from meshrun.errors import ConfigError
from meshrun.text.tokenizer import load_tokenizer
try:
    load_tokenizer(sys.argv[1], "data.tokenizer")
    preset = "loaded"
except ConfigError as error:
    preset = str(error)
ids = load_tokenizer(sys.argv[2], "data.tokenizer").encode(["a cat"])
print(json.dumps({"preset": preset, "tokenizer.json": [[int(i) for i in row] for row in ids]}))
"""


@pytest.mark.e2e
def test_a_keras_hub_presets_tokenizer_says_it_needs_tensorflow_and_a_tokenizer_json_needs_none(python_without_tensorflow, text_files, tmp_path):
    from meshrun.text.tokenizer import load_tokenizer
    from presets import hf_tokenizer_json

    hf = hf_tokenizer_json(tmp_path / "hf", text_files.corpus.read_text())
    done = subprocess.run([python_without_tensorflow, "-c", LOAD_TOKENIZERS, str(text_files.gemma), str(hf)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["preset"] == ("data.tokenizer: a KerasHub preset's tokenizer (checked against KerasHub's TensorFlow graph) "
                                 f"needs TensorFlow, which is not installed: {INSTALL}")
    assert outcome["tokenizer.json"] == [[int(i) for i in row] for row in load_tokenizer(str(hf), "data.tokenizer").encode(["a cat"])]


def test_the_record_writer_writes_the_bytes_tensorflows_does(tmp_path):
    tf = pytest.importorskip("tensorflow", reason="TensorFlow's TFRecordWriter is the reference (meshrun[tf], meshrun[dev])")
    records = [b"", b"x", bytes(range(256)) * 40, "événement".encode()]
    ours = TFRecordFile(tmp_path / "ours")
    with tf.io.TFRecordWriter(str(tmp_path / "tensorflows")) as theirs:
        for record in records:
            ours.write(record)
            theirs.write(record)
    ours.close()
    assert (tmp_path / "ours").read_bytes() == (tmp_path / "tensorflows").read_bytes()
    assert [r.numpy() for r in tf.data.TFRecordDataset(str(tmp_path / "ours"))] == records
