"""Keras, as meshrun uses it past its public API, one module for each concern, so that a Keras
release that changes one touches one module. Each module lists its private names (PRIVATE_NAMES,
meshrun.compat.names) beside the functions that reach them; importing any of them imports neither
Keras nor jax. Import each name from the module that owns it:

- startup: importing Keras without the optional packages it would load; seeding it and saving a
  model without importing TensorFlow.
- jax_trainer: the JAX trainer's training state and its shardings, a batch placed as fit places
  it, and the state written back to the variables.
- models: a model's layers, its frozen weights, its functional graph run again with calls
  replaced, and what its code compiles it with, recorded.
- callbacks: the attribute that lets Keras call a callback's step hooks from worker threads.
- variable_values: variables with shapes alone (the abstract build, pipelined blocks' templates),
  their initializers, values given later or dropped.
- variable_layouts: the layout a variable has, and the variables of a block laid out by meshrun.
- lora: meshrun's LoRA adapters (PEFT's) on Dense and EinsumDense layers: their variables, the
  call and quantized_call a layer instance runs, and the merged kernel its save writes.
- sharded_loading: a preset's weights loaded straight onto their shards (load_onto_shards).
- h5_weights: a Keras weights file read a weight slice at a time (H5Weight).
- class_patches: methods of Keras' classes replaced while a block runs.
- quantized: int8 and int4 Dense and EinsumDense layers: quantized builds, their kernels' facts,
  scales and float values (the keras_quantize group).
"""
