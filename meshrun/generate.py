"""`meshrun generate RUN_DIR --prompt TEXT [--prompt TEXT ...] [--max-length N] [--temperature T]
[--top-k K] [--top-p P] [--seed S] [--json]`: the completions of prompts by the model a finished
KerasHub run trained, loaded on the run's own mesh and layout (its composed config in
RUN_DIR/.hydra/config.yaml; the devices set up as `train` sets them, before jax starts). The
weights are those the run's metrics.json says it wrote, never a file that merely lies in the dir:
its exported preset, else the LoRA adapters it kept (on the base model.preset), else its newest
checkpoint, read into each variable's sharding as resuming reads it. A QLoRA run (model.quantize)
is completed by the model it trained: its adapters on model.preset quantized as in training.
Prompts are encoded, batched and decoded as `train.sample_prompts` does (meshrun.text.complete),
greedily unless the sampling flags say otherwise (checked as train.sample_temperature, _top_k,
_top_p and _seed are).

Paths in the run's config (model.preset, data.tokenizer, data.files, checkpoint.dir) are read as
they were at training: from the dir the run was launched in (Hydra's runtime.cwd), where it still
exists. Every problem with the command line or the run dir is one line (a ConfigError).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshrun.errors import ConfigError
from meshrun.flags import read_command_line
from meshrun.models import get_model
from meshrun.run.sampling import (
    HUB_MODEL,
    check_max_length,
    check_vocabulary,
    load_run_tokenizer,
    model_vocabulary,
    run_chat,
)
from meshrun.specs import rundir
from meshrun.text.complete import (
    GREEDY,
    Sampling,
    SamplingKeys,
    check_sampling,
    check_top_k,
    complete,
    encode_prompts,
    prompt_text,
)
from meshrun.wording import first_line

USAGE = """\
usage: meshrun generate RUN_DIR --prompt TEXT [--prompt TEXT ...] [--max-length N]
                        [--temperature T] [--top-k K] [--top-p P] [--seed S] [--json]
       meshrun generate RUN_DIR --chat JSON [--chat JSON ...] [options as above]
       meshrun generate RUN_DIR [--system TEXT] --user TEXT [--assistant TEXT --user TEXT ...] [options]

