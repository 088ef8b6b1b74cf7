"""`train.sample_prompts`: after training and evaluation a run completes a few prompts with the
model it trained (meshrun.text.complete) and records them in metrics.json (`samples`) and its
summary. Everything sampling needs is checked in the prepare phase, before anything is built: the
model is a KerasHub causal LM, the run has a tokenizer (data.tokenizer, else model.preset's), the
tokenizer fits the model, every prompt fits `train.sample_max_length` (default model.seq_len), and
the sampling settings (`train.sample_temperature`, `train.sample_top_k`, `train.sample_top_p`,
`train.sample_seed`; greedy by default) are valid.

`meshrun generate RUN_DIR` (meshrun.generate) finds the run's tokenizer, its framing
and checks its lengths with the same functions.

Nothing here imports jax or keras.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from meshrun.errors import ConfigError
from meshrun.text.complete import (
    GREEDY,
    Sampling,
    SamplingKeys,
    check_sampling,
    check_top_k,
    complete,
    encode_prompts,
)
from meshrun.text.examples import Framing
from meshrun.wording import counted

SAMPLE_KEY = "train.sample_prompts"
LENGTH_KEY = "train.sample_max_length"
SAMPLING_KEYS = SamplingKeys(
    temperature="train.sample_temperature",
    top_k="train.sample_top_k",
    top_p="train.sample_top_p",
    seed="train.sample_seed",
)
HUB_MODEL = "keras_hub"


@dataclass(frozen=True)
class SamplingPlan:
    """What the end of a run completes: the prompts, the run's tokenizer and the special tokens its
    examples are framed with, the tokens of prompt and completion together (`max_length`), the
    size of the mesh's batch axis (the prompts' batch is padded to a multiple of it), and how each
    token is picked."""

    prompts: tuple[str, ...]
    tokenizer: Any  # meshrun.text.tokenizer.TextTokenizer
    framing: Framing
    max_length: int
    batch_multiple: int
    sampling: Sampling = GREEDY
    chat: Any = None  # meshrun.text.chat.ChatFormat of a run on conversations: prompts are user turns


def plan_sampling(config, planned, mesh, processes: int) -> SamplingPlan | None:
    """The run's sampling plan (None: train.sample_prompts is empty), or the ConfigError of the
    first thing that would keep it from sampling: `planned` is the run's PlannedModel, `mesh` its
    mesh with no -1 left, `processes` the job's process count."""
    train = config.train
    prompts = check_sampling_settings(config, processes)
    if not prompts:
        return None
    options = planned.options
    tokenizer, framing = load_run_tokenizer(config, SAMPLE_KEY)
    chat = run_chat(config, tokenizer, SAMPLE_KEY)
    vocabulary = model_vocabulary(planned.abstract.signature)
    check_vocabulary(tokenizer, config, vocabulary)
    sampling = run_sampling(config)
    check_top_k(sampling, vocabulary, SAMPLING_KEYS.top_k)
    max_length = check_max_length(train.sample_max_length or options.seq_len, options, LENGTH_KEY)
    encode_prompts(
        tokenizer, framing, list(prompts), max_length, SAMPLE_KEY, LENGTH_KEY, chat
    )  # a prompt too long fails now
    return SamplingPlan(
        prompts=prompts,
        tokenizer=tokenizer,
        framing=framing,
        max_length=max_length,
        batch_multiple=mesh.axis_size(mesh.batch_axis),
        sampling=sampling,
        chat=chat,
    )


def check_sampling_settings(config, processes: int) -> tuple[str, ...]:
    """The prompts of train.sample_prompts, or the ConfigError of a setting that keeps the run from
    sampling, whatever its tokenizer: a bad train.sample_max_length or sampling setting (checked
    with or without prompts), prompts for a model that is not a KerasHub causal LM or in a job of
    several `processes`."""
    train = config.train
    run_sampling(config)
    if train.sample_max_length is not None and train.sample_max_length < 2:
        raise ConfigError(
            LENGTH_KEY,
            f"got {train.sample_max_length}; expected the tokens of prompt and completion together, "
            "2 or more (null: model.seq_len)",
        )
    prompts = tuple(train.sample_prompts or ())
    if prompts and config.model.name != HUB_MODEL:
        raise ConfigError(
            SAMPLE_KEY,
            f"got {counted(len(prompts), 'prompt')} with model={config.model.name}; only KerasHub causal LMs "
            "(model=keras_hub) complete prompts: leave train.sample_prompts empty",
        )
    if prompts and processes > 1:
        raise ConfigError(
            SAMPLE_KEY,
            f"got {counted(len(prompts), 'prompt')} in a job of {processes} processes; sample in a "
            "one-process run, or after training with meshrun generate RUN_DIR --prompt TEXT",
        )
    return prompts


def run_sampling(config) -> Sampling:
    """How train.sample_prompts are completed (train.sample_temperature, _top_k, _top_p, _seed), or
    the ConfigError of the first bad setting."""
    train = config.train
    return check_sampling(
        Sampling(
            temperature=train.sample_temperature,
            top_k=train.sample_top_k,
            top_p=train.sample_top_p,
            seed=train.sample_seed,
        ),
        SAMPLING_KEYS,
    )


