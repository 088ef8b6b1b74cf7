"""keras_hub: KerasHub causal language models, by class and constructor arguments or from a local
preset dir (keras-hub is an optional dependency: pip install 'meshrun[hub]').

    meshrun train model=keras_hub model.task=LlamaCausalLM \
      'model.backbone={vocabulary_size:512,num_layers:2,num_query_heads:8,num_key_value_heads:4,'\
'hidden_dim:64,intermediate_dim:128}' \
      model.seq_len=32 mesh=2x4 layout=from_model

- The backbone is `Task.backbone_cls(**model.backbone)`, randomly initialised, or the architecture
  and weights of `model.preset`, a local dir as `save_to_preset` writes it (nothing is downloaded).
  The task is built with preprocessor=None and compile=False: the data holds token ids.
- Inputs {token_ids, padding_mask} of model.seq_len tokens, the next tokens as labels. The loss is
  the next-token cross-entropy averaged over the labels that weigh (the data's sample weights,
  else the padding mask), `reduction="mean_with_sample_weight"`: the task's own default divides by
  every position, padding included, so padded data would get a wrong loss and perplexity.
- layout=from_model turns the backbone's own `get_layout_map` into rules (KerasHub has one for
  Llama, Gemma, Qwen, QwenMoe and Qwen3Moe). Its Llama and Qwen maps use Gemma's q/k/v axes on
  kernels laid out (hidden, heads, head_dim): the heads land on the batch axis (which must then
  divide them) and the untied head `token_embedding/reverse_embeddings` has no rule (keras-hub
  #2795, #2807). The plan warns about both; meshrun's own layouts llama_tp, llama_fsdp, llama_2d
  (Llama, Mistral, Qwen) and gemma_tp, gemma_fsdp, gemma_2d place them Megatron style.
- model.lora.rank=R trains LoRA adapters on the target layers (query and value by default) and
  freezes every other weight, in the plan's build and the run's alike (same variable paths:
  `.../query/lora_kernel_a`, `.../lora_kernel_b`, which meshrun's layouts leave replicated).
- model.quantize=int8|int4 (with model.lora.rank: QLoRA) builds the Dense and EinsumDense layers
  in Keras' quantized form and quantizes each weight as it is read (meshrun.quantize); layout rules
  written for the float kernels are carried over to the quantized ones (meshrun.placement.quantized).
- checkpoint.export=true writes, beside model.keras, `preset/` (a KerasHub preset with the adapters
  merged and model.preset's tokenizer) and for a LoRA run `adapter.lora.h5`
  (meshrun.models.hub_export). Without an export, a LoRA fine-tune of model.preset keeps its
  `adapter.lora.h5` all the same (checkpoint.keep_adapter, on by default). A transformers
  model.preset exports `hf/` (a transformers checkpoint) and `peft/` instead of `preset/`
  (meshrun.hf.export).
"""

from __future__ import annotations

import contextlib
import math
import re
from dataclasses import dataclass
from pathlib import Path

from meshrun import user_code
from meshrun.config.fields import setting
from meshrun.errors import ConfigError
from meshrun.models.registry import InputSpec, ModelSpec, class_accuracy, register_model, require_positive
from meshrun.system.trust import check_preset_objects
from meshrun.wording import did_you_mean, format_bytes, one_of

