"""What model=keras_hub finds in model.preset and model.task before anything is built: whether the
preset dir is a KerasHub preset (save_to_preset's config.json) or a Hugging Face transformers
checkpoint (meshrun.hf.checkpoint), what its small JSON files say (the task class it was saved
from, its preprocessor's sequence length, its backbone's max_sequence_length), and the KerasHub
classes a run builds (the task, its backbone), with keras_hub imported the way meshrun imports it.
Nothing is downloaded: a preset handle or a Hugging Face Hub id is an error saying how to download
it first.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from meshrun.errors import ConfigError
from meshrun.system.trust import check_preset_objects
from meshrun.wording import did_you_mean, one_of

HANDLE = re.compile(r"^[a-z]+://|^[\w.-]+$")  # kaggle://..., hf://..., or a bare preset name
HUB_ID = re.compile(r"^(?:hf://)?([\w.-]+)/([\w.-]+)$")  # a Hugging Face Hub id: org/name
LOCAL = ("/", "./", "../", "~")  # how a value that can only be a path starts
DEFAULT_SEQ_LEN = 128  # model.seq_len without a preset


def _preset_file(preset: str, name: str) -> dict:
    """JSON file `name` of a preset dir ({} where the preset has no such file)."""
    path = Path(preset).expanduser() / name
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except (ValueError, OSError) as err:
        raise ConfigError("model.preset", f"cannot read {str(path)!r} ({err})") from None


def _preset_config(preset: str, name: str) -> dict:
    """The `config` of JSON file `name` of a preset dir ({} where the preset has no such file)."""
    return _preset_file(preset, name).get("config", {})


def task_name(task: str | None, preset: str | None) -> str:
    """The name of the causal LM class a run builds: model.task (`task`), else the class the preset
    was saved from (its task.json), else the one KerasHub picks for the preset's backbone
    (GemmaBackbone: GemmaCausalLM)."""
    if task or not preset:
        return task
    checkpoint = transformers_checkpoint(preset)
    if checkpoint is not None:
        return checkpoint.family.task
    saved = _preset_file(preset, "task.json").get("class_name")
    if saved:
        return saved
    backbone = _preset_file(preset, "config.json").get("class_name", "")
    return backbone.removesuffix("Backbone") + "CausalLM" if backbone.endswith("Backbone") else "CausalLM"


def preset_sequence_length(preset: str) -> int:
    """The sequence length of a preset's own preprocessor (DEFAULT_SEQ_LEN where it has none)."""
    return int(_preset_config(preset, "preprocessor.json").get("sequence_length") or DEFAULT_SEQ_LEN)


def max_sequence_length(preset: str | None, backbone: dict) -> int | None:
    """The longest sequence the backbone takes (its position embedding's length), or None where it
    has no such limit (rotary position encodings): from model.preset's config.json, else from
    model.backbone's arguments (`backbone`)."""
    config = _preset_config(preset, "config.json") if preset else backbone
    value = config.get("max_sequence_length")
    return int(value) if isinstance(value, int) else None


def check_preset(preset: str) -> None:
    """ConfigError on model.preset unless it is a transformers checkpoint meshrun loads (every check
    a load needs) or a KerasHub preset dir whose objects meshrun trusts; a preset handle is refused
    with how to save the preset first."""
    from meshrun.hf import checkpoint as hf_checkpoint

    path = Path(preset).expanduser()
    if hf_checkpoint.is_transformers_dir(path):
        hf_checkpoint.inspect(path)  # every check a load needs, before anything loads
        return
    if (path / "config.json").is_file():
        check_preset_objects(path, "model.preset")
        return
    if not path.exists():
        raise _missing_preset(preset, path)
    raise ConfigError(
        "model.preset",
        f"got {preset!r}, which is not a preset dir (one holding config.json, as save_to_preset writes)",
    )


def _missing_preset(preset: str, path: Path) -> ConfigError:
    """The error of a model.preset that is nothing here: a Hugging Face Hub id (org/name, whose org
    is no local dir either) or a KerasHub preset handle says that meshrun downloads nothing and how
    to download it first; anything else is a path that does not exist."""
    hub = HUB_ID.match(preset)
    if hub and (preset.startswith("hf://") or not path.parent.exists()):
        hub_id, name = f"{hub[1]}/{hub[2]}", hub[2]
        return ConfigError(
            "model.preset",
            f"got {preset!r}, a Hugging Face Hub id and no local dir; meshrun downloads nothing: download it "
            f"first, where there is a network (hf download {hub_id} --local-dir models/{name}), then give "
            f"model.preset=models/{name}",
        )
    if HANDLE.match(preset) and not preset.startswith(LOCAL):
        return ConfigError(
            "model.preset",
            f"got {preset!r}, a preset handle; meshrun downloads nothing: download the preset first "
            "(e.g. keras_hub.models.CausalLM.from_preset(...).save_to_preset(DIR)) and give the dir",
        )
    where = f" ({path.absolute()})" if str(path.absolute()) != preset else ""
    return ConfigError(
        "model.preset",
        f"got {preset!r}{where}, which does not exist; give the dir of a transformers checkpoint "
        "(config.json, safetensors, tokenizer files) or of a KerasHub preset (save_to_preset)",
    )


def transformers_checkpoint(preset: str | None):
    """The checked transformers checkpoint model.preset (`preset`) names (meshrun.hf.checkpoint), or
    None where it is not one."""
    from meshrun.hf import checkpoint as hf_checkpoint

    if not preset or not hf_checkpoint.is_transformers_dir(preset):
        return None
    return hf_checkpoint.inspect(preset)


def import_keras_hub():
    """keras_hub, imported without TensorFlow where nothing has imported it yet (KerasHub models need
    none: meshrun feeds them through Grain; meshrun.compat.keras_hub); a ConfigError saying how to
    install keras_hub when it is missing."""
    from meshrun.compat.keras_hub import import_keras_hub as import_without_tensorflow

    try:
        return import_without_tensorflow()
    except ImportError:
        raise ConfigError(
            "model",
            "model=keras_hub needs the keras-hub package, which is not installed: pip install 'meshrun[hub]'",
        ) from None


def task_class(task: str | None):
    """The KerasHub causal LM class of model.task (`task`), or, without one, CausalLM, whose
    from_preset picks the class a preset was saved from."""
    keras_hub = import_keras_hub()
    causal = sorted(n for n in dir(keras_hub.models) if n.endswith("CausalLM") and n != "CausalLM")
    if task is None:
        return keras_hub.models.CausalLM  # from_preset picks the preset's own class
    if task in causal:
        return getattr(keras_hub.models, task)
    if isinstance(getattr(keras_hub.models, task, None), type):
        raise ConfigError(
            "model.task",
            f"got {task!r}, which is not a causal language model; meshrun trains those: {one_of(causal)}",
        )
    raise ConfigError("model.task", f"got {task!r}; {did_you_mean(task, causal)}valid: {one_of(causal)}")


def backbone_class(task: str | None, preset: str | None):
    """The KerasHub backbone class a run builds: model.task's, else a transformers checkpoint's
    family's, else the one a KerasHub preset's config.json names."""
    if task is not None:
        return task_class(task).backbone_cls
    checkpoint = transformers_checkpoint(preset)
    if checkpoint is not None:
        return getattr(import_keras_hub().models, checkpoint.family.backbone)
    config = json.loads((Path(preset).expanduser() / "config.json").read_text())
    return getattr(import_keras_hub().models, config["class_name"])
