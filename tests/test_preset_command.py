"""`meshrun preset FAMILY --text PATH --out DIR`: a small KerasHub preset made offline from local text
(a tokenizer trained on it, random weights), in-process. The preset loads in plain KerasHub with
the family's classes, special tokens and heads, and fine-tunes with `meshrun train model=keras_hub
model.preset=DIR data=text` (LoRA on instruction records, as docs/jobs/finetune.md's); --force
replaces a preset; every bad input is one line, exit 2, with nothing written."""

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import INSTRUCTION_PROMPT, train_here
from meshrun import cli
from meshrun.files import dir_written_whole
from presets import corpus_text, instruction_records

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def texts(tmp_path_factory) -> Path:
    """A dir with corpus.txt (35 KB of plain text) and facts.jsonl (400 instruction records)."""
    root = tmp_path_factory.mktemp("texts")
    (root / "corpus.txt").write_text(corpus_text())
    (root / "facts.jsonl").write_text(
        "".join(json.dumps(record) + "\n" for record in instruction_records(400))
    )
    return root


def make(args: list[str], capsys) -> str:
    """What `meshrun preset ARGS` prints, having asserted it succeeds and prints one line."""
    cli.main(["preset", *args])
    out, err = capsys.readouterr()
    assert err == "" and len(out.strip().splitlines()) == 1, (out, err)
    return out.strip()


@pytest.fixture(scope="module")
def gemma(texts, tmp_path_factory) -> tuple[Path, str]:
    """The fine-tune page's preset: `meshrun preset gemma` on both files, its defaults; its dir and line."""
    out = tmp_path_factory.mktemp("presets") / "tiny_gemma"
    printed = io.StringIO()  # a module's fixture cannot take capsys
    with contextlib.redirect_stdout(printed):
        cli.main(
            [
                "preset",
                "gemma",
                "--text",
                str(texts / "corpus.txt"),
                "--text",
                str(texts / "*.jsonl"),
                "--out",
                str(out),
            ]
        )
    return out, printed.getvalue().strip()


def test_the_gemma_preset_loads_in_keras_hub_as_gemma_2b_is_shaped(gemma):
    import keras_hub

    out, line = gemma
    assert (
        line.startswith(f"wrote {out}: a gemma preset, GemmaCausalLM of ")
        and "8 query and 1 key/value heads" in line
    )
    assert "a SentencePiece vocabulary of 512" in line and "in 2 files" in line and "RANDOM weights" in line
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".partial")]  # nothing left beside it
    lm = keras_hub.models.CausalLM.from_preset(str(out))
    config = lm.backbone.get_config()
    assert type(lm).__name__ == "GemmaCausalLM" and lm.preprocessor.sequence_length == 64
    assert (config["num_query_heads"], config["num_key_value_heads"], config["head_dim"]) == (8, 1, 8)
    assert (config["vocabulary_size"], config["num_layers"], config["hidden_dim"]) == (512, 2, 64)
    tokenizer = lm.preprocessor.tokenizer
    assert tokenizer.vocabulary_size() == 512
    assert [tokenizer.token_to_id(t) for t in ("<pad>", "<eos>", "<bos>", "<unk>")] == [0, 1, 2, 3]
    assert tokenizer.detokenize(tokenizer.tokenize("What colour is the sky?")) == "What colour is the sky?"


def test_the_preset_fine_tunes_with_lora_on_instruction_records(gemma, texts, tmp_path):
    """The fine-tune page's run: LoRA on 1x8 under gemma_tp, which keeps the single key/value head whole."""
    out, _ = gemma
    run = tmp_path / "run"
    metrics = train_here(
        [
            "model=keras_hub",
            f"model.preset={out}",
            "mesh=1x8",
            "layout=gemma_tp",
            "data=text",
            f"data.files=[{texts / 'facts.jsonl'}]",
            f"data.prompt='{INSTRUCTION_PROMPT}'",
            "data.completion='{response}'",
            "model.lora.rank=4",
            "train.epochs=1",
            "model.seq_len=32",
            "train.verbose=0",
        ],
        run,
    )
    assert (
        metrics["model"]["label"] == f"GemmaCausalLM (preset {out}), LoRA rank 4"
        and metrics["model"]["trainable_params"] < metrics["model"]["params"]
    )
    assert metrics["history"]["loss"][-1] < 10
    assert metrics["sharding"]["decoder_block_0/attention/key/kernel"]["spec"] == [None, None, None]
    assert metrics["sharding"]["decoder_block_0/attention/query/kernel"]["spec"] == ["model", None, None]


