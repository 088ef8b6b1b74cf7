"""Where a tokenizer's files are: the tokenizer.json a source is or holds, read as JSON, told apart
(KerasHub's or Hugging Face's), the files that define a KerasHub preset's tokenizer, and the
fingerprint over a tokenizer's files that the token cache keys on. Bad sources are one-line
ConfigErrors naming the config key and saying what was expected (EXPECTED).

Importing this module imports none of jax, keras, keras_hub and tensorflow.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

from meshrun.errors import ConfigError
from meshrun.wording import first_line

EXPECTED = (
    "expected a KerasHub preset dir (config.json, tokenizer.json and assets/, as save_to_preset writes) "
    "or a Hugging Face tokenizer.json (or a dir holding one)"
)
TOKENIZER_FILE = "tokenizer.json"  # KerasHub's tokenizer config in a preset, and Hugging Face's tokenizer
PRESET_CONFIG_FILE = "config.json"
PREPROCESSOR_FILE = "preprocessor.json"
ASSETS_DIR = "assets"


def tokenizer_file(path: Path, source, key: str) -> Path:
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


def read_json(file: Path, source, key: str):
    """The contents of the JSON `file` of `source`; a ConfigError on `key` where it is unreadable."""
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise ConfigError(
            key, f"got {source!r}, whose {file.name} is not readable JSON ({first_line(error)}); {EXPECTED}"
        ) from None


def is_keras_serialized(contents) -> bool:
    """Whether a tokenizer.json's `contents` are a serialized Keras object (KerasHub's)."""
    return isinstance(contents, dict) and "class_name" in contents and "config" in contents


def keras_hub_tokenizer_files(preset: Path) -> list[Path]:
    """The files that define a preset's tokenizer: tokenizer.json and its assets."""
    assets = preset / ASSETS_DIR / Path(TOKENIZER_FILE).stem
    return [preset / TOKENIZER_FILE, *(f for f in assets.rglob("*") if f.is_file())]


def fingerprint_files(root: Path, files: Sequence[Path]) -> str:
    """sha256 hex over the names (relative to `root`) and bytes of `files`, in name order."""
    digest = hashlib.sha256()
    for file in sorted(files, key=lambda f: f.relative_to(root).as_posix()):
        for part in (file.relative_to(root).as_posix().encode(), file.read_bytes()):
            digest.update(len(part).to_bytes(8, "little"))
            digest.update(part)
    return digest.hexdigest()
