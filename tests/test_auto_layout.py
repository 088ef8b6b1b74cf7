"""layout=auto, layout files and plans that know a device's memory.

- derive_layout on hand-built variables: which dimension each axis takes (heads, hidden size,
  embedding rows; the width for FSDP), min_bytes, extra_rules first, collapsed block patterns, and
  the one warning when nothing can be sharded; attention heads kept whole, and the warning saying so.
- `layout.min_bytes` sizes and their errors.
- Through the CLI: the 7B preset's bytes per device against the hand-written layouts, a saved layout
  loaded back with the same placement, `--save-layout` errors, and devices.memory_gib (a plan that
  does not fit exits 2; a sweep over meshes and layouts records `does not fit` rows without running
  them and names the fastest job among those that fit).
"""

from __future__ import annotations

import json
import logging
import re

import pytest

from conftest import cli_here, one_error_line, run_meshrun
from meshrun.config.layout_schema import LayoutRule, MeshConfig
from meshrun.config.parse import parse_size
from meshrun.errors import ConfigError
from meshrun.placement.auto import collapse, derive_layout, model_width
from meshrun.placement.layout import TensorSpec, check_rules

MESH_1X8 = MeshConfig(shape=(1, 8), axis_names=("data", "model"), batch_axis="data")
MESH_2X4 = MeshConfig(shape=(2, 4), axis_names=("data", "model"), batch_axis="data")
MESH_8X1 = MeshConfig(shape=(8, 1), axis_names=("data", "model"), batch_axis="data")
KIB, MIB = 1 << 10, 1 << 20


def var(path, *shape):
    return TensorSpec(path, tuple(shape))


def transformer_block_variables(layers=2, d_model=512, heads=8, ff=2048, vocab=4096):
    """The zoo transformer's variables (paths and shapes as it names them)."""
    head_dim = d_model // heads
    variables = [
        var("token_embedding/embeddings", vocab, d_model),
        var("position_embedding/embeddings", 128, d_model),
    ]
    for n in range(layers):
        b = f"block_{n}"
        variables += [var(f"{b}/ln_1/gamma", d_model)]
        variables += [
            var(f"{b}/attention/{p}/kernel", d_model, heads, head_dim) for p in ("query", "key", "value")
        ]
        variables += [
            var(f"{b}/attention/attention_output/kernel", heads, head_dim, d_model),
            var(f"{b}/mlp_up/kernel", d_model, ff),
            var(f"{b}/mlp_up/bias", ff),
            var(f"{b}/mlp_down/kernel", ff, d_model),
        ]
    return variables


def placed(layout, variables, mesh):
    """path -> spec, as the derived rules place `variables` (Keras' matching, checked)."""
    check = check_rules(layout.rules, mesh, variables)
    assert not check.errors, check.errors
    return {
        v.path: check.assigned[v.path].axes if v.path in check.assigned else (None,) * len(v.shape)
        for v in variables
    }


def test_tensor_parallel_splits_heads_hidden_size_and_embedding_rows():
    variables = transformer_block_variables()
    layout = derive_layout(variables, MESH_1X8, min_bytes=64 * KIB, fsdp=False)
    specs = placed(layout, variables, MESH_1X8)
    assert specs["block_0/attention/query/kernel"] == (None, "model", None)  # heads
    assert specs["block_1/attention/attention_output/kernel"] == ("model", None, None)  # heads
    assert specs["block_0/mlp_up/kernel"] == (None, "model")  # column-parallel
    assert specs["block_0/mlp_down/kernel"] == ("model", None)  # row-parallel
    assert specs["token_embedding/embeddings"] == ("model", None)  # rows: the vocabulary
    assert specs["block_0/ln_1/gamma"] == (None,)  # small: replicated
    assert specs["block_0/mlp_up/bias"] == (None,)  # 8 KiB < min_bytes
    assert {rule.origin for rule in layout.rules} == {"auto"}
    assert layout.warning is None


