"""The model's own tokenizer, run as fast as its library allows: `load_tokenizer(source, key)`.

`source` is one of:

- A KerasHub preset dir (config.json, tokenizer.json and assets/tokenizer/, as `save_to_preset`
  writes). The tokenizer's class, vocabulary and special tokens are read through KerasHub, but text
  is encoded by the library underneath, called directly on every core: SentencePiece (Gemma,
  Llama 2, Mistral, ...) by `SentencePieceProcessor.encode(..., num_threads=cores)`, byte-level BPE
  (GPT-2, Llama 3, Qwen, ...) by a Hugging Face `tokenizers.Tokenizer` built from the same
  vocabulary and merges (GPT-2's split, byte-level alphabet) and its `encode_batch`.
- A Hugging Face tokenizer.json, or a dir holding one (`tokenizers.Tokenizer.from_file`).

The reference for a KerasHub tokenizer is KerasHub's own, as its tf.data pipelines run it (its
TensorFlow graph). The first time a tokenizer is loaded the fast encoder and the reference encode a
probe text (punctuation, digits, runs of spaces, newlines, non-ASCII text, contractions); where the
ids differ (a family that splits text its own way, such as Mistral's Tekken), the reference itself
is used, backend "keras_hub", with a warning that tokenization will be slow. KerasHub 0.32's eager
path for byte-level BPE (calling the tokenizer outside tf.data) passes its split regex to
`tokenizers` as a literal string, so it splits nothing and can differ from the graph on runs of
spaces; meshrun follows the graph, which splits as GPT-2 does. The verdict is kept in the token
cache (meshrun.text.cache.ProbeVerdicts) under a key over the tokenizer's files, the probe text and
the versions of the libraries on both sides, so a later process that finds it makes no check and,
where the fast encoder agreed, imports no TensorFlow (1-3 s and 500 MiB). Without TensorFlow
(meshrun's `tf` extra) there is no graph to check against: SentencePiece and byte-level BPE split as
GPT-2 splits are encoded by their library unchecked, and a tokenizer that splits text its own way
(Tekken) is a ConfigError saying TensorFlow is needed. A Hugging Face tokenizer.json never needs it.

Importing this module imports none of jax, keras, keras_hub and tensorflow.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import itertools
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from meshrun.errors import ConfigError
from meshrun.system.process import native_info_lines_dropped
from meshrun.system.trust import check_preset_objects, private_dir
from meshrun.text import cache
from meshrun.wording import first_line

log = logging.getLogger("meshrun")

EXPECTED = (
    "expected a KerasHub preset dir (config.json, tokenizer.json and assets/, as save_to_preset writes) "
    "or a Hugging Face tokenizer.json (or a dir holding one)"
)
TOKENIZER_FILE = "tokenizer.json"  # KerasHub's tokenizer config in a preset, and Hugging Face's tokenizer
PRESET_CONFIG_FILE = "config.json"
PREPROCESSOR_FILE = "preprocessor.json"
ASSETS_DIR = "assets"

# Special tokens of a Hugging Face tokenizer.json, by name, first found wins.
HF_END_TOKENS = ("<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>", "<|im_end|>")
HF_START_TOKENS = ("<|begin_of_text|>", "<s>", "<bos>")
HF_PAD_TOKENS = ("<pad>",)
HF_TOKENIZER_CONFIG_FILE = "tokenizer_config.json"  # names the end and pad tokens where it is beside
HF_GENERATION_CONFIG_FILE = "generation_config.json"  # names the ids a model stops at where it is beside

# Texts the fast encoder and KerasHub's own must encode alike (each one apart, and as one batch).
PROBE_TEXTS = (
    "Hello, world! It's 3.14159 o'clock; we'll see 12,345 cats & 2024 dogs in 1999, won't we?",
    "Instruction: Reverse the words: red blue\nResponse: ",
    "Items:\n    - an indented item\n\n\n  two  spaces,   three   and trailing   ",
    "Café naïve Zürich Ελλάδα 東京 🙂 “quoted” — 'single' x=y+1 {\"a\": [1, 2]}\r\n\tTHEY'RE DON'T I'M",
    "<s></s><bos><eos><pad><|endoftext|><|begin_of_text|><|end_of_text|><|im_end|>",
    "",
    " ",
    "\n\n",
)

# The libraries a verdict of the check depends on: KerasHub's graph on one side, the library
# encoders on the other (and meshrun, which builds them). Raise PROBE_FORMAT when how meshrun
# builds its encoders or reaches a verdict changes within one meshrun version.
PROBE_LIBRARIES = ("meshrun", "keras-hub", "tensorflow", "tensorflow-text", "sentencepiece", "tokenizers")
PROBE_FORMAT = 1
VERDICTS = (
    "the verdicts of its tokenizer check"  # what meshrun reads from the token cache for a preset's tokenizer
)

# The tokenizers (by description) whose fall-back to KerasHub's graph this process has warned
# about, so that the warning is said once though a run loads its tokenizer more than once (for its
# sampling plan and for its data, each through load_tokenizer). Module-level because those loads
# share no object a caller holds: they would once the run loads its tokenizer once and hands it on.
_SLOW_FALLBACKS_SAID: set[str] = set()


class TextTokenizer:
    """The tokenizer a model was trained with, as data=text and generation use it: text to ids with
    no special tokens added (`encode`), ids back to text (`decode`), the ids of its special tokens,
    and a fingerprint of the files that define it (for token caches)."""

    def __init__(
        self,
        encoder,
        *,
        description: str,
        vocabulary_size: int,
        start_id: int | None,
        end_id: int | None,
        pad_id: int,
        fingerprint: str,
        stop_ids: tuple[int, ...] = (),
    ):
        self._encoder = encoder
        self.description = description  # one line for logs and metrics.json
        self.backend = encoder.backend  # "sentencepiece", "tokenizers" or "keras_hub"
        self.vocabulary_size = vocabulary_size  # the size of its id space (largest id + 1)
        self.start_id = start_id  # the token the model's preprocessor puts first (None: none)
        self.end_id = end_id
        self.pad_id = pad_id
        self.fingerprint = fingerprint  # sha256 over the bytes of the tokenizer's files
        # the ids generation stops at: the end token, then any other the model's files name
        self.stop_ids = tuple(dict.fromkeys(([] if end_id is None else [end_id]) + list(stop_ids)))
        self._special_tokens: dict[str, int] | None = None

    def encode(self, texts: Sequence[str]) -> list[np.ndarray]:
        """The int32 ids of each text, no special tokens added; many texts are encoded on every core."""
        if isinstance(texts, str):
            raise TypeError("TextTokenizer.encode takes a sequence of texts, not one str")
        return [np.asarray(ids, dtype=np.int32) for ids in self._encoder.encode(list(texts))]

    def encode_ragged(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """The ids of all texts end to end (int32) and each text's count: `encode` without an array
        per text, for many texts at once (data=text)."""
        encoded = self._encoder.encode(list(texts))
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
        values = np.fromiter(itertools.chain.from_iterable(encoded), dtype=np.int32, count=int(lengths.sum()))
        return values, lengths

    def decode(self, ids) -> str:
        """The text of `ids` (a sequence or array of ints), special tokens skipped."""
        return self._encoder.decode([int(i) for i in np.asarray(ids).reshape(-1)])

    def token_id(self, token: str) -> int | None:
        """The id of a token string such as "<eos>", None if the tokenizer has no such token."""
        return self._encoder.token_id(token)

    def token_text(self, token_id: int) -> str:
        """The string of one id as the tokenizer's vocabulary writes it ("<eos>", "▁the", "Ġthe")."""
        return self._encoder.token_text(int(token_id))

    def special_tokens(self) -> dict[str, int]:
        """The tokenizer's special tokens by their text (control and added tokens: "<bos>",
        "<|eot_id|>", "<start_of_turn>"): text that holds one stands for that id alone. Found once
        (a SentencePiece model's are found by looking at every piece)."""
        if self._special_tokens is None:
            self._special_tokens = self._encoder.special_tokens()
        return dict(self._special_tokens)

    def __repr__(self) -> str:
        return f"TextTokenizer({self.description}, backend={self.backend})"