def sample(model, plan: SamplingPlan) -> list[dict]:
    """Each prompt of `plan` and its completion by `model`, as metrics.json records them: {prompt,
    completion, sampling} (sampling: the settings, Sampling.record)."""
    prompts = list(plan.prompts)
    completions = complete(
        model,
        plan.tokenizer,
        plan.framing,
        prompts,
        plan.max_length,
        plan.batch_multiple,
        SAMPLE_KEY,
        LENGTH_KEY,
        plan.sampling,
        plan.chat,
    )
    record = plan.sampling.record()
    return [
        {"prompt": prompt, "completion": completion, "sampling": record}
        for prompt, completion in zip(prompts, completions, strict=True)
    ]


def tokenizer_source(config, key: str) -> tuple[str, str]:
    """Where the run's tokenizer comes from and the key that says so: data.tokenizer (data=text
    has one), else model.preset; a run with neither is a ConfigError naming `key`."""
    from meshrun.text.tokenizer import tokenizer_source as source_of

    return source_of(
        getattr(config.data.options, "tokenizer", None), getattr(config.model.options, "preset", None), key
    )


def load_run_tokenizer(config, key: str):
    """The run's tokenizer (meshrun.text.tokenizer.TextTokenizer) and the special tokens its
    examples were framed with (`key`: what asked, for a run without a tokenizer)."""
    from meshrun.text.tokenizer import load_tokenizer

    source, source_key = tokenizer_source(config, key)
    cache_dir = getattr(
        config.data.options, "cache_dir", None
    )  # data=text's: where its check's verdict is kept
    tokenizer = load_tokenizer(source, source_key, cache_dir, config.cache.shared)
    return tokenizer, run_framing(config, tokenizer)


def run_chat(config, tokenizer, key: str, wanted: bool = False):
    """The ChatFormat a run's prompts are rendered with (meshrun.text.chat): its own where it
    trained on conversations (data.format=chat), else, when `wanted` (generate --chat), the chat
    template beside its tokenizer or the built-in one its turn markers call for; else None."""
    options = config.data.options
    trained_on_chat = config.data.name == "text" and getattr(options, "chat", False)
    if not (trained_on_chat or wanted):
        return None
    from meshrun.text.chat import load_chat

    source, source_key = tokenizer_source(config, key)
    return load_chat(tokenizer, source, options.chat_template if trained_on_chat else None, source_key)


def run_framing(config, tokenizer) -> Framing:
    """The start, end and pad tokens the run's examples were made with: data=text's (its
    data.end_token included), else the tokenizer's own (pad: the end token where it has no pad)."""
    if config.data.name == "text":
        from meshrun.data.text_tokenizer import framing_for

        return framing_for(config.data.options, tokenizer)
    end, pad = tokenizer.end_id, tokenizer.pad_id
    return Framing(
        start=tokenizer.start_id, end=end, pad=int(pad if pad is not None else end if end is not None else 0)
    )


def model_vocabulary(signature) -> int:
    """The vocabulary of a causal LM: the width of its logits (`signature`: its Signature)."""
    return int(signature.outputs[0].shape[-1])


def check_vocabulary(tokenizer, config, vocabulary: int) -> None:
    """ConfigError, naming the key the tokenizer came from, when it has more ids than the model."""
    from meshrun.text.tokenizer import check_fits_vocabulary

    check_fits_vocabulary(tokenizer, *tokenizer_source(config, SAMPLE_KEY), vocabulary)


def check_max_length(max_length: int, options, key: str) -> int:
    """`max_length`, or a ConfigError naming `key` when the backbone cannot take that many tokens
    (its position embedding is shorter; `options`: the run's KerasHubOptions)."""
    from meshrun.models.hub.presets import max_sequence_length

    limit = max_sequence_length(options.preset, options.backbone)
    if limit is not None and max_length > limit:
        raise ConfigError(
            key,
            f"got {max_length}, more than the backbone's max_sequence_length {limit}; valid: 2 to {limit}",
        )
    return max_length


def check_text_tokenizer(config, planned) -> None:
    """The checks of a data=text run's tokenizer that need no pass over its corpus, as its training
    would make them, for `meshrun plan` (`planned`: the run's PlannedModel): the tokenizer loads
    (data.tokenizer, else model.preset's), fits the model's vocabulary and has an end token, and
    with data.format=chat the chat template is found and renders a probe conversation. A
    ConfigError for the first problem; nothing for a run on other data."""
    if config.data.name != "text":
        return
    tokenizer, _ = load_run_tokenizer(config, "data.tokenizer")
    check_vocabulary(tokenizer, config, model_vocabulary(planned.abstract.signature))
    chat = run_chat(config, tokenizer, "data.tokenizer")
    if chat is not None:
        _ = chat.end_of_turn_ids  # renders a probe conversation: a ConfigError for a broken template