@pytest.mark.parametrize("heads", [4, 2])
def test_attention_keeps_its_heads_whole_and_says_when_the_model_axis_does_not_divide_them(heads):
    # 4 heads split 4 ways by heads (not by head_dim, although 4 is a small dimension); 2 heads do
    # not split 4 ways, and splitting head_dim instead would cut every head across devices.
    variables = transformer_block_variables(heads=heads)
    gemma_query = var(
        "decoder_block_0/attention/query/kernel", heads, 512, 512 // heads
    )  # (heads, width, head_dim)
    layout = derive_layout([*variables, gemma_query], MESH_2X4, min_bytes=64 * KIB, fsdp=False)
    specs = placed(layout, [*variables, gemma_query], MESH_2X4)
    by_heads = ("model",) if heads == 4 else (None,)
    assert specs["block_0/attention/query/kernel"] == (None, *by_heads, None)
    assert specs["block_1/attention/attention_output/kernel"] == (*by_heads, None, None)
    assert specs["decoder_block_0/attention/query/kernel"] == (*by_heads, None, None)
    assert specs["block_0/mlp_up/kernel"] == (None, "model")  # the rest as before
    if heads == 4:
        assert layout.warnings == ()
        return
    assert layout.warnings == (
        "layout=auto keeps attention heads whole: block_0/attention/query/kernel (512x2x256) and 8 more "
        "attention variables have 2 heads, which mesh axis 'model' (size 4) does not divide: kept replicated "
        "over 'model' rather than split along head_dim; a "
        "'model' axis whose size divides the heads shards them",
    )


def test_fsdp_adds_the_batch_axis_on_the_width_and_alone_on_a_mesh_without_a_model_axis():
    variables = transformer_block_variables()
    both = placed(derive_layout(variables, MESH_2X4, 64 * KIB, fsdp=True), variables, MESH_2X4)
    assert both["block_0/mlp_up/kernel"] == ("data", "model")
    assert both["block_0/mlp_down/kernel"] == ("model", "data")
    assert both["block_0/attention/query/kernel"] == ("data", "model", None)
    assert both["token_embedding/embeddings"] == ("model", "data")
    fsdp = placed(derive_layout(variables, MESH_8X1, 64 * KIB, fsdp=True), variables, MESH_8X1)
    assert fsdp["block_0/mlp_up/kernel"] == ("data", None)
    assert fsdp["block_0/attention/attention_output/kernel"] == (None, None, "data")
    assert fsdp["token_embedding/embeddings"] == (None, "data")


def test_blocks_collapse_into_one_pattern_per_variable_kind():
    layout = derive_layout(transformer_block_variables(layers=12), MESH_1X8, 64 * KIB, fsdp=False)
    patterns = [rule.pattern for rule in layout.rules]
    assert r"block_\d+/attention/query/kernel" in patterns
    assert r"block_\d+/mlp_down/kernel" in patterns
    assert not any(re.search(r"block_\d", p) for p in patterns), patterns
    assert "token_embedding/embeddings" in patterns


def test_a_pattern_is_not_collapsed_when_it_would_place_other_paths_or_other_axes():
    # block_1's kernel is too small to shard: a pattern would wrongly take it too.
    rules = collapse(
        {"block_0/kernel": (None, "model"), "block_2/kernel": (None, "model")},
        ["block_0/kernel", "block_1/kernel", "block_2/kernel"],
    )
    assert [r.pattern for r in rules] == ["block_0/kernel", "block_2/kernel"]
    mixed = collapse(
        {"block_0/kernel": (None, "model"), "block_1/kernel": ("model", None)},
        ["block_0/kernel", "block_1/kernel"],
    )
    assert {r.pattern for r in mixed} == {"block_0/kernel", "block_1/kernel"}
    # Paths with regex characters are escaped: the rule matches exactly its path.
    (dotted,) = collapse({"head.v2/kernel": ("model",)}, ["head.v2/kernel", "headXv2/kernel"])
    assert re.fullmatch(dotted.pattern, "head.v2/kernel") and not re.fullmatch(
        dotted.pattern, "headXv2/kernel"
    )


def test_extra_rules_take_their_paths_first():
    variables = transformer_block_variables(layers=1)
    extra = (LayoutRule("token_embedding/embeddings", (None, "model"), origin="extra_rules"),)
    layout = derive_layout(variables, MESH_1X8, 64 * KIB, fsdp=False, taken=extra)
    assert not any(re.fullmatch(rule.pattern, "token_embedding/embeddings") for rule in layout.rules)


def test_width_is_the_size_most_large_variables_share():
    assert model_width(transformer_block_variables()) == 512
    assert (
        model_width([var("a", 3, 3, 64, 128), var("b", 3, 3, 128, 128)]) == 128
    )  # kernel windows do not count
    assert model_width([var("only", 300, 200)]) is None


