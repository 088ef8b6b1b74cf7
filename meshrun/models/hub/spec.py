"""keras_hub: KerasHub causal language models, by class and constructor arguments or from a local
preset dir (keras-hub is an optional dependency: pip install 'meshrun[hub]'). This module registers
the model's spec (what MODELS names for model=keras_hub) and says how reports name the model; the
package's other modules hold what the spec points at.

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
  (meshrun.models.hub.export). Without an export, a LoRA fine-tune of model.preset keeps its
  `adapter.lora.h5` all the same (checkpoint.keep_adapter, on by default). A transformers
  model.preset exports `hf/` (a transformers checkpoint) and `peft/` instead of `preset/`
  (meshrun.hf.export).
"""

from __future__ import annotations

from meshrun.models.hub import presets
from meshrun.models.hub.build import build, build_abstract, inputs
from meshrun.models.hub.export import export, keep_adapter
from meshrun.models.hub.layouts import layout_advice, layout_rules
from meshrun.models.hub.objective import analytic_flops, next_token_loss
from meshrun.models.hub.options import KerasHubOptions
from meshrun.models.registry import ModelSpec, class_accuracy, quantize_option, register_model


def label(options: KerasHubOptions) -> str:
    """The model as reports name it: its class, the preset it came from, and its LoRA rank
    (`GemmaCausalLM (preset /models/gemma2), LoRA rank 8`)."""
    task = presets.task_name(options.task, options.preset)
    checkpoint = presets.transformers_checkpoint(options.preset)
    if checkpoint is not None:
        name = f"{task} (from {checkpoint.describe()})"
    else:
        name = f"{task} (preset {options.preset})" if options.preset else options.task
    return f"{name}, LoRA rank {options.lora.rank}" if options.lora.enabled else name


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
        export=export,
        save_adapter=keep_adapter,
        quantization=quantize_option,
    )
)
