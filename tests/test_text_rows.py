"""data=text without a model: how files become examples (and every bad file one ConfigError naming
the file and line), how examples become token rows (which labels weigh, packing, padding), and the
token cache (keys that cover every input, entries never seen half-written)."""

import json
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from meshrun.errors import ConfigError
from meshrun.text import cache, corpus, examples

INSTRUCTIONS = corpus.CorpusFormat(prompt="Q: {q} A: ", completion="{a}")
FRAMING = examples.Framing(start=2, end=1, pad=0)


def write_jsonl(path, records):
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path


def error_of(call, *args) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        call(*args)
    return caught.value


# --- files into examples ------------------------------------------------------------------------


def test_plain_text_is_one_document_per_file_or_cut_at_the_separator(tmp_path):
    (tmp_path / "a.txt").write_text("first doc\n\nsecond doc\n\n\n")
    (tmp_path / "b.md").write_text("third")
    files = corpus.expand((str(tmp_path / "*.txt"), str(tmp_path / "b.md")), "data.files")
    whole = corpus.read_examples(files, corpus.CorpusFormat(), "data.files")
    assert [e.text for e in whole] == ["first doc\n\nsecond doc\n\n\n", "third"]
    cut = corpus.read_examples(files, corpus.CorpusFormat(separator="\n\n"), "data.files")
    assert [e.text for e in cut] == ["first doc", "second doc", "third"]  # blank parts are no documents
    assert all(e.prompt == "" for e in cut)


def test_jsonl_records_give_a_field_or_prompt_and_completion(tmp_path):
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [{"q": "one?", "a": "1", "text": "plain"}, {"q": "two?", "a": "2", "text": "more"}],
    )
    plain = corpus.read_examples((path,), corpus.CorpusFormat(), "data.files")
    assert [e.text for e in plain] == ["plain", "more"]
    pairs = corpus.read_examples((path,), INSTRUCTIONS, "data.files")
    assert [(e.prompt, e.text) for e in pairs] == [("Q: one? A: ", "1"), ("Q: two? A: ", "2")]
    assert pairs[1].where == f"{path}:2"


@pytest.mark.parametrize(
    "line, fmt, key, words",
    [
        ("{not json", corpus.CorpusFormat(), "data.files", ["d.jsonl:2", "is not JSON"]),
        ("[1, 2]", corpus.CorpusFormat(), "data.files", ["d.jsonl:2", "JSON list"]),
        ('{"body": "x"}', corpus.CorpusFormat(), "data.field", ["'text'", "d.jsonl:2 lacks", "body"]),
        ('{"q": "x"}', INSTRUCTIONS, "data.completion", ["'a'", "d.jsonl:2 lacks", "q"]),
        ('{"q": "x", "a": "  "}', INSTRUCTIONS, "data.completion", ["empty completion", "d.jsonl:2"]),
    ],
)
def test_a_bad_record_names_its_file_and_line(tmp_path, line, fmt, key, words):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"q": "ok", "a": "ok", "text": "ok"}) + "\n" + line + "\n")
    error = error_of(corpus.read_examples, (path,), fmt, "data.files")
    assert error.key == key and "\n" not in str(error)
    for word in words:
        assert word in str(error)


def test_missing_files_empty_corpus_and_bad_encoding_are_config_errors(tmp_path):
    assert "matches no file" in str(error_of(corpus.expand, (str(tmp_path / "*.txt"),), "data.files"))
    assert "is not a file" in str(error_of(corpus.expand, (str(tmp_path / "gone.txt"),), "data.files"))
    (tmp_path / "empty.txt").write_text("  \n")
    assert "holds no text" in str(
        error_of(corpus.read_examples, (tmp_path / "empty.txt",), corpus.CorpusFormat(), "data.files")
    )
    (tmp_path / "latin.txt").write_bytes("caf\xe9".encode("latin-1"))
    assert "not UTF-8" in str(
        error_of(corpus.read_examples, (tmp_path / "latin.txt",), corpus.CorpusFormat(), "data.files")
    )


# --- examples into rows -------------------------------------------------------------------------


def example(prompt="", text=""):
    return corpus.Example(prompt, text, "here", line=1)


def ragged(*sequences) -> examples.Ragged:
    return examples.Ragged(
        np.asarray([i for s in sequences for i in s], np.int32),
        np.asarray([len(s) for s in sequences], np.int64),
    )


def prompts(*sequences) -> examples.Ragged:
    return examples.framed_prompts(FRAMING, ragged(*sequences))