@pytest.mark.parametrize(
    "variables,mesh,min_bytes,fsdp,expected",
    [
        (
            [var("w", 96, 96)],
            MeshConfig((1, 7), ("data", "model"), "data"),
            KIB,
            False,
            "no dimension of any variable of at least 1.00 KiB divides by the axis sizes (model=7)",
        ),
        (
            [var("w", 96, 96)],
            MESH_8X1,
            KIB,
            False,
            "no axis besides the batch axis 'data' has more than one device",
        ),
        ([var("w", 96, 96)], MESH_1X8, MIB, False, "no variable reaches layout.min_bytes=1.00 MiB"),
    ],
)
def test_nothing_sharded_is_one_warning_naming_the_largest_variable(
    variables, mesh, min_bytes, fsdp, expected
):
    layout = derive_layout([var("small", 4), *variables], mesh, min_bytes, fsdp)
    assert layout.rules == ()
    assert expected in layout.warning
    assert "the largest is w (96x96, 36.00 KiB)" in layout.warning
    assert "\n" not in layout.warning


@pytest.mark.parametrize(
    "text,size",
    [
        (0, 0),
        (4096, 4096),
        ("1MiB", MIB),
        ("512KiB", 512 * KIB),
        ("4MB", 4_000_000),
        ("1.5 GiB", 3 << 29),
        ("2048", 2048),
    ],
)
def test_min_bytes_reads_sizes(text, size):
    assert parse_size("layout.min_bytes", text) == size


@pytest.mark.parametrize("bad", ["lots", "-1", -5, "1 parsec", True, "MiB"])
def test_min_bytes_that_is_not_a_size_names_the_key_and_examples(bad):
    with pytest.raises(ConfigError, match=r"^layout\.min_bytes: got .*; expected a size in bytes.*1MiB"):
        parse_size("layout.min_bytes", bad)


# --- through the CLI ------------------------------------------------------------------------------


def plan_in_process(args: list[str], capsys) -> dict:
    """The plan `meshrun plan ARGS --json` prints, run in this process (conftest's cli_here starts
    jax with its 8 devices first: a plan would start it with 1, and later tests need 8)."""
    done = cli_here(["plan", *args, "--json"], capsys)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.mark.integration
def test_the_plan_says_which_attention_variables_auto_keeps_whole(capsys):
    plan = plan_in_process(
        ["model=transformer", "model.heads=2", "mesh=2x4", "layout=auto", "layout.min_bytes=1KiB"], capsys
    )
    placed = {v["path"]: v for v in plan["variables"]}
    assert placed["block_0/attention/query/kernel"]["spec"] == [
        None,
        None,
        None,
    ]  # 64x2x32: head_dim stays whole
    assert placed["block_0/mlp_up/kernel"]["spec"] == [None, "model"]
    kept = [w for w in plan["warnings"] if w.startswith("layout=auto keeps attention heads whole")]
    assert (
        len(kept) == 1
        and "block_0/attention/query/kernel (64x2x32) and 7 more attention variables have 2 heads" in kept[0]
    )


@pytest.mark.integration
def test_auto_keys_on_another_layout_are_one_grammatical_warning_said_once_a_process(
    tmp_path, caplog, capsys
):
    # A sweep over layout=auto,dense_model sets layout.min_bytes for auto: each job's plan keeps the
    # warning, but a multirun's jobs (one process) say it once. 7KiB: a size no other test sets.
    plan = plan_in_process(["mesh=2x4", "layout=dense_model", "layout.min_bytes=7KiB"], capsys)
    said = "layout.min_bytes=7.00 KiB only steers layout=auto; this layout's rules are used as written"
    assert said in plan["warnings"]
    from meshrun.config.parse import parse_run_config
    from meshrun.run.prepare import RunContext, prepare

    raw = {
        "mesh": {"shape": "2x4"},
        "layout": {"rules": {"d1/kernel": [None, "model"]}, "min_bytes": "7KiB"},
        "model": {"name": "dense_model"},
        "data": {"name": "synthetic", "num_samples": 64, "eval_samples": 32},
    }
    said_once: set[str] = set()  # the invocation's, which a multirun's jobs share
    with caplog.at_level(logging.WARNING, logger="meshrun"):
        setups = [
            prepare(parse_run_config(raw), RunContext(run_dir=str(tmp_path / str(job)), said_once=said_once))
            for job in range(2)
        ]
    assert [r.message for r in caplog.records if "only steer" in r.message] == [said]
    assert all(said in setup.plan.warnings for setup in setups)