HANDLE = re.compile(r"^[a-z]+://|^[\w.-]+$")  # kaggle://..., hf://..., or a bare preset name
# Backbones whose variable paths meshrun's own layouts are written for, by layout family.
FAMILIES = {
    "LlamaBackbone": "llama",
    "MistralBackbone": "llama",
    "QwenBackbone": "llama",
    "Qwen3Backbone": "llama",
    "GemmaBackbone": "gemma",
    "Gemma3Backbone": "gemma",
}
# Attention kernels and the dimension that holds their heads: Llama-style (hidden, heads, head_dim),
# Gemma-style (heads, hidden, head_dim).
HEAD_DIMENSIONS = (
    (re.compile(r".*self_attention/(query|key|value)/kernel"), 1),
    (re.compile(r".*decoder_block_\d+/attention/(query|key|value)/kernel"), 0),
)
UNTIED_HEAD = "token_embedding/reverse_embeddings"
# Keyword arguments a backbone's **kwargs passes on to keras.Model.
LAYER_KEYWORDS = ("name", "trainable", "dtype")
DEFAULT_SEQ_LEN = 128  # model.seq_len without a preset
VARIABLE_DTYPES = ("float32", "bfloat16", "float16")
LORA_DROPOUT_SEED = "lora_dropout"  # the seed generator of model.lora.dropout's masks, on the backbone


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
            _check_preset(self.preset)
        if self.seq_len is None:
            object.__setattr__(
                self, "seq_len", preset_sequence_length(self.preset) if self.preset else DEFAULT_SEQ_LEN
            )
        require_positive(self, "seq_len")
        limit = max_sequence_length(self)
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
    """model.quantize: a mode Keras has, on a frozen base under LoRA adapters without dropout."""
    from meshrun.specs.quantized import check_quantize_mode

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
    if options.lora.dropout:
        raise ConfigError(
            "model.lora.dropout",
            f"got {options.lora.dropout:g} with model.quantize={options.quantize}: Keras' quantized layers "
            "compute their adapters in their own call, which meshrun cannot drop inputs in; set "
            "model.lora.dropout=0, or model.quantize=null",
        )


def _check_task_of_checkpoint(options: KerasHubOptions) -> None:
    """model.task, where given beside a transformers checkpoint, must be its family's task."""
    checkpoint = transformers_checkpoint(options)
    if options.task and checkpoint is not None and options.task != checkpoint.family.task:
        raise ConfigError(
            "model.task",
            f"got {options.task!r}, but model.preset is a {checkpoint.model_type} checkpoint, which "
            f"builds {checkpoint.family.task}; valid: {checkpoint.family.task}, or null",
        )


def _preset_file(preset: str, name: str) -> dict:
    """JSON file `name` of a preset dir ({} where the preset has no such file)."""
    import json

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


def task_name(options: KerasHubOptions) -> str:
    """The name of the causal LM class a run builds: model.task, else the class the preset was
    saved from (its task.json), else the one KerasHub picks for the preset's backbone
    (GemmaBackbone: GemmaCausalLM)."""
    if options.task or not options.preset:
        return options.task
    checkpoint = transformers_checkpoint(options)
    if checkpoint is not None:
        return checkpoint.family.task
    saved = _preset_file(options.preset, "task.json").get("class_name")
    if saved:
        return saved
    backbone = _preset_file(options.preset, "config.json").get("class_name", "")
    return backbone.removesuffix("Backbone") + "CausalLM" if backbone.endswith("Backbone") else "CausalLM"


def preset_sequence_length(preset: str) -> int:
    """The sequence length of a preset's own preprocessor (DEFAULT_SEQ_LEN where it has none)."""
    return int(_preset_config(preset, "preprocessor.json").get("sequence_length") or DEFAULT_SEQ_LEN)


def max_sequence_length(options: KerasHubOptions) -> int | None:
    """The longest sequence the backbone takes (its position embedding's length), or None where it
    has no such limit (rotary position encodings)."""
    config = _preset_config(options.preset, "config.json") if options.preset else options.backbone
    value = config.get("max_sequence_length")
    return int(value) if isinstance(value, int) else None


def _check_preset(preset: str) -> None:
    from meshrun.hf import checkpoint as hf_checkpoint

    path = Path(preset).expanduser()
    if hf_checkpoint.is_transformers_dir(path):
        hf_checkpoint.inspect(path)  # every check a load needs, before anything loads
        return
    if (path / "config.json").is_file():
        check_preset_objects(path, "model.preset")
        return
    if not path.exists() and HANDLE.match(preset):
        raise ConfigError(
            "model.preset",
            f"got {preset!r}, a preset handle; meshrun downloads nothing: download the preset first "
            "(e.g. keras_hub.models.CausalLM.from_preset(...).save_to_preset(DIR)) and give the dir",
        )
    raise ConfigError(
        "model.preset",
        f"got {preset!r}, which is not a preset dir (one holding config.json, as save_to_preset writes)",
    )


