"""The options of model=keras_hub (model.*) and their checks: which KerasHub causal LM (model.task
and model.backbone, or model.preset), the sequence length it trains on, its dtype, its quantized
base (model.quantize) and its LoRA adapters (model.lora, LoraOptions). Checking them reads the
preset's small JSON files and, for a transformers dir, its config and headers
(meshrun.models.hub.presets); nothing is imported from keras or keras_hub.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshrun.config.fields import setting
from meshrun.errors import ConfigError
from meshrun.models.hub import presets
from meshrun.models.registry import require_positive
from meshrun.specs.quantized import check_quantize_mode
from meshrun.wording import one_of

VARIABLE_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class LoraOptions:
    """LoRA adapters for fine-tuning (model.lora): `rank` of the low-rank update added to each
    target layer's kernel (None: LoRA off, every weight trains), `alpha` the update's scale
    numerator (the update is multiplied by alpha / rank; None: alpha = rank, a scale of 1), and
    `targets` the names of the layers that get an adapter (None: the backbone's
    default_lora_layer_names(), the attention query and value projections). With LoRA on, only the
    adapters train: every other weight of the backbone is frozen, target layers' biases included.
    `dropout`: the share of each adapter's input dropped in training (PEFT's lora_dropout; the
    layers' own kernels see all of it), 0 for none."""

    rank: int | None = setting(None, "The adapters' rank, e.g. 8; null: LoRA off, every weight trains.")
    alpha: float | None = setting(
        None, "The update is scaled by alpha / rank; null: alpha = rank (a scale of 1)."
    )
    targets: tuple[str, ...] | None = setting(
        None, "The names of the layers that get an adapter; null: the backbone's default, query and value."
    )
    dropout: float = setting(
        0.0, "The share of each adapter's input dropped in training (PEFT's lora_dropout); 0: none."
    )

    def __post_init__(self):
        if not 0 <= self.dropout < 1:
            raise ConfigError(
                "model.lora.dropout",
                f"got {self.dropout:g}; valid: a number in [0, 1) (the share of each adapter's input "
                "dropped in training), 0 for none",
            )
        if self.rank is None:
            if self.dropout:
                raise ConfigError(
                    "model.lora.dropout",
                    f"got {self.dropout:g} with model.lora.rank=null, which leaves LoRA "
                    "off; set model.lora.rank (e.g. 8) to train adapters",
                )
            for key in ("alpha", "targets"):
                if getattr(self, key) is not None:
                    raise ConfigError(
                        f"model.lora.{key}",
                        f"got {_listed(getattr(self, key))} with model.lora.rank=null, which leaves LoRA "
                        "off; set model.lora.rank (e.g. 8) to train adapters",
                    )
            return
        if self.rank <= 0:
            raise ConfigError(
                "model.lora.rank",
                f"got {self.rank}; valid: a positive integer (the "
                "adapters' rank, e.g. 8), or null for no LoRA",
            )
        if self.alpha is not None and self.alpha <= 0:
            raise ConfigError(
                "model.lora.alpha",
                f"got {self.alpha:g}; valid: a positive number (the update is scaled by alpha / rank), "
                "or null for alpha = rank",
            )
        if self.targets is not None and not self.targets:
            raise ConfigError(
                "model.lora.targets",
                "got an empty list; valid: layer names such as "
                "[query,value], or null for the backbone's default",
            )

    @property
    def enabled(self) -> bool:
        """Whether the model trains LoRA adapters (model.lora.rank is set)."""
        return self.rank is not None

    @property
    def scale(self) -> float:
        """alpha / rank: what the adapters' product is multiplied by."""
        return (self.alpha or self.rank) / self.rank


def _listed(value) -> str:
    """A model.lora value as error messages show it."""
    return (
        repr(list(value))
        if isinstance(value, tuple)
        else f"{value:g}"
        if isinstance(value, float)
        else repr(value)
    )