def test_unpacked_rows_weigh_exactly_the_completion_and_its_end_token():
    rows = examples.to_rows(
        [example("p", "c")],
        prompts([10, 11, 12]),
        ragged([20, 21]),
        FRAMING,
        seq_len=8,
        packing=False,
        too_long="drop",
    )
    assert rows.tokens.tolist() == [[2, 10, 11, 12, 20, 21, 1, 0, 0]]
    assert rows.lengths.tolist() == [7]
    # Labels are tokens 1..8: 10 11 12 (prompt: 0) 20 21 end (1) pad pad (0).
    assert rows.weights.tolist() == [[0, 0, 0, 1, 1, 1, 0, 0]]
    batch = examples.model_batch(({"tokens": rows.tokens, "lengths": rows.lengths}, rows.weights))
    assert batch[0]["padding_mask"].tolist() == [[1, 1, 1, 1, 1, 1, 1, 0]]
    assert batch[1].tolist() == [[10, 11, 12, 20, 21, 1, 0, 0]] and batch[2].dtype == np.float32


def test_padding_is_found_by_length_even_when_the_pad_id_is_the_end_id():
    same = examples.Framing(start=None, end=5, pad=5)
    rows = examples.to_rows(
        [example("p", "c")],
        examples.framed_prompts(same, ragged([7])),
        ragged([8]),
        same,
        seq_len=6,
        packing=False,
        too_long="drop",
    )
    assert rows.tokens.tolist() == [[7, 8, 5, 5, 5, 5, 5]]
    assert rows.weights.tolist() == [
        [1, 1, 0, 0, 0, 0]
    ]  # the end token (id 5) weighs; the padding (id 5 too) does not


def test_packed_plain_text_uses_every_token_once_as_a_label():
    texts = ragged(range(10, 20), range(30, 35))
    rows = examples.to_rows(
        [example(text="a"), example(text="b")], None, texts, FRAMING, seq_len=4, packing=True, too_long="drop"
    )
    stream = [2, *range(10, 20), 1, 2, *range(30, 35), 1]  # 19 tokens
    assert rows.tokens.shape == (4, 5) and rows.padding_fraction == 0.0
    labels = [t for row in rows.tokens for t in row[1:]]
    assert (
        labels == stream[1:17]
    )  # consecutive rows overlap by one token: each label once; the tail is left out
    start_of_second = labels.index(2)
    assert (
        rows.weights.reshape(-1)[start_of_second] == 0 and rows.weights.sum() == 15
    )  # a document's start token is not predicted


def test_unpacked_long_documents_go_on_in_the_next_rows_and_long_examples_drop_or_fail():
    rows = examples.to_rows(
        [example(text="a")], None, ragged(range(10, 20)), FRAMING, seq_len=8, packing=False, too_long="drop"
    )
    assert rows.lengths.tolist() == [9, 4] and rows.tokens[1, :4].tolist() == [17, 18, 19, 1]
    assert rows.trained_tokens == 11  # 10 text tokens and the end token, each once
    long_one = [example("p", "c"), example("p", "c")]
    heads = prompts([9] * 10, [9])
    kept = examples.to_rows(
        long_one, heads, ragged([3], [3]), FRAMING, seq_len=8, packing=False, too_long="drop"
    )
    assert kept.dropped == 1 and len(kept.lengths) == 1 and "13 tokens" in kept.first_dropped
    assert kept.tokens[0, :4].tolist() == [2, 9, 3, 1]  # the second example, whole
    error = error_of(examples.to_rows, long_one, heads, ragged([3], [3]), FRAMING, 8, False, "error")
    assert error.key == "data.too_long" and "13 tokens" in str(error) and "here:1" in str(error)


# --- the cache ----------------------------------------------------------------------------------


def test_the_key_covers_every_byte_and_every_setting(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("hello world")
    settings = {"seq_len": 64, "packing": True, "tokenizer": "abc"}
    first = cache.key(settings, (path,))
    assert cache.key(dict(settings), (path,)) == first
    assert cache.key({**settings, "seq_len": 65}, (path,)) != first
    assert cache.key({**settings, "tokenizer": "abd"}, (path,)) != first
    path.write_text("hello worle")
    assert cache.key(settings, (path,)) != first


def arrays(value: int) -> dict:
    return {
        "train_tokens": np.full((1000, 65), value, np.int32),
        "train_lengths": np.full(1000, 65, np.int32),
    }


# A writer of a cache entry in a process of its own (no fork of this process, whose jax threads a
# forked child could deadlock on); with a pause after each array when asked, to be killed mid-write.
WRITER = """
import sys, time
import numpy as np
from meshrun.text import cache
directory, value, start_at, pause = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
save = np.save
def slow_save(*args, **kwargs):
    save(*args, **kwargs)
    time.sleep(pause)
np.save = slow_save
while time.time() < start_at:
    time.sleep(0.001)
cache.write(__import__("pathlib").Path(directory), {"train_tokens": np.full((1000, 65), value, np.int32),
            "train_lengths": np.full(1000, 65, np.int32)}, {"value": value})
"""


def writer(directory, value: int, start_at: float = 0.0, pause: float = 0.0) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(directory), str(value), str(start_at), str(pause)]
    )


