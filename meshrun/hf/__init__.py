"""Hugging Face transformers checkpoints in and out: a local transformers dir as `model.preset`
(config.json, safetensors weights, tokenizer files) read shard by shard onto a mesh, and the trained
model written back as one (`<run>/hf/`) with a PEFT adapter beside it (`<run>/peft/`).

- `safetensors`: the file format, read a slice at a time and written a tensor at a time.
- `transforms`: how a transformers tensor becomes a KerasHub variable (a split and a transpose).
- `families`: each supported model_type's config and weight names, mapped exactly or refused.
- `checkpoint`: one validation pass over a dir, giving the typed record the rest works from.
- `load` and `export`: the model in and out.

Importing this package imports none of jax, keras and keras_hub.
"""
