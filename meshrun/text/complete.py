"""Completions of text prompts by a KerasHub causal LM on a device mesh: the one path that both
`train.sample_prompts` (at the end of a run) and `meshrun generate RUN_DIR` go through.

A prompt is encoded as at training (meshrun.text.examples.prompt_ids: the start token where the
tokenizer has one, then the prompt alone), so the ids the model completes are the ids it was
trained on. Prompts go to KerasHub's `generate` as one batch of {token_ids, padding_mask}, right
padded to `max_length` tokens (prompt and completion), the batch padded with copies of the first
prompt to a multiple of the mesh's batch axis (a batch that axis does not divide cannot be
placed). The padding is never a stop token, though a run pads with its end token where the
tokenizer has no pad token (a Hugging Face tokenizer.json such as GPT-2's or Llama 3's): KerasHub's
`generate` takes a stop token anywhere outside the padding mask as already generated, and would
return at once with nothing generated.

How each token is picked is a `Sampling`: greedy by default (keras_hub.samplers.GreedySampler: the
most likely token every step), else drawn at a temperature, from the k most likely tokens (top_k)
and/or the fewest whose probabilities add up to p (top_p), with a seed: a fresh sampler, and so a
fresh seed generator, every call, so the same seed gives the same text in any call of any process.
A completion stops at the first of the stop tokens (`stop_ids`: the end token the run's examples end
with and the tokenizer's own stop list).

Only numpy is imported here; `complete` needs the model, so keras_hub is imported by then.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from meshrun.errors import ConfigError
from meshrun.text.examples import Framing, prompt_ids

SEED_LIMIT = 2**32  # KerasHub's samplers keep their seed as uint32


@dataclass(frozen=True)
class Sampling:
    """How a completion picks each token (greedy unless asked otherwise).

    - `temperature`: the logits are divided by it before the draw (above 1: more varied, below 1:
      closer to greedy). None: greedy, unless top_k or top_p is set, then 1.0; 0: greedy (top_k
      and top_p must then be None).
    - `top_k`: draw from the k most likely tokens only (1 or more; 1 is greedy). None: no limit.
    - `top_p`: draw from the fewest most likely tokens whose probabilities add up to p (over 0, up
      to 1), within top_k where both are set. None: no limit.
    - `seed`: the draws' seed, 0 to 2**32 - 1: the same seed gives the same text. Unused when greedy.
    """

    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0

    @property
    def greedy(self) -> bool:
        """Whether every token is the most likely one (no draw)."""
        if self.temperature is None:
            return self.top_k is None and self.top_p is None
        return self.temperature == 0

    @property
    def sampler_name(self) -> str:
        """The KerasHub sampler that picks the tokens: greedy, top_p, top_k or random."""
        if self.greedy:
            return "greedy"
        if self.top_p is not None:
            return "top_p"
        return "top_k" if self.top_k is not None else "random"

    def drawn_temperature(self) -> float:
        """The temperature the draws are made at (1.0 where none was given)."""
        return 1.0 if self.temperature is None else float(self.temperature)

    def record(self) -> dict:
        """The settings as metrics.json and `meshrun generate --json` record them: the sampler, and
        for a draw its temperature (resolved), top_k, top_p and seed (null where greedy)."""
        if self.greedy:
            return {"sampler": "greedy", "temperature": None, "top_k": None, "top_p": None, "seed": None}
        return {
            "sampler": self.sampler_name,
            "temperature": self.drawn_temperature(),
            "top_k": self.top_k,
            "top_p": self.top_p,
            "seed": self.seed,
        }

    def make_sampler(self):
        """A new KerasHub sampler for these settings (with a new seed generator: imports keras_hub)."""
        import keras_hub

        samplers = keras_hub.samplers
        name, temperature = self.sampler_name, self.drawn_temperature()
        if name == "greedy":
            return samplers.GreedySampler()
        if name == "top_p":
            return samplers.TopPSampler(p=self.top_p, k=self.top_k, seed=self.seed, temperature=temperature)
        if name == "top_k":
            return samplers.TopKSampler(k=self.top_k, seed=self.seed, temperature=temperature)
        return samplers.RandomSampler(seed=self.seed, temperature=temperature)


GREEDY = Sampling()  # the default: the most likely token every step


@dataclass(frozen=True)
class SamplingKeys:
    """The names of the settings of a Sampling in errors: config keys or command-line flags."""

    temperature: str
    top_k: str
    top_p: str
    seed: str


def check_sampling(sampling: Sampling, keys: SamplingKeys) -> Sampling:
    """`sampling`, or the ConfigError of its first bad setting, naming its key (`keys`), the value
    and what is valid."""
    temperature, top_k, top_p, seed = sampling.temperature, sampling.top_k, sampling.top_p, sampling.seed
    if temperature is not None and not (_is_number(temperature) and 0 <= temperature < math.inf):
        raise ConfigError(
            keys.temperature,
            f"got {temperature!r}; expected a number of 0 or more (0: greedy; null: greedy, or 1.0 with "
            f"{keys.top_k} or {keys.top_p})",
        )
    if top_k is not None and not (_is_whole(top_k) and top_k >= 1):
        raise ConfigError(keys.top_k, f"got {top_k!r}; expected a whole number of 1 or more (null: no limit)")
    if top_p is not None and not (_is_number(top_p) and 0 < top_p <= 1):
        raise ConfigError(keys.top_p, f"got {top_p!r}; expected a number over 0, up to 1 (null: no limit)")
    if not (_is_whole(seed) and 0 <= seed < SEED_LIMIT):
        raise ConfigError(keys.seed, f"got {seed!r}; expected a whole number from 0 to {SEED_LIMIT - 1}")
    if temperature == 0 and (top_k is not None or top_p is not None):
        given = keys.top_k if top_k is not None else keys.top_p
        raise ConfigError(
            keys.temperature,
            f"got 0 (greedy) with {given} set; greedy decoding draws nothing: "
            f"leave {given} unset, or give a temperature over 0",
        )
    return sampling


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and not math.isnan(value)


def _is_whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_top_k(sampling: Sampling, vocabulary: int, key: str) -> None:
    """ConfigError naming `key` when top_k is more than the model's `vocabulary` (its logits' width)."""
    if sampling.top_k is not None and sampling.top_k > vocabulary:
        raise ConfigError(
            key,
            f"got {sampling.top_k}, more than the model's vocabulary of {vocabulary} tokens; valid: 1 to "
            f"{vocabulary} (null: no limit)",
        )


def stop_ids(tokenizer, framing: Framing, chat=None) -> list[int]:
    """The tokens a completion stops at: the end of an assistant's turn where `chat` (a
    meshrun.text.chat.ChatFormat) renders the prompts, the end token the run's examples end with
    (where it has one), then the tokenizer's own stop list (`stop_ids`, where it has one), each
    once, in order."""
    ids = [int(i) for i in chat.end_of_turn_ids] if chat is not None else []
    if framing.end is not None and int(framing.end) not in ids:
        ids.append(int(framing.end))
    for token in getattr(tokenizer, "stop_ids", ()) or ():
        if int(token) not in ids:
            ids.append(int(token))
    return ids


def encode_prompts(
    tokenizer, framing: Framing, prompts: list, max_length: int, key: str, length_key: str, chat=None
) -> list[np.ndarray]:
    """Each prompt's ids as the model was trained on them; a ConfigError naming `key` for a prompt
    that encodes to nothing or leaves no room for a completion within `max_length` tokens (set by
    `length_key`). With `chat` (the ChatFormat of a run on conversations), a prompt is a
    conversation (a text: one user turn), rendered by the template with its generation prompt."""
    if chat is not None:
        encoded = [chat.prompt_ids(as_conversation(prompt, key)) for prompt in prompts]
    else:
        encoded = [prompt_ids(tokenizer.encode, framing, prompt) for prompt in prompts]
    for prompt, ids in zip(map(prompt_text, prompts), encoded, strict=True):
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


def as_conversation(prompt, key: str) -> tuple[dict, ...]:
    """A prompt as chat turns: a text is one user turn; turns ({role, content} dicts) are checked."""
    from meshrun.text.chat import prompt_conversation

    if isinstance(prompt, str):
        return ({"role": "user", "content": prompt},)
    return prompt_conversation(prompt, "the conversation", key)


def prompt_text(prompt) -> str:
    """A prompt as errors and outputs show it: a text as it is, a conversation its last turn's text."""
    return prompt if isinstance(prompt, str) else prompt[-1]["content"]


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