def test_two_writers_at_once_leave_one_complete_entry(tmp_path):
    directory = tmp_path / "tokens" / "k"
    start_at = time.time() + 2  # both begin writing at this moment
    writers = [writer(directory, 7, start_at) for _ in range(2)]
    assert [w.wait(60) for w in writers] == [0, 0]
    meta = cache.find(directory)
    assert meta["value"] == 7 and sorted(meta["arrays"]) == ["train_lengths.npy", "train_tokens.npy"]
    assert np.load(directory / "train_tokens.npy").shape == (1000, 65)
    assert [p.name for p in directory.parent.iterdir()] == ["k"]  # no temporary dir left


def test_a_writer_killed_halfway_leaves_no_entry_and_its_leftovers_are_removed(tmp_path):
    directory = tmp_path / "tokens" / "k"
    slow = writer(directory, 1, pause=30)
    deadline = time.time() + 30
    while not list(directory.parent.glob(".tmp-*/*.npy")) and time.time() < deadline:
        time.sleep(0.05)
    slow.send_signal(signal.SIGKILL)
    slow.wait()
    assert cache.find(directory) is None and list(directory.parent.glob(".tmp-*"))
    cache.write(directory, arrays(3), {"value": 3})
    assert cache.find(directory)["value"] == 3
    assert [p.name for p in directory.parent.iterdir()] == ["k"]


def test_an_entry_missing_its_metadata_or_arrays_is_not_found(tmp_path):
    directory = tmp_path / "k"
    cache.write(directory, arrays(1), {})
    (directory / "train_lengths.npy").unlink()
    assert cache.find(directory) is None
    cache.write(directory, arrays(2), {"value": 2})  # replaces the broken entry
    assert cache.find(directory)["value"] == 2


def rows_by_hand(heads, texts, framing, seq_len, packing):
    """The rows as the docstring of meshrun.text.examples says, one example at a time."""
    pieces = [
        (list(h) + list(t) + [framing.end], [0] * len(h) + [1] * (len(t) + 1))
        for h, t in zip(heads, texts, strict=True)
    ]
    if packing:
        stream = [i for ids, _ in pieces for i in ids]
        weight = [w for _, ws in pieces for w in ws]
        starts = range(0, max(len(stream) - 1, 0) // seq_len * seq_len, seq_len)
        return [(stream[s : s + seq_len + 1], weight[s + 1 : s + seq_len + 1]) for s in starts]
    rows = []
    for ids, ws in pieces:
        for first in range(0, max(len(ids) - 1, 1), seq_len):
            part = ids[first : first + seq_len + 1]
            rows.append(
                (
                    part + [framing.pad] * (seq_len + 1 - len(part)),
                    (ws[first + 1 : first + len(part)] + [0] * seq_len)[:seq_len],
                )
            )
    return rows


@pytest.mark.parametrize("packing", [True, False])
@pytest.mark.parametrize("instructions", [True, False])
def test_rows_cut_with_arrays_equal_rows_made_one_example_at_a_time(packing, instructions):
    rng = np.random.default_rng(3)
    count, seq_len = 40, 7
    texts = [list(rng.integers(5, 100, rng.integers(0, 20))) for _ in range(count)]
    heads = (
        [[2, *rng.integers(5, 100, rng.integers(0, 4))] for _ in range(count)]
        if instructions
        else [[2]] * count
    )
    encoded_prompts = (
        examples.Ragged(
            np.asarray([i for h in heads for i in h], np.int32), np.asarray([len(h) for h in heads])
        )
        if instructions
        else None
    )
    made = examples.to_rows(
        [example("p" if instructions else "", "t")] * count,
        encoded_prompts,
        ragged(*texts),
        FRAMING,
        seq_len,
        packing,
        "drop",
    )
    kept = [
        (h, t)
        for h, t in zip(heads, texts, strict=True)
        if packing or not instructions or len(h) + len(t) + 1 <= seq_len + 1
    ]
    expected = rows_by_hand([h for h, _ in kept], [t for _, t in kept], FRAMING, seq_len, packing)
    assert made.tokens.tolist() == [ids for ids, _ in expected]
    assert made.weights.tolist() == [ws for _, ws in expected]
    assert made.dropped == count - len(kept)


# --- issue 50: wording, links read once, a byte-order mark --------------------------------------


def test_an_empty_corpus_says_which_files_in_words_that_agree_with_their_count(tmp_path):
    (tmp_path / "a.txt").write_text("  \n")
    (tmp_path / "b.jsonl").write_text("\n")
    one = str(error_of(corpus.read_examples, (tmp_path / "a.txt",), corpus.CorpusFormat(), "data.files"))
    assert one == f"data.files: {str(tmp_path / 'a.txt')!r} holds no text: it is empty or only whitespace"
    two = str(
        error_of(
            corpus.read_examples,
            (tmp_path / "a.txt", tmp_path / "b.jsonl"),
            corpus.CorpusFormat(),
            "data.files",
        )
    )
    assert two == (
        f"data.files: none of the 2 files ({str(tmp_path / 'a.txt')!r}, {str(tmp_path / 'b.jsonl')!r}) holds "
        "any text: each is empty or only whitespace"
    )


def test_a_file_a_glob_also_reaches_through_a_link_is_read_once_and_the_log_says_so(tmp_path, caplog):
    (tmp_path / "a.txt").write_text("first")
    (tmp_path / "b.txt").write_text("second")
    (tmp_path / "c.txt").symlink_to(tmp_path / "a.txt")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "d.txt").symlink_to(tmp_path / "b.txt")
    with caplog.at_level("INFO", logger="meshrun"):
        files = corpus.expand((str(tmp_path / "*.txt"), str(tmp_path / "sub" / "*.txt")), "data.files")
    assert files == (tmp_path / "a.txt", tmp_path / "b.txt")
    assert [e.text for e in corpus.read_examples(files, corpus.CorpusFormat(), "data.files")] == [
        "first",
        "second",
    ]
    said = [r.getMessage() for r in caplog.records if "same file" in r.getMessage()]
    assert said == [
        f"data.files: 2 paths name the same file as an earlier path (through a link), which is read once: "
        f"{tmp_path / 'c.txt'} = {tmp_path / 'a.txt'}, {tmp_path / 'sub' / 'd.txt'} = {tmp_path / 'b.txt'}"
    ]


