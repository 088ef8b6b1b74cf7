"""What a model declares to meshrun (ModelSpec, InputSpec), keras-hub style, and which module
registers each model name (MODELS). The models themselves are in meshrun.models; a spec carries
everything meshrun needs to know about a model family beside the model's code: its options
dataclass (configurable sizes, checked by meshrun.config; the dataclass raises ConfigError for values
that do not fit together), a `build(options)` function that imports keras only when called, the
layout configs written for it (under configs/layout/, the first being its default), the synthetic
data family that matches its inputs, and its training loss.

Besides the zoo (models meshrun defines), two specs build the user's models: `python` (any Keras
model from the user's `module:function`) and `keras_hub` (KerasHub architectures by class). What
they know only once the model exists (its inputs, its loss, its layout map) comes through the
optional hooks of ModelSpec.

A new model is a module of meshrun.models that calls `register_model(ModelSpec(...))`, and a line
in MODELS.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from meshrun.registry import Registry
from meshrun.specs.quantized import Quantization

# The data families data=synthetic generates, one generator each (meshrun.data.synthetic.FAMILIES): a
# ModelSpec's `data` names the one that matches the model's inputs.
SYNTHETIC_FAMILIES = ("regression", "images", "tokens", "id_pairs", "classes", "padded_tokens", "shaped")


@dataclass(frozen=True)
class InputSpec:
    """One input of a model, per sample: its name (None: the model takes one unnamed tensor), shape
    without the batch dimension (None: any size) and dtype."""

    name: str | None
    shape: tuple[int | None, ...]
    dtype: str = "float32"


@dataclass(frozen=True)
class ModelSpec:
    """A registered model: how to configure it, build it, feed it, train it, and which layouts fit it.

    - `data`: the synthetic data family of meshrun.data that matches the model's inputs, one of
      SYNTHETIC_FAMILIES (checked when the model registers).
    - `loss(options)`: the Keras loss (a name or a loss object) used when train.loss is null; None:
      the model has none of its own (the loss it was compiled with, else train.loss is required).
    - `tokens_per_sample(options)`: for sequence models, the tokens one sample carries (reported
      as timing.tokens_per_s).
    - `analytic_flops(options, batch_size, variables)`: a closed-form FLOPs estimate of one train
      step (`variables`: the plan's placements, for models whose sizes the options do not give),
      reported beside XLA's count.
    - `metrics(options)`: the Keras metrics to report with the model's own loss (e.g. accuracy).
    - `language_model`: its own loss is the mean next-token cross-entropy, so the evaluation also
      reports perplexity, exp(loss).
    - `zoo`: one of meshrun's own models (False for the specs that build the user's models).
    - `inputs(options)`: the inputs the model trains on, as InputSpecs by name (None for one
      unnamed input); the built model is called on them, and they are what the data must fit.
      None (or no hook): the model's own inputs, or, for a model not built yet, the inputs the
      data source declares.
    - `build_abstract(options)`: the build used for the abstract description, where it differs
      from `build` (no weights read from a preset).
    - `layout_rules(options, mesh)`: the model's own layout map as LayoutRules (`layout=from_model`);
      None: the model has none.
    - `layout_advice(options, variables, mesh)`: warnings of the plan about how the variables are
      placed that only the model knows to give (a layout map known to be wrong for it).
    - `label(options)`: how reports name the model (default: its registered name).
    - `sample_weight_input`: the input whose values weigh each label when the data gives no
      sample weights (a language model's padding mask).
    - `export(model, options, run_dir, checkpoint)`: with checkpoint.export, writes the model's own
      formats into the run dir beside model.keras (KerasHub: a preset, LoRA adapters; `checkpoint`:
      the run's CheckpointConfig); returns {name: path}.
    - `save_adapter(trained, options, run_dir)`: without an export, writes the adapters a fine-tune
      keeps (checkpoint.keep_adapter; KerasHub: a LoRA run's adapter.lora.h5) into the run dir;
      `trained()` gives the trained model (None where it cannot be had). Returns the file's path,
      None where the run has none to keep.
    - `quantization(options)`: the quantized base the options ask for (model.quantize), as a
      Quantization: its mode and the options of the float model it is made from; None for a float
      base (meshrun.models.registry.quantize_option, for options with a `quantize` field). A model
      without the hook is never quantized. The run builds such a model quantized, evaluates the
      float one beside it, and keeps it out of pipeline stages.
    """

    name: str
    options: type
    build: Callable[[Any], Any]
    layouts: tuple[str, ...]
    data: str
    loss: Callable[[Any], Any] | None
    description: str = ""
    tokens_per_sample: Callable[[Any], int] | None = None
    analytic_flops: Callable[[Any, int, Any], float] | None = None
    metrics: Callable[[Any], list] | None = None
    language_model: bool = False
    zoo: bool = True
    inputs: Callable[[Any], dict | None] | None = None
    build_abstract: Callable[[Any], Any] | None = None
    layout_rules: Callable[[Any, Any], tuple] | None = None
    layout_advice: Callable[[Any, Any, Any], list] | None = None
    label: Callable[[Any], str] | None = None
    sample_weight_input: str | None = None
    export: Callable[[Any, Any, Any, Any], dict] | None = None
    save_adapter: Callable[[Any, Any, Any], str | None] | None = None
    quantization: Callable[[Any], Quantization | None] | None = None

    @property
    def default_layout(self) -> str:
        """The layout config picked when a run selects this model and no layout."""
        return self.layouts[0]

    def name_of(self, options) -> str:
        """How reports name a model of this spec built with `options`."""
        return self.label(options) if self.label else self.name

    def quantization_of(self, options) -> Quantization | None:
        """The quantized base `options` ask for (ModelSpec.quantization); None: a float base."""
        return self.quantization(options) if self.quantization else None


MODELS: Registry[ModelSpec] = Registry(
    "model",
    {
        "cnn": "meshrun.models.cnn",
        "dense_model": "meshrun.models.dense_model",
        "keras_hub": "meshrun.models.hub.spec",
        "python": "meshrun.models.factory",
        "transformer": "meshrun.models.transformer",
        "two_tower": "meshrun.models.two_tower",
    },
)