def generation_pad(stops: list[int]) -> int:
    """The id a prompt batch is padded with: the lowest id that is no stop token (KerasHub would take
    a stop token in the padding for one already generated). Which id it is changes nothing else:
    generation overwrites the padding, and the causal model never attends to what lies after its
    position."""
    pad, taken = 0, set(stops)
    while pad in taken:
        pad += 1
    return pad


def completion_ids(row: np.ndarray, prompt_length: int, stops: list[int]) -> np.ndarray:
    """The generated part of one output row: after the prompt, up to and excluding the first of the
    stop tokens `stops` (the whole rest of the row when none was generated)."""
    generated = np.asarray(row[prompt_length:])
    if stops:
        at = np.flatnonzero(np.isin(generated, stops))
        if at.size:
            generated = generated[: at[0]]
    return generated


def use_sampler(model, sampling: Sampling) -> None:
    """Makes `model` (a KerasHub CausalLM) pick tokens as `sampling` says, with a new sampler (and
    so a new seed generator, made under the distribution in force). Its sampler is set by its
    compile (top_k by default, which draws at random) and absent when it was never compiled; the
    generate function compiled for the old one is replaced by one for the new (which leaves out
    the outputs a Gemma 3 task returns as None: meshrun.compat.keras_hub)."""
    from meshrun.compat.keras_hub import generate_without_absent_outputs

    model.sampler = sampling.make_sampler()
    generate_without_absent_outputs(model)