def test_a_byte_order_mark_is_read_as_nothing(tmp_path):
    records = write_jsonl(tmp_path / "bom.jsonl", [{"q": "one?", "a": "1"}, {"q": "two?", "a": "2"}])
    records.write_bytes(b"\xef\xbb\xbf" + records.read_bytes())
    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbfplain text")
    pairs = corpus.read_examples((records,), INSTRUCTIONS, "data.files")
    assert [(e.prompt, e.text) for e in pairs] == [("Q: one? A: ", "1"), ("Q: two? A: ", "2")]
    assert [
        e.text for e in corpus.read_examples((tmp_path / "bom.txt",), corpus.CorpusFormat(), "data.files")
    ] == ["plain text"]


def test_counts_of_examples_agree_with_their_nouns(tmp_path, caplog):
    """An example too long for a row is `1 example`, and one left out of two `makes` and `was`."""
    from meshrun.data import text, text_report, text_tokenizer, text_tokens
    from meshrun.text.tokenizer import load_tokenizer
    from presets import hf_tokenizer_json

    short_text = (
        "a short text and a longer text " * 20
    )  # gives a byte-level BPE of 276 ids at most: all of them
    tokenizer = load_tokenizer(
        str(hf_tokenizer_json(tmp_path / "hf", short_text, vocabulary_size=276)), "data.tokenizer"
    )
    long = " ".join("qwertyuiop")  # ten tokens or more: letters the tokenizer never saw together
    one = write_jsonl(tmp_path / "one.jsonl", [{"q": long, "a": "a"}])
    two = write_jsonl(tmp_path / "two.jsonl", [{"q": "a short", "a": "text"}, {"q": long, "a": "a"}])
    made = {}
    for path in (one, two):
        options = text.TextOptions(
            files=str(path), prompt="{q}", completion="{a}", cache_dir=str(tmp_path / "tokens")
        )
        made[path.name] = lambda options=options: text_tokens.tokenize_cached(
            options, tokenizer, text_tokenizer.framing_for(options, tokenizer), seq_len=6
        )
    assert (
        str(error_of(made["one.jsonl"]))
        == "data.files: the text makes no row of model.seq_len + 1 = 7 tokens (1 example, too long)"
    )
    with caplog.at_level("WARNING", logger="meshrun"):
        tokenized = made["two.jsonl"]()
    (warning,) = [r.getMessage() for r in caplog.records if "data.too_long=drop" in r.getMessage()]
    assert warning.startswith(
        "data.too_long=drop: 1 of the 2 train examples makes "
        "more than model.seq_len + 1 = 7 tokens and was left out"
    )
    assert warning.endswith("raise model.seq_len to keep it")
    # metrics.json counts the example trained on, and the one dropped apart
    figures = text_report.info(options, tokenized, tokenizer, None, train_rows=1, eval_rows=0)
    assert (figures["train_examples"], figures["dropped_too_long"]) == (1, 1)