@dataclass(frozen=True)
class KerasHubOptions:
    """Which KerasHub causal LM (`task`, a class of keras_hub.models such as LlamaCausalLM), its
    backbone's constructor arguments (`backbone`) or a local preset dir (`preset`), and the
    sequence length it trains on (`seq_len`: synthetic data is made this long, and other data must
    have it; None: the preset's preprocessor's, else DEFAULT_SEQ_LEN). A seq_len above the
    backbone's max_sequence_length (where it has one) is an error before anything loads. `lora`:
    LoRA adapters to fine-tune instead of every weight (LoraOptions)."""

    task: str | None = setting(
        None,
        "A causal LM class of keras_hub.models: LlamaCausalLM, GemmaCausalLM, MistralCausalLM, "
        "QwenCausalLM, GPT2CausalLM, ...",
    )
    backbone: dict = setting(
        doc="The backbone's constructor arguments (random init), e.g. "
        "'model.backbone={vocabulary_size:512,num_layers:2,hidden_dim:64}'.",
        factory=dict,
    )
    preset: str | None = setting(
        None,
        "A local dir instead of backbone: a KerasHub preset (save_to_preset) or a Hugging Face "
        "transformers checkpoint (config.json, safetensors, tokenizer files); nothing is downloaded.",
    )
    seq_len: int | None = setting(
        None,
        "The tokens per example it trains on (synthetic data is made this long, other data must have "
        "it); null: the preset preprocessor's sequence length (128 without a preset).",
    )
    dtype: str | None = setting(
        None,
        "The backbone's dtype: float32, bfloat16 or float16; null: a transformers checkpoint's own "
        "(config.json), a KerasHub preset's own, else Keras' policy (train.precision).",
    )
    quantize: str | None = setting(
        None,
        "int8 or int4: the base's Dense and EinsumDense layers are quantized and frozen as their weights "
        "load (QLoRA with model.lora.rank); null: the base stays float.",
    )
    lora: LoraOptions = setting(
        doc="LoRA fine-tuning (model.lora.<key>): only the adapters train; checkpoint.export=true also "
        "writes adapter.lora.h5.",
        factory=LoraOptions,
    )

    def __post_init__(self):
        if self.dtype is not None and self.dtype not in VARIABLE_DTYPES:
            raise ConfigError("model.dtype", f"got {self.dtype!r}; valid: {one_of(VARIABLE_DTYPES)}, or null")
        if self.dtype is not None and "dtype" in self.backbone:
            raise ConfigError(
                "model.dtype",
                f"got {self.dtype!r} beside model.backbone.dtype={self.backbone['dtype']!r}; "
                "give one of them",
            )
        _check_quantize(self)
        if self.preset:
            presets.check_preset(self.preset)
        if self.seq_len is None:
            object.__setattr__(
                self,
                "seq_len",
                presets.preset_sequence_length(self.preset) if self.preset else presets.DEFAULT_SEQ_LEN,
            )
        require_positive(self, "seq_len")
        limit = presets.max_sequence_length(self.preset, self.backbone)
        if limit is not None and self.seq_len > limit:
            raise ConfigError(
                "model.seq_len",
                f"got {self.seq_len}, more than the backbone's "
                f"max_sequence_length {limit}; valid: 1 to {limit}",
            )
        if self.preset:
            _check_task_of_checkpoint(self)
            if self.backbone:
                raise ConfigError(
                    "model.backbone",
                    f"got {self.backbone} with model.preset: a preset holds "
                    "its backbone's arguments; leave model.backbone empty",
                )
        elif not self.task:
            raise ConfigError(
                "model.task",
                "is required: a KerasHub causal LM class, e.g. "
                "LlamaCausalLM or GemmaCausalLM (or model.preset=DIR)",
            )
        elif not self.backbone:
            raise ConfigError(
                "model.backbone",
                f"is required with model.task={self.task}: the backbone's constructor arguments, e.g. "
                "{vocabulary_size:512,num_layers:2,num_query_heads:8,num_key_value_heads:4,hidden_dim:64,intermediate_dim:128}",
            )


def _check_quantize(options: KerasHubOptions) -> None:
    """model.quantize: a mode Keras has, on a frozen base under LoRA adapters."""
    check_quantize_mode(options.quantize)
    if options.quantize is None:
        return
    if not options.lora.enabled:
        raise ConfigError(
            "model.quantize",
            f"got {options.quantize!r} with model.lora.rank=null, which trains every weight, and quantized "
            "weights cannot train; set model.lora.rank (e.g. 8) to train adapters on the quantized base "
            "(QLoRA), or model.quantize=null",
        )


def _check_task_of_checkpoint(options: KerasHubOptions) -> None:
    """model.task, where given beside a transformers checkpoint, must be its family's task."""
    checkpoint = presets.transformers_checkpoint(options.preset)
    if options.task and checkpoint is not None and options.task != checkpoint.family.task:
        raise ConfigError(
            "model.task",
            f"got {options.task!r}, but model.preset is a {checkpoint.model_type} checkpoint, which "
            f"builds {checkpoint.family.task}; valid: {checkpoint.family.task}, or null",
        )
