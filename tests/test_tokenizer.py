"""meshrun.text.tokenizer on presets built here (tests/presets.py): each kind of tokenizer gets the
backend expected, encodes exactly as KerasHub's own tokenizer does in a tf.data pipeline (on a
corpus and on tricky strings), decodes back to the text, has KerasHub's special ids, and a
fingerprint that follows its files; a tokenizer that splits text otherwise than GPT-2 does
(Mistral's Tekken) falls back to KerasHub itself; the check's verdict is kept in the token cache and
believed by later loads; bad sources are one-line ConfigErrors naming the key and the path."""

import importlib.metadata
import json
import logging
import os
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest

import presets
from meshrun.errors import ConfigError
from meshrun.text import cache, tokenizer_check
from meshrun.text.cache import PROBES, ProbeVerdicts
from meshrun.text.tokenizer import load_tokenizer
from meshrun.text.tokenizer_check import PROBE_TEXTS, probe_key, probe_libraries
from meshrun.text.tokenizer_encoders import same_ids

KEY = "data.tokenizer"
BACKENDS = {
    "gemma": "sentencepiece",
    "gpt2": "tokenizers",
    "llama3": "tokenizers",
    "tekken": "keras_hub",
    "hf": "tokenizers",
}
KERAS_HUB_KINDS = ("gemma", "gpt2", "llama3", "tekken")
TRICKY = (
    "trailing spaces   ",
    "Response: ",
    "Instruction: Reverse the words: red blue\nResponse: ",
    "line one\nline two\n\n\nthree\n",
    "  leading spaces",
    "    - indented\n        - twice",
    "digits 0123456789 3.14 1,000,000 in 2024",
    'x=y+1; {"a": [1, 2]} (ok)...',
    "café naïve Ελλάδα 東京 🙂 a\u00a0b c\u3000d e\u2009f",
    "tabs\tand\r\nCRLF",
    "it's THEY'RE we'll I'm",
    "",
    " ",
    "\n",
)


@pytest.fixture(scope="module")
def corpus() -> str:
    return presets.corpus_text()


@pytest.fixture(scope="module")
def sources(tmp_path_factory, corpus, text_files) -> dict:
    """Every kind of tokenizer source: four KerasHub presets and a tokenizer.json. Gemma's and
    GPT-2's are the session's (conftest's text_files, which the fine-tuning tests build and have
    checked already; their tokenizers trained on this corpus and instruction lines), read here
    only (a test that changes one changes a copy); the others are built here, on the corpus."""
    root = tmp_path_factory.mktemp("tokenizers")
    return {
        "gemma": text_files.gemma,
        "gpt2": text_files.gpt2,
        "llama3": presets.llama3_preset(root / "llama3", corpus),
        "tekken": presets.mistral_tekken_preset(root / "tekken", corpus),
        "hf": presets.hf_tokenizer_json(root / "hf", corpus),
    }


@pytest.fixture(scope="module")
def tokenizers(sources) -> dict:
    return {kind: load_tokenizer(str(path), KEY) for kind, path in sources.items()}


def documents(corpus: str) -> list[str]:
    return corpus.split("\n\n")


def keras_hub_layer(preset):
    import keras_hub

    return keras_hub.tokenizers.Tokenizer.from_preset(str(preset))


def keras_hub_ids(preset, texts) -> list[list[int]]:
    """The ids KerasHub's own tokenizer gives `texts` in a tf.data pipeline (its TensorFlow graph)."""
    import tensorflow as tf

    dataset = (
        tf.data.Dataset.from_tensor_slices(list(texts)).batch(256).map(keras_hub_layer(preset)).unbatch()
    )
    return [ids.tolist() for ids in dataset.as_numpy_iterator()]


@pytest.mark.parametrize("kind", sorted(BACKENDS))
def test_each_kind_gets_its_backend_and_describes_itself(tokenizers, sources, kind):
    tokenizer = tokenizers[kind]
    assert tokenizer.backend == BACKENDS[kind]
    assert str(sources[kind].resolve()) in tokenizer.description and "\n" not in tokenizer.description
    assert tokenizer.vocabulary_size == presets.VOCABULARY_SIZE
    assert len(tokenizer.fingerprint) == 64


