"""The check of a KerasHub preset's library encoder against KerasHub's own tokenizer, and its
verdicts: the probe texts (PROBE_TEXTS), the comparison, the key a verdict is kept under in the token
cache and what it depends on, the encoder used without TensorFlow (no graph to check against), and
the warning, once a process, where a tokenizer falls back to KerasHub's slow graph.

The reference for a KerasHub tokenizer is KerasHub's own, as its tf.data pipelines run it (its
TensorFlow graph). The first time a tokenizer is loaded the fast encoder and the reference encode a
probe text (punctuation, digits, runs of spaces, newlines, non-ASCII text, contractions); where the
ids differ (a family that splits text its own way, such as Mistral's Tekken), the reference itself
is used, backend "keras_hub", with a warning that tokenization will be slow. KerasHub 0.32's eager
path for byte-level BPE (calling the tokenizer outside tf.data) passes its split regex to
`tokenizers` as a literal string, so it splits nothing and can differ from the graph on runs of
spaces; meshrun follows the graph, which splits as GPT-2 does. The verdict is kept in the token
cache (meshrun.text.cache.ProbeVerdicts) under a key over the tokenizer's files, the probe text and
the versions of the libraries on both sides, so a later process that finds it makes no check and,
where the fast encoder agreed, imports no TensorFlow (1-3 s and 500 MiB). Without TensorFlow
(meshrun's `tf` extra) there is no graph to check against: SentencePiece and byte-level BPE split as
GPT-2 splits are encoded by their library unchecked, and a tokenizer that splits text its own way
(Tekken) is a ConfigError saying TensorFlow is needed.

Importing this module imports none of jax, keras, keras_hub and tensorflow.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
from pathlib import Path

from meshrun.errors import ConfigError
from meshrun.system.trust import private_dir
from meshrun.text import cache
from meshrun.text.tokenizer_encoders import KerasHubGraphEncoder, SentencePieceEncoder, fast_encoder, same_ids
from meshrun.wording import first_line

log = logging.getLogger("meshrun")

# Texts the fast encoder and KerasHub's own must encode alike (each one apart, and as one batch).
PROBE_TEXTS = (
    "Hello, world! It's 3.14159 o'clock; we'll see 12,345 cats & 2024 dogs in 1999, won't we?",
    "Instruction: Reverse the words: red blue\nResponse: ",
    "Items:\n    - an indented item\n\n\n  two  spaces,   three   and trailing   ",
    "Café naïve Zürich Ελλάδα 東京 🙂 “quoted” — 'single' x=y+1 {\"a\": [1, 2]}\r\n\tTHEY'RE DON'T I'M",
    "<s></s><bos><eos><pad><|endoftext|><|begin_of_text|><|end_of_text|><|im_end|>",
    "",
    " ",
    "\n\n",
)

# The libraries a verdict of the check depends on: KerasHub's graph on one side, the library
# encoders on the other (and meshrun, which builds them). Raise PROBE_FORMAT when how meshrun
# builds its encoders or reaches a verdict changes within one meshrun version.
PROBE_LIBRARIES = ("meshrun", "keras-hub", "tensorflow", "tensorflow-text", "sentencepiece", "tokenizers")
PROBE_FORMAT = 1
VERDICTS = (
    "the verdicts of its tokenizer check"  # what meshrun reads from the token cache for a preset's tokenizer
)

# The tokenizers (by description) whose fall-back to KerasHub's graph this process has warned
# about, so that the warning is said once though a run loads its tokenizer more than once (for its
# sampling plan and for its data, each through load_tokenizer). Module-level because those loads
# share no object a caller holds: they would once the run loads its tokenizer once and hands it on.
_SLOW_FALLBACKS_SAID: set[str] = set()


def encoder_without_tensorflow(encoder, layer, preset: Path, key: str):
    """The library encoder where TensorFlow, and so KerasHub's graph to check it against, is not
    installed: for the kinds it encodes as KerasHub does by construction (SentencePiece; byte-level
    BPE split as GPT-2 splits); for any other, a ConfigError saying TensorFlow is needed."""
    from meshrun.compat.keras_hub import splits_as_byte_pair_tokenizer
    from meshrun.compat.tensorflow import TENSORFLOW_INSTALL

    if isinstance(encoder, SentencePieceEncoder) or (
        encoder is not None and splits_as_byte_pair_tokenizer(layer)
    ):
        return encoder
    raise ConfigError(
        key,
        f"{type(layer).__name__} of {preset.resolve()} splits text its own way, which meshrun encodes with "
        f"KerasHub's TensorFlow graph: needs TensorFlow, which is not installed: {TENSORFLOW_INSTALL}",
    )


def checked_encoder(layer, preset: Path, agrees: bool | None, keep):
    """`layer`'s library encoder where it encodes PROBE_TEXTS as KerasHub's graph does (`agrees`
    when known, else checked now and given to `keep`), else the graph itself (a warning where the
    library encoder differs: it is much slower). `layer` was made with TensorFlow imported."""
    reference = KerasHubGraphEncoder(layer)
    encoder = fast_encoder(layer)
    if encoder is None:
        return reference
    if agrees is None:
        agrees = same_ids(encoder.encode(list(PROBE_TEXTS)), reference.encode(list(PROBE_TEXTS)))
        keep(agrees)
    if not agrees:
        _warn_slow(
            f"{type(layer).__name__} of {preset.resolve()}",
            f"does not encode a probe text as KerasHub does with {encoder.library}",
        )
        return reference
    return encoder


def probe_key(fingerprint: str) -> str:
    """The key of the check's verdict for a tokenizer whose files have `fingerprint`: sha256 over
    everything the verdict depends on (probe_inputs)."""
    return hashlib.sha256(json.dumps(probe_inputs(fingerprint), sort_keys=True).encode()).hexdigest()


def probe_inputs(fingerprint: str) -> dict:
    """What the check's verdict depends on: the tokenizer's files (their `fingerprint`), the probe
    texts, the versions of PROBE_LIBRARIES installed and PROBE_FORMAT."""
    return {
        "format": PROBE_FORMAT,
        "fingerprint": fingerprint,
        "probe": PROBE_TEXTS,
        "versions": probe_libraries(),
    }


def probe_libraries() -> dict[str, str | None]:
    """The installed version of each of PROBE_LIBRARIES (None: not installed), read from their
    metadata (nothing is imported)."""
    from meshrun.compat.names import installed_distribution

    versions = {}
    for name in PROBE_LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(installed_distribution(name))
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def verdicts_in(cache_dir: str | None, shared: bool) -> cache.ProbeVerdicts:
    """The check's verdicts in the token cache at `cache_dir`, once its dir and the verdicts' are
    found writable by their owner alone (their group too when `shared`)."""
    root = private_dir(cache.root(cache_dir), "data.cache_dir", shared, what=VERDICTS)
    private_dir(root / cache.PROBES, "data.cache_dir", shared, what=VERDICTS)
    return cache.ProbeVerdicts(root)


def keep_verdict(
    verdicts: cache.ProbeVerdicts, verdict_key: str, agrees: bool, layer, fingerprint: str
) -> None:
    """Writes the check's verdict (with what it depends on, for whoever reads the file); one that
    cannot be written is said in the log and made again next time."""
    try:
        verdicts.put(verdict_key, agrees, {"tokenizer": type(layer).__name__, **probe_inputs(fingerprint)})
    except OSError as error:
        log.warning(
            f"the verdict of the tokenizer check could not be kept in {verdicts.folder} "
            f"({first_line(error)}); the next run checks again"
        )


def _warn_slow(description: str, why: str) -> None:
    """Warns that the tokenizer `description` names is used through KerasHub's graph (`why`),
    once a process."""
    if description not in _SLOW_FALLBACKS_SAID:
        _SLOW_FALLBACKS_SAID.add(description)
        log.warning(
            f"{description} {why}; tokenizing through KerasHub's "
            "TensorFlow graph instead, which is much slower"
        )