def tokenizer_source(given: str | None, preset: str | None, missing_key: str) -> tuple[str, str]:
    """Where a run's tokenizer comes from and the config key that names it: `given`
    (data.tokenizer), else the model's preset; with neither, a ConfigError on `missing_key`."""
    if given:
        return given, "data.tokenizer"
    if preset:
        return preset, "model.preset"
    raise ConfigError(
        missing_key,
        "needs a tokenizer: model.preset or data.tokenizer (a preset dir or a Hugging Face tokenizer.json); "
        "a model made from model.backbone brings none",
    )


def check_fits_vocabulary(tokenizer: TextTokenizer, source: str, key: str, vocabulary: int) -> None:
    """ConfigError naming `key` (where the tokenizer came from) when it has more ids than the
    model's `vocabulary`: its ids would index past the embedding. Fewer is fine (padded vocabularies)."""
    if tokenizer.vocabulary_size > vocabulary:
        raise ConfigError(
            key,
            f"got {source!r}, whose tokenizer has {tokenizer.vocabulary_size} ids, more than the model's "
            f"vocabulary of {vocabulary}; give the tokenizer the model was trained with",
        )


def load_tokenizer(
    source: str, key: str, cache_dir: str | None = None, shared_cache: bool = False
) -> TextTokenizer:
    """The tokenizer at `source` (a KerasHub preset dir, or a Hugging Face tokenizer.json or a dir
    holding one); anything else is a ConfigError blaming config key `key`. A KerasHub preset's
    tokenizer is checked against KerasHub's own once, the verdict kept in the token cache at
    `cache_dir` (data.cache_dir, None: its default), which must be writable by its owner alone (by
    its group too when `shared_cache`: meshrun.system.trust)."""
    path = Path(str(source)).expanduser()
    file = _tokenizer_file(path, source, key)
    contents = _read_json(file, source, key)
    if _is_keras_serialized(contents):
        return _load_keras_hub(file.parent, source, key, _verdicts_in(cache_dir, shared_cache))
    if isinstance(contents, dict) and isinstance(contents.get("model"), dict):
        return _load_hugging_face(file, contents["model"].get("type", "?"), source, key)
    raise ConfigError(
        key, f"got {source!r}, whose {file.name} is neither KerasHub's nor Hugging Face's; {EXPECTED}"
    )