def transformers_checkpoint(options: KerasHubOptions):
    """The checked transformers checkpoint model.preset names (meshrun.hf.checkpoint), or None
    where model.preset is not one."""
    from meshrun.hf import checkpoint as hf_checkpoint

    if not options.preset or not hf_checkpoint.is_transformers_dir(options.preset):
        return None
    return hf_checkpoint.inspect(options.preset)


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


def task_class(options: KerasHubOptions):
    """The KerasHub causal LM class of `options`: model.task, or the one a preset was saved from."""
    keras_hub = import_keras_hub()
    causal = sorted(n for n in dir(keras_hub.models) if n.endswith("CausalLM") and n != "CausalLM")
    if options.task is None:
        return keras_hub.models.CausalLM  # from_preset picks the preset's own class
    if options.task in causal:
        return getattr(keras_hub.models, options.task)
    if isinstance(getattr(keras_hub.models, options.task, None), type):
        raise ConfigError(
            "model.task",
            f"got {options.task!r}, which is not a causal language "
            f"model; meshrun trains those: {one_of(causal)}",
        )
    raise ConfigError(
        "model.task", f"got {options.task!r}; {did_you_mean(options.task, causal)}valid: {one_of(causal)}"
    )


def build(options: KerasHubOptions, load_weights: bool = True):
    """The task with preprocessor=None and compile=False: from the preset dir (with its weights
    when `load_weights`), else around a new backbone made from model.backbone; with LoRA
    adapters on its target layers when model.lora.rank is set (enable_lora)."""
    task = _build_task(options, load_weights)
    enable_lora(task.backbone, options.lora)
    return _staged(task, options)


def _staged(task, options: KerasHubOptions):
    """The task as the build asks: itself, or (for pipeline stages) a functional model of the same
    layers on inputs of model.seq_len tokens whose backbone's transformer_layers run as stages,
    stacked under `transformer_layers` (meshrun.pipeline.functional); the task's own blocks are
    then dropped."""
    import keras

    from meshrun.pipeline.blocks import building_for

    pipeline = building_for()
    blocks = list(getattr(task.backbone, "transformer_layers", None) or [])
    if pipeline is None or not blocks:
        return task  # without blocks: meshrun's checks say so in the config's terms
    from meshrun.pipeline.functional import with_pipelined_blocks

    symbolic = {
        name: keras.Input(batch_shape=(None, options.seq_len), dtype=spec.dtype, name=name)
        for name, spec in inputs(options).items()
    }
    return with_pipelined_blocks(task, blocks, pipeline, name="transformer_layers", inputs=symbolic)


def _build_task(options: KerasHubOptions, load_weights: bool):
    """The task, built with its Dense and EinsumDense layers quantized under model.quantize (each
    filled from its float weights as they load; a new backbone's are drawn once it is built:
    meshrun.run.build)."""
    from meshrun import quantize

    with quantize.quantized_layers(options.quantize):
        return _build_float_or_quantized(options, load_weights)


def _build_float_or_quantized(options: KerasHubOptions, load_weights: bool):
    from meshrun.compat.keras.sharded_loading import load_onto_shards
    from meshrun.compat.keras_hub import local_preset_loading
    from meshrun.system import load_memory

    task = task_class(options)
    checkpoint = transformers_checkpoint(options)
    if checkpoint is not None:
        return _build_from_transformers(checkpoint, options, load_weights)
    if options.preset:
        described = f"{task.__name__}.from_preset({options.preset!r})"
        loading = load_onto_shards(on_placed=load_memory.sample) if load_weights else contextlib.nullcontext()
        with loading, local_preset_loading():  # each weight straight onto its shards
            return user_code.call(
                "model.preset",
                described,
                task.from_preset,
                preset=str(Path(options.preset).expanduser()),
                preprocessor=None,
                compile=False,
                load_weights=load_weights,
                **({"dtype": options.dtype} if options.dtype else {}),
            )
    backbone_cls = task.backbone_cls
    name = backbone_cls.__name__
    user_code.check_kwargs("model.backbone", backbone_cls, name, options.backbone, passed_on=LAYER_KEYWORDS)
    given = {**options.backbone, **({"dtype": options.dtype} if options.dtype else {})}
    arguments = ", ".join(f"{k}={v!r}" for k, v in given.items())
    backbone = user_code.call("model.backbone", f"{name}({arguments})", backbone_cls, **given)
    return task(backbone=backbone, preprocessor=None, compile=False)