@pytest.mark.parametrize(
    "family, task, tokens",
    [
        ("llama", "Llama3CausalLM", {"<|begin_of_text|>": 507, "<|end_of_text|>": 508, "<|eot_id|>": 511}),
        ("mistral", "MistralCausalLM", {"<unk>": 0, "<s>": 1, "</s>": 2}),
        ("gpt2", "GPT2CausalLM", {"<|endoftext|>": 511}),
    ],
)
def test_each_family_loads_with_its_classes_and_special_tokens(family, task, tokens, texts, tmp_path, capsys):
    import keras_hub

    out = tmp_path / family
    line = make(
        [family, "--text", str(texts / "*"), "--out", str(out), "--layers", "1", "--seed", "3"], capsys
    )
    assert f"a {family} preset, {task}" in line and "(1 layer, hidden 64" in line
    lm = keras_hub.models.CausalLM.from_preset(str(out))
    assert type(lm).__name__ == task and lm.backbone.vocabulary_size == 512
    assert {token: lm.preprocessor.tokenizer.token_to_id(token) for token in tokens} == tokens


def test_force_replaces_a_preset_and_only_a_preset(gemma, texts, tmp_path, capsys):
    out = tmp_path / "preset"
    make(["gemma", "--text", str(texts / "corpus.txt"), "--out", str(out)], capsys)
    first = json.loads((out / "config.json").read_text())
    line = make(
        [
            "gemma",
            "--text",
            str(texts / "corpus.txt"),
            "--out",
            str(out),
            "--force",
            "--heads",
            "4:4",
            "--layers",
            "1",
        ],
        capsys,
    )
    config = json.loads((out / "config.json").read_text())["config"]
    assert first["config"]["num_layers"] == 2 and (config["num_layers"], config["num_key_value_heads"]) == (
        1,
        4,
    ), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["preset"]


def test_a_dir_is_written_whole_or_not_at_all(tmp_path):
    target = tmp_path / "a" / "preset"
    with pytest.raises(RuntimeError), dir_written_whole(target) as partial:
        (partial / "config.json").write_text("{}")
        raise RuntimeError("the save failed")
    assert not target.exists() and list(target.parent.iterdir()) == []
    with dir_written_whole(target) as partial:
        (partial / "config.json").write_text("{}")
    with pytest.raises(RuntimeError), dir_written_whole(target) as partial:
        raise RuntimeError("a second save failed")
    assert [p.name for p in target.parent.iterdir()] == ["preset"] and (
        target / "config.json"
    ).read_text() == "{}"