def _tokenizer_file(path: Path, source, key: str) -> Path:
    """The tokenizer.json that `path` is or holds."""
    if not path.exists():
        raise ConfigError(key, f"got {source!r}, which does not exist; {EXPECTED}")
    if path.is_file():
        return path
    file = path / TOKENIZER_FILE
    if file.is_file():
        return file
    if (path / PRESET_CONFIG_FILE).is_file():
        raise ConfigError(
            key, f"got {source!r}, a preset with no tokenizer (no {TOKENIZER_FILE}); {EXPECTED}"
        )
    raise ConfigError(key, f"got {source!r}, a dir with no {TOKENIZER_FILE}; {EXPECTED}")


def _read_json(file: Path, source, key: str):
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise ConfigError(
            key, f"got {source!r}, whose {file.name} is not readable JSON ({first_line(error)}); {EXPECTED}"
        ) from None


def _is_keras_serialized(contents) -> bool:
    return isinstance(contents, dict) and "class_name" in contents and "config" in contents


def fingerprint_files(root: Path, files: Sequence[Path]) -> str:
    """sha256 hex over the names (relative to `root`) and bytes of `files`, in name order."""
    digest = hashlib.sha256()
    for file in sorted(files, key=lambda f: f.relative_to(root).as_posix()):
        for part in (file.relative_to(root).as_posix().encode(), file.read_bytes()):
            digest.update(len(part).to_bytes(8, "little"))
            digest.update(part)
    return digest.hexdigest()


def available_cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def same_ids(encoded: Sequence, reference: Sequence) -> bool:
    """Whether two encodings of the same texts hold the same ids, text by text."""
    return len(encoded) == len(reference) and all(
        np.array_equal(np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64))
        for a, b in zip(encoded, reference, strict=True)
    )


# --- Hugging Face tokenizer.json --------------------------------------------------------------------