def _build_from_transformers(checkpoint, options: KerasHubOptions, load_weights: bool):
    """The task of a transformers checkpoint, read shard by shard (meshrun.hf.load)."""
    import logging

    from meshrun.hf import load
    from meshrun.system import load_memory

    task, bytes_read = load.build_task(checkpoint, load_weights, options.dtype, on_placed=load_memory.sample)
    if load_weights:
        logging.getLogger("meshrun").info(
            "read %s of the %s of weights in %s (this process's devices' slices)",
            format_bytes(bytes_read),
            format_bytes(checkpoint.weight_bytes),
            checkpoint.path,
        )
    return task


def build_abstract(options: KerasHubOptions):
    """The task as `build` makes it, without reading a preset's weights (the plan needs shapes)."""
    return build(options, load_weights=False)


def enable_lora(backbone, lora: LoraOptions) -> None:
    """Puts LoRA adapters on the backbone's target layers as model.lora asks (nothing when its
    rank is None): KerasHub's `enable_lora(rank, targets)`, which freezes every other layer, then
    each adapter's `lora_alpha` (KerasHub passes none, so Keras uses alpha = rank) and the target
    layers' own biases frozen too, so that only the adapters train; with model.lora.dropout, the
    adapters' inputs dropped in training (drop_adapter_inputs). Target names that no Dense or
    EinsumDense layer of the backbone has are a ConfigError listing the names it has."""
    if not lora.enabled:
        return
    targets = list(lora.targets or backbone.default_lora_layer_names())
    _check_lora_targets(backbone, lora, targets)
    backbone.enable_lora(lora.rank, target_layer_names=targets)
    for layer in adapted_layers(backbone):
        layer.lora_alpha = lora.alpha or lora.rank
        adapters = (layer.lora_kernel_a, layer.lora_kernel_b)
        for variable in layer.weights:
            if not any(variable is adapter for adapter in adapters):
                variable.trainable = False
    if lora.dropout:
        drop_adapter_inputs(backbone, lora.dropout)


def drop_adapter_inputs(backbone, rate: float) -> None:
    """LoRA dropout (model.lora.dropout) on the backbone's adapted layers, as PEFT's lora_dropout:
    in training each layer gives W x + scale * B A dropout(x) (its own kernel sees all of x), and
    outside training exactly its own output, so evaluation, sampling and the merged export are
    those of the adapters as trained. Every mask comes from one seed generator on the backbone
    (`lora_dropout`, seeded from the run's seed as Keras' dropout layers are), whose state is one
    of the model's variables: it goes through the train step, checkpoints and resumes with them.
    Not in a build for pipeline stages, whose blocks cannot hand on random state."""
    import keras

    from meshrun.compat.keras.lora import replace_call
    from meshrun.pipeline.blocks import building_for

    if building_for() is not None:
        raise ConfigError(
            "model.lora.dropout",
            f"got {rate:g} with pipeline stages, which cannot hand on dropout's random state yet; "
            "set model.lora.dropout=0, or train without a stage axis",
        )
    seeds = keras.random.SeedGenerator(name=LORA_DROPOUT_SEED)
    backbone.lora_dropout_seeds = seeds  # tracked by the backbone: its state is one of its variables
    for layer in adapted_layers(backbone):
        replace_call(layer, _adapter_dropout_call(layer, layer.call, rate, seeds))


def _adapter_dropout_call(layer, call, rate: float, seeds):
    """`layer`'s call with its adapter's input dropped in training: x times its kernel (the
    adapter merged in) plus its bias and the adapter's product of dropout(x) - x, then its
    activation; outside training, `call` itself."""
    from keras import ops, random

    def dropping(inputs, training=None):
        if not training:
            return call(inputs, training=training)
        outputs = _pre_activation(layer, inputs)
        dropped = ops.subtract(random.dropout(inputs, rate, seed=seeds), inputs)
        outputs = ops.add(outputs, _adapter_product(layer, dropped))
        return outputs if layer.activation is None else layer.activation(outputs)

    return dropping


