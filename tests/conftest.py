"""Test set-up: 8 emulated CPU devices and the jax backend, fixed before anything imports jax."""

import gc
import importlib.metadata
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import absl.logging
import pytest

import file_order

os.environ["KERAS_BACKEND"] = "jax"
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["JAX_NUM_CPU_DEVICES"] = "8"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


def tests_xla_cache() -> Path:
    """Where the tests keep XLA's compiled programs from one run of the suite to the next: the
    user's cache dir, one dir per version of jax, jaxlib and Keras (MESHRUN_TESTS_XLA_CACHE: another
    dir). JAX keys each program by its whole HLO, flags and jaxlib's version, so a program is loaded
    only where the same program would be compiled: a rerun tests what a fresh run tests."""
    given = os.environ.get("MESHRUN_TESTS_XLA_CACHE")
    if given:
        return Path(given)
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    versions = "-".join(f"{name}{importlib.metadata.version(name)}" for name in ("jax", "jaxlib", "keras"))
    return root / "meshrun" / "tests" / f"xla-{versions}"


XLA_CACHE_LIMIT_BYTES = 2 << 30


def open_xla_cache(cache: Path) -> str:
    """Makes the tests' XLA cache dir (private: meshrun refuses code from a dir others can write to),
    emptying it first once it has grown past XLA_CACHE_LIMIT_BYTES (jax's own limit needs filelock);
    whether it holds programs from an earlier run: "warm" or "cold"."""
    cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    entries = list(cache.iterdir())
    if sum(entry.stat().st_size for entry in entries if entry.is_file()) > XLA_CACHE_LIMIT_BYTES:
        for entry in entries:
            entry.unlink()
        entries = []
    return "warm" if entries else "cold"


def set_up_caches() -> None:
    """Sets up the caches of a session, in its first process (pytest's, before its workers start);
    the workers and the meshrun processes the tests start find them through the environment. The
    session's runs share one throw-away cache home (XDG_CACHE_HOME: tokens, tokenizer probes,
    fonts), but for XLA's compiled programs: $XDG_CACHE_HOME/meshrun/xla, where meshrun keeps them
    by default, links to the tests' lasting XLA cache."""
    home = Path(tempfile.mkdtemp(prefix="meshrun-test-cache-"))
    xla = tests_xla_cache()
    os.environ["MESHRUN_TESTS_XLA_CACHE"] = str(xla)
    os.environ["MESHRUN_TESTS_XLA_KIND"] = open_xla_cache(xla)
    (home / "meshrun").mkdir()
    (home / "meshrun" / "xla").symlink_to(xla)
    os.environ["MESHRUN_TESTS_CACHE_HOME"] = str(home)
    os.environ["MESHRUN_TESTS_CACHE_OWNER"] = str(os.getpid())


if "MESHRUN_TESTS_XLA_KIND" not in os.environ:
    set_up_caches()
os.environ["XDG_CACHE_HOME"] = os.environ["MESHRUN_TESTS_CACHE_HOME"]
# Every test process uses the XLA cache from its first compile (jax decides once a process).
os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(os.environ["XDG_CACHE_HOME"], "meshrun", "xla")
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"

# Hydra's logging set-up (logging.config.dictConfig, once per job) closes every handler ever
# created, and absl's handler closes its stream unless that stream is sys.stderr at the time. Under
# pytest's capture it is not, so in-process CLI tests would close pytest's own capture file.
absl.logging.get_absl_handler().python_handler.stream = sys.__stderr__

# The suite's layers (docs/getting-started.md, "Run the tests"): a test marked with none of these is a
# unit test.
LAYERS = ("integration", "e2e", "slurm")


def pytest_configure(config):
    """Keeps pytest-xdist to the order the files are collected in (file_order) and, in the process
    that hands out the tests, records how long each file took."""
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist 3.7+ would order by test count
        config.option.loadscopereorder = False
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(
            file_order.DurationRecorder(config, os.environ["MESHRUN_TESTS_XLA_KIND"])
        )


def pytest_unconfigure(config):
    """Removes the session's throw-away cache home, in the process that made it (not the XLA cache
    it links to)."""
    if os.environ.get("MESHRUN_TESTS_CACHE_OWNER") == str(os.getpid()):
        shutil.rmtree(os.environ["MESHRUN_TESTS_CACHE_HOME"], ignore_errors=True)


