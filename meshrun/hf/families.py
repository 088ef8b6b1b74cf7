"""Each supported transformers `model_type`, mapped exactly onto a KerasHub backbone or refused:
its config.json as the backbone's constructor arguments (`Family.arguments`) and its tensors as
the backbone's variables (`Family.tensors`: name, variable path, transform).

Every config key that changes what the model computes is either mapped (norm epsilon, head_dim,
RoPE theta and scaling in transformers 4's spelling (`rope_theta`, `rope_scaling`) and 5's
(`rope_parameters`), tied heads, sliding windows, soft caps) or, where the backbone cannot express
its value, a ConfigError naming the key and the value before anything is read. KerasHub's own
converters (keras_hub.src.utils.transformers) drop several of these silently; meshrun reads the
config itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from meshrun.errors import ConfigError
from meshrun.hf import transforms
from meshrun.wording import one_of

KEY = "model.preset"
DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}
SILU = ("silu", "swish")
GELU_TANH = ("gelu_pytorch_tanh", "gelu")  # Gemma 1's configs say gelu and mean the tanh form
GEMMA3_LOCAL_THETA, GEMMA3_GLOBAL_THETA = 10_000.0, 1_000_000.0  # fixed in KerasHub's Gemma 3


@dataclass(frozen=True)
class TensorMap:
    """One transformers tensor (`name`) and the backbone variable it fills (`path`, as
    `variable.path` reads), through `transform`."""

    name: str
    path: str
    transform: transforms.Transform


class HFConfig:
    """A transformers config.json's values, read so that a missing or unmappable one is a
    ConfigError naming the file's key."""

    def __init__(self, values: dict, source: str):
        self.values = values
        self.source = source

    @property
    def model_type(self) -> str:
        return self.values.get("model_type", "")

    def get(self, key: str, default=None):
        value = self.values.get(key)
        return default if value is None else value

    def require(self, key: str):
        if self.values.get(key) is None:
            raise ConfigError(KEY, f"got {self.source!r}, whose config.json has no {key!r}")
        return self.values[key]

    def refuse(self, key: str, value, why: str):
        """A ConfigError: `key` has a `value` that the backbone cannot express."""
        raise ConfigError(KEY, f"got {self.source!r}, whose config.json has {key}={value!r}, which {why}")

    def expect(self, key: str, allowed: tuple, default=None, why: str = "") -> None:
        """A ConfigError unless `key` (or `default` where absent) is one of `allowed`."""
        value = self.get(key, default)
        if value not in allowed:
            self.refuse(key, value, why or f"meshrun cannot map (valid: {one_of(allowed)})")

    @property
    def dtype(self) -> str:
        """The checkpoint's dtype: transformers 5's `dtype`, else 4's `torch_dtype`; float32 where
        neither is given (transformers' own default)."""
        value = self.get("dtype", self.get("torch_dtype", "float32"))
        key = "dtype" if self.values.get("dtype") is not None else "torch_dtype"
        if value not in DTYPES:
            self.refuse(key, value, f"meshrun does not load (valid: {one_of(tuple(DTYPES))})")
        return DTYPES[value]

    @property
    def heads(self) -> tuple[int, int, int, int]:
        """(hidden size, query heads, key/value heads, head_dim)."""
        hidden = self.require("hidden_size")
        query = self.require("num_attention_heads")
        kv = self.get("num_key_value_heads", query)
        return hidden, query, kv, self.get("head_dim", hidden // query)


@dataclass(frozen=True)
class RoPE:
    """A config's rotary embedding: theta, and its scaling (type and parameters)."""

    theta: float
    kind: str  # "default", "linear" or "llama3"
    parameters: dict


def rope(config: HFConfig, default_theta: float = 10_000.0, kinds=("default", "linear")) -> RoPE:
    """The config's RoPE in either spelling: transformers 5's `rope_parameters` {rope_type,
    rope_theta, factor, ...}, or 4's `rope_theta` and `rope_scaling` {rope_type or type, factor,
    ...}; a scaling type outside `kinds` is a ConfigError."""
    parameters = dict(config.get("rope_parameters", {}))
    scaling = config.get("rope_scaling")
    key = "rope_parameters"
    if scaling:
        parameters = {**parameters, **scaling}
        key = "rope_scaling"
    theta = float(parameters.get("rope_theta", config.get("rope_theta", default_theta)))
    kind = parameters.get("rope_type", parameters.get("type", "default"))
    if kind not in kinds:
        config.refuse(f"{key}.rope_type", kind, f"meshrun cannot map (valid: {one_of(kinds)})")
    return RoPE(theta, kind, parameters)


def _scaling_factor(config: HFConfig, rope_config: RoPE) -> float:
    return float(rope_config.parameters.get("factor", 1.0)) if rope_config.kind == "linear" else 1.0


def _tied(config: HFConfig, default: bool) -> bool:
    return bool(config.get("tie_word_embeddings", default))


def _no_biases(config: HFConfig) -> None:
    for key in ("attention_bias", "mlp_bias"):
        if config.get(key, False):
            config.refuse(
                key, True, "the KerasHub backbone cannot hold: it has no such biases (valid: false)"
            )


def _plain_head_dim(config: HFConfig, backbone: str) -> None:
    hidden, query, _, head_dim = config.heads
    if head_dim * query != hidden:
        config.refuse(
            "head_dim", head_dim, f"{backbone} cannot express (it takes hidden_size / num_attention_heads)"
        )


# --- Llama, Mistral, Qwen 2 and 3: KerasHub's transformer_layer_<i> backbones ---------------------


def llama_arguments(config: HFConfig) -> dict:
    _no_biases(config)
    _plain_head_dim(config, "LlamaBackbone")
    config.expect("hidden_act", SILU, "silu")
    rope_config = rope(config, kinds=("default", "linear", "llama3"))
    arguments = _decoder_arguments(config) | {
        "rope_max_wavelength": rope_config.theta,
        "tie_word_embeddings": _tied(config, False),
    }
    if rope_config.kind == "linear":
        arguments["rope_position_scaling_factor"] = _scaling_factor(config, rope_config)
    if rope_config.kind == "llama3":
        p = rope_config.parameters
        arguments |= {
            "rope_frequency_adjustment_factor": float(p["factor"]),
            "rope_low_freq_factor": float(p["low_freq_factor"]),
            "rope_high_freq_factor": float(p["high_freq_factor"]),
            "rope_pretraining_sequence_length": int(p["original_max_position_embeddings"]),
        }
    return arguments


def mistral_arguments(config: HFConfig) -> dict:
    _no_biases(config)
    config.expect("hidden_act", SILU, "silu")
    if _tied(config, False):
        config.refuse("tie_word_embeddings", True, "MistralBackbone cannot express (its head is its own)")
    rope_config = rope(config)
    return _decoder_arguments(config) | {
        "head_dim": config.heads[3],
        "rope_max_wavelength": rope_config.theta,
        "rope_scaling_factor": _scaling_factor(config, rope_config),
        "sliding_window": config.get("sliding_window", None),
    }


def qwen2_arguments(config: HFConfig) -> dict:
    _plain_head_dim(config, "QwenBackbone")
    config.expect("hidden_act", SILU, "silu")
    config.expect("use_sliding_window", (False,), False, "QwenBackbone does not apply as transformers does")
    rope_config = rope(config)
    return _decoder_arguments(config) | {
        "rope_max_wavelength": rope_config.theta,
        "rope_scaling_factor": _scaling_factor(config, rope_config),
        "tie_word_embeddings": _tied(config, False),
    }


def qwen3_arguments(config: HFConfig) -> dict:
    _no_biases(config)
    config.expect("hidden_act", SILU, "silu")
    config.expect("use_sliding_window", (False,), False, "Qwen3Backbone does not apply as transformers does")
    rope_config = rope(config)
    return _decoder_arguments(config) | {
        "head_dim": config.heads[3],
        "rope_max_wavelength": rope_config.theta,
        "rope_scaling_factor": _scaling_factor(config, rope_config),
        "tie_word_embeddings": _tied(config, False),
    }


def _decoder_arguments(config: HFConfig) -> dict:
    """The arguments every family's backbone takes alike (Gemma's doubles intermediate_dim)."""
    hidden, query, kv, _ = config.heads
    return {
        "vocabulary_size": config.require("vocab_size"),
        "num_layers": config.require("num_hidden_layers"),
        "num_query_heads": query,
        "num_key_value_heads": kv,
        "hidden_dim": hidden,
        "intermediate_dim": config.require("intermediate_size"),
        "layer_norm_epsilon": float(config.get("rms_norm_eps", 1e-6)),
    }


def decoder_tensors(arguments: dict, config: HFConfig) -> list[TensorMap]:
    """The tensors of a Llama-style checkpoint (Llama, Mistral, Qwen 2 and 3)."""
    hidden = config.heads[0]
    vocab = arguments["vocabulary_size"]
    maps = [
        TensorMap("model.embed_tokens.weight", "token_embedding/embeddings", transforms.same((vocab, hidden)))
    ]
    if not arguments.get("tie_word_embeddings", False):
        maps.append(
            TensorMap("lm_head.weight", "token_embedding/reverse_embeddings", transforms.dense(vocab, hidden))
        )
    for i in range(arguments["num_layers"]):
        maps += _decoder_layer(f"model.layers.{i}", f"transformer_layer_{i}", arguments, config)
    maps.append(TensorMap("model.norm.weight", "sequence_output_layernorm/scale", _norm(hidden)))
    return maps


def _decoder_layer(hf: str, keras: str, arguments: dict, config: HFConfig) -> list[TensorMap]:
    """The tensors of one decoder layer (`hf`: its checkpoint prefix, `keras`: its Keras layer):
    norms, attention projections, the gated MLP, and Qwen 2's biases or Qwen 3's q/k norms."""
    hidden, query, kv, head_dim = config.heads
    inner = arguments["intermediate_dim"]
    attention = f"{keras}/self_attention"
    maps = [
        TensorMap(f"{hf}.input_layernorm.weight", f"{keras}/self_attention_layernorm/scale", _norm(hidden)),
        TensorMap(
            f"{hf}.post_attention_layernorm.weight", f"{keras}/feedforward_layernorm/scale", _norm(hidden)
        ),
        *_projections(hf, attention, query, kv, head_dim, hidden, heads_first=False),
        TensorMap(
            f"{hf}.mlp.gate_proj.weight",
            f"{keras}/feedforward_gate_dense/kernel",
            transforms.dense(inner, hidden),
        ),
        TensorMap(
            f"{hf}.mlp.up_proj.weight",
            f"{keras}/feedforward_intermediate_dense/kernel",
            transforms.dense(inner, hidden),
        ),
        TensorMap(
            f"{hf}.mlp.down_proj.weight",
            f"{keras}/feedforward_output_dense/kernel",
            transforms.dense(hidden, inner),
        ),
    ]
    if config.model_type == "qwen2":
        for short, name, heads in (("q", "query", query), ("k", "key", kv), ("v", "value", kv)):
            maps.append(
                TensorMap(
                    f"{hf}.self_attn.{short}_proj.bias",
                    f"{attention}/{name}/bias",
                    transforms.head_bias(heads, head_dim),
                )
            )
    if config.model_type == "qwen3":
        maps += [
            TensorMap(
                f"{hf}.self_attn.q_norm.weight", f"{attention}/query_dense_layernorm/scale", _norm(head_dim)
            ),
            TensorMap(
                f"{hf}.self_attn.k_norm.weight", f"{attention}/key_dense_layernorm/scale", _norm(head_dim)
            ),
        ]
    return maps


def _norm(size: int) -> transforms.Transform:
    return transforms.same((size,))


def _projections(hf: str, attention: str, query: int, kv: int, head_dim: int, hidden: int, heads_first: bool):
    """The q, k, v and output projections of one layer."""
    return [
        TensorMap(
            f"{hf}.self_attn.q_proj.weight",
            f"{attention}/query/kernel",
            transforms.heads_in(query, head_dim, hidden, heads_first),
        ),
        TensorMap(
            f"{hf}.self_attn.k_proj.weight",
            f"{attention}/key/kernel",
            transforms.heads_in(kv, head_dim, hidden, heads_first),
        ),
        TensorMap(
            f"{hf}.self_attn.v_proj.weight",
            f"{attention}/value/kernel",
            transforms.heads_in(kv, head_dim, hidden, heads_first),
        ),
        TensorMap(
            f"{hf}.self_attn.o_proj.weight",
            f"{attention}/attention_output/kernel",
            transforms.heads_out(query, head_dim, hidden),
        ),
    ]


# --- Gemma 1, 2 and 3 (text): KerasHub's decoder_block_<i> backbones ----------------------------


def gemma_arguments(config: HFConfig) -> dict:
    _no_biases(config)
    _gemma_activation(config)
    _gemma_tied(config)
    rope_config = rope(config, kinds=("default",))
    if rope_config.theta != 10_000.0:
        config.refuse("rope_theta", rope_config.theta, "GemmaBackbone cannot express (it uses 10000)")
    arguments = _gemma_common(config) | {"intermediate_dim": 2 * config.require("intermediate_size")}
    if config.model_type == "gemma2":
        _layer_pattern(config, lambda i: i % 2 == 0, "sliding on even layers, as GemmaBackbone")
        arguments |= {
            "use_post_ffw_norm": True,
            "use_post_attention_norm": True,
            "attention_logit_soft_cap": config.get("attn_logit_softcapping"),
            "final_logit_soft_cap": config.get("final_logit_softcapping"),
            "use_sliding_window_attention": config.get("sliding_window") is not None,
            "sliding_window_size": config.get("sliding_window", 4096),
        }
    return arguments


def gemma3_arguments(config: HFConfig) -> dict:
    _no_biases(config)
    _gemma_activation(config)
    _gemma_tied(config)
    if config.get("use_bidirectional_attention", False):
        config.refuse("use_bidirectional_attention", True, "a causal LM does not have")
    global_rope, local_rope = _gemma3_rope(config)
    sliding = config.get("sliding_window") is not None
    if sliding:
        _layer_pattern(config, lambda i: i % 6 < 5, "5 sliding layers then 1 full, as Gemma3Backbone")
    return _gemma_common(config) | {
        "intermediate_dim": config.require("intermediate_size"),
        "image_size": None,
        "vision_encoder": None,
        "use_query_key_norm": True,
        "use_post_ffw_norm": True,
        "use_post_attention_norm": True,
        "attention_logit_soft_cap": config.get("attn_logit_softcapping"),
        "final_logit_soft_cap": config.get("final_logit_softcapping"),
        "use_sliding_window_attention": sliding,
        "sliding_window_size": config.get("sliding_window", 4096),
        "global_rope_scaling_factor": global_rope,
        "local_rope_scaling_factor": local_rope,
    }


def _gemma3_rope(config: HFConfig) -> tuple[float, float]:
    """Gemma 3's (global, local) linear RoPE scaling factors, from transformers 4's rope_theta,
    rope_local_base_freq and rope_scaling, or 5's rope_parameters {full_attention,
    sliding_attention}; thetas other than KerasHub's fixed ones are refused."""
    parameters = config.get("rope_parameters", {})
    if "full_attention" in parameters:
        full_config = HFConfig({"rope_parameters": parameters["full_attention"]}, config.source)
        local_config = HFConfig({"rope_parameters": parameters.get("sliding_attention", {})}, config.source)
    else:
        full_config, local_config = (
            config,
            HFConfig({"rope_theta": config.get("rope_local_base_freq", GEMMA3_LOCAL_THETA)}, config.source),
        )
    full = rope(full_config, GEMMA3_GLOBAL_THETA)
    local = rope(local_config, GEMMA3_LOCAL_THETA)
    if full.theta != GEMMA3_GLOBAL_THETA:
        config.refuse(
            "rope_theta", full.theta, f"Gemma3Backbone cannot express (it uses {GEMMA3_GLOBAL_THETA:g})"
        )
    if local.theta != GEMMA3_LOCAL_THETA:
        config.refuse(
            "rope_local_base_freq",
            local.theta,
            f"Gemma3Backbone cannot express (it uses {GEMMA3_LOCAL_THETA:g})",
        )
    return _scaling_factor(config, full), _scaling_factor(config, local)


def _gemma_common(config: HFConfig) -> dict:
    hidden, query, kv, head_dim = config.heads
    scalar = config.get("query_pre_attn_scalar", head_dim)
    if scalar not in (head_dim, hidden // query):
        valid = (
            f"{head_dim}, head_dim and hidden_size / num_attention_heads alike"
            if head_dim == hidden // query
            else f"{head_dim}, head_dim, or {hidden // query}, hidden_size / num_attention_heads"
        )
        config.refuse("query_pre_attn_scalar", scalar, f"KerasHub's Gemma cannot express (valid: {valid})")
    # False: 1/sqrt(hidden / heads), which meshrun.compat.keras_hub.set_gemma_attention_scales makes
    # the blocks' attention use (KerasHub's blocks would not pass it on)
    return _decoder_arguments(config) | {"head_dim": head_dim, "query_head_dim_normalize": scalar == head_dim}


def _gemma_activation(config: HFConfig) -> None:
    key = "hidden_activation" if config.get("hidden_activation") else "hidden_act"
    config.expect(key, GELU_TANH, "gelu_pytorch_tanh")


def _gemma_tied(config: HFConfig) -> None:
    if not _tied(config, True):
        config.refuse(
            "tie_word_embeddings", False, "KerasHub's Gemma cannot express (its head is its embedding)"
        )


def _layer_pattern(config: HFConfig, is_sliding: Callable[[int], bool], described: str) -> None:
    """A ConfigError where config.json's layer_types differ from the backbone's fixed pattern."""
    layer_types = config.get("layer_types")
    if not layer_types:
        return
    expected = ["sliding_attention" if is_sliding(i) else "full_attention" for i in range(len(layer_types))]
    if list(layer_types) != expected:
        config.refuse("layer_types", layer_types, f"KerasHub cannot express (it takes {described})")


def gemma_tensors(arguments: dict, config: HFConfig) -> list[TensorMap]:
    """The tensors of a Gemma 1, 2 or 3 (text) checkpoint."""
    hidden, query, kv, head_dim = config.heads
    vocab = arguments["vocabulary_size"]
    inner = config.require("intermediate_size")
    maps = [
        TensorMap("model.embed_tokens.weight", "token_embedding/embeddings", transforms.same((vocab, hidden)))
    ]
    for i in range(arguments["num_layers"]):
        hf, keras = f"model.layers.{i}", f"decoder_block_{i}"
        maps += [
            TensorMap(f"{hf}.input_layernorm.weight", f"{keras}/pre_attention_norm/scale", _norm(hidden)),
            *_projections(hf, f"{keras}/attention", query, kv, head_dim, hidden, heads_first=True),
            TensorMap(
                f"{hf}.mlp.gate_proj.weight", f"{keras}/ffw_gating/kernel", transforms.dense(inner, hidden)
            ),
            TensorMap(
                f"{hf}.mlp.up_proj.weight", f"{keras}/ffw_gating_2/kernel", transforms.dense(inner, hidden)
            ),
            TensorMap(
                f"{hf}.mlp.down_proj.weight", f"{keras}/ffw_linear/kernel", transforms.dense(hidden, inner)
            ),
        ]
        if config.model_type == "gemma":
            maps.append(
                TensorMap(
                    f"{hf}.post_attention_layernorm.weight", f"{keras}/pre_ffw_norm/scale", _norm(hidden)
                )
            )
        else:
            maps += [
                TensorMap(
                    f"{hf}.post_attention_layernorm.weight",
                    f"{keras}/post_attention_norm/scale",
                    _norm(hidden),
                ),
                TensorMap(
                    f"{hf}.pre_feedforward_layernorm.weight", f"{keras}/pre_ffw_norm/scale", _norm(hidden)
                ),
                TensorMap(
                    f"{hf}.post_feedforward_layernorm.weight", f"{keras}/post_ffw_norm/scale", _norm(hidden)
                ),
            ]
        if config.model_type == "gemma3_text":
            maps += [
                TensorMap(
                    f"{hf}.self_attn.q_norm.weight", f"{keras}/attention/query_norm/scale", _norm(head_dim)
                ),
                TensorMap(
                    f"{hf}.self_attn.k_norm.weight", f"{keras}/attention/key_norm/scale", _norm(head_dim)
                ),
            ]
    maps.append(TensorMap("model.norm.weight", "final_normalization/scale", _norm(hidden)))
    return maps


@dataclass(frozen=True)
class Family:
    """A supported model_type: its KerasHub backbone and task class names, meshrun's layout family
    for it, its constructor arguments and its tensor map."""

    backbone: str
    task: str
    layout_family: str
    arguments: Callable[[HFConfig], dict]
    tensors: Callable[[dict, HFConfig], list[TensorMap]]


FAMILIES = {
    "llama": Family("LlamaBackbone", "LlamaCausalLM", "llama", llama_arguments, decoder_tensors),
    "mistral": Family("MistralBackbone", "MistralCausalLM", "llama", mistral_arguments, decoder_tensors),
    "qwen2": Family("QwenBackbone", "QwenCausalLM", "llama", qwen2_arguments, decoder_tensors),
    "qwen3": Family("Qwen3Backbone", "Qwen3CausalLM", "llama", qwen3_arguments, decoder_tensors),
    "gemma": Family("GemmaBackbone", "GemmaCausalLM", "gemma", gemma_arguments, gemma_tensors),
    "gemma2": Family("GemmaBackbone", "GemmaCausalLM", "gemma", gemma_arguments, gemma_tensors),
    "gemma3_text": Family("Gemma3Backbone", "Gemma3CausalLM", "gemma", gemma3_arguments, gemma_tensors),
}


def family_of(config: HFConfig) -> Family:
    """The Family of a config's model_type; a ConfigError listing the supported ones otherwise."""
    model_type = config.model_type
    if model_type not in FAMILIES:
        raise ConfigError(
            KEY,
            f"got {config.source!r}, a transformers checkpoint of model_type {model_type!r}, which meshrun "
            f"has no converter for; valid: {one_of(tuple(FAMILIES))}",
        )
    return FAMILIES[model_type]