@pytest.mark.parametrize("kind", KERAS_HUB_KINDS)
def test_encode_equals_keras_hubs_own_tokenizer(tokenizers, sources, corpus, kind):
    texts = [*documents(corpus), *TRICKY, *PROBE_TEXTS]
    encoded = tokenizers[kind].encode(texts)
    assert all(ids.dtype == np.int32 and ids.ndim == 1 for ids in encoded)
    reference = keras_hub_ids(sources[kind], texts)
    differing = [
        text for text, ids, ref in zip(texts, encoded, reference, strict=True) if ids.tolist() != ref
    ]
    assert not differing, differing[:3]
    assert sum(len(ids) for ids in encoded) > len(corpus) / 8  # real tokens, not empty lists


def test_the_hugging_face_file_encodes_without_special_tokens(tokenizers, sources, corpus):
    from tokenizers import Tokenizer

    library = Tokenizer.from_file(str(sources["hf"]))
    texts = [*documents(corpus), *TRICKY]
    encoded = tokenizers["hf"].encode(texts)
    assert [ids.tolist() for ids in encoded] == [
        library.encode(text, add_special_tokens=False).ids for text in texts
    ]
    # the dir holding the file is the same tokenizer
    from_dir = load_tokenizer(str(sources["hf"].parent), KEY)
    assert from_dir.fingerprint == tokenizers["hf"].fingerprint and same_ids(from_dir.encode(texts), encoded)


def test_a_hugging_face_model_dir_is_read_by_its_tokenizer_json(sources, tokenizers, tmp_path):
    shutil.copy(sources["hf"], tmp_path / "tokenizer.json")
    (tmp_path / "config.json").write_text(
        '{"model_type": "llama"}'
    )  # a Transformers checkpoint's, not KerasHub's
    tokenizer = load_tokenizer(str(tmp_path), KEY)
    assert tokenizer.backend == "tokenizers" and tokenizer.fingerprint == tokenizers["hf"].fingerprint


@pytest.mark.parametrize("kind", sorted(BACKENDS))
def test_decode_gives_back_the_text_and_skips_special_tokens(tokenizers, corpus, kind):
    tokenizer = tokenizers[kind]
    texts = [*documents(corpus), *TRICKY]
    assert [tokenizer.decode(ids) for ids in tokenizer.encode(texts)] == texts
    framed = [
        tokenizer.start_id if tokenizer.start_id is not None else tokenizer.end_id,
        *tokenizer.encode(["Response: blue"])[0],
        tokenizer.end_id,
    ]
    assert tokenizer.decode(np.array(framed, dtype=np.int32)) == "Response: blue"


@pytest.mark.parametrize("kind", KERAS_HUB_KINDS)
def test_special_ids_are_keras_hubs(tokenizers, sources, kind):
    layer = keras_hub_layer(sources[kind])
    tokenizer = tokenizers[kind]
    assert (tokenizer.start_id, tokenizer.end_id, tokenizer.pad_id) == (
        layer.start_token_id,
        layer.end_token_id,
        layer.pad_token_id,
    )
    assert tokenizer.token_id(layer.end_token) == layer.end_token_id
    assert tokenizer.token_id("<not a token>") is None


def test_special_tokens_by_family(tokenizers):
    gemma, gpt2, llama3, hf = (tokenizers[k] for k in ("gemma", "gpt2", "llama3", "hf"))
    assert (gemma.start_id, gemma.end_id, gemma.pad_id) == (2, 1, 0)  # <bos>, <eos>, <pad> as Gemma has them
    assert (
        gpt2.start_id == gpt2.end_id == gpt2.token_id("<|endoftext|>") == 511
    )  # GPT-2: one token starts and ends
    assert (llama3.start_id, llama3.end_id) == (
        llama3.token_id("<|begin_of_text|>"),
        llama3.token_id("<|end_of_text|>"),
    )
    assert llama3.token_id("<|eot_id|>") == 511
    # a tokenizer.json: start and end by name, no <pad> so pad is the end token
    assert (hf.start_id, hf.end_id, hf.pad_id) == (510, 511, 511)


