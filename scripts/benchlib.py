"""What the benchmarks under scripts/ share: running meshrun in a fresh process (through
meshrun.measure) and reading back its metrics.json or plan, the environment of a child process
(emulated CPU devices, another checkout), the order in which variants take turns, medians over
repeats, the Gemma presets of random weights the KerasHub benchmarks load, the rich tables they
print and the JSON file they write. A script imports it as `import benchlib` (scripts/ is on the
path of a script run as `python scripts/bench_x.py`).

It imports neither jax nor Keras: a benchmark that measures its children keeps its own process
small."""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from meshrun.files import write_output
from meshrun.measure import Measured, run_measured

# --- meshrun in a fresh process ---------------------------------------------------------------------


def succeeded(done: Measured, what: str) -> Measured:
    """`done` when its process exited 0; else the benchmark stops with `what` and the end of its
    stderr."""
    if done.returncode != 0:
        raise SystemExit(f"{what} failed with status {done.returncode}:\n{done.stderr[-3000:]}")
    return done


def read_metrics(run_dir: Path) -> dict:
    """The metrics.json a run wrote into `run_dir`."""
    return json.loads((Path(run_dir) / "metrics.json").read_text())


def train(
    overrides: Sequence[str],
    run_dir: Path,
    what: str,
    *,
    cwd: Path | str | None = None,
    timeout: float = 1800,
    env: dict | None = None,
) -> tuple[Measured, dict]:
    """`meshrun train OVERRIDES hydra.run.dir=RUN_DIR` in a fresh process (in `cwd`, default the run
    dir's parent): the measured process and its metrics.json. A run that fails stops the benchmark
    (`what` names it)."""
    done = run_measured(
        ["train", *overrides, f"hydra.run.dir={run_dir}"],
        cwd or Path(run_dir).parent,
        timeout=timeout,
        env=env,
    )
    return succeeded(done, what), read_metrics(run_dir)


def plan(overrides: Sequence[str], timeout: float = 300) -> tuple[Measured, dict | None]:
    """`meshrun plan OVERRIDES --json` in a fresh process and an empty working dir: the measured
    process and the plan it printed (None when it printed none)."""
    with tempfile.TemporaryDirectory(prefix="bench-plan-") as cwd:
        done = run_measured(["plan", *overrides, "--json"], cwd, timeout=timeout)
    try:
        return done, json.loads(done.stdout)
    except json.JSONDecodeError:
        return done, None


# --- a child's environment --------------------------------------------------------------------------


def mesh_devices(shape: str) -> int:
    """The devices of a mesh shape such as `2x4`."""
    return math.prod(int(size) for size in shape.split("x"))


def emulated_cpu_env(devices: int, keras_backend: bool = False) -> dict:
    """This process's environment for a child on `devices` emulated CPU devices (XLA's host platform
    device count), with KERAS_BACKEND=jax where `keras_backend`."""
    return {
        **os.environ,
        **({"KERAS_BACKEND": "jax"} if keras_backend else {}),
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
        "JAX_PLATFORMS": "cpu",
    }