def _pre_activation(layer, inputs):
    """What Keras' Dense or EinsumDense call computes before its activation: x times the kernel
    (its adapter merged in), plus the bias."""
    from keras import layers, ops

    from meshrun.compat.keras.lora import adapted_kernel

    kernel = adapted_kernel(layer)
    if isinstance(layer, layers.EinsumDense):
        outputs = ops.einsum(layer.equation, inputs, kernel)
    else:
        outputs = ops.matmul(inputs, kernel)
    return outputs if layer.bias is None else ops.add(outputs, layer.bias)


def _adapter_product(layer, inputs):
    """scale * B A x of `layer`'s adapter (scale = alpha / rank), through the rank: for an
    EinsumDense, its equation applied with A in place of the kernel and then B, where the kernel's
    last axis is the output's last axis alone (the other equations take A @ B whole)."""
    from keras import layers, ops

    a, b = (ops.cast(kernel, inputs.dtype) for kernel in (layer.lora_kernel_a, layer.lora_kernel_b))
    scale = layer.lora_alpha / layer.lora_rank
    if not isinstance(layer, layers.EinsumDense):
        return ops.multiply(ops.matmul(ops.matmul(inputs, a), b), scale)
    if _kernel_last_axis_is_output_last(layer.equation):
        return ops.multiply(ops.matmul(ops.einsum(layer.equation, inputs, a), b), scale)
    return ops.einsum(layer.equation, inputs, ops.multiply(ops.matmul(a, b), scale))


def _kernel_last_axis_is_output_last(equation: str) -> bool:
    """Whether einsum `equation` ("x,kernel->output") makes the kernel's last axis the output's
    last, an axis the input lacks: the equation then takes A (the rank in that axis) too."""
    operands, output = equation.replace(" ", "").split("->")
    inputs, kernel = operands.split(",")
    last = kernel[-1]
    return output.endswith(last) and last not in inputs and kernel.count(last) == 1


def _check_lora_targets(backbone, lora: LoraOptions, targets: list[str]) -> None:
    """ConfigError on model.lora.targets when a name given is not one of the backbone's Dense or
    EinsumDense layers, or when none of KerasHub's default names is."""
    valid = lora_layer_names(backbone)
    name = type(backbone).__name__
    if lora.targets is None:
        if not set(targets) & set(valid):
            raise ConfigError(
                "model.lora.targets",
                f"got null, but {name} has none of KerasHub's default LoRA layers ({one_of(targets)}); "
                f"name the layers to adapt: {one_of(valid)}",
            )
        return
    missing = [t for t in targets if t not in valid]
    if missing:
        raise ConfigError(
            "model.lora.targets",
            f"got {list(lora.targets)}, but {name} has no Dense or EinsumDense layer named {missing[0]!r}; "
            f"{did_you_mean(missing[0], valid)}valid: {one_of(valid)}",
        )


def lora_layer_names(backbone) -> list[str]:
    """The names of the backbone's layers LoRA can adapt (Dense and EinsumDense, the kinds
    KerasHub's save_lora_weights writes), sorted."""
    import keras

    from meshrun.compat.keras.models import sublayers

    kinds = (keras.layers.Dense, keras.layers.EinsumDense)
    return sorted({layer.name for layer in sublayers(backbone) if isinstance(layer, kinds) and layer.weights})


def adapted_layers(backbone) -> list:
    """The backbone's layers that carry LoRA adapters."""
    from meshrun.compat.keras.models import sublayers

    return [layer for layer in sublayers(backbone) if getattr(layer, "lora_enabled", False)]


def export_formats(task, options: KerasHubOptions, run_dir: Path, checkpoint=None) -> dict[str, str]:
    """KerasHub's own formats of the trained task beside model.keras, or a transformers checkpoint
    and PEFT adapter for a transformers model.preset (meshrun.models.hub_export)."""
    from meshrun.models import hub_export

    return hub_export.export(task, options, run_dir, checkpoint)