def test_a_preprocessor_that_adds_no_start_token_gives_no_start_id(sources, tmp_path):
    preset = shutil.copytree(sources["gpt2"], tmp_path / "gpt2")
    config = json.loads((preset / "preprocessor.json").read_text())
    config["config"]["add_start_token"] = False
    (preset / "preprocessor.json").write_text(json.dumps(config))
    tokenizer = load_tokenizer(str(preset), KEY)
    assert tokenizer.start_id is None and tokenizer.end_id == 511


def test_fingerprint_follows_the_tokenizer_files_only(sources, tokenizers, tmp_path, corpus):
    preset = shutil.copytree(sources["gpt2"], tmp_path / "gpt2")
    assert (
        load_tokenizer(str(preset), KEY).fingerprint == tokenizers["gpt2"].fingerprint
    )  # where it lies does not count
    (preset / "model.weights.h5").write_bytes(b"other weights")
    (preset / "metadata.json").write_text("{}")
    assert load_tokenizer(str(preset), KEY).fingerprint == tokenizers["gpt2"].fingerprint
    vocabulary_file = preset / "assets" / "tokenizer" / "vocabulary.json"
    vocabulary = json.loads(vocabulary_file.read_text())
    vocabulary["e"], vocabulary["t"] = (
        vocabulary["t"],
        vocabulary["e"],
    )  # two ids swapped: other ids for the same text
    vocabulary_file.write_text(json.dumps(vocabulary))
    changed = load_tokenizer(str(preset), KEY)
    assert changed.fingerprint != tokenizers["gpt2"].fingerprint
    assert not same_ids(changed.encode(["the test"]), tokenizers["gpt2"].encode(["the test"]))

    hf = shutil.copy(sources["hf"], tmp_path / "tokenizer.json")
    assert load_tokenizer(hf, KEY).fingerprint == tokenizers["hf"].fingerprint
    reformatted = tmp_path / "reformatted" / "tokenizer.json"
    reformatted.parent.mkdir()
    reformatted.write_text(json.dumps(json.loads(sources["hf"].read_text()), indent=1))
    assert load_tokenizer(str(reformatted), KEY).fingerprint != tokenizers["hf"].fingerprint


def test_a_tokenizer_that_splits_otherwise_falls_back_to_keras_hub(sources, corpus, caplog):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    # The library encoder (GPT-2's split over Tekken's vocabulary and merges) really differs...
    assets = sources["tekken"] / "assets" / "tokenizer"
    merges = [
        tuple(line.split(" "))
        for line in (assets / "merges.txt").read_text(encoding="utf-8").splitlines()
        if line
    ]
    library = Tokenizer(
        models.BPE(vocab=json.loads((assets / "vocabulary.json").read_text(encoding="utf-8")), merges=merges)
    )
    library.add_special_tokens(list(presets.MISTRAL_SPECIAL_TOKENS))
    library.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    library.decoder = decoders.ByteLevel()
    reference = keras_hub_ids(sources["tekken"], PROBE_TEXTS)
    assert not same_ids([library.encode(text).ids for text in PROBE_TEXTS], reference)
    # ... so the tokenizer is KerasHub's own, with a warning, and still right.
    copy = shutil.copytree(
        sources["tekken"], sources["tekken"].parent / "tekken-again"
    )  # a new path: warned anew
    with caplog.at_level(logging.WARNING, logger="meshrun"):
        tokenizer = load_tokenizer(str(copy), KEY)
    assert tokenizer.backend == "keras_hub" and "KerasHub" in tokenizer.description
    assert [
        r.message
        for r in caplog.records
        if "much slower" in r.message and "MistralTekkenTokenizer" in r.message
    ]
    texts = [*documents(corpus)[:40], *TRICKY]
    assert [ids.tolist() for ids in tokenizer.encode(texts)] == keras_hub_ids(copy, texts)
    assert [tokenizer.decode(ids) for ids in tokenizer.encode(texts)] == texts