def meshrun_in_process(args: list[str], cwd, capsys, monkeypatch):
    """`meshrun ARGS` run in this process in the working dir `cwd`, as run_meshrun runs it in a
    fresh one: its exit status (`returncode`), `stdout` and `stderr`."""
    monkeypatch.chdir(cwd)
    return cli_here(args, capsys)


def plans(tmp_path, capsys, monkeypatch, *overrides) -> list[dict]:
    """The JSON plans `meshrun plan -m OVERRIDES --json` prints, one per job."""
    done = meshrun_in_process(["plan", "-m", *overrides, "--json"], tmp_path, capsys, monkeypatch)
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def key(job: dict) -> tuple:
    """(mesh, layout, fsdp) of a job of a plan multirun."""
    return job["choices"]["mesh"], job["layout"], "layout.fsdp=true" in [o.lower() for o in job["overrides"]]


@pytest.mark.integration
def test_auto_on_the_zoo_transformer_is_within_15_percent_of_the_hand_written_layouts(
    tmp_path, capsys, monkeypatch
):
    # The tiny preset's variables are under 1 MiB: auto shards those of 1 KiB or more here.
    # scripts/auto_layout_bytes.py prints the same comparison for the 7b preset at the default.
    jobs = plans(
        tmp_path,
        capsys,
        monkeypatch,
        "model=transformer",
        "layout.min_bytes=1KiB",
        "mesh=1x8,2x4,8x1",
        "layout=auto,transformer_tp,transformer_fsdp,transformer_2d",
        "layout.fsdp=false,true",
    )
    total = {key(j): j["per_device"]["total_bytes"] for j in jobs}
    pairs = [
        (("1x8", "auto", False), ("1x8", "transformer_tp", False)),
        (("2x4", "auto", False), ("2x4", "transformer_tp", False)),
        (("8x1", "auto", True), ("8x1", "transformer_fsdp", False)),
        (("2x4", "auto", True), ("2x4", "transformer_2d", False)),
    ]
    for auto, hand in pairs:
        assert total[auto] == pytest.approx(total[hand], rel=0.15), (auto, hand)
    # On 8x1 without fsdp there is nothing but the batch axis: replicated, and it says so.
    replicated = next(j for j in jobs if key(j) == ("8x1", "auto", False))
    assert any(
        "layout=auto shards nothing" in w and "token_embedding/embeddings" in w
        for w in replicated["warnings"]
    )
    # The keys of auto are keys of every layout (a sweep over layouts sets them); others say they ignore them.
    hand = next(j for j in jobs if key(j) == ("1x8", "transformer_tp", True))
    assert (
        "layout.fsdp=true and layout.min_bytes=1.00 KiB only "
        "steer layout=auto; this layout's rules are used as written" in hand["warnings"]
    )
    auto_1x8 = next(j for j in jobs if key(j) == ("1x8", "auto", False))
    rules = {v["rule"] for v in auto_1x8["variables"] if v.get("origin") == "auto"}
    assert r"block_\d+/mlp_up/kernel" in rules and len(rules) < 15


@pytest.mark.integration
def test_a_saved_layout_loads_back_with_the_same_placement(tmp_path, capsys, monkeypatch):
    args = [
        "plan",
        "model=transformer",
        "mesh=2x4",
        "layout=auto",
        "layout.min_bytes=1KiB",
        "layout.fsdp=true",
    ]
    done = meshrun_in_process(
        [*args, "--json", "--save-layout", "saved/tp.yaml"], tmp_path, capsys, monkeypatch
    )  # saved/ is made
    assert done.returncode == 0, done.stderr
    auto = json.loads(done.stdout)
    text = (tmp_path / "saved" / "tp.yaml").read_text()
    assert text.startswith("# Saved by `meshrun plan model=transformer mesh=2x4 layout=auto")
    assert r"block_\d+/mlp_up/kernel: [data, model]" in text
    again = meshrun_in_process(
        ["plan", "model=transformer", "mesh=2x4", "layout=saved/tp.yaml", "--json"],
        tmp_path,
        capsys,
        monkeypatch,
    )
    assert again.returncode == 0, again.stderr
    loaded = json.loads(again.stdout)
    assert [(v["path"], v["spec"], v["bytes_per_device"]) for v in loaded["variables"]] == [
        (v["path"], v["spec"], v["bytes_per_device"]) for v in auto["variables"]
    ]
    assert loaded["per_device"] == auto["per_device"]
    assert {v.get("origin") for v in loaded["variables"] if v["rule"]} == {"rules"}


