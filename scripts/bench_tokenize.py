"""Benchmarks meshrun's tokenizer (`meshrun.text.tokenizer.TextTokenizer.encode`) against the
tokenizer library called directly, on a corpus of --size-mb MB (at least 50 by default).

The corpus is generated English-like text (tests/presets.py `corpus_text`, paragraphs of about
200 bytes, as JSONL records or short documents are) or --corpus FILE (cut into documents at blank
lines). Two presets are built in a temp dir as the tests build them (vocabulary 512, trained on
the tests' 35 KB corpus): a Gemma-style SentencePiece one and a GPT-2-style byte-level BPE one.
For each:

- meshrun: `load_tokenizer(preset).encode(chunk)` over the whole corpus, a chunk of about
  --chunk-mb MB of documents at a time (as data=text calls it), ids as int32 arrays.
- library: the same chunks through the library alone, its ids as Python lists:
  `SentencePieceProcessor.encode(chunk, out_type=int, num_threads=CORES)` on the preset's proto,
  or a Hugging Face `tokenizers.Tokenizer` with the preset's vocabulary and merges (ByteLevel)
  `encode_batch(chunk, add_special_tokens=False)`.

The two alternate in one process chunk by chunk (A B B A A B ..., so load from other processes
falls on both alike), --repeats passes over the corpus each; medians are reported as MB/s and
tokens/s, the cores each kept busy (CPU time over wall time), and meshrun's wall time and CPU
time over the library's (target: at most 1.5; on a machine others share, the CPU-time ratio is
the steadier). Both use every core this process may run on (CORES). Then meshrun alone over chunk sizes of
--sweep-mb MB (--sweep-repeats passes each), to show which chunk size data=text should pass.

    python scripts/bench_tokenize.py                                  # 50 MB, about 6 minutes on 2 cores
    python scripts/bench_tokenize.py --size-mb 100 --repeats 5 --out bench_tokenize.json
    python scripts/bench_tokenize.py --corpus my_corpus.txt
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(
    0, str(Path(__file__).resolve().parent.parent / "tests")
)  # tests/presets.py builds the presets

from rich.console import Console  # noqa: E402

import benchlib  # noqa: E402
import presets  # noqa: E402
from meshrun.text.tokenizer import load_tokenizer  # noqa: E402
from meshrun.text.tokenizer_encoders import available_cores, same_ids  # noqa: E402

MB = 1_000_000


def main() -> None:
    args = parse_args()
    from meshrun.compat.tensorflow import import_tensorflow

    import_tensorflow()  # before the presets' keras_hub imports it, quietly
    corpus = read_corpus(args)
    documents = [doc for doc in corpus.split("\n\n") if doc]
    size = sum(len(doc.encode("utf-8")) for doc in documents)
    console = Console(width=170)
    console.print(
        f"corpus: {size / MB:.1f} MB, {len(documents):,} documents (median "
        f"{statistics.median(map(len, documents)):.0f} characters); "
        f"{available_cores()} cores; chunks of {args.chunk_mb} MB"
    )
    with tempfile.TemporaryDirectory(prefix="bench-tokenize-") as tmp:
        text = presets.corpus_text()
        built = {
            "gemma": presets.gemma_preset(Path(tmp) / "gemma", text),
            "gpt2": presets.gpt2_preset(Path(tmp) / "gpt2", text),
        }
        results = {kind: compare(kind, preset, documents, size, args) for kind, preset in built.items()}
        sweeps = {kind: sweep(preset, documents, size, args) for kind, preset in built.items()}
        corpus_file = Path(tmp) / "corpus.txt"
        corpus_file.write_text("\n\n".join(documents), encoding="utf-8")
        for kind, preset in built.items():
            results[kind].update(
                whole_source(preset, corpus_file, Path(tmp) / f"cache-{kind}", size, results[kind])
            )
    report(console, results, sweeps, args)
    if args.out:
        benchlib.write_json(
            args.out,
            {
                "corpus_bytes": size,
                "documents": len(documents),
                "cores": available_cores(),
                "chunk_mb": args.chunk_mb,
                "results": results,
                "sweeps": sweeps,
            },
        )


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--corpus", help="a UTF-8 text file (documents cut at blank lines); default: generated"
    )
    parser.add_argument("--size-mb", type=float, default=50, help="generated corpus size in MB (default 50)")
    parser.add_argument(
        "--chunk-mb",
        type=float,
        default=4,
        help="MB of documents per encode call in the comparison (default 4)",
    )
    parser.add_argument("--sweep-mb", default="0.25,1,4,16", help="chunk sizes (MB) for meshrun alone")
    parser.add_argument("--repeats", type=int, default=3, help="passes of each (medians; default 3)")
    parser.add_argument(
        "--sweep-repeats", type=int, default=1, help="passes of each chunk size (medians; default 1)"
    )
    parser.add_argument("--out", help="write the results as JSON here")
    return parser.parse_args()


def read_corpus(args) -> str:
    if args.corpus:
        return Path(args.corpus).read_text(encoding="utf-8")
    return presets.corpus_text(int(args.size_mb * MB), seed=1)


def chunked(documents: list[str], chunk_bytes: float) -> list[list[str]]:
    """`documents` in consecutive chunks of about `chunk_bytes` bytes."""
    chunks, chunk, size = [], [], 0
    for doc in documents:
        chunk.append(doc)
        size += len(doc)
        if size >= chunk_bytes:
            chunks.append(chunk)
            chunk, size = [], 0
    return chunks + ([chunk] if chunk else [])


def library_encoder(kind: str, preset: Path):
    """The preset's tokenizer library alone: a function from a list of texts to lists of ids."""
    assets = preset / "assets" / "tokenizer"
    if kind == "gemma":
        import sentencepiece

        processor = sentencepiece.SentencePieceProcessor(model_file=str(assets / "vocabulary.spm"))
        cores = available_cores()
        return lambda texts: processor.encode(texts, out_type=int, num_threads=cores)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    merges = [
        tuple(line.split(" "))
        for line in (assets / "merges.txt").read_text(encoding="utf-8").splitlines()
        if line
    ]
    tokenizer = Tokenizer(
        models.BPE(vocab=json.loads((assets / "vocabulary.json").read_text(encoding="utf-8")), merges=merges)
    )
    tokenizer.add_special_tokens(list(presets.GPT2_SPECIAL_TOKENS))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return lambda texts: [
        encoding.ids for encoding in tokenizer.encode_batch(texts, add_special_tokens=False)
    ]


