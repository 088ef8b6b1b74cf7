"""One pass over a transformers checkpoint dir that checks everything a load needs before anything
is read (`inspect`), giving the typed record the load, the plan and the export work from
(`HFCheckpoint`). Each problem is one ConfigError on model.preset: config.json without weights, a
shard the index names that is missing, a tensor whose shape disagrees with config.json, a tensor
the backbone has no variable for, a model_type without a converter, a config value the backbone
cannot express, a tokenizer.json and a tokenizer.model that disagree on the vocabulary."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from meshrun.errors import ConfigError
from meshrun.hf import families, safetensors
from meshrun.hf.families import KEY, Family, HFConfig, TensorMap

CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
)
GENERATION_FILE = "generation_config.json"
# Tensors a checkpoint may hold that carry nothing the backbone needs.
IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


@dataclass(frozen=True)
class HFCheckpoint:
    """A checked transformers checkpoint: where it is, its config, family, the backbone's
    constructor arguments (without dtype), the weights' dtype, the tensor map and where each
    tensor lies, and the tokenizer and generation files it has."""

    path: Path
    config: HFConfig
    family: Family
    arguments: dict
    dtype: str
    tensors: tuple[TensorMap, ...]
    entries: dict  # tensor name -> safetensors.TensorEntry
    files: tuple[str, ...]  # the weight files, as the index names them
    tokenizer_files: tuple[str, ...]

    @property
    def model_type(self) -> str:
        return self.config.model_type

    @property
    def weight_bytes(self) -> int:
        return sum(self.entries[t.name].nbytes for t in self.tensors)

    def describe(self) -> str:
        """`llama (transformers, bfloat16, 2 shards) at /models/llama`, as the plan shows it."""
        shards = f"{len(self.files)} shards" if len(self.files) > 1 else "1 file"
        return f"{self.model_type} (transformers, {self.dtype}, {shards}) at {self.path}"


def is_transformers_dir(preset: str | Path) -> bool:
    """Whether `preset` is a transformers checkpoint dir: its config.json has a model_type (a
    KerasHub preset's config.json has class_name instead)."""
    file = Path(preset).expanduser() / CONFIG_FILE
    if not file.is_file():
        return False
    try:
        config = json.loads(file.read_text())
    except (ValueError, OSError):
        return False
    return isinstance(config, dict) and "model_type" in config and "class_name" not in config


def inspect(preset: str | Path) -> HFCheckpoint:
    """The checked checkpoint at `preset` (cached per dir and file times: the config, plan and build
    all ask)."""
    path = Path(preset).expanduser().resolve()
    stamp = tuple((f.name, f.stat().st_mtime_ns) for f in sorted(path.iterdir()) if f.is_file())
    return _inspect(path, str(preset), stamp)


@functools.lru_cache(maxsize=8)
def _inspect(path: Path, source: str, _stamp) -> HFCheckpoint:
    config = HFConfig(_read_json(path / CONFIG_FILE, source), source)
    family = families.family_of(config)
    arguments = family.arguments(config)
    dtype = config.dtype
    tensors = tuple(family.tensors(arguments, config))
    files, entries = _weight_entries(path, source)
    _check_tensors(tensors, entries, config, family.backbone, source)
    _check_tokenizer_files(path, source)
    tokenizer_files = tuple(name for name in TOKENIZER_FILES if (path / name).is_file())
    return HFCheckpoint(path, config, family, arguments, dtype, tensors, entries, files, tokenizer_files)


def _read_json(file: Path, source: str) -> dict:
    try:
        return json.loads(file.read_text())
    except (ValueError, OSError) as error:
        raise ConfigError(KEY, f"got {source!r}, whose {file.name} cannot be read ({error})") from None


def _weight_entries(path: Path, source: str) -> tuple[tuple[str, ...], dict]:
    """The weight files (as the index names them, or model.safetensors) and every tensor in them."""
    if (path / INDEX_FILE).is_file():
        weight_map = _read_json(path / INDEX_FILE, source).get("weight_map") or {}
        files = tuple(dict.fromkeys(weight_map.values()))
        missing = [name for name in files if not (path / name).is_file()]
        if missing:
            raise ConfigError(
                KEY,
                f"got {source!r}, whose {INDEX_FILE} names {missing[0]!r}, which is not in the dir "
                f"({len(missing)} of {len(files)} shards missing): download the whole checkpoint",
            )
    elif (path / SINGLE_FILE).is_file():
        weight_map, files = None, (SINGLE_FILE,)
    else:
        others = sorted(p.name for p in path.glob("*.bin")) + sorted(p.name for p in path.glob("*.pth"))
        found = f"; it has {others[0]}, a PyTorch pickle, which meshrun does not read" if others else ""
        raise ConfigError(
            KEY,
            f"got {source!r}, a transformers checkpoint with config.json but no weights (no {SINGLE_FILE} "
            f"or {INDEX_FILE}){found}; valid: a dir holding safetensors weights",
        )
    entries = {}
    for name in files:
        try:
            found, _ = safetensors.read_header(path / name)
        except (safetensors.FormatError, OSError) as error:
            raise ConfigError(
                KEY, f"got {source!r}, whose {name} is not a safetensors file ({error})"
            ) from None
        entries.update(found)
    if weight_map is not None:
        stray = [name for name, file in weight_map.items() if name not in entries]
        if stray:
            raise ConfigError(
                KEY,
                f"got {source!r}, whose {INDEX_FILE} puts {stray[0]!r} in "
                f"{weight_map[stray[0]]}, which lacks it",
            )
    return files, entries


def _check_tensors(
    tensors: tuple[TensorMap, ...], entries: dict, config: HFConfig, backbone: str, source: str
) -> None:
    """Every tensor the config implies is there with the shape it implies, and every tensor there
    fills a variable."""
    for tensor in tensors:
        entry = entries.get(tensor.name)
        expected = tensor.transform.hf_shape
        if entry is None:
            raise ConfigError(
                KEY,
                f"got {source!r}, which has no tensor {tensor.name!r} "
                f"(shape {list(expected)}, from config.json)",
            )
        if entry.shape != expected:
            raise ConfigError(
                KEY,
                f"got {source!r}, whose tensor {tensor.name!r} in {entry.file.name} has shape "
                f"{list(entry.shape)}, but config.json implies {list(expected)}: the weights and "
                "config.json are from different models",
            )
    mapped = {tensor.name for tensor in tensors}
    tied = bool(config.get("tie_word_embeddings", False))
    for name, entry in entries.items():
        if name in mapped or name.endswith(IGNORED_SUFFIXES) or (tied and name == "lm_head.weight"):
            continue
        raise ConfigError(
            KEY,
            f"got {source!r}, whose tensor {name!r} (shape {list(entry.shape)}) has no place in KerasHub's "
            f"{backbone}: meshrun cannot load it exactly",
        )


def _check_tokenizer_files(path: Path, source: str) -> None:
    """A tokenizer.json and a tokenizer.model beside it must have the same vocabulary size."""
    if not ((path / "tokenizer.json").is_file() and (path / "tokenizer.model").is_file()):
        return
    fast = _read_json(path / "tokenizer.json", source)
    fast_size = len((fast.get("model") or {}).get("vocab") or {})
    slow_size = _sentencepiece_size(path / "tokenizer.model", source)
    if fast_size and slow_size is not None and fast_size != slow_size:
        raise ConfigError(
            KEY,
            f"got {source!r}, whose tokenizer.json has {fast_size} tokens and tokenizer.model {slow_size}: "
            "they are not the same tokenizer; keep the pair the checkpoint was published with",
        )


def _sentencepiece_size(file: Path, source: str) -> int | None:
    """The number of pieces in a SentencePiece model (None without the sentencepiece package)."""
    try:
        import sentencepiece
    except ImportError:
        return None
    processor = sentencepiece.SentencePieceProcessor()
    try:
        processor.LoadFromSerializedProto(file.read_bytes())
    except Exception as error:  # sentencepiece raises RuntimeError or OSError for a bad proto
        raise ConfigError(KEY, f"got {source!r}, whose tokenizer.model cannot be read ({error})") from None
    return processor.get_piece_size()