def keep_adapter(trained, options: KerasHubOptions, run_dir: Path) -> str | None:
    """checkpoint.keep_adapter: a LoRA run's adapters in the run dir (meshrun.models.hub_export)."""
    from meshrun.models import hub_export

    return hub_export.keep_adapter(trained, options, run_dir)


def inputs(options: KerasHubOptions) -> dict:
    """token_ids and padding_mask of model.seq_len tokens."""
    return {name: InputSpec(name, (options.seq_len,), "int32") for name in ("token_ids", "padding_mask")}


def label(options: KerasHubOptions) -> str:
    """The model as reports name it: its class, the preset it came from, and its LoRA rank
    (`GemmaCausalLM (preset /models/gemma2), LoRA rank 8`)."""
    checkpoint = transformers_checkpoint(options)
    if checkpoint is not None:
        name = f"{task_name(options)} (from {checkpoint.describe()})"
    else:
        name = f"{task_name(options)} (preset {options.preset})" if options.preset else options.task
    return f"{name}, LoRA rank {options.lora.rank}" if options.lora.enabled else name


def next_token_loss(options: KerasHubOptions):
    """Cross-entropy of the logits over the labels that weigh: divided by the sum of the sample
    weights (the real tokens), not by every position."""
    import keras

    return keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="mean_with_sample_weight", name="next_token_crossentropy"
    )


def analytic_flops(options: KerasHubOptions, batch_size: int, variables) -> float:
    """(4 * N + 2 * T) * tokens for one train step, N the parameters that take part in a matmul for
    every token (all of them except the input embedding table when the head has its own (untied),
    position embeddings and non-float state) and T those of them that train: 2 N for the forward
    pass, 2 N for the gradients of the activations, 2 T for the gradients of the weights (6 N when
    every weight trains; much less under LoRA). Attention's score and value products are left out."""
    paths = {p.path for p in variables}
    untied = UNTIED_HEAD in paths

    def in_matmuls(p) -> bool:
        lookup = p.path == "token_embedding/embeddings" and untied
        return not lookup and "position_embedding" not in p.path and p.dtype.startswith(("float", "bfloat"))

    matmuls = [p for p in variables if in_matmuls(p)]
    params = sum(math.prod(p.shape) for p in matmuls)
    trained = sum(math.prod(p.shape) for p in matmuls if p.trainable)
    return (4.0 * params + 2.0 * trained) * batch_size * options.seq_len


def layout_rules(options: KerasHubOptions, mesh) -> tuple:
    """The backbone's own layout map (get_layout_map) as LayoutRules of origin from_model, for the
    batch axis and the mesh's other axis as the model axis."""
    from keras import distribution as kd

    from meshrun.config.schema import LayoutRule

    backbone_cls = _backbone_class(options)
    if not hasattr(backbone_cls, "get_layout_map"):
        raise ConfigError(
            "layout.from_model",
            f"got true, but KerasHub's {backbone_cls.__name__} has no get_layout_map (KerasHub writes one "
            f"for Llama, Gemma, Qwen, QwenMoe and Qwen3Moe); {_layouts_hint(backbone_cls)}",
        )
    model_axis = _model_axis(mesh)
    # The map only needs the mesh's shape and axis names: placeholders stand in for devices, so a
    # mesh is planned on any machine.
    device_mesh = kd.DeviceMesh(
        tuple(mesh.shape),
        list(mesh.axis_names),
        devices=[f"device:{i}" for i in range(math.prod(mesh.shape))],
    )
    layouts = backbone_cls.get_layout_map(
        device_mesh, model_parallel_dim_name=model_axis, data_parallel_dim_name=mesh.batch_axis
    )
    # Written for a whole family (one map for Gemma 2B's one key/value head and Gemma 7B's sixteen),
    # so a dimension the mesh cannot divide stays whole (the plan notes it) rather than failing.
    return tuple(
        LayoutRule(
            pattern,
            tuple(layouts[pattern].axes),
            origin="from_model",
            optional=True,
            replicate_if_indivisible=True,
        )
        for pattern in layouts
    )