def timed(encode, chunk) -> tuple[float, float, int]:
    """Wall seconds and CPU seconds (this process, every thread) to encode `chunk`, and its tokens."""
    wall, cpu = time.perf_counter(), time.process_time()
    tokens = sum(len(ids) for ids in encode(chunk))
    return time.perf_counter() - wall, time.process_time() - cpu, tokens


def compare(kind: str, preset: Path, documents: list[str], size: int, args) -> dict:
    """meshrun's encode and the library's, alternating chunk by chunk (the one going first
    swapped every chunk), --repeats passes over the corpus each."""
    tokenizer = load_tokenizer(str(preset), "model.preset")
    encoders = {"meshrun": tokenizer.encode, "library": library_encoder(kind, preset)}
    chunks = chunked(documents, args.chunk_mb * MB)
    if not same_ids(encoders["meshrun"](chunks[0]), encoders["library"](chunks[0])):
        raise SystemExit(f"{kind}: meshrun's ids differ from the library's")
    walls = {name: [] for name in encoders}
    cpus = {name: [] for name in encoders}
    for _ in range(args.repeats):
        totals = {name: [0.0, 0.0, 0] for name in encoders}
        for index, chunk in enumerate(chunks):
            for name in ("meshrun", "library") if index % 2 == 0 else ("library", "meshrun"):
                totals[name] = [
                    sum(pair) for pair in zip(totals[name], timed(encoders[name], chunk), strict=True)
                ]
        for name, (wall, cpu, _) in totals.items():
            walls[name].append(wall)
            cpus[name].append(cpu)
    tokens = totals["library"][2]  # both encoders give the same ids (checked above)
    wall = {name: statistics.median(values) for name, values in walls.items()}
    cpu = {name: statistics.median(values) for name, values in cpus.items()}
    return {
        "tokenizer": tokenizer.description,
        "backend": tokenizer.backend,
        "tokens": tokens,
        "wall_s": walls,
        "cpu_s": cpus,
        **{f"{name}_mb_per_s": size / MB / seconds for name, seconds in wall.items()},
        **{f"{name}_tokens_per_s": tokens / seconds for name, seconds in wall.items()},
        **{f"{name}_cores_busy": cpu[name] / wall[name] for name in wall},
        "ratio": wall["meshrun"] / wall["library"],
        "cpu_ratio": cpu["meshrun"] / cpu["library"],
    }


