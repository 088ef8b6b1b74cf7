"""Caches are code: XLA's persistent compilation cache holds executables (on a CPU, machine code)
that jax loads and runs, and the token cache holds the rows a run trains on. meshrun uses a cache
directory only when no one but its owner (this user, or root) can write to it: a directory the
group can write to is refused unless the user says they trust that group (`cache.shared=true`,
then a one-line warning), and one everyone can write to, or another user owns, is always refused.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path

from meshrun.errors import ConfigError

log = logging.getLogger("meshrun")


def private_dir(path: str | os.PathLike, key: str, shared: bool, what: str) -> Path:
    """`path`, once checked to be writable by its owner alone (by its group too when `shared`); a
    ConfigError naming `key`, the directory, `what` meshrun loads from it and the chmod that fixes
    it otherwise. A directory that
    does not exist yet passes: this process will make it (nothing is made here, so that a run
    refused later leaves nothing behind)."""
    path = Path(path).expanduser()
    if not path.exists():
        return path
    info = path.stat()
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid not in (os.getuid(), 0):
        raise ConfigError(
            key,
            f"got {path}, which user {info.st_uid} owns; meshrun loads {what} from it only when you or root "
            "own it: give a directory of your own",
        )
    if mode & stat.S_IWOTH:
        raise ConfigError(
            key,
            f"got {path}, which everyone can write to (mode {mode:04o}); meshrun loads {what} from it only "
            "when no one but its owner can write to it: chmod o-w,g-w "
            f"{path} (cache.shared=true trusts a group, never everyone)",
        )
    if mode & stat.S_IWGRP:
        if not shared:
            raise ConfigError(
                key,
                f"got {path}, which its group can write to (mode {mode:04o}); meshrun loads {what} from it "
                "only when no one but its owner can write to it: chmod "
                f"g-w {path}, or cache.shared=true if you trust that group",
            )
        log.warning(
            f"{key}: {path} is writable by its group (mode {mode:04o}); "
            "using it since cache.shared=true trusts that group"
        )
    return path


# What a preset's JSON may ask Keras to build: Keras' and KerasHub's own objects. Any other module
# would be imported (running its code) to find the class; a Lambda layer holds code itself.
TRUSTED_MODULES = ("keras", "keras_hub")
CODE_CLASSES = ("Lambda", "__lambda__")


def check_preset_objects(preset: str | os.PathLike, key: str) -> None:
    """ConfigError when a JSON file of KerasHub preset dir `preset` asks for an object that is not
    Keras' or KerasHub's (its module would be imported) or for a Lambda (code in the config), naming
    the file and the object; `key` is the config key that named the preset."""
    for path in sorted(Path(preset).expanduser().glob("*.json")):
        try:
            document = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # KerasHub's own loading says what is wrong with it
        found = _untrusted_object(document)
        if found is not None:
            module, class_name = found
            what = (
                "a Lambda (code inside the config)"
                if class_name in CODE_CLASSES
                else "code outside Keras and KerasHub"
            )
            raise ConfigError(
                key,
                f"got {str(preset)!r}, whose {path.name} asks for "
                f"{module + '.' if module else ''}{class_name}, "
                f"{what}; meshrun loads only Keras' and KerasHub's own objects from a preset",
            )


def _untrusted_object(node) -> tuple[str, str] | None:
    """The (module, class name) of the first serialized object in `node` that is not Keras' or
    KerasHub's, or is a Lambda; None when there is none."""
    if isinstance(node, dict):
        class_name, module = node.get("class_name"), node.get("module")
        if isinstance(class_name, str):
            foreign = (
                isinstance(module, str)
                and module.split(".")[0] not in TRUSTED_MODULES
                and module != "builtins"
            )
            if class_name in CODE_CLASSES or foreign:
                return (module or "", class_name)
        children = node.values()
    elif isinstance(node, list):
        children = node
    else:
        return None
    for child in children:
        found = _untrusted_object(child)
        if found is not None:
            return found
    return None