def checkout_env(checkout: str | None) -> dict:
    """This process's environment for a child that runs `checkout`'s code through PYTHONPATH (None:
    the meshrun this interpreter imports, any PYTHONPATH of this process left out)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if checkout:
        env["PYTHONPATH"] = checkout
    return env


# --- repeats and their figures ----------------------------------------------------------------------


def alternating(items: Sequence, repeat: int) -> Sequence:
    """`items` in their order on even repeats and reversed on odd ones, so that none always runs
    first on a machine whose speed drifts."""
    return items if repeat % 2 == 0 else items[::-1]


def rotated(items: Sequence, repeat: int) -> list:
    """`items` rotated left by `repeat`: each takes every place in turn over the repeats."""
    shift = repeat % len(items)
    return [*items[shift:], *items[:shift]]


def interleaved(repeats: int, items: Sequence, alternate: bool = True) -> Iterator[tuple[int, object]]:
    """(repeat, item) for every repeat and item, the items taking turns within each repeat (in
    alternating order with `alternate`, else always in their order)."""
    for repeat in range(repeats):
        for item in alternating(items, repeat) if alternate else items:
            yield repeat, item


def median_of(runs: Iterable[dict], key: str):
    """The median of `key` over the runs that have a value for it; None where none has."""
    values = [run[key] for run in runs if run.get(key) is not None]
    return statistics.median(values) if values else None


def medians(runs: Sequence[dict], keys: Iterable[str] | None = None) -> dict:
    """median_of each of `keys` (default: the first run's) over `runs`."""
    return {key: median_of(runs, key) for key in (runs[0] if keys is None else keys)}


# --- KerasHub presets of random weights -------------------------------------------------------------


@dataclass(frozen=True)
class GemmaPreset:
    """The sizes of a Gemma preset of random float32 weights and no tokenizer: `blocks` decoder
    blocks of width `hidden` with `heads` heads (as many key-value heads) of hidden / heads, a gated
    MLP of 2 x hidden (intermediate_dim 4 x hidden: Gemma's MLP is half of it wide), and an
    embedding of `vocabulary`. A block holds 10 hidden^2 weights (attention 4, the MLP 6)."""

    blocks: int
    hidden: int
    heads: int
    vocabulary: int

    @classmethod
    def of_size(cls, size_bytes: float, hidden: int, heads: int, vocabulary: int) -> GemmaPreset:
        """As many blocks of `hidden` as make the preset about `size_bytes` (at least one)."""
        per_block, embedding = 4 * 10 * hidden * hidden, 4 * vocabulary * hidden
        return cls(max(1, round((size_bytes - embedding) / per_block)), hidden, heads, vocabulary)

    @classmethod
    def of_blocks(cls, size_bytes: float, blocks: int, heads: int, vocabulary: int) -> GemmaPreset:
        """`blocks` blocks of the width (a multiple of 256, at least 256) that makes the preset about
        `size_bytes`."""
        a, b = 40 * blocks, 4 * vocabulary
        hidden = (-b + (b * b + 4 * a * size_bytes) ** 0.5) / (2 * a)
        return cls(blocks, max(256, int(hidden) // 256 * 256), heads, vocabulary)

    def describe(self) -> str:
        """The preset's sizes in a line."""
        return (
            f"Gemma, {self.blocks} blocks, hidden {self.hidden}, {self.heads} heads of "
            f"{self.hidden // self.heads}, MLP {2 * self.hidden}, vocabulary {self.vocabulary}"
        )

    def save(self, path: Path) -> float:
        """Saves the preset into `path` with KerasHub, in a process of its own (its memory stays
        out of this one's); the seconds it took."""
        code = (
            "import sys, keras_hub\n"
            f"backbone = keras_hub.models.GemmaBackbone(vocabulary_size={self.vocabulary}, "
            f"num_layers={self.blocks}, num_query_heads={self.heads}, num_key_value_heads={self.heads}, "
            f"hidden_dim={self.hidden}, intermediate_dim={4 * self.hidden}, "
            f"head_dim={self.hidden // self.heads})\n"
            "keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=None)"
            ".save_to_preset(sys.argv[1])\n"
        )
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-c", code, str(path)],
            check=True,
            env={**os.environ, "KERAS_BACKEND": "jax"},
            stderr=subprocess.DEVNULL,
        )
        return time.perf_counter() - started


def weights_bytes(preset: Path) -> int:
    """The bytes of a KerasHub preset's weights files."""
    return sum(f.stat().st_size for f in Path(preset).glob("*.weights*.h5"))


def layout_rules(name: str) -> dict:
    """The rules (pattern -> axes) of meshrun's layout config `name` (configs/layout/NAME.yaml)."""
    import importlib.resources

    import yaml

    text = (importlib.resources.files("meshrun.configs") / "layout" / f"{name}.yaml").read_text()
    return yaml.safe_load(text)["rules"] or {}


# --- what a benchmark prints and writes -------------------------------------------------------------


def console(min_width: int) -> Console:
    """A rich console at least `min_width` columns wide (piped output would get 80)."""
    return Console(width=max(Console().width, min_width))


def table(title: str, columns: Iterable[str], left: Collection[str] | None = None) -> Table:
    """A rich table titled `title` with `columns`: those in `left` aligned left and the rest right;
    all as rich aligns them (left) where `left` is None."""
    made = Table(title=title)
    for column in columns:
        if left is None:
            made.add_column(column)
        else:
            made.add_column(column, justify="left" if column in left else "right")
    return made


def write_json(path: Path | str, payload, indent: int = 2, default=None) -> None:
    """Writes `payload` as JSON to `path` whole (a reader never sees half of it), making its missing
    parent dirs."""
    write_output(path, (json.dumps(payload, indent=indent, default=default) + "\n").encode())