def sweep(preset: Path, documents: list[str], size: int, args) -> dict:
    """meshrun's MB/s by chunk size (MB): medians of --sweep-repeats passes."""
    tokenizer = load_tokenizer(str(preset), "model.preset")
    speeds = {}
    for chunk_mb in (float(mb) for mb in args.sweep_mb.split(",")):
        chunks = chunked(documents, chunk_mb * MB)
        seconds = statistics.median(
            sum(timed(tokenizer.encode, chunk)[0] for chunk in chunks) for _ in range(args.sweep_repeats)
        )
        speeds[str(chunk_mb)] = size / MB / seconds
    return speeds


def whole_source(preset: Path, corpus_file: Path, cache_dir: Path, size: int, compared: dict) -> dict:
    """data=text's whole tokenizing pass on a cache miss (read the file, cut it into documents,
    encode, pack into rows of 65 tokens, write the cache): its MB/s and its time over the library's
    encode alone (`compared`: this preset's results of compare)."""
    from meshrun.data import text, text_tokenizer, text_tokens

    options = text.TextOptions(files=(str(corpus_file),), separator="\n\n", cache_dir=str(cache_dir))
    tokenizer = load_tokenizer(str(preset), "model.preset")
    started = time.perf_counter()
    made = text_tokens.tokenize_cached(options, tokenizer, text_tokenizer.framing_for(options, tokenizer), 64)
    seconds = time.perf_counter() - started
    assert not made.hit
    mb_per_s = size / MB / seconds
    return {"data_text_mb_per_s": mb_per_s, "data_text_ratio": compared["library_mb_per_s"] / mb_per_s}


def report(console: Console, results: dict, sweeps: dict, args) -> None:
    """The comparison's table, data=text's whole pass and the chunk sizes' table."""
    table = benchlib.table(
        f"encode: meshrun vs the library (medians of {args.repeats}, chunks of {args.chunk_mb} MB)",
        (
            "preset",
            "backend",
            "MB/s meshrun",
            "MB/s library",
            "tokens/s meshrun",
            "tokens/s library",
            "cores busy meshrun",
            "cores busy library",
            "time meshrun / library",
            "CPU time meshrun / library",
        ),
        left=("preset", "backend"),
    )
    for kind, r in results.items():
        table.add_row(
            kind,
            r["backend"],
            f"{r['meshrun_mb_per_s']:.2f}",
            f"{r['library_mb_per_s']:.2f}",
            f"{r['meshrun_tokens_per_s']:,.0f}",
            f"{r['library_tokens_per_s']:,.0f}",
            f"{r['meshrun_cores_busy']:.2f}",
            f"{r['library_cores_busy']:.2f}",
            f"{r['ratio']:.2f}x",
            f"{r['cpu_ratio']:.2f}x",
        )
    console.print(table)
    console.print(
        "data=text's whole pass on a cache miss (read, encode, pack, write): "
        + ", ".join(
            f"{kind} {r['data_text_mb_per_s']:.2f} MB/s, "
            f"{r['data_text_ratio']:.2f}x the library's encode time"
            for kind, r in results.items()
        )
    )
    chunk_sizes = list(next(iter(sweeps.values())))
    sweep_table = benchlib.table(
        f"meshrun encode MB/s by chunk size (medians of {args.sweep_repeats})",
        ("preset", *(f"{chunk_mb} MB" for chunk_mb in chunk_sizes)),
        left=("preset",),
    )
    for kind, speeds in sweeps.items():
        sweep_table.add_row(kind, *(f"{speeds[c]:.2f}" for c in chunk_sizes))
    console.print(sweep_table)


if __name__ == "__main__":
    main()