def kept_verdicts(cache_dir) -> dict:
    """The verdicts in the token cache at `cache_dir`: file name -> what it holds."""
    return {file.name: json.loads(file.read_text()) for file in sorted((cache_dir / PROBES).iterdir())}


def test_the_checks_verdict_is_kept_in_the_token_cache_and_believed_next_time(sources, tmp_path):
    cache_dir = tmp_path / "tokens"
    first = load_tokenizer(str(sources["gemma"]), KEY, str(cache_dir))
    kept = kept_verdicts(cache_dir)
    assert first.backend == "sentencepiece"
    assert list(kept) == [f"{probe_key(first.fingerprint)}.json"]  # one file, no temporary one left
    verdict = next(iter(kept.values()))
    assert (
        verdict["agrees"] is True
        and verdict["tokenizer"] == "GemmaTokenizer"
        and verdict["fingerprint"] == first.fingerprint
    )
    assert verdict["versions"] == probe_libraries() and tuple(verdict["probe"]) == PROBE_TEXTS
    # A later load reads the verdict instead of checking: one that says the encoders differ is
    # believed (the check would find they agree), so the tokenizer is KerasHub's graph.
    ProbeVerdicts(cache_dir).put(probe_key(first.fingerprint), False, {})
    assert load_tokenizer(str(sources["gemma"]), KEY, str(cache_dir)).backend == "keras_hub"
    # ... and another token cache has no verdict: checked there, and kept
    assert load_tokenizer(str(sources["gemma"]), KEY, str(tmp_path / "other")).backend == "sentencepiece"
    assert len(kept_verdicts(tmp_path / "other")) == 1


def test_the_verdicts_key_follows_the_tokenizer_files_the_probe_and_the_libraries(monkeypatch):
    key = probe_key("0" * 64)
    assert probe_key("0" * 64) == key and probe_key("1" * 64) != key
    versions = probe_libraries()
    assert (
        set(versions)
        == set(tokenizer_check.PROBE_LIBRARIES)
        == {"meshrun", "keras-hub", "tensorflow", "tensorflow-text", "sentencepiece", "tokenizers"}
    )
    assert versions["keras-hub"] == importlib.metadata.version("keras-hub")
    monkeypatch.setattr(tokenizer_check, "probe_libraries", lambda: {**versions, "sentencepiece": "0.0.1"})
    assert probe_key("0" * 64) != key
    monkeypatch.undo()
    monkeypatch.setattr(tokenizer_check, "PROBE_TEXTS", (*PROBE_TEXTS, "one more probe"))
    assert probe_key("0" * 64) != key


def test_a_token_cache_others_can_write_is_refused_before_its_verdict_is_read(sources, tokenizers, tmp_path):
    for shared, mode, where in ((False, 0o770, "root"), (True, 0o777, "root"), (False, 0o775, "verdicts")):
        cache_dir = tmp_path / f"tokens-{mode:o}-{where}"
        (cache_dir / PROBES).mkdir(parents=True)
        os.chmod(cache_dir if where == "root" else cache_dir / PROBES, mode)
        with pytest.raises(ConfigError) as caught:
            load_tokenizer(str(sources["gpt2"]), KEY, str(cache_dir), shared_cache=shared)
        assert caught.value.key == "data.cache_dir" and "the verdicts of its tokenizer check" in str(
            caught.value
        ), str(caught.value)
        assert not list((cache_dir / PROBES).iterdir())
    group = tmp_path / "tokens-group"
    group.mkdir(mode=0o770)
    os.chmod(group, 0o770)
    # the verdict of the check `tokenizers` made (kept in the session's token cache), copied: the
    # group's cache is trusted and its verdict read, without checking anew (other tests check)
    (group / PROBES).mkdir(mode=0o770)
    verdict = f"{probe_key(tokenizers['gpt2'].fingerprint)}.json"
    shutil.copy(cache.root(None) / PROBES / verdict, group / PROBES / verdict)
    assert load_tokenizer(str(sources["gpt2"]), KEY, str(group), shared_cache=True).backend == "tokenizers"