@pytest.mark.integration
@pytest.mark.parametrize(
    "args,expected",
    [
        (["layout=auto", "layout.min_bytes=lots"], "layout.min_bytes: got 'lots'; expected a size in bytes"),
        (["--save-layout", "out.txt"], "--save-layout: got 'out.txt'; a layout file is YAML"),
        (["--save-layout"], "--save-layout: got ''; give the path of the layout file to write"),
        (["-m", "mesh=2x4,1x8", "--save-layout", "x.yaml"], "--save-layout: got 'x.yaml' with -m"),
        (["layout=missing/saved.yaml"], "layout: got 'missing/saved.yaml', which is not a file"),
        (
            ["model=transformer", "model.preset=7b", "mesh=1x8", "layout=auto", "devices.memory_gib=8"],
            "devices.memory_gib: does not fit: the plan puts 9.40 GiB on each device of mesh 1x8",
        ),
    ],
)
def test_bad_auto_save_and_memory_input_is_one_line_exit_2(tmp_path, args, expected, capsys, monkeypatch):
    done = meshrun_in_process(["plan", *args], tmp_path, capsys, monkeypatch)
    assert expected in one_error_line(done)
    assert not (tmp_path / "x.yaml").exists() and not (tmp_path / "out.txt").exists()


@pytest.mark.e2e
def test_a_sweep_over_meshes_and_layouts_skips_jobs_that_do_not_fit(tmp_path):
    # 4 devices: 4x1, 2x2 and 1x4. With a memory figure the plan counts the train step's peak: the
    # tiny transformer at a global batch of 4 needs ~2.96 MB per device on 4x1, ~1.69 MB on 2x2 and
    # ~1.30 MB on 1x4 (state 1.62, 0.82 and 0.41 MB); with 1.5 MB per device only the 1x4 jobs run.
    done = run_meshrun(
        [
            "sweep",
            "model=transformer",
            "layout=auto,transformer_tp",
            "layout.min_bytes=1KiB",
            "devices.cpu_devices=4",
            "devices.memory_gib=0.0014",
            "train.batch_size=4",
            "train.epochs=1",
            "train.verbose=0",
            "data.num_samples=64",
            "data.eval_samples=32",
            "hydra.sweep.dir=sweep",
        ],
        tmp_path,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "does not fit" in done.stdout and "fastest first among those that fit" in done.stdout
    rows = json.loads((tmp_path / "sweep" / "summary.json").read_text())["rows"]
    assert {(r["mesh"], r["layout"]) for r in rows} == {
        (m, l) for m in ("4x1", "2x2", "1x4") for l in ("auto", "transformer_tp")
    }
    fitting = [r for r in rows if r["status"] == "ok"]
    assert {r["mesh"] for r in fitting} == {"1x4"} and rows[0]["best"] and rows[0] in fitting
    for row in rows[2:]:
        assert row["status"] == "does_not_fit" and row["peak_source"] == "planned"
        assert row["peak_bytes_per_device"] > 0.0014 * (1 << 30)
        run_dir = tmp_path / "sweep" / row["run_dir"]
        metrics = json.loads((run_dir / "metrics.json").read_text())
        assert metrics["exit_status"] == 2 and metrics["memory"]["device_memory_bytes"] == int(
            0.0014 * (1 << 30)
        )
        assert not (run_dir / "log.jsonl").exists()  # never ran a step


@pytest.mark.integration
def test_a_single_run_that_does_not_fit_is_one_line_and_leaves_nothing(tmp_path, capsys, monkeypatch):
    done = meshrun_in_process(
        ["train", "mesh=2x4", "devices.memory_gib=0.0001"], tmp_path, capsys, monkeypatch
    )
    assert "devices.memory_gib: does not fit" in one_error_line(done)
    assert list(tmp_path.iterdir()) == []