def _backbone_class(options: KerasHubOptions):
    if options.task is not None:
        return task_class(options).backbone_cls
    checkpoint = transformers_checkpoint(options)
    if checkpoint is not None:
        return getattr(import_keras_hub().models, checkpoint.family.backbone)
    import json

    config = json.loads((Path(options.preset).expanduser() / "config.json").read_text())
    return getattr(import_keras_hub().models, config["class_name"])


def _model_axis(mesh) -> str:
    """The axis KerasHub's map shards weights over: `model`, else the one axis besides the batch's."""
    others = [a for a in mesh.axis_names if a != mesh.batch_axis]
    if "model" in others:
        return "model"
    if len(others) == 1:
        return others[0]
    raise ConfigError(
        "layout.from_model",
        f"got true on mesh axes {list(mesh.axis_names)}: KerasHub's map needs the batch axis and one model "
        "axis (a 2-D mesh, or an axis named model)",
    )


def _layouts_hint(backbone_cls) -> str:
    """What to use for a backbone without a layout map: meshrun's layouts for its family, layout=auto."""
    family = next(
        (f for name, f in FAMILIES.items() if any(c.__name__ == name for c in backbone_cls.__mro__)), None
    )
    if family:
        return (
            f"use meshrun's layout={family}_tp ({family}_fsdp, "
            f"{family}_2d) or layout=auto, or write layout.rules"
        )
    return (
        "use layout=auto (rules derived from its variables and the mesh; `meshrun plan layout=auto` shows "
        "them), write layout.rules for its variable paths (meshrun plan lists them), or use layout=replicated"
    )


def layout_advice(options: KerasHubOptions, variables, mesh) -> list[str]:
    """Warnings about placements KerasHub's maps are known to get wrong: attention heads split over
    the batch axis, and an untied output head left whole on every device."""
    warnings = []
    batch_size = mesh.axis_size(mesh.batch_axis)
    on_batch = {}
    for p in variables:
        heads = next((dim for pattern, dim in HEAD_DIMENSIONS if pattern.fullmatch(p.path)), None)
        if heads is not None and batch_size > 1 and p.spec[heads] == mesh.batch_axis:
            on_batch.setdefault(p.rule, []).append(p)
    for rule, placed in on_batch.items():
        first = placed[0]
        warnings.append(
            f"rule {rule!r} ({first.origin}) splits the attention heads of {first.path} and "
            f"{len(placed) - 1} more kernels over the batch axis {mesh.batch_axis!r}: every step gathers "
            "them across data replicas, and the batch axis must divide the heads; KerasHub's Llama and Qwen "
            "maps put q/k/v axes in Gemma's order (keras-hub #2795): "
            "use layout=llama_tp for heads over the model axis"
        )
    from meshrun.config.schema import LARGE_REPLICATED_BYTES

    head = next((p for p in variables if p.path == UNTIED_HEAD), None)
    if head is not None and head.replicated and head.bytes >= LARGE_REPLICATED_BYTES and (mesh.size or 1) > 1:
        warnings.append(
            f"{UNTIED_HEAD}, the untied output head ({format_bytes(head.bytes)}), matches no rule, so every "
            "device holds all of it (KerasHub's maps have none, keras-hub #2807): add "
            f"layout.extra_rules={{{UNTIED_HEAD}:[null,model]}} or use layout=llama_tp"
        )
    return warnings


SPEC = register_model(
    ModelSpec(
        name="keras_hub",
        options=KerasHubOptions,
        build=build,
        layouts=(
            "replicated",
            "auto",
            "from_model",
            "llama_tp",
            "llama_fsdp",
            "llama_2d",
            "gemma_tp",
            "gemma_fsdp",
            "gemma_2d",
        ),
        data="padded_tokens",
        loss=next_token_loss,
        description="KerasHub causal language models (model.task, model.backbone or model.preset)",
        metrics=class_accuracy,
        tokens_per_sample=lambda options: options.seq_len,
        analytic_flops=analytic_flops,
        language_model=True,
        zoo=False,
        inputs=inputs,
        build_abstract=build_abstract,
        layout_rules=layout_rules,
        layout_advice=layout_advice,
        label=label,
        sample_weight_input="padding_mask",
        export=export_formats,
        save_adapter=keep_adapter,
    )
)