def test_a_verdict_is_written_whole_and_what_a_killed_writer_left_is_removed(tmp_path):
    verdicts = ProbeVerdicts(tmp_path)
    (tmp_path / PROBES).mkdir()
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    abandoned = tmp_path / PROBES / f".tmp-abc-{socket.gethostname()}-{gone.stdout.strip()}"
    abandoned.write_text('{"agr')
    (tmp_path / PROBES / "broken.json").write_text('{"agr')
    verdicts.put("abc", True, {"tokenizer": "X"})
    assert sorted(f.name for f in (tmp_path / PROBES).iterdir()) == ["abc.json", "broken.json"]
    assert verdicts.get("abc") is True and verdicts.get("broken") is None and verdicts.get("missing") is None
    verdicts.put("abc", False, {})
    assert verdicts.get("abc") is False


def test_preset_tokenizers_are_deterministic(corpus):
    assert presets.sentencepiece_proto(corpus) == presets.sentencepiece_proto(corpus)
    first, second = (presets.byte_level_bpe(corpus, presets.GPT2_SPECIAL_TOKENS).to_str() for _ in range(2))
    assert first == second


def test_same_ids_compares_text_by_text():
    assert same_ids([np.array([1, 2], np.int32), []], [[1, 2], np.array([], np.int64)])
    assert not same_ids([[1, 2]], [[1, 3]])
    assert not same_ids([[1, 2]], [[1, 2, 3]])
    assert not same_ids([[1]], [[1], [2]])


def test_encode_takes_a_sequence_of_texts(tokenizers):
    tokenizer = tokenizers["gemma"]
    assert tokenizer.encode([]) == []
    with pytest.raises(TypeError, match="not one str"):
        tokenizer.encode("one text")


def bad_sources(root, sources) -> dict:
    """Sources load_tokenizer must refuse, each with words its message must hold."""
    (root / "empty").mkdir()
    (root / "no_tokenizer").mkdir()
    (root / "no_tokenizer" / "config.json").write_text("{}")
    (root / "garbage.json").write_bytes(b"\x00\xffnot json")
    (root / "other.json").write_text('{"vocab": [1, 2]}')
    (root / "broken_hf.json").write_text('{"model": {"type": "BPE", "vocab": 3}}')
    (root / "lone").mkdir()
    shutil.copy(sources["gpt2"] / "tokenizer.json", root / "lone" / "tokenizer.json")
    broken_preset = shutil.copytree(sources["gpt2"], root / "broken_preset")
    (broken_preset / "assets" / "tokenizer" / "merges.txt").write_text("no_such_token another\n")
    return {
        "missing": (root / "missing", "does not exist"),
        "empty": (root / "empty", "a dir with no tokenizer.json"),
        "no_tokenizer": (root / "no_tokenizer", "a preset with no tokenizer"),
        "garbage.json": (root / "garbage.json", "not readable JSON"),
        "other.json": (root / "other.json", "neither KerasHub's nor Hugging Face's"),
        "broken_hf.json": (root / "broken_hf.json", "Hugging Face tokenizers cannot load"),
        "lone": (root / "lone", "with no config.json beside it"),
        "broken_preset": (broken_preset, "KerasHub cannot load"),
    }


def test_bad_sources_are_one_line_config_errors_naming_key_and_path(sources, tmp_path):
    for name, (path, words) in bad_sources(tmp_path, sources).items():
        with pytest.raises(ConfigError) as caught:
            load_tokenizer(str(path), KEY)
        message = str(caught.value)
        assert caught.value.key == KEY and message.startswith(f"{KEY}: got {str(path)!r}"), (name, message)
        assert words in message and "expected a KerasHub preset dir" in message and "\n" not in message, (
            name,
            message,
        )


def test_importing_the_module_imports_no_framework():
    code = (
        "import sys, meshrun.text.tokenizer; "
        "print([m for m in ('jax', 'keras', 'keras_hub', 'tensorflow') if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr[-2000:]