def _load_hugging_face(file: Path, model_type: str, source, key: str) -> TextTokenizer:
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(file))
    except Exception as error:  # tokenizers raises plain Exception for a file it cannot parse
        raise ConfigError(
            key,
            f"got {source!r}, whose {file.name} Hugging Face "
            f"tokenizers cannot load ({first_line(error)}); {EXPECTED}",
        ) from None
    encoder = HuggingFaceEncoder(tokenizer)
    named = _named_special_tokens(file.parent / HF_TOKENIZER_CONFIG_FILE)
    end = _first_token(encoder, [named["eos_token"]] if named.get("eos_token") else HF_END_TOKENS)
    pad = _first_token(encoder, [named["pad_token"]] if named.get("pad_token") else HF_PAD_TOKENS)
    return TextTokenizer(
        encoder,
        description=f"Hugging Face tokenizer ({model_type}) of {file.resolve()}",
        vocabulary_size=max(tokenizer.get_vocab(with_added_tokens=True).values(), default=-1)
        + 1,  # the id space
        start_id=_first_token(encoder, HF_START_TOKENS),
        end_id=end,
        pad_id=pad if pad is not None else (end if end is not None else 0),
        fingerprint=fingerprint_files(file.parent, [file]),
        stop_ids=_model_stop_ids(file.parent),
    )


def _model_stop_ids(folder: Path) -> tuple[int, ...]:
    """The ids a transformers model stops generating at, as its generation_config.json (else its
    config.json) beside the tokenizer names them (`eos_token_id`: an id or a list); () without."""
    for name in (HF_GENERATION_CONFIG_FILE, PRESET_CONFIG_FILE):
        try:
            config = json.loads((folder / name).read_text())
        except (OSError, ValueError):
            continue
        value = config.get("eos_token_id") if isinstance(config, dict) else None
        ids = value if isinstance(value, list) else [value]
        found = tuple(int(i) for i in ids if isinstance(i, int) and not isinstance(i, bool))
        if found:
            return found
    return ()


def _named_special_tokens(file: Path) -> dict[str, str]:
    """The special tokens a tokenizer_config.json beside a tokenizer.json names (bos_token,
    eos_token, pad_token: a string, or a dict with its content), {} without one."""
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError):
        return {}
    named = {}
    for key in ("bos_token", "eos_token", "pad_token"):
        value = config.get(key) if isinstance(config, dict) else None
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            named[key] = value
    return named


def _first_token(encoder, tokens: Sequence[str]) -> int | None:
    """The id of the first of `tokens` the tokenizer has."""
    for token in tokens:
        found = encoder.token_id(token)
        if found is not None:
            return found
    return None


