"""Completions of text prompts by a KerasHub causal LM on a device mesh: the one path that both
`train.sample_prompts` (at the end of a run) and `meshrun generate RUN_DIR` go through.

A prompt is encoded as at training (meshrun.text.examples.prompt_ids: the start token where the
tokenizer has one, then the prompt alone), so the ids the model completes are the ids it was
trained on. Prompts go to KerasHub's `generate` as one batch of {token_ids, padding_mask}, right
padded to `max_length` tokens (prompt and completion), the batch padded with copies of the first
prompt to a multiple of the mesh's batch axis (a batch that axis does not divide cannot be
placed). The padding is never the end token, though a run pads with it where the tokenizer has no
pad token (a Hugging Face tokenizer.json such as GPT-2's or Llama 3's): KerasHub's `generate` takes
a stop token anywhere outside the padding mask as already generated, and would return at once with
nothing generated. Decoding is greedy (keras_hub.samplers.GreedySampler: the most likely token
every step, so a completion is reproducible) and stops at the end token the run's examples end with.

Only numpy is imported here; `complete` needs the model, so keras_hub is imported by then.
"""

from __future__ import annotations

import math

import numpy as np

from meshrun.errors import ConfigError
from meshrun.text.examples import Framing, prompt_ids


def encode_prompts(
    tokenizer, framing: Framing, prompts: list[str], max_length: int, key: str, length_key: str
) -> list[np.ndarray]:
    """Each prompt's ids as the model was trained on them; a ConfigError naming `key` for a prompt
    that encodes to nothing or leaves no room for a completion within `max_length` tokens (set by
    `length_key`)."""
    encoded = [prompt_ids(tokenizer.encode, framing, prompt) for prompt in prompts]
    for prompt, ids in zip(prompts, encoded, strict=True):
        if not len(ids):
            raise ConfigError(
                key,
                f"got {prompt!r}, which encodes to no tokens "
                f"({tokenizer.description} has no start token); give some text",
            )
        if len(ids) >= max_length:
            raise ConfigError(
                key,
                f"got {_shortened(prompt)!r}, {len(ids)} tokens, which leaves no room to complete it within "
                f"{length_key}={max_length} tokens (prompt and completion); shorten it or raise {length_key}",
            )
    return encoded


def _shortened(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def prompt_batch(encoded: list[np.ndarray], max_length: int, multiple: int, pad: int) -> dict:
    """The prompts as KerasHub's `generate` takes them without a preprocessor: token_ids (rows,
    max_length) int32, each prompt first and `pad` after it, and padding_mask (True over the
    prompt). The rows are a multiple of `multiple`: the extra rows repeat the first prompt (an
    empty row would make generation start at position 0, before any prompt token)."""
    rows = math.ceil(len(encoded) / multiple) * multiple
    filled = encoded + [encoded[0]] * (rows - len(encoded))
    token_ids = np.full((rows, max_length), pad, dtype=np.int32)
    padding_mask = np.zeros((rows, max_length), dtype=bool)
    for row, ids in enumerate(filled):
        token_ids[row, : len(ids)] = ids
        padding_mask[row, : len(ids)] = True
    return {"token_ids": token_ids, "padding_mask": padding_mask}


def generation_pad(framing: Framing) -> int:
    """The id a prompt batch is padded with: the run's pad, unless it is the end token (the stop
    token), then the lowest other id. Which id it is changes nothing else: generation overwrites
    the padding, and the causal model never attends to what lies after its position."""
    if framing.end is None or framing.pad != framing.end:
        return framing.pad
    return 1 if framing.end == 0 else 0


def completion_ids(row: np.ndarray, prompt_length: int, end: int | None) -> np.ndarray:
    """The generated part of one output row: after the prompt, up to and excluding the first end
    token (the whole rest of the row when none was generated)."""
    generated = np.asarray(row[prompt_length:])
    if end is not None:
        stops = np.flatnonzero(generated == end)
        if stops.size:
            generated = generated[: stops[0]]
    return generated


def use_greedy_sampler(model) -> None:
    """Makes `model` (a KerasHub CausalLM) decode greedily. Its sampler is set by its compile
    (top_k by default, which draws at random) and absent when it was never compiled; the generate
    function compiled for the old one is dropped."""
    import keras_hub

    model.sampler = keras_hub.samplers.GreedySampler()
    model.generate_function = None


def complete(
    model,
    tokenizer,
    framing: Framing,
    prompts: list[str],
    max_length: int,
    batch_multiple: int,
    key: str,
    length_key: str,
) -> list[str]:
    """The completion of each prompt by `model` (a KerasHub CausalLM built under the run's
    distribution, if any), decoded greedily, as text: the generated tokens up to the end token.
    `batch_multiple` is the size of the mesh's batch axis; `key` and `length_key` name what set the
    prompts and `max_length` in errors (see encode_prompts)."""
    encoded = encode_prompts(tokenizer, framing, prompts, max_length, key, length_key)
    batch = prompt_batch(encoded, max_length, batch_multiple, generation_pad(framing))
    use_greedy_sampler(model)
    stop = None if framing.end is None else [int(framing.end)]
    generated = np.asarray(model.generate(batch, stop_token_ids=stop)["token_ids"])
    # generated has a row per prompt and then the padding rows that fill the batch axis
    return [
        tokenizer.decode(completion_ids(row, len(ids), framing.end).tolist())
        for row, ids in zip(generated, encoded, strict=False)
    ]
