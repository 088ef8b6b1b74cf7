"""python: any Keras model from the user's own code, named as `module:function`.

    meshrun train model=python model.factory=mymodels:build_mlp 'model.kwargs={hidden:512}' \
      train.loss=sparse_categorical_crossentropy mesh=2x4 'layout.rules={dense_1/kernel:[null,model]}'

- `factory(**model.kwargs)` returns a new keras.Model (functional, Sequential or subclassed) on
  every call: meshrun calls it twice, once for the plan (abstractly: nothing is allocated, and a
  `compile` in it is only noted) and once, under the distribution, for the run.
- A model that is not built yet (subclassed, or Sequential without an Input) is built by calling it
  on symbolic inputs: `model.input_shape` / `model.input_dtype` (one input, or several by name),
  else the inputs the data source declares (data=arrays, data=tfrecord).
- The loss: train.loss, else the one the factory compiled the model with (with its metrics).
- Layout: replicated unless rules are written for its variable paths (`meshrun plan` lists them).
- data=synthetic makes random data shaped like the model's inputs and output (a smoke run).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from meshrun import user_code
from meshrun.config.fields import setting
from meshrun.errors import ConfigError
from meshrun.models.registry import InputSpec, ModelSpec, quantize_option, register_model
from meshrun.specs.quantized import check_quantize_mode
from meshrun.wording import one_of

DTYPES = (
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "bool",
)


@dataclass(frozen=True)
class FactoryOptions:
    """The factory (`module:function`), its keyword arguments, and the per-sample inputs to build
    a model that is not built yet: `input_shape` a list of sizes (null for any), or a mapping of
    input name to such a list; `input_dtype` a dtype, or a mapping of input name to dtype."""

    factory: str | None = setting(
        None,
        "module:function, called as function(**kwargs) and returning a keras.Model (functional, Sequential "
        "or subclassed); the working dir is importable.",
    )
    kwargs: dict = setting(
        doc="The factory's keyword arguments, e.g. 'model.kwargs={hidden:512}'.", factory=dict
    )
    input_shape: Any = setting(
        None,
        "The per-sample inputs that build a model not built yet (a subclassed model): a list of sizes "
        "(null for any size) such as [784], or {name: sizes} such as {tokens: [128]}; null: the data's.",
    )
    input_dtype: Any = setting(
        "float32", "The inputs' dtype, or {name: dtype} such as {tokens: int32}, with input_shape."
    )
    quantize: str | None = setting(
        None,
        "int8 or int4: the model's Dense and EinsumDense layers are built quantized (their initial "
        "values quantized) and frozen; the other weights train. null: none.",
    )

    def __post_init__(self):
        user_code.check_reference("model.factory", self.factory, "mymodels:build_mlp")
        check_quantize_mode(self.quantize)
        shapes = self.input_shape if isinstance(self.input_shape, dict) else {None: self.input_shape}
        if self.input_shape is not None:
            for name, shape in shapes.items():
                if not isinstance(shape, (list, tuple)) or not all(
                    d is None or (isinstance(d, int) and d > 0) for d in shape
                ):
                    key = "model.input_shape" + (f".{name}" if name else "")
                    raise ConfigError(
                        key,
                        f"got {shape!r}; expected a list of positive "
                        "sizes (null for any size), e.g. [28, 28, 1]",
                    )
        dtypes = self.input_dtype if isinstance(self.input_dtype, dict) else {None: self.input_dtype}
        for name, dtype in dtypes.items():
            if dtype not in DTYPES:
                key = "model.input_dtype" + (f".{name}" if name else "")
                raise ConfigError(key, f"got {dtype!r}; valid: {one_of(DTYPES)}")
        if (
            isinstance(self.input_dtype, dict)
            and isinstance(self.input_shape, dict)
            and set(self.input_dtype) - set(self.input_shape)
        ):
            extra = sorted(set(self.input_dtype) - set(self.input_shape))
            raise ConfigError(
                "model.input_dtype",
                f"names inputs {extra} that model.input_shape does not ({one_of(sorted(self.input_shape))})",
            )


def label(options: FactoryOptions) -> str:
    """The model as reports name it: its factory."""
    return options.factory


def build(options: FactoryOptions):
    """Calls the factory and checks that it returned a Keras model."""
    import keras

    function = user_code.load_callable("model.factory", options.factory)
    user_code.check_kwargs("model.kwargs", function, options.factory, options.kwargs)
    arguments = ", ".join(f"{k}={v!r}" for k, v in options.kwargs.items())
    from meshrun import quantize

    with quantize.quantized_layers(options.quantize):  # layers it makes build quantized, even later
        model = user_code.call("model.factory", f"{options.factory}({arguments})", function, **options.kwargs)
    if not isinstance(model, keras.Model):
        raise ConfigError(
            "model.factory", f"{options.factory} returned {type(model).__name__}, not a keras.Model"
        )
    return model


def inputs(options: FactoryOptions) -> dict | None:
    """The inputs model.input_shape / model.input_dtype give (None when not given)."""
    if options.input_shape is None:
        return None
    shapes = options.input_shape if isinstance(options.input_shape, dict) else {None: options.input_shape}

    def dtype_of(name):
        return (
            options.input_dtype.get(name, "float32")
            if isinstance(options.input_dtype, dict)
            else options.input_dtype
        )

    return {name: InputSpec(name, tuple(shape), dtype_of(name)) for name, shape in shapes.items()}


SPEC = register_model(
    ModelSpec(
        name="python",
        options=FactoryOptions,
        build=build,
        layouts=("replicated", "auto"),
        data="shaped",
        loss=None,
        description="any Keras model from your module:function (model.factory)",
        zoo=False,
        inputs=inputs,
        label=label,
        quantization=quantize_option,
    )
)