Completes each prompt with the model a KerasHub run of `meshrun train` trained (model=keras_hub),
loaded on the run's own mesh and layout, with the weights its metrics.json says it saved: the preset
its export wrote (checkpoint.export=true), else the LoRA adapters it kept on its model.preset, else
its newest checkpoint. Prompts are encoded as the run's examples
were, with its tokenizer (data.tokenizer, else model.preset), and completed up to the end token
(or one of the tokenizer's stop tokens), within --max-length tokens of prompt and completion
(default: the run's model.seq_len). Prints 'prompt' -> 'completion' for each prompt; --json prints
a JSON list of {prompt, completion, sampling} (sampling: the settings used).

A conversation is rendered with the run's chat template (its data.chat_template, else the model's
own, else the built-in one its tokenizer's turn markers call for) and the assistant's header after
it, as the run's conversations were rendered in training, and the reply ends at the end of the
assistant's turn. Give it as a JSONL line, {"messages": [{"role": "user", "content": ...}, ...]}
(--chat, once per conversation), or turn by turn (--system, --user, --assistant, in order: one
conversation). It ends with a user turn. A run trained on conversations (data.format=chat) takes
each --prompt as one user turn.

Tokens are greedy (the most likely each step) unless a sampling flag is given:
  --temperature T  draw at temperature T (0 or more; 0: greedy; default 1.0 with --top-k or --top-p)
  --top-k K        draw from the K most likely tokens (1 or more)
  --top-p P        draw from the fewest most likely tokens whose probabilities add up to P (over 0, up to 1)
  --seed S         the draws' seed (0 to 2**32 - 1, default 0): the same seed gives the same text

  meshrun generate outputs/2026-11-25/10-00-00 --prompt 'Once upon a time' --prompt 'The cat'
  meshrun generate outputs/2026-11-25/10-00-00 --prompt 'What colour is the sky?' --max-length 48 --json
  meshrun generate outputs/2026-11-25/10-00-00 --prompt 'The cat' --temperature 0.8 --top-p 0.9 --seed 7
  meshrun generate outputs/2026-11-25/10-00-00 --system 'You answer in one word.' \\
    --user 'What colour is grass?' --assistant green --user 'And the sky?'
  meshrun generate outputs/2026-11-25/10-00-00 --chat '{"messages": [{"role": "user", "content": "Hi"}]}'
"""
PROMPT, MAX_LENGTH, JSON = "--prompt", "--max-length", "--json"
CHAT, SYSTEM, USER, ASSISTANT = "--chat", "--system", "--user", "--assistant"
TURN_FLAGS = {SYSTEM: "system", USER: "user", ASSISTANT: "assistant"}
TEMPERATURE, TOP_K, TOP_P, SEED = "--temperature", "--top-k", "--top-p", "--seed"
SAMPLING_FLAGS = SamplingKeys(temperature=TEMPERATURE, top_k=TOP_K, top_p=TOP_P, seed=SEED)
RUN_DIR_KEY = "RUN_DIR"
NO_WEIGHTS_HINT = (
    "train with checkpoint.export=true or checkpoint.every_epoch=true "
    "(a LoRA fine-tune of a model.preset keeps its adapters)"
)


@dataclass(frozen=True)
class Request:
    """What `meshrun generate` was asked: the run dir (absolute), the prompts, the tokens of prompt
    and completion together (None: the run's model.seq_len), whether to print JSON, and how each
    token is picked."""

    run_dir: Path
    prompts: tuple  # texts, or conversations (tuples of {role, content} turns) with `chat`
    max_length: int | None
    as_json: bool
    sampling: Sampling = GREEDY
    chat: bool = False  # the prompts are conversations given by --chat or the turn flags


@dataclass(frozen=True)
class SavedRun:
    """A finished run as its dir holds it: the dir, its config (meshrun.config.RunConfig) and its
    metrics.json (what it wrote)."""

    path: Path
    config: Any
    metrics: dict


@dataclass(frozen=True)
class Weights:
    """Where a run's trained weights are: its exported preset dir, the adapter file it kept (on its
    base model.preset), or a checkpoint (meshrun.training.checkpoint.ResumePoint)."""

    preset: Path | None = None
    adapter: Path | None = None
    checkpoint: Any = None


def main(args: list[str]) -> int:
    """Runs `meshrun generate ARGS`; returns its exit status (problems are ConfigErrors)."""
    request = parse_request(args)
    if request is None:
        print(USAGE, end="")
        return 0
    with console_logging(), working_dir(launch_dir(request.run_dir)):
        run = read_run(request.run_dir)
        completions = generate(run, request)
    print_completions(request.prompts, completions, request.as_json, request.sampling)
    return 0


def parse_request(args: list[str]) -> Request | None:
    """The request `args` make (None: they ask for --help); a ConfigError for anything else."""
    value_flags = {
        PROMPT: "TEXT",
        CHAT: "JSON",
        **dict.fromkeys(TURN_FLAGS, "TEXT"),
        MAX_LENGTH: "N",
        TEMPERATURE: "T",
        TOP_K: "K",
        TOP_P: "P",
        SEED: "S",
    }
    line = read_command_line(args, "generate", value_flags, (JSON,))
    if line is None:
        return None
    run_dir = line.only_positional(
        RUN_DIR_KEY,
        "the one run dir of a KerasHub run of meshrun train, e.g. "
        "meshrun generate outputs/DATE/TIME --prompt 'Once upon a time'",
    )
    prompts, chat = _prompts(line)
    max_length = [_max_length(value) for value in line.values.get(MAX_LENGTH, [])]
    return Request(
        run_dir=Path(run_dir).expanduser().resolve(),
        prompts=tuple(prompts),
        max_length=max_length[-1] if max_length else None,
        as_json=JSON in line.switches,
        sampling=_sampling(line.values),
        chat=chat,
    )


def _prompts(line) -> tuple[tuple, bool]:
    """The prompts a command line gives, and whether they are conversations: the texts of
    --prompt, or the conversations of --chat, or the one the turn flags make; one kind only."""
    from meshrun.text.chat import prompt_conversation

    turns = [(flag, value) for flag, value in line.ordered if flag in TURN_FLAGS]
    given = [
        flag for flag, present in ((PROMPT, PROMPT in line.values), (CHAT, CHAT in line.values)) if present
    ]
    if turns:
        given.append(turns[0][0])
    if len(given) > 1:
        raise ConfigError(
            given[1],
            f"was given with {given[0]}; give text prompts (--prompt), conversations as JSON (--chat) "
            "or one conversation turn by turn (--system, --user, --assistant)",
        )
    if turns:
        messages = [{"role": TURN_FLAGS[flag], "content": value} for flag, value in turns]
        return (prompt_conversation(messages, "the conversation of --system/--user/--assistant", USER),), True
    if CHAT in line.values:
        return tuple(_conversation(text, number) for number, text in enumerate(line.values[CHAT], 1)), True
    if PROMPT in line.values:
        return tuple(line.values[PROMPT]), False
    raise ConfigError(
        PROMPT,
        "is required: give the text to complete, e.g. --prompt 'Once upon a time' (repeat it for more), "
        "or a conversation (--chat JSON, or --user TEXT)",
    )


def _conversation(text: str, number: int) -> tuple[dict, ...]:
    """The conversation of the `number`th --chat: a JSONL line, {"messages": [...]} or the list."""
    from meshrun.text.chat import prompt_conversation

    where = f"--chat {number}"
    try:
        given = json.loads(text)
    except ValueError as error:
        raise ConfigError(CHAT, f'{where} is not JSON ({error}); give {{"messages": [...]}}') from None
    messages = given.get("messages") if isinstance(given, dict) else given
    if isinstance(given, dict) and messages is None:
        raise ConfigError(
            CHAT, f'{where} has no \'messages\'; give {{"messages": [{{"role": ..., "content": ...}}]}}'
        )
    return prompt_conversation(messages, where, CHAT)


def _sampling(values: dict[str, list[str]]) -> Sampling:
    """The sampling flags given (the last of each), checked; a ConfigError naming a bad one."""

    def last(flag: str, parse, default=None):
        given = values.get(flag)
        if not given:
            return default
        try:
            return parse(given[-1])
        except ValueError:
            return given[-1]  # not a number: check_sampling names it

    sampling = Sampling(
        temperature=last(TEMPERATURE, float),
        top_k=last(TOP_K, int),
        top_p=last(TOP_P, float),
        seed=last(SEED, int, 0),
    )
    return check_sampling(sampling, SAMPLING_FLAGS)


def _max_length(value: str) -> int:
    try:
        length = int(value)
    except ValueError:
        length = 0
    if length < 2:
        raise ConfigError(
            MAX_LENGTH,
            f"got {value!r}; expected the tokens of prompt and "
            "completion together, a whole number of 2 or more",
        )
    return length


def launch_dir(run_dir: Path) -> Path | None:
    """The dir the run was launched from (Hydra's runtime.cwd in .hydra/hydra.yaml), where it
    still exists; None otherwise."""
    from omegaconf import OmegaConf

    try:
        cwd = Path(str(OmegaConf.load(run_dir / rundir.HYDRA_DIR / "hydra.yaml").hydra.runtime.cwd))
    except Exception:  # no such file, or not Hydra's: the config's paths are read from here
        return None
    return cwd if cwd.is_dir() else None


@contextlib.contextmanager
def console_logging():
    """Log records on stderr while the block runs as a run's console shows them (meshrun's own
    lines, other libraries' warnings; meshrun.logs.console), in place of whatever format a library
    would set up when it finds none."""
    from meshrun.logs.console import ConsoleFilter, LineFormatter

    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(ConsoleFilter())
    handler.setFormatter(LineFormatter())
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


@contextlib.contextmanager
def working_dir(path: Path | None):
    """Runs the block in `path` (None: where it is), then returns to the working dir."""
    if path is None:
        yield
        return
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def read_run(run_dir: Path) -> SavedRun:
    """The run in `run_dir`, its config parsed and checked; a ConfigError for a dir that is not the
    run dir of a KerasHub run of meshrun train."""
    from meshrun.config.parse import parse_run_config

    if not run_dir.is_dir():
        raise ConfigError(
            RUN_DIR_KEY,
            f"got {str(run_dir)!r}, which is not a directory; give "
            "the run dir of a meshrun train run (outputs/DATE/TIME)",
        )
    config_file = run_dir / rundir.HYDRA_DIR / "config.yaml"
    if not config_file.is_file():
        raise ConfigError(
            RUN_DIR_KEY,
            f"got {str(run_dir)!r}, which holds no .hydra/config.yaml: "
            "not the run dir of a meshrun train run",
        )
    raw = _read_config(config_file)
    model = (raw.get("model") or {}).get("name")
    if model != HUB_MODEL:
        raise ConfigError(
            RUN_DIR_KEY,
            f"got {str(run_dir)!r}, a run of model={model}; meshrun generate completes prompts with KerasHub "
            "causal LMs (model=keras_hub)",
        )
    return SavedRun(path=run_dir, config=parse_run_config(raw), metrics=_read_metrics(run_dir))


def _read_metrics(run_dir: Path) -> dict:
    """The run's metrics.json; a ConfigError for a run that wrote none (it did not finish)."""
    path = run_dir / rundir.METRICS_FILE
    try:
        metrics = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(
            RUN_DIR_KEY,
            f"got {str(run_dir)!r}, which holds no {rundir.METRICS_FILE}: its run did not finish "
            "(or still runs); give the dir of a finished run",
        ) from None
    except (OSError, ValueError) as err:
        raise ConfigError(RUN_DIR_KEY, f"cannot read {str(path)!r} ({first_line(err)})") from None
    return metrics if isinstance(metrics, dict) else {}


def _read_config(path: Path) -> dict:
    from omegaconf import OmegaConf

    try:
        raw = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except Exception as err:  # OmegaConf's and YAML's errors
        raise ConfigError(RUN_DIR_KEY, f"cannot read {str(path)!r} ({first_line(err)})") from None
    if not isinstance(raw, dict):
        raise ConfigError(RUN_DIR_KEY, f"{str(path)!r} holds no config (a mapping)")
    return raw


def find_weights(run: SavedRun) -> Weights:
    """The weights the run's metrics.json says it wrote, where they still are: its exported
    preset, else its kept adapters (on model.preset), else the newest complete checkpoint it saved;
    a ConfigError when it has none of them. A QLoRA run (model.quantize) takes its adapters first,
    on the base quantized as it trained (its preset is the float base with them merged). Imports
    jax (Orbax): set the devices up first."""
    from meshrun.training import checkpoint as checkpoint_lib
    from meshrun.training.orbax_io import complete_steps

    saved = run.metrics.get("checkpoint") or {}
    preset = _written(run, saved.get("exported_preset"))
    adapter = _written(run, saved.get("exported_adapter"))
    options = run.config.model.options
    kept = adapter if adapter is not None and adapter.is_file() and options.preset else None
    if kept is not None and get_model(run.config.model.name).quantization_of(options) is not None:
        return Weights(adapter=kept)  # the model trained: the quantized base with its adapters
    if preset is not None and (preset / "config.json").is_file():
        return Weights(preset=preset)
    if kept is not None:
        return Weights(adapter=kept)
    root = _written(run, saved.get("dir"))
    steps = set(complete_steps(root)) & set(saved.get("saved_steps") or []) if root is not None else set()
    if steps:
        return Weights(checkpoint=checkpoint_lib.ResumePoint(root, max(steps)))
    raise ConfigError(
        RUN_DIR_KEY,
        f"{str(run.path)!r} has no saved weights (its metrics.json "
        f"names none that are still there): {NO_WEIGHTS_HINT}",
    )


def _written(run: SavedRun, path: str | None) -> Path | None:
    """A path metrics.json records, as it is now: one inside the run dir as the run wrote it is
    read inside `run.path` (a run dir copied or moved elsewhere keeps its files)."""
    if not path:
        return None
    written, then = Path(path), Path(run.metrics.get("run_dir") or run.path)
    inside = next((base for base in (then, then.resolve()) if written.is_relative_to(base)), None)
    return written if inside is None else run.path / written.relative_to(inside)


def generate(run: SavedRun, request: Request) -> list[str]:
    """The completion of each prompt of `request` by the run's trained model on its mesh. The
    tokenizer and the prompts' lengths are checked before the model is loaded."""
    from meshrun.compat.keras.startup import import_keras
    from meshrun.placement import devices as devices_lib

    config = run.config
    options = config.model.options
    devices_lib.prepare(config.devices, config.mesh)  # before jax is imported
    import_keras()  # before anything else imports it (meshrun.compat.keras.startup)
    weights = find_weights(run)
    tokenizer, framing = load_run_tokenizer(config, RUN_DIR_KEY)
    chat = run_chat(config, tokenizer, RUN_DIR_KEY, wanted=request.chat)
    max_length = check_max_length(request.max_length or options.seq_len, options, MAX_LENGTH)
    prompts = list(request.prompts)
    key = CHAT if request.chat else PROMPT
    encode_prompts(tokenizer, framing, prompts, max_length, key, MAX_LENGTH, chat)
    from meshrun.placement import distribution as distribution_lib

    try:
        model, planned, mesh = load_model(config, weights)
        vocabulary = model_vocabulary(planned.abstract.signature)
        check_vocabulary(tokenizer, config, vocabulary)
        check_top_k(request.sampling, vocabulary, TOP_K)
        return complete(
            model,
            tokenizer,
            framing,
            prompts,
            max_length,
            mesh.axis_size(mesh.batch_axis),
            key,
            MAX_LENGTH,
            request.sampling,
            chat,
        )
    finally:
        distribution_lib.reset()


def load_model(config, weights: Weights):
    """The run's model with its trained weights, built under the run's distribution; its
    PlannedModel and its mesh (no -1 left)."""
    planned, mesh = enter_distribution(config)
    if weights.preset is not None:
        return _from_preset(planned, weights.preset), planned, mesh
    if weights.adapter is not None:
        return _from_adapter(planned, weights.adapter), planned, mesh
    return _from_checkpoint(config, planned, weights.checkpoint), planned, mesh


def enter_distribution(config):
    """Puts the run's distribution in force, as the run built it: its mesh over this machine's
    devices, its layout rules (placed by the run's own planning step), its dtype policy. Returns
    the PlannedModel and the mesh."""
    from meshrun.compat import names as compat
    from meshrun.compat.keras.startup import import_keras
    from meshrun.placement import devices as devices_lib
    from meshrun.placement import distribution as distribution_lib
    from meshrun.run.prepare import place

    keras = import_keras()
    compat.ensure("keras")
    devices_lib.set_compilation_cache(config.cache)
    found = devices_lib.discover(
        config.devices, dataclasses.replace(config.mesh, dcn=None)
    )  # one process, whatever the run's
    planned = place(config, found.mesh)
    planned.plan.raise_first_error()
    distribution = distribution_lib.make_distribution(found.mesh, planned.rules, found.devices)
    keras.distribution.set_distribution(distribution_lib.in_force(distribution))
    keras.config.set_dtype_policy(config.train.precision)
    return planned, found.mesh


def _from_checkpoint(config, planned, point):
    """The run's model built as the run built it, its weights read from checkpoint `point`; a run
    with pipeline stages gives the same model with separate blocks (KerasHub's task, whose
    generate the stages cannot run), built off the mesh."""
    from meshrun.run.build import build_model, built_off_the_mesh, check_paths_match
    from meshrun.training import checkpoint as checkpoint_lib
    from meshrun.training.restack import with_separate_blocks

    model, _ = build_model(
        planned.spec, planned.options, config.data, abstract=True, pipeline=planned.pipeline
    )  # initial weights, replaced next
    check_paths_match(model, planned.abstract, planned.spec, planned.options)
    try:
        checkpoint_lib.restore_weights(model, point)
    except checkpoint_lib.UnreadableCheckpoint as err:
        raise ConfigError(RUN_DIR_KEY, f"{err}: its files were changed after it was saved") from None
    return with_separate_blocks(model, lambda: built_off_the_mesh(planned.spec, planned.options, config.data))


def _from_preset(planned, preset: Path):
    """The run's task class loaded from its exported preset dir, with its weights (LoRA adapters
    merged into the kernels by the export, so none are added)."""
    from meshrun.models.hub import build as building
    from meshrun.models.hub.options import LoraOptions

    options = dataclasses.replace(
        planned.options, preset=str(preset), backbone={}, lora=LoraOptions(), quantize=None
    )  # a QLoRA run's preset is its float base with the adapters merged
    return building.build(options)


def _from_adapter(planned, adapter: Path):
    """The run's base model (model.preset, with separate blocks) with the LoRA adapters it kept; a
    QLoRA run's base quantized as it trained (model.quantize, the same preset), the adapters put
    on it as it builds."""
    from meshrun.models.hub import build as building
    from meshrun.models.hub.export import AdapterFileMismatch, load_adapter, sampling_lora
    from meshrun.models.hub.options import LoraOptions

    options = planned.options
    lora = sampling_lora(options.lora) if options.quantize else LoraOptions()
    base = building.build(dataclasses.replace(options, lora=lora))
    try:
        return load_adapter(base, options.lora, adapter)
    except AdapterFileMismatch as err:
        raise ConfigError(RUN_DIR_KEY, str(err)) from None


def print_completions(
    prompts: tuple, completions: list[str], as_json: bool, sampling: Sampling = GREEDY
) -> None:
    """Prints each prompt and its completion: a line each ('prompt' -> 'completion'), or a JSON list
    of {prompt, completion, sampling} (the settings, as metrics.json's samples record them); a
    conversation's prompt is its last turn's text, and its JSON has its `messages` too."""
    record = sampling.record()
    pairs = [
        {
            "prompt": prompt_text(prompt),
            **({} if isinstance(prompt, str) else {"messages": list(prompt)}),
            "completion": completion,
            "sampling": record,
        }
        for prompt, completion in zip(prompts, completions, strict=True)
    ]
    if as_json:
        print(json.dumps(pairs, indent=2, ensure_ascii=False))
        return
    for pair in pairs:
        print(f"{pair['prompt']!r} -> {pair['completion']!r}")
