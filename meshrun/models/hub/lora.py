"""LoRA for model=keras_hub (model.lora): the adapters put on the backbone's target layers
(KerasHub's enable_lora, then meshrun's alpha and the target layers' biases frozen, so that only the
adapters train), the target names checked against the backbone's Dense and EinsumDense layers, and
LoRA dropout (model.lora.dropout), which Keras' layers lack: each adapted layer's call replaced by
one that drops the adapter's input in training, as PEFT's lora_dropout does. Its options are
LoraOptions (meshrun.models.hub.options).
"""

from __future__ import annotations

from meshrun.errors import ConfigError
from meshrun.models.hub.options import LoraOptions
from meshrun.wording import did_you_mean, one_of

LORA_DROPOUT_SEED = "lora_dropout"  # the seed generator of model.lora.dropout's masks, on the backbone


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