def bad_inputs(texts: Path, tmp: Path) -> dict[tuple, str]:
    """Each bad command line of meshrun preset and a part of its one error line."""
    corpus, out = str(texts / "corpus.txt"), str(tmp / "out")
    base = ["--text", corpus, "--out", out]
    (tmp / "empty.txt").write_text("  \n")
    (tmp / "latin1.txt").write_bytes("café".encode("latin-1"))
    (tmp / "bad.jsonl").write_text('{"text": "fine"}\nnot json\n')
    (tmp / "a-file").write_text("x")
    (tmp / "full").mkdir()
    (tmp / "full" / "notes.txt").write_text("mine")
    (tmp / "preset-with-text").mkdir()
    (tmp / "preset-with-text" / "config.json").write_text("{}")
    (tmp / "preset-with-text" / "text.txt").write_text(corpus_text(5_000))
    return {
        (): "FAMILY: is required; give the one model family to make",
        ("gemmma", *base): "FAMILY: got 'gemmma'; did you mean gemma? valid: gemma, gpt2, llama or mistral",
        ("gemma", "llama", *base): "FAMILY: got 2 ('gemma', 'llama')",
        ("gemma", "--out", out): "--text: is required",
        ("gemma", "--text", corpus): "--out: is required",
        ("gemma", "--text", "--out", out): "--text: got nothing; give PATH after it",
        ("gemma", *base, "--fource"): "--fource: not a flag of meshrun preset; did you mean --force? valid: ",
        (
            "gemma",
            *base,
            "--temperature",
            "1",
        ): "--temperature: not a flag of meshrun preset; valid: "
        "--text PATH, --out DIR, --vocabulary N, --layers N",
        ("gemma", "--text", str(tmp / "nowhere" / "*.txt"), "--out", out): "which matches no file",
        (
            "gemma",
            "--text",
            str(tmp / "empty.txt"),
            "--out",
            out,
        ): "empty.txt' holds no text to train a tokenizer on",
        ("gemma", "--text", str(tmp / "latin1.txt"), "--out", out): "latin1.txt' is not UTF-8 text (byte 3)",
        ("gemma", "--text", str(tmp / "bad.jsonl"), "--out", out): "bad.jsonl:2 is not JSON",
        (
            "gemma",
            *base,
            "--vocabulary",
            "50000",
        ): "--vocabulary: got 50000, more ids than this text gives a SentencePiece tokenizer (",
        (
            "gemma",
            *base,
            "--vocabulary",
            "270",
        ): "--vocabulary: got 270, too few ids for this text: a SentencePiece tokenizer keeps each",
        (
            "llama",
            *base,
            "--vocabulary",
            "50000",
        ): "--vocabulary: got 50000, more ids than this text gives a byte-level BPE tokenizer (",
        (
            "llama",
            *base,
            "--vocabulary",
            "200",
        ): "--vocabulary: got 200, too few ids: a byte-level BPE tokenizer holds 256 byte tokens "
        "and 5 special tokens; give --vocabulary 261 or more",
        (
            "gemma",
            *base,
            "--vocabulary",
            "512",
            "--vocabulary",
            "256",
        ): "--vocabulary: given 2 times ('512', '256'); give it once",
        ("gemma", *base, "--layers", "0"): "--layers: got '0'; expected a whole number of 1 or more",
        ("gemma", *base, "--seq-len", "one"): "--seq-len: got 'one'; expected a whole number of 2 or more",
        (
            "gemma",
            *base,
            "--heads",
            "8:3",
        ): "--heads: got '8:3': 3 key/value heads do not divide 8 query heads",
        ("gemma", *base, "--heads", "many"): "--heads: got 'many'; expected Q:KV",
        (
            "gpt2",
            *base,
            "--heads",
            "8:2",
        ): "--heads: got '8:2'; gpt2 has a key/value head for each query head: give --heads 8",
        ("gemma", *base, "--hidden", "60"): "--hidden: got 60, which 8 query heads do not divide",
        ("llama", *base, "--hidden", "24"): "rotary position embedding needs an even width",
        (
            "gemma",
            "--text",
            corpus,
            "--out",
            str(tmp / "a-file"),
        ): "a-file', which cannot be written (it is a file); give a dir where you can write",
        (
            "gemma",
            "--text",
            corpus,
            "--out",
            str(tmp / "a-file" / "preset"),
        ): "a-file/preset', which cannot be written (",
        ("gemma", "--text", corpus, "--out", ""): "--out: got ''; give the preset dir to write",
        (
            "gemma",
            "--text",
            corpus,
            "--out",
            str(tmp / "full"),
        ): "full', which already holds files; give a new or empty dir, or --force",
        (
            "gemma",
            "--text",
            corpus,
            "--out",
            str(tmp / "full"),
            "--force",
        ): "holds files but no preset (config.json); --force replaces only",
        (
            "gemma",
            "--text",
            str(tmp / "preset-with-text" / "text.txt"),
            "--out",
            str(tmp / "preset-with-text"),
            "--force",
        ): "holds the --text file",
    }


def test_bad_input_is_one_line_with_exit_2_and_nothing_written(texts, tmp_path, capsys):
    for args, expected in bad_inputs(texts, tmp_path).items():
        before = sorted(p.name for p in tmp_path.rglob("*"))
        with pytest.raises(SystemExit) as ended:
            cli.main(["preset", *args])
        out, err = capsys.readouterr()
        lines = err.strip().splitlines()
        assert ended.value.code == 2 and out == "" and len(lines) == 1, (args, out, err)
        assert lines[0].startswith("meshrun: error: ") and expected in lines[0], (args, lines[0])
        assert sorted(p.name for p in tmp_path.rglob("*")) == before, args


@pytest.mark.parametrize(
    "module, package",
    [("keras_hub", "keras-hub"), ("sentencepiece", "sentencepiece"), ("tensorflow_text", "tensorflow-text")],
)
def test_a_missing_package_is_named_with_how_to_install_it(
    module, package, texts, tmp_path, monkeypatch, capsys
):
    monkeypatch.setitem(sys.modules, module, None)  # what `import module` meets when it is not installed
    with pytest.raises(SystemExit) as ended:
        cli.main(["preset", "gemma", "--text", str(texts / "corpus.txt"), "--out", str(tmp_path / "out")])
    line = capsys.readouterr().err.strip()
    assert ended.value.code == 2 and line == (
        f"meshrun: error: FAMILY: got 'gemma', which needs {package}, not installed: "
        "pip install 'meshrun[hub]'"
    )
    assert list(tmp_path.iterdir()) == []