def complete(
    model,
    tokenizer,
    framing: Framing,
    prompts: list[str],
    max_length: int,
    batch_multiple: int,
    key: str,
    length_key: str,
    sampling: Sampling = GREEDY,
    chat=None,
) -> list[str]:
    """The completion of each text prompt by `model`, encoded as at training (see encode_prompts:
    `key` and `length_key` name what set the prompts and `max_length` in errors), as complete_ids
    gives it; it stops at stop_ids(tokenizer, framing, chat). With `chat`, prompts are
    conversations (encode_prompts)."""
    encoded = encode_prompts(tokenizer, framing, prompts, max_length, key, length_key, chat)
    return complete_ids(
        model, tokenizer, encoded, max_length, batch_multiple, sampling, stop_ids(tokenizer, framing, chat)
    )


def complete_ids(
    model,
    tokenizer,
    encoded: list[np.ndarray],
    max_length: int,
    batch_multiple: int,
    sampling: Sampling,
    stop_ids: list[int],
) -> list[str]:
    """The completion of each encoded prompt (each shorter than `max_length`) by `model` (a KerasHub
    CausalLM built under the run's distribution, if any), its tokens picked as `sampling` says, as
    text: the generated tokens up to the first of `stop_ids`. `batch_multiple` is the size of the
    mesh's batch axis."""
    batch = prompt_batch(encoded, max_length, batch_multiple, generation_pad(stop_ids))
    use_sampler(model, sampling)
    generated = np.asarray(model.generate(batch, stop_token_ids=list(stop_ids) or None)["token_ids"])
    # generated has a row per prompt and then the padding rows that fill the batch axis
    return [
        tokenizer.decode(completion_ids(row, len(ids), stop_ids).tolist())
        for row, ids in zip(generated, encoded, strict=False)
    ]