class HuggingFaceEncoder:
    """Encodes with a Hugging Face `tokenizers.Tokenizer` (Rust, a batch on every core)."""

    backend = "tokenizers"
    library = "Hugging Face tokenizers"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        # encode_batch_fast skips the offsets encode_batch computes (tokenizers >= 0.20)
        self._encode_batch = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [encoding.ids for encoding in self._encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def token_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.id_to_token(token_id) or ""

    def special_tokens(self) -> dict[str, int]:
        return {added.content: int(i) for i, added in self.tokenizer.get_added_tokens_decoder().items()}


# --- KerasHub presets ------------------------------------------------------------------------------


def _load_keras_hub(preset: Path, source, key: str, verdicts: cache.ProbeVerdicts) -> TextTokenizer:
    """The preset's tokenizer: its library encoder where that encodes as KerasHub's TensorFlow graph
    does (a verdict found in `verdicts`, else found now and kept there), else the graph itself.
    TensorFlow is imported only to make the check or to use the graph."""
    if not (preset / PRESET_CONFIG_FILE).is_file():
        raise ConfigError(
            key,
            f"got {source!r}, a KerasHub {TOKENIZER_FILE} with no {PRESET_CONFIG_FILE} beside it; {EXPECTED}",
        )
    from meshrun.compat.tensorflow import tensorflow_installed

    fingerprint = fingerprint_files(preset, _keras_hub_tokenizer_files(preset))
    verdict_key = probe_key(fingerprint)
    agrees = verdicts.get(verdict_key)
    if agrees or not tensorflow_installed():  # the check made before, or nothing to check against
        layer = _keras_hub_layer(preset, source, key, tensorflow=False)
        encoder = (
            _fast_encoder(layer)
            if agrees
            else _encoder_without_tensorflow(_fast_encoder(layer), layer, preset, key)
        )
    else:
        layer = _keras_hub_layer(preset, source, key, tensorflow=True)
        encoder = _checked_encoder(
            layer,
            preset,
            agrees,
            lambda verdict: _keep_verdict(verdicts, verdict_key, verdict, layer, fingerprint),
        )
    start, end, pad = _keras_hub_special_ids(layer, preset)
    return TextTokenizer(
        encoder,
        description=f"{type(layer).__name__} ({encoder.library}) of {preset.resolve()}",
        vocabulary_size=int(layer.vocabulary_size()),
        start_id=start,
        end_id=end,
        pad_id=pad,
        fingerprint=fingerprint,
    )


def _encoder_without_tensorflow(encoder, layer, preset: Path, key: str):
    """The library encoder where TensorFlow, and so KerasHub's graph to check it against, is not
    installed: for the kinds it encodes as KerasHub does by construction (SentencePiece; byte-level
    BPE split as GPT-2 splits); for any other, a ConfigError saying TensorFlow is needed."""
    from meshrun.compat.keras_hub import splits_as_byte_pair_tokenizer
    from meshrun.compat.tensorflow import TENSORFLOW_INSTALL

    if isinstance(encoder, SentencePieceEncoder) or (
        encoder is not None and splits_as_byte_pair_tokenizer(layer)
    ):
        return encoder
    raise ConfigError(
        key,
        f"{type(layer).__name__} of {preset.resolve()} splits text its own way, which meshrun encodes with "
        f"KerasHub's TensorFlow graph: needs TensorFlow, which is not installed: {TENSORFLOW_INSTALL}",
    )


def _checked_encoder(layer, preset: Path, agrees: bool | None, keep):
    """`layer`'s library encoder where it encodes PROBE_TEXTS as KerasHub's graph does (`agrees`
    when known, else checked now and given to `keep`), else the graph itself (a warning where the
    library encoder differs: it is much slower). `layer` was made with TensorFlow imported."""
    reference = KerasHubGraphEncoder(layer)
    encoder = _fast_encoder(layer)
    if encoder is None:
        return reference
    if agrees is None:
        agrees = same_ids(encoder.encode(list(PROBE_TEXTS)), reference.encode(list(PROBE_TEXTS)))
        keep(agrees)
    if not agrees:
        _warn_slow(
            f"{type(layer).__name__} of {preset.resolve()}",
            f"does not encode a probe text as KerasHub does with {encoder.library}",
        )
        return reference
    return encoder


def probe_key(fingerprint: str) -> str:
    """The key of the check's verdict for a tokenizer whose files have `fingerprint`: sha256 over
    everything the verdict depends on (probe_inputs)."""
    return hashlib.sha256(json.dumps(probe_inputs(fingerprint), sort_keys=True).encode()).hexdigest()


def probe_inputs(fingerprint: str) -> dict:
    """What the check's verdict depends on: the tokenizer's files (their `fingerprint`), the probe
    texts, the versions of PROBE_LIBRARIES installed and PROBE_FORMAT."""
    return {
        "format": PROBE_FORMAT,
        "fingerprint": fingerprint,
        "probe": PROBE_TEXTS,
        "versions": probe_libraries(),
    }


def probe_libraries() -> dict[str, str | None]:
    """The installed version of each of PROBE_LIBRARIES (None: not installed), read from their
    metadata (nothing is imported)."""
    from meshrun.compat.names import installed_distribution

    versions = {}
    for name in PROBE_LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(installed_distribution(name))
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _verdicts_in(cache_dir: str | None, shared: bool) -> cache.ProbeVerdicts:
    """The check's verdicts in the token cache at `cache_dir`, once its dir and the verdicts' are
    found writable by their owner alone (their group too when `shared`)."""
    root = private_dir(cache.root(cache_dir), "data.cache_dir", shared, what=VERDICTS)
    private_dir(root / cache.PROBES, "data.cache_dir", shared, what=VERDICTS)
    return cache.ProbeVerdicts(root)


def _keep_verdict(
    verdicts: cache.ProbeVerdicts, verdict_key: str, agrees: bool, layer, fingerprint: str
) -> None:
    """Writes the check's verdict (with what it depends on, for whoever reads the file); one that
    cannot be written is said in the log and made again next time."""
    try:
        verdicts.put(verdict_key, agrees, {"tokenizer": type(layer).__name__, **probe_inputs(fingerprint)})
    except OSError as error:
        log.warning(
            f"the verdict of the tokenizer check could not be kept in {verdicts.folder} "
            f"({first_line(error)}); the next run checks again"
        )


def _keras_hub_layer(preset: Path, source, key: str, tensorflow: bool):
    """The preset's tokenizer layer, as KerasHub loads it; with its TensorFlow graph when
    `tensorflow` (TensorFlow is then imported), else keras_hub is imported without TensorFlow
    where nothing has imported it (meshrun.compat.keras_hub)."""
    from meshrun.compat.keras_hub import local_preset_loading

    check_preset_objects(preset, key)
    keras_hub = _import_keras_hub(key, tensorflow)
    try:
        with native_info_lines_dropped(), local_preset_loading():  # SentencePiece's LOG(INFO) lines
            return keras_hub.tokenizers.Tokenizer.from_preset(str(preset))
    except Exception as error:  # whatever a broken preset makes KerasHub raise
        raise ConfigError(
            key, f"got {source!r}, whose tokenizer KerasHub cannot load ({first_line(error)}); {EXPECTED}"
        ) from None


def _import_keras_hub(key: str, tensorflow: bool):
    from meshrun.compat.keras_hub import import_keras_hub

    try:
        return import_keras_hub(tensorflow)
    except ImportError:
        raise ConfigError(
            key,
            "a KerasHub preset's tokenizer needs the keras-hub "
            "package, which is not installed: pip install 'meshrun[hub]'",
        ) from None


def _fast_encoder(layer):
    """The library encoder for `layer` (None for a kind of tokenizer it has none for)."""
    from keras_hub.tokenizers import BytePairTokenizer, SentencePieceTokenizer

    if isinstance(layer, SentencePieceTokenizer) and layer.proto is not None:
        return SentencePieceEncoder(layer.proto)
    if isinstance(layer, BytePairTokenizer) and layer.vocabulary is not None:
        return HuggingFaceEncoder(_byte_level_bpe(layer))
    return None


def _byte_level_bpe(layer):
    """A Hugging Face tokenizer with `layer`'s vocabulary, merges and unsplittable tokens, splitting
    text as GPT-2 does (KerasHub's graph path emulates that split)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    merges = [tuple(merge.split(" ")) for merge in layer.merges if merge and "#version:" not in merge]
    tokenizer = Tokenizer(models.BPE(vocab=dict(layer.vocabulary), merges=merges))
    tokenizer.add_special_tokens(list(layer.unsplittable_tokens or []))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=bool(layer.add_prefix_space))
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _warn_slow(description: str, why: str) -> None:
    """Warns that the tokenizer `description` names is used through KerasHub's graph (`why`),
    once a process."""
    if description not in _SLOW_FALLBACKS_SAID:
        _SLOW_FALLBACKS_SAID.add(description)
        log.warning(
            f"{description} {why}; tokenizing through KerasHub's "
            "TensorFlow graph instead, which is much slower"
        )


def _keras_hub_special_ids(layer, preset: Path) -> tuple[int | None, int | None, int]:
    """(start, end, pad) ids: the start token only where the preset's preprocessor puts it first;
    pad is the tokenizer's, else the end token."""
    start = getattr(layer, "start_token_id", None)
    end = getattr(layer, "end_token_id", None)
    pad = getattr(layer, "pad_token_id", None)
    if not _preprocessor_adds_start(preset):
        start = None
    if pad is None:
        pad = end if end is not None else 0
    return _optional_int(start), _optional_int(end), int(pad)


def _optional_int(value) -> int | None:
    return None if value is None else int(value)


def _preprocessor_adds_start(preset: Path) -> bool:
    """Whether the preset's preprocessor puts the start token first (true where it has none saved:
    KerasHub's causal LM preprocessors do by default)."""
    try:
        config = json.loads((preset / PREPROCESSOR_FILE).read_text(encoding="utf-8")).get("config", {})
    except (OSError, ValueError):
        return True
    return bool(config.get("add_start_token", True))


def _keras_hub_tokenizer_files(preset: Path) -> list[Path]:
    """The files that define a preset's tokenizer: tokenizer.json and its assets."""
    assets = preset / ASSETS_DIR / Path(TOKENIZER_FILE).stem
    return [preset / TOKENIZER_FILE, *(f for f in assets.rglob("*") if f.is_file())]


class SentencePieceEncoder:
    """Encodes with a SentencePiece model (C++, a batch on every core)."""

    backend = "sentencepiece"
    library = "SentencePiece"

    def __init__(self, proto: bytes):
        import sentencepiece

        self.processor = sentencepiece.SentencePieceProcessor(model_proto=proto)
        self.threads = available_cores()

    def encode(self, texts: list[str]) -> list[list[int]]:
        return self.processor.encode(texts, out_type=int, num_threads=self.threads)

    def decode(self, ids: list[int]) -> str:
        return self.processor.decode(ids)  # control tokens (pad, bos, eos) decode to nothing

    def token_id(self, token: str) -> int | None:
        found = self.processor.piece_to_id(token)  # the unknown token's id for a piece it lacks
        return found if self.processor.id_to_piece(found) == token else None

    def token_text(self, token_id: int) -> str:
        return self.processor.id_to_piece(token_id)

    def special_tokens(self) -> dict[str, int]:
        """Control pieces (<bos>, <eos>: never read from text) and the user-defined ones written
        as markers (<start_of_turn>), which the model proto alone tells apart: a piece in angle
        brackets, not a byte, that text encodes to as one id."""
        processor, found = self.processor, {}
        for i in range(processor.get_piece_size()):
            piece = processor.id_to_piece(i)
            if processor.is_control(i) or (
                piece.startswith("<")
                and piece.endswith(">")
                and not processor.is_byte(i)
                and not processor.is_unknown(i)
                and processor.encode(piece) == [i]
            ):
                found[piece] = i
        return found


class KerasHubGraphEncoder:
    """Encodes with a KerasHub tokenizer layer as tf.data runs it (a TensorFlow graph): the
    reference the library encoders are checked against, and the fallback where they differ."""

    backend = "keras_hub"
    library = "KerasHub, TensorFlow graph"

    def __init__(self, layer):
        self.layer = layer
        self._graph = None

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        if not texts:
            return []
        import tensorflow as tf

        values, row_splits = self._traced()(tf.constant(texts, dtype=tf.string))
        return np.split(values.numpy(), row_splits.numpy()[1:-1])

    def _traced(self):
        if self._graph is None:
            import tensorflow as tf

            @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
            def tokenize(texts):
                ids = self.layer.tokenize(texts)
                if not isinstance(ids, tf.RaggedTensor):
                    ids = tf.RaggedTensor.from_tensor(ids)
                return ids.flat_values, ids.row_splits

            self._graph = tokenize
        return self._graph

    def decode(self, ids: list[int]) -> str:
        special = set(self.layer.special_token_ids)
        text = self.layer.detokenize([i for i in ids if i not in special])
        return text.decode("utf-8") if isinstance(text, bytes) else str(text)

    def token_id(self, token: str) -> int | None:
        try:
            found = int(self.layer.token_to_id(token))
            return found if self.layer.id_to_token(found) == token else None
        except (ValueError, KeyError, IndexError):
            return None

    def token_text(self, token_id: int) -> str:
        return str(self.layer.id_to_token(token_id))

    def special_tokens(self) -> dict[str, int]:
        names = [
            *getattr(self.layer, "special_tokens", []),
            *(getattr(self.layer, "unsplittable_tokens", None) or []),
        ]
        return {name: found for name in names if (found := self.token_id(name)) is not None}