def test_help_names_the_families_and_the_flags(capsys):
    cli.main(["preset", "--help"])
    text = capsys.readouterr().out
    assert text.startswith("usage: meshrun preset FAMILY --text PATH")
    assert all(
        word in text
        for word in (
            "gemma",
            "llama",
            "mistral",
            "gpt2",
            "--vocabulary N",
            "--heads Q:KV",
            "--force",
            "RANDOM",
        )
    )
    cli.main(["--help"])
    assert "meshrun preset FAMILY" in capsys.readouterr().out


NO_FRAMEWORK = """
import contextlib, io, sys
from meshrun import cli
with contextlib.redirect_stdout(io.StringIO()):
    cli.run(["preset", "--help"], as_program=False)
status = cli.run(["preset", "gemma", "--text", sys.argv[1], "--out", sys.argv[2], "--vocabulary", "50000"],
                 as_program=False)
print(status, [m for m in ("jax", "keras", "keras_hub", "tensorflow") if m in sys.modules])
"""


@pytest.mark.e2e
def test_help_and_a_vocabulary_the_text_cannot_give_import_no_framework(texts, tmp_path):
    """The tokenizer is trained before KerasHub is imported: its errors come in a second."""
    done = subprocess.run(
        [sys.executable, "-c", NO_FRAMEWORK, str(texts / "corpus.txt"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout.strip() == "2 []" and "--vocabulary: got 50000, more ids" in done.stderr, (
        done.stdout,
        done.stderr,
    )


@pytest.mark.e2e
def test_making_a_preset_in_a_process_of_its_own_imports_no_tensorflow_and_says_nothing_on_stderr(
    texts, tmp_path
):
    """KerasHub is imported without TensorFlow, and saving the preset does not import it either
    (Keras' serialization would, printing TensorFlow's start-up lines on stderr)."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from meshrun import cli; cli.main(sys.argv[1:]); "
            "print(sorted(m for m in ('tensorflow', 'tensorflow_text') if sys.modules.get(m)))",
            "preset",
            "gemma",
            "--text",
            str(texts / "corpus.txt"),
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr[-2000:]
    assert done.stdout.startswith(
        f"wrote {tmp_path / 'out'}: a gemma preset"
    ) and done.stdout.rstrip().endswith("[]")


@pytest.mark.parametrize("train", ["sentencepiece", "bpe"])
def test_the_vocabulary_an_error_offers_is_one_the_text_gives(train, texts):
    """A vocabulary larger than the text gives is refused naming the largest it gives, and that one
    trains to exactly its size (SentencePiece refuses in its own words, byte-level BPE stops short)."""
    from meshrun.errors import ConfigError
    from meshrun.text import tokenizer_training as training

    text = [(texts / "facts.jsonl").read_text()]

    def size(vocabulary: int) -> int:
        if train == "sentencepiece":
            import sentencepiece

            proto = training.sentencepiece_proto(
                text, vocabulary, training.GEMMA_SENTENCEPIECE, "--vocabulary"
            )
            return sentencepiece.SentencePieceProcessor(model_proto=proto).get_piece_size()
        return training.byte_level_bpe(text, ("<s>",), vocabulary, "--vocabulary").get_vocab_size(
            with_added_tokens=True
        )

    with pytest.raises(ConfigError) as refused:
        size(20_000)
    offered = int(str(refused.value).rpartition(" ")[2])
    assert (
        "--vocabulary: got 20000, more ids than this text gives a "
        f"{'SentencePiece' if train == 'sentencepiece' else 'byte-level BPE'}"
        in str(refused.value)
        and 300 < offered < 20_000
    )
    assert size(offered) == offered


def test_a_text_of_lines_longer_than_sentencepieces_limit_trains():
    """SentencePiece skips lines over 4,192 bytes without a word (a corpus of one long line would
    leave it nothing): the limit is raised to the longest line."""
    import sentencepiece

    from meshrun.text import tokenizer_training as training

    line = corpus_text(30_000).replace("\n", " ")
    proto = training.sentencepiece_proto([line], 512, training.GEMMA_SENTENCEPIECE, "--vocabulary")
    assert sentencepiece.SentencePieceProcessor(model_proto=proto).get_piece_size() == 512
