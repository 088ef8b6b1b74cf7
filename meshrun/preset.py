"""`meshrun preset FAMILY --text PATH [--text PATH ...] --out DIR [...]`: a small KerasHub preset of
a model family, made offline from the user's own text, to try the fine-tuning workflow with before
a real preset is at hand: a tokenizer trained on the text, a causal LM of the sizes asked around it
with random weights (meshrun.models.hub.small_presets), written as `save_to_preset` writes it.

The text is read as data=text reads files (meshrun.text.corpus): UTF-8 text files whole, and every
text field of JSONL records. The preset is written into a temporary dir renamed to DIR when
complete; a DIR that holds files is refused unless it holds a preset and --force is given. Every
problem is one line (a ConfigError), found before anything is written. The model is built on the
CPU: it is small, and a GPU's memory is left to the jobs that need it.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from meshrun.errors import ConfigError
from meshrun.files import dir_written_whole, unwritable
from meshrun.flags import read_command_line
from meshrun.models.hub.small_presets import FAMILIES, Family, PresetShape, assemble, tokenizer
from meshrun.text.corpus import expand, read_texts
from meshrun.wording import did_you_mean, first_line, format_bytes, one_of

USAGE = """\
usage: meshrun preset FAMILY --text PATH [--text PATH ...] --out DIR [--vocabulary N] [--layers N]
                      [--hidden N] [--heads Q:KV] [--seq-len N] [--seed N] [--force]