def pytest_collection_modifyitems(items):
    """Marks the tests of no other layer `unit` (`-m unit`: the quick set); runs the files slowest
    first (file_order), the tests inside each in their order."""
    for item in items:
        if not any(item.get_closest_marker(layer) for layer in LAYERS):
            item.add_marker(pytest.mark.unit)
    file_order.slowest_first(items, os.environ["MESHRUN_TESTS_XLA_KIND"])


# Python's cyclic garbage collector walks every object a process holds, and every in-process run
# walks at least twice (Keras' clear_session, as meshrun clears the session between runs). In a
# test worker that is the imports' half a million objects plus all that jax's caches of traced and
# compiled programs and the modules' fixtures gather over the session: walks of a second and more,
# a fifth of the suite's time. So after each test, once its garbage is collected, what is still
# alive is frozen out of the walks (gc.freeze): a run walks what it made itself. When a file's
# last test ends (its module fixtures gone), everything is walked once more, so that what the file
# held and let go is freed.


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After a test and its fixtures' teardown: collects its garbage and freezes what lives on; at
    the end of a file, first unfreezes everything, so that the whole process is collected."""
    result = yield
    if nextitem is None or nextitem.path != item.path:
        gc.unfreeze()
    gc.collect()
    gc.freeze()
    return result


# Small, fast runs of the seeds' model: 8 steps an epoch.
FAST = ["train.verbose=0", "data.num_samples=128", "data.eval_samples=32", "train.epochs=2"]


def run_meshrun(args, cwd, timeout=300):
    """Runs `python -m meshrun ARGS` in a subprocess in `cwd`; returns the CompletedProcess."""
    return subprocess.run(
        [sys.executable, "-m", "meshrun", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def cli_here(args, capture) -> subprocess.CompletedProcess:
    """`meshrun ARGS` run by the real CLI in this test process, as run_meshrun runs it in a fresh
    one, without the fresh process's start-up: its exit status and what it printed, as a
    CompletedProcess (`capture`: pytest's capsys, or capfd to take what native code writes to the
    file descriptors too). jax is started first, with this process's 8 devices: a plan started
    alone would start it with one."""
    import jax  # noqa: F401

    from meshrun import cli

    capture.readouterr()
    try:
        cli.main(args)
        returncode = 0
    except SystemExit as ended:
        returncode = ended.code if isinstance(ended.code, int) else 1
    out, err = capture.readouterr()
    return subprocess.CompletedProcess(["meshrun", *args], returncode, out, err)


def one_error_line(done) -> str:
    """The one `meshrun: error:` line of a run rejected with exit status 2 (asserting that is
    all it printed)."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("meshrun: error: "), done.stderr[
        -2000:
    ]
    return lines[0]


def composed_config(*overrides, resolve: bool = False) -> dict:
    """meshrun's config composed by Hydra from the installed config tree with `overrides` (as
    meshrun.app.prepare_overrides gives them), as plain data, not yet parsed (no jax)."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from meshrun import hydra_sources

    hydra_sources.register_config_sources()
    with initialize_config_module(config_module=hydra_sources.CONFIG_MODULE, version_base="1.3"):
        config = compose(config_name="meshrun", overrides=list(overrides))
    return OmegaConf.to_container(config, resolve=resolve)


def error_line_here(args, capture) -> str:
    """The one `meshrun: error:` line of `meshrun ARGS` run by the real CLI in this process
    (cli_here) and rejected with exit status 2, asserting that is all it printed."""
    return one_error_line(cli_here(args, capture))


def read_metrics(run_dir) -> dict:
    """The metrics.json a run wrote into `run_dir`."""
    return json.loads((Path(run_dir) / "metrics.json").read_text())


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Runs the test with a fresh empty working dir (Hydra writes run dirs relative to it)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@dataclass(frozen=True)
class Trained:
    """A run trained in this process: its metrics as metrics.json holds them, and its plan."""

    metrics: dict
    plan: object


def train_in_process(raw: dict, run_dir=None) -> Trained:
    """Validates the config dict `raw` and trains it in this test process (8 CPU devices), writing
    into `run_dir` only what the config asks for (checkpoints, an export); returns its metrics (as
    metrics.json would hold them) and plan."""
    from meshrun.config.parse import parse_run_config
    from meshrun.placement import devices

    parsed = parse_run_config(raw)
    devices.prepare(parsed.devices, parsed.mesh)
    from meshrun.run.phases import RunContext, train

    trained = train(parsed, RunContext(run_dir=str(run_dir or tempfile.mkdtemp(prefix="meshrun-run-"))))
    return Trained(metrics=trained.metrics.to_json(), plan=trained.plan)


def fast_run_in_process(mesh_shape: str, layout: str) -> dict:
    """The metrics of the seeds' model trained as FAST on `mesh_shape` with layout config
    `layout`, in this test process (one process, 8 devices): the reference for other launches."""
    raw = {
        "mesh": {"shape": mesh_shape},
        "layout": {"rules": layout_rules(layout)},
        "model": {"name": "dense_model"},
        "data": {"name": "synthetic", "num_samples": 128, "eval_samples": 32},
        "train": {"epochs": 2, "verbose": 0},
    }
    return train_in_process(raw).metrics


def layout_rules(name: str) -> dict:
    """The rules of layout config `name`, read from the installed package's configs."""
    return layout_config(name)["rules"] or {}


