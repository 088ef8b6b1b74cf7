"""A KerasHub preset's tokenizer: its layer, as KerasHub loads it (with or without its TensorFlow
graph), and the encoder meshrun encodes with (`preset_encoder`): the layer's library encoder where
the check (meshrun.text.tokenizer_check) found, finds now or, without TensorFlow, trusts that it
encodes as KerasHub's graph does, else the graph itself. TensorFlow is imported only to make the
check or to use the graph.

Importing this module imports none of jax, keras, keras_hub and tensorflow.
"""

from __future__ import annotations

from pathlib import Path

from meshrun.errors import ConfigError
from meshrun.system.process import native_info_lines_dropped
from meshrun.system.trust import check_preset_objects
from meshrun.text import cache
from meshrun.text.tokenizer_check import checked_encoder, encoder_without_tensorflow, keep_verdict, probe_key
from meshrun.text.tokenizer_encoders import fast_encoder
from meshrun.text.tokenizer_files import EXPECTED
from meshrun.wording import first_line


def preset_encoder(preset: Path, source, key: str, fingerprint: str, verdicts: cache.ProbeVerdicts):
    """(layer, encoder): the preset's tokenizer layer, and its library encoder where that encodes as
    KerasHub's TensorFlow graph does (a verdict found in `verdicts` under the tokenizer's
    `fingerprint`, else found now and kept there), else the graph itself."""
    from meshrun.compat.tensorflow import tensorflow_installed

    verdict_key = probe_key(fingerprint)
    agrees = verdicts.get(verdict_key)
    if agrees or not tensorflow_installed():  # the check made before, or nothing to check against
        layer = _keras_hub_layer(preset, source, key, tensorflow=False)
        encoder = (
            fast_encoder(layer)
            if agrees
            else encoder_without_tensorflow(fast_encoder(layer), layer, preset, key)
        )
    else:
        layer = _keras_hub_layer(preset, source, key, tensorflow=True)
        encoder = checked_encoder(
            layer,
            preset,
            agrees,
            lambda verdict: keep_verdict(verdicts, verdict_key, verdict, layer, fingerprint),
        )
    return layer, encoder


def _keras_hub_layer(preset: Path, source, key: str, tensorflow: bool):
    """The preset's tokenizer layer, as KerasHub loads it; with its TensorFlow graph when
    `tensorflow` (TensorFlow is then imported), else keras_hub is imported without TensorFlow
    where nothing has imported it (meshrun.compat.keras_hub)."""
    from meshrun.compat.keras_hub import local_preset_loading

    check_preset_objects(preset, key)
    keras_hub = _import_keras_hub(key, tensorflow)
    try:
        with native_info_lines_dropped(), local_preset_loading():  # SentencePiece's LOG(INFO) lines
            return keras_hub.tokenizers.Tokenizer.from_preset(str(preset))
    except Exception as error:  # whatever a broken preset makes KerasHub raise
        raise ConfigError(
            key, f"got {source!r}, whose tokenizer KerasHub cannot load ({first_line(error)}); {EXPECTED}"
        ) from None


def _import_keras_hub(key: str, tensorflow: bool):
    from meshrun.compat.keras_hub import import_keras_hub

    try:
        return import_keras_hub(tensorflow)
    except ImportError:
        raise ConfigError(
            key,
            "a KerasHub preset's tokenizer needs the keras-hub "
            "package, which is not installed: pip install 'meshrun[hub]'",
        ) from None
