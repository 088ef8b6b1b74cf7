"""LoRA for model=keras_hub (model.lora): adapters of rank model.lora.rank on the backbone's target
layers, as PEFT's (meshrun.compat.keras.lora: A (in_features, r), B (r, out_features) over the
layer's kernel as a matrix, alpha / r * A @ B its update), every other weight frozen; the target
names checked against the backbone's Dense and EinsumDense layers; LoRA dropout (model.lora.dropout),
the adapter's input dropped in training as PEFT's lora_dropout does; and the adapted layers' saves
(model.keras, a preset) made to write their kernels with the update merged in. Its options are
LoraOptions (meshrun.models.hub.options).
"""

from __future__ import annotations

from meshrun.errors import ConfigError
from meshrun.models.hub.options import LoraOptions
from meshrun.wording import did_you_mean, one_of

LORA_DROPOUT_SEED = "lora_dropout"  # the seed generator of model.lora.dropout's masks, on the backbone


def enable_lora(backbone, lora: LoraOptions) -> None:
    """Puts LoRA adapters on the backbone's target layers as model.lora asks (nothing when its rank
    is None): every layer frozen, then on each Dense or EinsumDense layer named in model.lora.targets
    (default: KerasHub's default_lora_layer_names, the attention query and value) an adapter of rank
    model.lora.rank and alpha model.lora.alpha (default: the rank), which alone trains. Target
    names that no such layer of the backbone has, or a layer whose kernel is no matrix, are a
    ConfigError."""
    from meshrun.compat.keras.lora import add_adapter, drop_inputs, save_with
    from meshrun.compat.keras.models import sublayers

    if not lora.enabled:
        return
    targets = list(lora.targets or backbone.default_lora_layer_names())
    _check_lora_targets(backbone, lora, targets)
    backbone.trainable = True
    layers = sublayers(backbone)
    for layer in layers:
        layer.trainable = False
    adapted = _target_layers(layers, targets)
    for layer in adapted:
        layer.trainable = True
        adapter = add_adapter(layer, lora.rank, lora.alpha or lora.rank)
        for variable in layer.weights:
            if variable is not adapter.a and variable is not adapter.b:
                variable.trainable = False
        save_with(layer, lambda layer=layer: merged_values(layer))
    if lora.dropout:
        seeds = _dropout_seeds(backbone, lora.dropout)
        for layer in adapted:
            drop_inputs(layer, lora.dropout, seeds)


def _target_layers(layers, targets: list[str]) -> list:
    """The Dense and EinsumDense layers (with weights) among `layers` named in `targets`."""
    import keras

    kinds = (keras.layers.Dense, keras.layers.EinsumDense)
    return [layer for layer in layers if layer.name in targets and isinstance(layer, kinds) and layer.weights]


def _dropout_seeds(backbone, rate: float):
    """The seed generator of LoRA dropout's masks (model.lora.dropout), on the backbone (`lora_dropout`,
    seeded from the run's seed as Keras' dropout layers are), whose state is one of the model's
    variables: it goes through the train step, checkpoints and resumes with them. Not in a build for
    pipeline stages, whose blocks cannot hand on random state."""
    import keras

    from meshrun.pipeline.blocks import building_for

    if building_for() is not None:
        raise ConfigError(
            "model.lora.dropout",
            f"got {rate:g} with pipeline stages, which cannot hand on dropout's random state yet; "
            "set model.lora.dropout=0, or train without a stage axis",
        )
    seeds = keras.random.SeedGenerator(name=LORA_DROPOUT_SEED)
    backbone.lora_dropout_seeds = seeds  # tracked by the backbone: its state is one of its variables
    return seeds


def merged_values(layer) -> dict:
    """What an adapted layer saves in place of its kernel, by id(variable): a float kernel + alpha /
    rank * A @ B (computed where the kernel lies, in float32, cast to its dtype); a quantized
    kernel dequantized, the update added and quantized again (its values and scales)."""
    from meshrun.compat.keras.lora import adapter_of

    if layer.quantization_mode is None:
        kernel = layer.kernel
        merged = kernel.value.astype("float32") + adapter_of(layer).delta()
        return {id(kernel): merged.astype(kernel.value.dtype)}
    from meshrun.quantize import merged_kernel, quantized_values

    return {id(variable): value for variable, value in quantized_values(layer, merged_kernel(layer))}


def _check_lora_targets(backbone, lora: LoraOptions, targets: list[str]) -> None:
    """ConfigError on model.lora.targets when a name given is not one of the backbone's Dense or
    EinsumDense layers, when none of KerasHub's default names is, or when a target's kernel is no
    (in_features, out_features) matrix (an axis both its input and output keep)."""
    from meshrun.compat.keras.lora import layer_geometry
    from meshrun.compat.keras.models import sublayers

    valid = lora_layer_names(backbone)
    name = type(backbone).__name__
    if lora.targets is None:
        if not set(targets) & set(valid):
            raise ConfigError(
                "model.lora.targets",
                f"got null, but {name} has none of KerasHub's default LoRA layers ({one_of(targets)}); "
                f"name the layers to adapt: {one_of(valid)}",
            )
    else:
        missing = [t for t in targets if t not in valid]
        if missing:
            raise ConfigError(
                "model.lora.targets",
                f"got {list(lora.targets)}, but {name} has no Dense or EinsumDense layer named "
                f"{missing[0]!r}; {did_you_mean(missing[0], valid)}valid: {one_of(valid)}",
            )
    for layer in _target_layers(sublayers(backbone), targets):
        try:
            layer_geometry(layer)
        except ValueError as err:
            raise ConfigError(
                "model.lora.targets",
                f"got {targets}, but {name}'s {layer.path} takes no LoRA adapter: {err}; "
                f"leave {layer.name!r} out",
            ) from None


def lora_layer_names(backbone) -> list[str]:
    """The names of the backbone's layers LoRA can adapt (Dense and EinsumDense), sorted."""
    import keras

    from meshrun.compat.keras.models import sublayers

    kinds = (keras.layers.Dense, keras.layers.EinsumDense)
    return sorted({layer.name for layer in sublayers(backbone) if isinstance(layer, kinds) and layer.weights})


def adapted_layers(backbone) -> list:
    """The backbone's layers that carry LoRA adapters."""
    from meshrun.compat.keras.lora import adapter_of
    from meshrun.compat.keras.models import sublayers

    return [layer for layer in sublayers(backbone) if adapter_of(layer) is not None]