@dataclass(frozen=True)
class TextFiles:
    """The texts the fine-tuning tests train on (tests/presets.py makes them): `corpus` (35 KB of
    plain text, paragraphs apart), `instructions` (a JSONL file of 400 learnable records with
    `instruction` and `response`) and the tiny presets whose tokenizers were trained on both:
    `gemma` (SentencePiece; 4 query and 4 key/value heads, so gemma_tp splits them on 2x4) and
    `gpt2` (byte-level BPE)."""

    root: Path
    corpus: Path
    instructions: Path
    gemma: Path
    gpt2: Path


INSTRUCTION_PROMPT = "Instruction: {instruction} Response: "


@pytest.fixture(scope="session")
def text_files(tmp_path_factory) -> TextFiles:
    """The fine-tuning tests' texts and presets, built once a session."""
    from presets import corpus_text, gemma_preset, gpt2_preset, instruction_records

    root = tmp_path_factory.mktemp("text")
    corpus, instructions = root / "corpus.txt", root / "instructions.jsonl"
    corpus.write_text(corpus_text())
    records = instruction_records(400)
    instructions.write_text("".join(json.dumps(r) + "\n" for r in records))
    tokenizer_text = (
        corpus.read_text()
        + "\n\n"
        + "\n".join(INSTRUCTION_PROMPT.format(**r) + r["response"] for r in records)
    )
    return TextFiles(
        root=root,
        corpus=corpus,
        instructions=instructions,
        gemma=gemma_preset(root / "gemma", tokenizer_text, num_key_value_heads=4),
        gpt2=gpt2_preset(root / "gpt2", tokenizer_text),
    )


