"""KerasHub, as meshrun uses it past its public API: importing it without TensorFlow, which
byte-pair tokenizers split text as their base class does (meshrun.text.tokenizer_check), the
attention scale of Gemma's decoder blocks, which KerasHub does not pass on
(set_gemma_attention_scales), and generation by a task whose generate step returns an output as
None (generate_without_absent_outputs). Importing this module imports no KerasHub.

keras_hub imports TensorFlow and TensorFlow Text at its own import whenever they are installed
(keras-hub requires tensorflow-text, so they are wherever it was installed with its dependencies),
each inside try/except ImportError, for its preprocessing layers and tokenizers as tf.data runs them,
which meshrun's own feeds do not use: 2-4 s and 500-600 MiB of every KerasHub run's start-up.
`import_keras_hub` imports it with both unimportable, as on an install without them (keras_hub then
binds None, or `object` for one base class, where it would have bound theirs), and leaves a finder on
`sys.meta_path` that gives keras_hub TensorFlow's modules as soon as anything imports TensorFlow
(meshrun for tf.data or a tokenizer's TensorFlow graph, or the user's code): the process then has
keras_hub as an import with TensorFlow would have made it (tests/test_compat.py compares the two,
name by name). A tokenizer layer made before TensorFlow came has no TensorFlow graph: make it again.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import sys
import types
from dataclasses import dataclass

from meshrun.compat.names import PrivateName, ensure, uses

_TOKENIZERS = uses(
    "keras_hub",
    PrivateName(
        "keras-hub",
        "keras_hub.tokenizers",
        "BytePairTokenizer._tokenize_tf",
        "telling a byte-pair tokenizer that splits text its own way (its class redefines how it tokenizes, "
        "as MistralTekkenTokenizer does) from one that splits "
        "as GPT-2 does, where TensorFlow is not there to check",
    ),
)


def splits_as_byte_pair_tokenizer(layer) -> bool:
    """Whether a KerasHub BytePairTokenizer `layer` tokenizes as the base class does (GPT-2's
    split: GPT2Tokenizer, Llama3Tokenizer, QwenTokenizer, ...): no class between its own and
    BytePairTokenizer redefines a method of the base class that tokenizes or reads the merges
    (MistralTekkenTokenizer and CLIPTokenizer do, to split text their own way)."""
    ensure("keras_hub")
    from keras_hub.tokenizers import BytePairTokenizer

    mro = type(layer).__mro__
    if BytePairTokenizer not in mro:
        return False
    tokenizing = {name for name in vars(BytePairTokenizer) if "tokenize" in name or "merges" in name}
    return not any(tokenizing & set(vars(cls)) for cls in mro[: mro.index(BytePairTokenizer)])


# --- Gemma's attention scale -----------------------------------------------------------------------

# (module, decoder block class, module, its attention class) of each KerasHub Gemma family
GEMMA_BLOCKS = (
    (
        "keras_hub.src.models.gemma.gemma_decoder_block",
        "GemmaDecoderBlock",
        "keras_hub.src.models.gemma.gemma_attention",
        "CachedGemmaAttention",
    ),
    (
        "keras_hub.src.models.gemma3.gemma3_decoder_block",
        "Gemma3DecoderBlock",
        "keras_hub.src.models.gemma3.gemma3_attention",
        "CachedGemma3Attention",
    ),
)
SCALE_FLAG = "query_head_dim_normalize"
_SCALE_PURPOSE = (
    f"the attention scale a Gemma backbone's {SCALE_FLAG}=False asks for, 1/sqrt(hidden_dim / "
    "num_query_heads) (transformers' query_pre_attn_scalar), which KerasHub's decoder blocks do not "
    "pass on to their attention"
)
_GEMMA_ATTENTION_SCALE = uses(
    "keras_hub",
    *(
        name
        for block_module, block, attention_module, attention in GEMMA_BLOCKS
        for name in (
            PrivateName(
                "keras-hub",
                block_module,
                f"{block}.__init__",
                _SCALE_PURPOSE,
                source_contains=f"self.attention = {attention}(",
            ),
            PrivateName(
                "keras-hub",
                attention_module,
                f"{attention}._compute_attention",
                _SCALE_PURPOSE,
                source_contains=f"if self.{SCALE_FLAG}:",
            ),
        )
    ),
)


def set_gemma_attention_scales(backbone) -> None:
    """Gives each Gemma or Gemma 3 decoder block's attention the block's own
    `query_head_dim_normalize`: KerasHub 0.32's blocks keep it (and their config saves it) but build
    their attention with True whatever it is, so a backbone made with False (Gemma 2 27B's and Gemma 3
    27B's query_pre_attn_scalar = hidden_dim / num_query_heads) would scale its queries by
    1/sqrt(head_dim). The attention reads the flag each call, so setting it after the build is
    enough; a backbone of another family is left as it is."""
    import importlib

    ensure("keras_hub")
    classes = tuple(getattr(importlib.import_module(module), name) for module, name, _, _ in GEMMA_BLOCKS)
    for block in getattr(backbone, "transformer_layers", None) or ():
        if isinstance(block, classes):
            setattr(block.attention, SCALE_FLAG, getattr(block, SCALE_FLAG))


# --- generation without absent outputs -----------------------------------------------------------

_GENERATE_OUTPUTS = uses(
    "keras_hub",
    PrivateName(
        "keras-hub",
        "keras_hub.models",
        "CausalLM.generate",
        "generating with a task whose generate step returns an output as None (Gemma3CausalLM's "
        "'images' for text alone), which CausalLM.generate would concatenate: it calls the task's "
        "generate_function, made by make_generate_function",
        source_contains="generate_function = self.make_generate_function()",
    ),
)


def generate_without_absent_outputs(model) -> None:
    """Makes `model`'s (a KerasHub CausalLM's) generate function anew and leaves out of each of
    its results the outputs that are None: KerasHub 0.32's Gemma3CausalLM generates text alone
    with `images: None` among them, which its `generate` then fails to concatenate ('None is not
    a valid value for jnp.array'). The other tasks' results have no None and are left as they are."""
    ensure("keras_hub")
    model.generate_function = None
    inner = model.make_generate_function()

    def generate_function(inputs, stop_token_ids=None):
        outputs = inner(inputs, stop_token_ids=stop_token_ids)
        if isinstance(outputs, dict):
            return {key: value for key, value in outputs.items() if value is not None}
        return outputs

    model.generate_function = generate_function


# --- keras_hub without TensorFlow ------------------------------------------------------------------

TENSORFLOW_PACKAGES = ("tensorflow", "tensorflow_text")  # the packages keras_hub imports when it can


@dataclass(frozen=True)
class TensorFlowName:
    """A global that keras_hub's module `module` ('' for every keras_hub module) binds at import to
    module `target` when TensorFlow is importable, and to None without it."""

    module: str
    name: str
    target: str


BYTE_PAIR_MODULE = "keras_hub.src.tokenizers.byte_pair_tokenizer"
TENSORFLOW_NAMES = (
    TensorFlowName("", "tf", "tensorflow"),
    TensorFlowName("", "tf_text", "tensorflow_text"),
    # imported in the same try block as TensorFlow, so None without it
    TensorFlowName("keras_hub.src.tokenizers.sentence_piece_tokenizer_trainer", "spm", "sentencepiece"),
    TensorFlowName(
        "keras_hub.src.tokenizers.word_piece_tokenizer_trainer",
        "learner",
        "tensorflow_text.tools.wordpiece_vocab.wordpiece_tokenizer_learner_lib",
    ),
)
# BytePairTokenizerCache is a tf.Module with TensorFlow, an `object` without (`_base_class`).
TF_MODULE_CLASS = ("BytePairTokenizerCache", "_base_class")

_IMPORT_WITHOUT_TENSORFLOW = uses(
    "keras_hub",
    PrivateName(
        "keras-hub",
        "keras_hub.src.utils.tensor_utils",
        "",
        "importing keras_hub without TensorFlow (its `tf`, set later)",
        source_contains="tf = try_import_tensorflow()",
    ),
    PrivateName(
        "keras-hub",
        BYTE_PAIR_MODULE,
        TF_MODULE_CLASS[0],
        "importing keras_hub without TensorFlow (its base class, set later)",
        source_contains=f"class {TF_MODULE_CLASS[0]}({TF_MODULE_CLASS[1]})",
    ),
)


def import_keras_hub(tensorflow: bool = False):
    """keras_hub, imported without TensorFlow (see above) unless `tensorflow` (then TensorFlow is
    imported first, quietly: meshrun.compat.tensorflow.import_tensorflow) or TensorFlow is imported
    already; ImportError where keras_hub is not installed. Keras is imported first (import_keras)."""
    from meshrun.compat.keras.startup import import_keras
    from meshrun.compat.tensorflow import import_tensorflow, tensorflow_installed

    if tensorflow:
        import_tensorflow()  # gives an imported keras_hub TensorFlow too (the finder)
    import_keras()
    if "keras_hub" in sys.modules or sys.modules.get("tensorflow") is not None or not tensorflow_installed():
        import keras_hub

        return keras_hub
    with _tensorflow_hidden():
        import keras_hub
    ensure("keras_hub")
    if sys.modules.get("tensorflow") is not None:  # something else imported it meanwhile
        give_keras_hub_tensorflow(sys.modules["tensorflow"])
    else:
        sys.meta_path.insert(0, TensorFlowArrival())
    return keras_hub


_LOCAL_PRESETS = uses(
    "keras_hub",
    PrivateName(
        "keras-hub",
        "keras_hub.src.utils.preset_utils",
        "tf_registered_schemes",
        "loading a local preset without importing TensorFlow "
        "(an ImportError: no file systems of TensorFlow's)",
        source_contains="except ImportError",
    ),
)


@contextlib.contextmanager
def local_preset_loading():
    """Runs the block, KerasHub reading a local preset dir, without importing TensorFlow unless it
    is imported already: KerasHub imports it to list the file systems TensorFlow registers (gs://,
    ...) before reading any preset file, a local one's too (tf_registered_schemes), and takes none
    registered where that import fails. meshrun reads local presets only."""
    with _tensorflow_hidden():
        yield


def keras_hub_has_tensorflow() -> bool:
    """Whether keras_hub is imported and its modules hold TensorFlow (False also where it is not
    installed or keras_hub was imported without it and TensorFlow has not come since)."""
    tensor_utils = sys.modules.get("keras_hub.src.utils.tensor_utils")
    return tensor_utils is not None and getattr(tensor_utils, "tf", None) is not None


@contextlib.contextmanager
def _tensorflow_hidden():
    """TensorFlow's packages unimportable while the block runs (Python's own way: None in
    sys.modules makes `import` raise ImportError), importable again after."""
    hidden = [name for name in TENSORFLOW_PACKAGES if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None
    try:
        yield
    finally:
        for name in hidden:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]


def give_keras_hub_tensorflow(tensorflow) -> None:
    """Binds in keras_hub's imported modules what its import would have bound with TensorFlow
    importable (TENSORFLOW_NAMES, and TF_MODULE_CLASS on tf.Module), where it holds None; imports
    TensorFlow Text, as keras_hub does, when it is installed."""
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "keras_hub" or name.startswith("keras_hub.")):
            continue
        namespace = vars(module)
        for binding in TENSORFLOW_NAMES:
            if binding.module in ("", name) and binding.name in namespace and namespace[binding.name] is None:
                namespace[binding.name] = _importable(binding.target)
    _rebase_on_tf_module(sys.modules.get(BYTE_PAIR_MODULE), tensorflow)


def _importable(target: str):
    """Module `target`, None where it cannot be imported (as keras_hub's own try/except ImportError
    leaves it)."""
    try:
        return importlib.import_module(target)
    except ImportError:
        return None


def _rebase_on_tf_module(module, tensorflow) -> None:
    """Makes the module's TF_MODULE_CLASS a tf.Module again: the same class body on that base (no
    instance of the old one can exist: its __init__ needs TensorFlow)."""
    class_name, base_name = TF_MODULE_CLASS
    if module is None or getattr(module, base_name, None) is not object:
        return
    old = getattr(module, class_name)
    body = {key: value for key, value in vars(old).items() if key not in ("__dict__", "__weakref__")}
    setattr(module, base_name, tensorflow.Module)
    setattr(
        module,
        class_name,
        types.new_class(
            old.__name__, (tensorflow.Module,), exec_body=lambda namespace: namespace.update(body)
        ),
    )


class TensorFlowArrival(importlib.abc.MetaPathFinder):
    """The finder `import_keras_hub` leaves first on sys.meta_path once it has imported keras_hub
    without TensorFlow: when TensorFlow is imported, by anyone, keras_hub gets it
    (give_keras_hub_tensorflow) right after TensorFlow's own code has run, and the finder leaves.
    It finds nothing itself: TensorFlow's spec is the other finders', its loader wrapped."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "tensorflow":
            return None
        for finder in sys.meta_path:
            found = (
                finder.find_spec(fullname, path, target)
                if finder is not self and hasattr(finder, "find_spec")
                else None
            )
            if found is not None:
                if found.loader is not None:
                    found.loader = _ThenKerasHub(found.loader, self)
                return found
        return None


class _ThenKerasHub(importlib.abc.Loader):
    """TensorFlow's loader, then give_keras_hub_tensorflow; the module ends up naming its own
    loader, as if imported without this one."""

    def __init__(self, loader, arrival: TensorFlowArrival):
        self.loader = loader
        self.arrival = arrival

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        if self.arrival in sys.meta_path:
            sys.meta_path.remove(self.arrival)
        give_keras_hub_tensorflow(module)


PRIVATE_NAMES = (
    _TOKENIZERS + _GEMMA_ATTENTION_SCALE + _GENERATE_OUTPUTS + _IMPORT_WITHOUT_TENSORFLOW + _LOCAL_PRESETS
)
