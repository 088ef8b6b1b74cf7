"""model=keras_hub: KerasHub causal language models (a class and its backbone's arguments, a KerasHub
preset dir or a transformers checkpoint), fine-tuned whole or with LoRA adapters, on a float or a
quantized base (QLoRA). A module per concern; spec.py registers the model (MODELS names it) and says
what model=keras_hub does for the user:

- options.py: model.* and model.lora.* (KerasHubOptions, LoraOptions) and their checks
- presets.py: what model.preset is (a KerasHub preset, a transformers checkpoint) and the classes
  a run builds
- build.py: the three build paths (preset, transformers checkpoint, new backbone) and the inputs
- lora.py: the adapters on the target layers, and LoRA dropout
- objective.py: the next-token loss and the analytic FLOPs of a step
- layouts.py: layout=from_model's rules and the plan's advice about KerasHub's maps
- export.py: checkpoint.export and checkpoint.keep_adapter (a preset, hf/, peft/, adapter.lora.h5)
- small_presets.py: the small models `meshrun preset` makes
"""