class LogRecords(logging.Handler):
    """A logging handler that keeps every record it is given, at every level (`records`)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


def train_here(args: list[str], run_dir) -> dict:
    """For the tests that build on a run that succeeded: `meshrun train ARGS` run by the real CLI in
    this test process into `run_dir` (Hydra's run dir); the metrics.json it wrote, asserting that
    its status is ok (the run's error as the message if not)."""
    from meshrun import cli

    cli.main(["train", *args, f"hydra.run.dir={run_dir}"])
    metrics = read_metrics(run_dir)
    assert metrics["status"] == "ok", metrics.get("error")
    return metrics


# --- transformers checkpoints (tests/data/hf) -------------------------------------------------------

# The tiny transformers checkpoints scripts/make_hf_reference.py made, with transformers' references.
HF_DATA = Path(__file__).parent / "data" / "hf"


def layout_config(name: str) -> dict:
    """The layout section of config `name` as meshrun's config holds it: `{auto: true}` or
    `{from_model: true}` for those two, else the installed layout config `name`."""
    import importlib.resources

    import yaml

    if name in ("auto", "from_model"):
        return {name: True}
    return yaml.safe_load(
        (importlib.resources.files("meshrun.configs") / "layout" / f"{name}.yaml").read_text()
    )


def built_on_2x4(preset: Path, layout: str, tmp_path, **model):
    """The model of `preset` as `meshrun train` builds it on mesh 2x4 under `layout` (the plan, the
    distribution, the load onto shards), and its load peaks."""
    from meshrun.config.parse import parse_run_config
    from meshrun.placement import devices
    from meshrun.run import execute
    from meshrun.run.prepare import RunContext, prepare

    raw = {
        "mesh": {"shape": "2x4"},
        "layout": layout_config(layout),
        "model": {"name": "keras_hub", "preset": str(preset), "seq_len": 16, **model},
        "data": {"name": "synthetic", "num_samples": 16, "eval_samples": 16},
        "train": {"batch_size": 8},
    }
    parsed = parse_run_config(raw)
    devices.prepare(parsed.devices, parsed.mesh)
    setup = prepare(parsed, RunContext(run_dir=str(tmp_path)))
    model, _, peaks = execute.build(setup)
    return model, peaks


def fresh_session_reset():
    """Drops the distribution and the Keras session a model was built under (built_on_2x4)."""
    from meshrun.placement import distribution

    distribution.reset()  # clears Keras' session too


@pytest.fixture
def fresh_session():
    """Leaves no distribution or Keras session behind the test (fresh_session_reset after it)."""
    yield
    fresh_session_reset()


# --- transformers exports: read back ---------------------------------------------------------------


def read_all(directory) -> dict:
    """Every tensor of the transformers checkpoint in `directory`, as float32 arrays by name."""
    import numpy as np

    from meshrun.hf import checkpoint as hf_checkpoint
    from meshrun.hf import safetensors

    checkpoint = hf_checkpoint.inspect(directory)
    reader = safetensors.SliceReader()
    return {name: np.asarray(reader.view(entry), np.float32) for name, entry in checkpoint.entries.items()}


def apply_peft(base: dict, peft_dir) -> dict:
    """W + lora_alpha / r * B @ A for every module of the PEFT adapter, in numpy, as PEFT merges."""
    from meshrun.hf import safetensors

    config = json.loads((peft_dir / "adapter_config.json").read_text())
    adapter, _ = safetensors.read_header(peft_dir / "adapter_model.safetensors")
    reader = safetensors.SliceReader()
    merged = dict(base)
    scale = config["lora_alpha"] / config["r"]
    for name in adapter:
        if name.endswith(".lora_A.weight"):
            module = name.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
            a = reader.view(adapter[name])
            b = reader.view(adapter[name.replace("lora_A", "lora_B")])
            merged[f"{module}.weight"] = base[f"{module}.weight"] + scale * b @ a
    return merged


# --- LoRA runs: stopped, and their adapters ----------------------------------------------------------


def stop_after(command: list[str], run_dir, checkpoints, at_step: int, stop: int, returncode: int) -> None:
    """Runs `meshrun COMMAND` and sends it signal `stop` once a checkpoint of step `at_step` or
    later is complete on disk; asserts the run ended with `returncode`."""
    import time

    run = subprocess.Popen(
        [sys.executable, "-m", "meshrun", *command, f"hydra.run.dir={run_dir}"],
        cwd=run_dir.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 240
    while not any(p.name.isdigit() and int(p.name) >= at_step for p in checkpoints.glob("*")):
        assert run.poll() is None and time.monotonic() < deadline, "the run ended before it could be stopped"
        time.sleep(0.05)
    run.send_signal(stop)
    assert run.wait(timeout=120) == returncode


def adapter_weights(path) -> dict:
    """The arrays of an exported adapter file, by their path in it."""
    import h5py

    found = {}
    with h5py.File(path, "r") as adapter:
        adapter.visititems(
            lambda name, item: found.__setitem__(name, item[()]) if isinstance(item, h5py.Dataset) else None
        )
    return found


# --- meshrun k8s ---------------------------------------------------------------------------------------

K8S_IMAGE = "registry.example.com/meshrun:0.1"
K8S_CPU_JOB = ["devices.platform=cpu", "mesh=2x4", "layout=dense_model"]  # a job a CPU pod can run
K8S_JOB_FLAGS = ["--image", K8S_IMAGE, "--nodes", "2", "--name", "exp1"]


def k8s_here(args, capsys) -> tuple[int, str, str]:
    """Runs `meshrun k8s ARGS` in this process (cli_here); returns its exit status, stdout and stderr."""
    done = cli_here(["k8s", *args], capsys)
    return done.returncode, done.stdout, done.stderr


def k8s_rendered(args, capsys) -> list[dict]:
    """The objects `meshrun k8s ARGS` prints (asserting it succeeded)."""
    import yaml

    status, out, err = k8s_here(args, capsys)
    assert status == 0, err
    return list(yaml.safe_load_all(out))