Makes a small KerasHub preset of a model family, offline, to try fine-tuning with: a tokenizer
trained on your text, and a causal LM of that family around it with RANDOM weights (for trying the
workflow, not a pretrained model). It is written as save_to_preset writes it: train it with
`meshrun train model=keras_hub model.preset=DIR data=text ...`, or load it with plain KerasHub,
keras_hub.models.CausalLM.from_preset(DIR). Needs keras-hub: pip install 'meshrun[hub]'.

  FAMILY           gemma    GemmaCausalLM; SentencePiece, Gemma's special tokens; heads 8:1 (Gemma 2B's
                            multi-query attention)
                   llama    Llama3CausalLM; byte-level BPE, Llama 3's special tokens; heads 8:2
                   mistral  MistralCausalLM; SentencePiece, Mistral 7B's special tokens; heads 8:2
                   gpt2     GPT2CausalLM; byte-level BPE, <|endoftext|>; heads 8 (one key/value head each)
  --text PATH      text to train the tokenizer on: files or globs ('data/*.jsonl'), UTF-8 text files
                   whole and every text field of JSONL records (repeat it for more)
  --out DIR        the preset dir to write (made with its parents; it must be new or empty)
  --vocabulary N   ids in the tokenizer and the model (default 512); more than the text gives, or
                   fewer than its distinct characters need, is refused, saying what would do
  --layers N       transformer blocks (default 2)
  --hidden N       hidden size (default 64); each head is hidden / Q wide, the feed-forward 2 x hidden
  --heads Q:KV     query and key/value heads (default: the family's); KV must divide Q; gpt2: --heads Q
  --seq-len N      the preprocessor's sequence length, a fine-tune's default model.seq_len (default 64)
  --seed N         the seed the weights are drawn with (default 0); the same inputs give the same preset
  --force          replace the preset already in --out (a dir that holds no preset is never replaced)

  meshrun preset gemma --text 'data/*.jsonl' --out tiny_gemma
  meshrun preset llama --text notes.txt --text 'more/*.txt' --out tiny_llama --vocabulary 1024 --layers 4
"""
FAMILY_KEY, TEXT, OUT, HEADS, FORCE = "FAMILY", "--text", "--out", "--heads", "--force"
VOCABULARY = "--vocabulary"
NUMBERS = {
    VOCABULARY: "vocabulary_size",
    "--layers": "num_layers",
    "--hidden": "hidden_dim",
    "--seq-len": "sequence_length",
    "--seed": "seed",
}
VALUE_FLAGS = {
    TEXT: "PATH",
    OUT: "DIR",
    **dict.fromkeys(NUMBERS, "N"),
    HEADS: "Q:KV",
}  # flag: its value, in messages
OUT_HINT = "the preset dir to write, e.g. --out tiny_model"
PRESET_CONFIG = "config.json"  # what makes a dir a preset (save_to_preset writes it)


@dataclass(frozen=True)
class Request:
    """What `meshrun preset` was asked: the family, the text's paths or globs, the preset dir
    (absolute), the model's sizes, and whether a preset already in the dir may be replaced."""

    family: Family
    texts: tuple[str, ...]
    out: Path
    shape: PresetShape
    force: bool


def main(args: list[str]) -> int:
    """Runs `meshrun preset ARGS`; returns its exit status (problems are ConfigErrors)."""
    request = parse_request(args)
    if request is None:
        print(USAGE, end="")
        return 0
    check_installed(request.family)
    files = expand(request.texts, TEXT)
    check_out(request.out, request.force, files)
    texts = read_texts(files, TEXT)
    causal_lm = build(request, texts)
    from meshrun.compat.keras.startup import keras_without_tensorflow

    try:
        with (
            dir_written_whole(request.out) as partial,
            keras_without_tensorflow(),
        ):  # 2-4 s of TensorFlow's import saved
            causal_lm.save_to_preset(str(partial))
    except OSError as err:  # a full disk, a dir made read-only meanwhile
        raise ConfigError(
            OUT,
            f"got {str(request.out)!r}, which could not be "
            f"written ({err.strerror or err}); nothing was written",
        ) from None
    print(summary(request, causal_lm, files, texts))
    return 0


def parse_request(args: list[str]) -> Request | None:
    """The request `args` make (None: they ask for --help); a ConfigError for anything else."""
    line = read_command_line(args, "preset", VALUE_FLAGS, (FORCE,))
    if line is None:
        return None
    family = _family(
        line.only_positional(
            FAMILY_KEY,
            f"the one model family to make, e.g. meshrun preset gemma --text 'data/*.jsonl' "
            f"--out tiny_gemma; valid: {one_of(sorted(FAMILIES))}",
        )
    )
    values = line.values
    for flag, hint in (
        (TEXT, "the text to train the tokenizer on, e.g. --text 'data/*.jsonl'"),
        (OUT, OUT_HINT),
    ):
        if not values.get(flag):
            raise ConfigError(flag, f"is required: give {hint}")
    for flag, given in values.items():
        if flag != TEXT and len(given) > 1:
            raise ConfigError(flag, f"given {len(given)} times ({', '.join(map(repr, given))}); give it once")
    if not values[OUT][0].strip():
        raise ConfigError(OUT, f"got ''; give {OUT_HINT}")
    out = Path(values[OUT][0]).expanduser().resolve()
    return Request(
        family=family,
        texts=tuple(values[TEXT]),
        out=out,
        shape=_shape(family, values),
        force=FORCE in line.switches,
    )


def _family(name: str) -> Family:
    if name.lower() in FAMILIES:  # Gemma, GPT2: the families' names differ in more than case
        return FAMILIES[name.lower()]
    names = sorted(FAMILIES)
    raise ConfigError(FAMILY_KEY, f"got {name!r}; {did_you_mean(name.lower(), names)}valid: {one_of(names)}")


def _shape(family: Family, values: dict[str, list[str]]) -> PresetShape:
    """The model's sizes: the defaults (PresetShape's, the family's heads) with the flags given."""
    numbers = {NUMBERS[flag]: _number(flag, given[0]) for flag, given in values.items() if flag in NUMBERS}
    heads = _heads(family, values[HEADS][0]) if HEADS in values else family.heads
    shape = replace(PresetShape(num_query_heads=heads[0], num_key_value_heads=heads[1]), **numbers)
    if shape.hidden_dim % shape.num_query_heads:
        raise ConfigError(
            "--hidden",
            f"got {shape.hidden_dim}, which {shape.num_query_heads} query heads do not divide (each head is "
            f"hidden / Q wide); give a multiple of {shape.num_query_heads}, e.g. {8 * shape.num_query_heads}",
        )
    if family.rotary and shape.head_dim % 2:
        raise ConfigError(
            "--hidden",
            f"got {shape.hidden_dim}, which makes each of {shape.num_query_heads} heads {shape.head_dim} "
            f"wide; {family.name}'s rotary position embedding needs an even width: give a multiple of "
            f"{2 * shape.num_query_heads}",
        )
    return shape


def _number(flag: str, value: str) -> int:
    least = 0 if flag == "--seed" else 2 if flag == "--seq-len" else 1
    try:
        number = int(value)
    except ValueError:
        number = least - 1
    if number < least:
        raise ConfigError(flag, f"got {value!r}; expected a whole number of {least} or more")
    return number


def _heads(family: Family, value: str) -> tuple[int, int]:
    """(query heads, key/value heads) from `Q:KV` or `Q` (as many key/value heads as query heads)."""
    query, _, key_value = value.partition(":")
    try:
        heads = (int(query), int(key_value or query))
    except ValueError:
        heads = (0, 0)
    if min(heads) < 1:
        raise ConfigError(
            HEADS,
            f"got {value!r}; expected Q:KV, query and key/value "
            f"heads, e.g. {HEADS} 8:2 (or {HEADS} 8: as many of each)",
        )
    if not family.grouped and heads[0] != heads[1]:
        raise ConfigError(
            HEADS,
            f"got {value!r}; {family.name} has a key/value head for each query head: give {HEADS} {heads[0]}",
        )
    if heads[0] % heads[1]:
        raise ConfigError(
            HEADS,
            f"got {value!r}: {heads[1]} key/value heads do not divide {heads[0]} query heads (each key/value "
            f"head serves an equal group of them); give e.g. {HEADS} {heads[0]}:1",
        )
    return heads


def check_out(out: Path, force: bool, files: tuple[Path, ...]) -> None:
    """A ConfigError unless `out` can take the new preset: a dir that can be written (its missing
    parents are made), new or empty, or with --force one that holds a preset and none of the text."""
    reason = unwritable(out, directory=True)
    if reason:
        raise ConfigError(
            OUT,
            f"got {str(out)!r}, which cannot be written ({reason}); "
            "give a dir where you can write, e.g. --out tiny_model",
        )
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not force:
        raise ConfigError(
            OUT,
            f"got {str(out)!r}, which already holds files; give a "
            f"new or empty dir, or {FORCE} to replace the preset there",
        )
    if not (out / PRESET_CONFIG).is_file():
        raise ConfigError(
            OUT,
            f"got {str(out)!r}, which holds files but no preset ({PRESET_CONFIG}); {FORCE} replaces only a "
            "preset: give a new or empty dir",
        )
    inside = [f for f in files if f.resolve().is_relative_to(out)]
    if inside:
        raise ConfigError(
            OUT,
            f"got {str(out)!r}, which holds the {TEXT} file "
            f"{str(inside[0])!r}: {FORCE} would delete it; give another dir",
        )


def build(request: Request, texts: list[str]):
    """The family's causal LM with a tokenizer trained on `texts` (before KerasHub is imported: a
    text too small for the vocabulary is said in a second), built on the CPU (where jax is not
    started yet), with the info lines SentencePiece prints while loading left out."""
    family = request.family
    trained = family.train(texts, request.shape, VOCABULARY)
    if "jax" not in sys.modules:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from meshrun.system.process import native_info_lines_dropped

    with native_info_lines_dropped():
        try:
            return assemble(family, tokenizer(family, trained), request.shape)
        except ConfigError:
            raise
        except Exception as err:  # whatever KerasHub raises for sizes it cannot build
            raise ConfigError(
                FAMILY_KEY,
                f"got {family.name!r}, which KerasHub cannot build at these sizes: {first_line(err)}",
            ) from None


def check_installed(family: Family) -> None:
    """A ConfigError saying how to install what the family needs, when a package is missing
    (found, not imported: keras_hub takes seconds). KerasHub's tokenizers are built on
    tensorflow-text, which a keras-hub installed without its dependencies lacks."""
    needed = (
        ("keras-hub", "keras_hub"),
        (family.library, family.library),
        ("tensorflow-text", "tensorflow_text"),
    )
    missing = [package for package, module in needed if not _installed(module)]
    if missing:
        raise ConfigError(
            FAMILY_KEY,
            f"got {family.name!r}, which needs {one_of(missing)}, not installed: pip install 'meshrun[hub]'",
        )


def _installed(module: str) -> bool:
    if module in sys.modules:
        return sys.modules[module] is not None  # None: an import of it is known to fail
    return importlib.util.find_spec(module) is not None


def summary(request: Request, causal_lm, files: tuple[Path, ...], texts: list[str]) -> str:
    """The line that says what was written, and that its weights are random."""
    shape, family = request.shape, request.family
    heads = (
        f"{shape.num_query_heads} query and {shape.num_key_value_heads} key/value heads"
        if family.grouped
        else f"{shape.num_query_heads} heads"
    )
    size = format_bytes(sum(len(text.encode()) for text in texts))
    return (
        f"wrote {request.out}: a {family.name} preset, {family.task} of "
        f"{causal_lm.backbone.count_params():,} parameters ({_count(shape.num_layers, 'layer')}, hidden "
        f"{shape.hidden_dim}, {heads}), a {family.tokenizer_kind} vocabulary of {shape.vocabulary_size} "
        f"trained on {size} of text in {_count(len(files), 'file')}, sequence length "
        f"{shape.sequence_length}; RANDOM weights, for trying the workflow, not a pretrained model: "
        f"meshrun train model=keras_hub {shlex.quote(f'model.preset={request.out}')} data=text ..."
    )


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'s' * (number != 1)}"
