"""`meshrun plan`: the placement plan worked out from shapes alone.

- make_plan on hand-built abstract models: bytes per device against hand arithmetic, optimizer
  slots, totals, the largest replicated variables, the lint (errors and warnings), to_dict.
- The tables as printed: rules whole on a narrow terminal, the model's parameter count, scattered
  numbers (seed generators) folded into one row per kind; a regex rule typed as the docs show.
- The 7B-class transformer on 1x8 in a fresh subprocess: under 60 s and 2 GiB peak RSS, and every
  number equal to shape arithmetic done here from the preset.
- The CLI as a user runs it: JSON and tables, lint errors (exit 2, one stderr line each), -m
  multiruns, no files left behind, explicit meshes bigger than this machine.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from meshrun.config.layout_schema import LayoutRule, MeshConfig
from meshrun.errors import ConfigError
from meshrun.measure import run_measured
from meshrun.placement.layout import TensorSpec, with_bends
from meshrun.placement.plan import LARGE_REPLICATED_BYTES, MAX_LISTED, make_plan
from meshrun.run.build import AbstractModel, OptimizerSlot
from meshrun.wording import format_bytes

MESH_2X4 = MeshConfig(shape=(2, 4), axis_names=("data", "model"), batch_axis="data")
MESH_1X1 = MeshConfig(shape=(1, 1), axis_names=("data", "model"), batch_axis="data")
MESH_8X1 = MeshConfig(
    shape=(8, 1), axis_names=("data", "model"), batch_axis="data"
)  # no axis left idle by replication
MESH_1X8 = MeshConfig(shape=(1, 8), axis_names=("data", "model"), batch_axis="data")
MIB = 1 << 20
GIB = 1 << 30


def rule(pattern, *axes):
    return LayoutRule(pattern, tuple(axes))


def var(path, *shape, dtype="float32", itemsize=4):
    return TensorSpec(path, tuple(shape), dtype=dtype, itemsize=itemsize)


def adam_slots(variables):
    """What Keras' Adam creates: its iteration and learning rate, then a momentum and a velocity
    mirroring each variable (paths as Keras names them)."""
    slots = [
        OptimizerSlot(TensorSpec("adam/iteration", (), dtype="int64", itemsize=8), None),
        OptimizerSlot(TensorSpec("adam/learning_rate", ()), None),
    ]
    for v in variables:
        for kind in ("momentum", "velocity"):
            name = f"adam/{v.path.replace('/', '_')}_{kind}"
            slots.append(OptimizerSlot(TensorSpec(name, v.shape, dtype=v.dtype, itemsize=v.itemsize), v.path))
    return tuple(slots)


def abstract(variables, outputs=(), optimizer=True):
    variables = tuple(variables)
    return AbstractModel(tensors=variables + tuple(outputs), slots=adam_slots(variables) if optimizer else ())


def plan_of(variables, rules=(), mesh=MESH_2X4, outputs=(), optimizer=True):
    return make_plan("toy", mesh, tuple(rules), abstract(variables, outputs, optimizer), "adam")


def by_path(placed):
    """Placements (or rules) by their path (pattern)."""
    return {getattr(p, "path", None) or p.pattern: p for p in placed}


# --- make_plan: bytes per device ---------------------------------------------------------------


def test_bytes_per_device_follow_shape_arithmetic():
    variables = [
        var("dense/kernel", 64, 256),  # column-parallel over model (4)
        var("dense/bias", 256),  # no rule: replicated
        var("big/kernel", 128, 512),  # both axes: data (2) x model (4)
        var("emb/embeddings", 1000, 32, dtype="bfloat16", itemsize=2),  # rows over model, 2-byte
        var("three/kernel", 6, 8, 10),  # middle dimension over data
    ]
    rules = [
        rule("dense/kernel", None, "model"),
        rule("big/kernel", "data", "model"),
        rule("emb/embeddings", "model", None),
        rule("three/kernel", None, "data", None),
    ]
    plan = plan_of(variables, rules)
    assert plan.errors == () and plan.warnings == ()
    placed = by_path(plan.variables)
    assert list(placed) == [v.path for v in variables]  # model order kept

    expected = {
        "dense/kernel": (64 * 256 * 4, 64 * (256 // 4) * 4, "dense/kernel", (None, "model")),
        "dense/bias": (256 * 4, 256 * 4, None, (None,)),
        "big/kernel": (128 * 512 * 4, (128 // 2) * (512 // 4) * 4, "big/kernel", ("data", "model")),
        "emb/embeddings": (1000 * 32 * 2, (1000 // 4) * 32 * 2, "emb/embeddings", ("model", None)),
        "three/kernel": (6 * 8 * 10 * 4, 6 * (8 // 2) * 10 * 4, "three/kernel", (None, "data", None)),
    }
    for path, (total, per_device, matched, spec) in expected.items():
        p = placed[path]
        assert (p.bytes, p.bytes_per_device, p.rule, p.spec) == (total, per_device, matched, spec), path
    assert placed["dense/bias"].replicated and not placed["big/kernel"].replicated
    assert placed["emb/embeddings"].dtype == "bfloat16"
    assert placed["big/kernel"].bytes_per_device * 8 == placed["big/kernel"].bytes  # 2 x 4 devices

    assert plan.params == 64 * 256 + 256 + 128 * 512 + 1000 * 32 + 6 * 8 * 10
    assert plan.params_bytes_per_device == sum(e[1] for e in expected.values())


def test_an_axis_of_size_one_shards_nothing():
    # A rule over an axis of size 1 keeps its spec but every device holds the whole variable, so it
    # counts as replicated for the totals and the warnings.
    mesh = MeshConfig(shape=(8, 1), axis_names=("data", "model"), batch_axis="data")
    big = var("embedding", 1024, 512)  # 2 MiB
    plan = plan_of([big], [rule("embedding", "model", None)], mesh=mesh)
    p = plan.variables[0]
    assert p.spec == ("model", None) and p.replicated
    assert p.bytes_per_device == p.bytes == 1024 * 512 * 4
    assert [q.path for q in plan.largest_replicated()] == ["embedding"]
    assert len(plan.warnings) == 1 and plan.warnings[0].startswith(
        "embedding (1024x512, 2.00 MiB) is replicated"
    )


def test_optimizer_slots_mirror_their_variable_and_scalars_are_replicated():
    variables = [var("dense/kernel", 64, 256), var("dense/bias", 256), var("big/kernel", 128, 512)]
    rules = [rule("dense/kernel", None, "model"), rule("big/kernel", "data", "model")]
    plan = plan_of(variables, rules)
    placed = by_path(plan.variables)
    slots = by_path(plan.slots)
    assert len(plan.slots) == 2 + 2 * len(variables)

    for kind in ("momentum", "velocity"):
        for v in variables:
            slot = slots[f"adam/{v.path.replace('/', '_')}_{kind}"]
            ref = placed[v.path]
            assert slot.reference == v.path
            assert (slot.shape, slot.spec, slot.rule, slot.bytes, slot.bytes_per_device) == (
                ref.shape,
                ref.spec,
                ref.rule,
                ref.bytes,
                ref.bytes_per_device,
            )

    iteration, learning_rate = slots["adam/iteration"], slots["adam/learning_rate"]
    assert (iteration.shape, iteration.spec, iteration.rule, iteration.reference) == ((), (), None, None)
    assert (iteration.dtype, iteration.bytes, iteration.bytes_per_device) == ("int64", 8, 8)
    assert (learning_rate.dtype, learning_rate.bytes_per_device) == ("float32", 4)
    assert iteration.replicated and learning_rate.replicated

    params = 64 * 256 * 4 // 4 + 256 * 4 + 128 * 512 * 4 // 8
    assert plan.params_bytes_per_device == params
    assert plan.optimizer_bytes_per_device == 2 * params + 8 + 4
    assert plan.total_bytes_per_device == 3 * params + 12


def test_a_variable_whose_rule_does_not_fit_is_listed_under_the_rule_the_lint_names():
    """One truth: the row names the rule the error is about and the spec it asks for (its bytes
    rounded up, as if padded), not "replicated"; its optimizer slots follow it."""
    variables = [var("odd/kernel", 10, 6)]  # 10 rows do not split 4 ways
    plan = plan_of(variables, [rule("odd/kernel", "model", None)])
    assert len(plan.errors) == 1 and "shards dimension 0 of variable 'odd/kernel'" in str(plan.errors[0])
    p = plan.variables[0]
    assert (p.rule, p.spec, p.bytes_per_device) == ("odd/kernel", ("model", None), 3 * 6 * 4)
    with pytest.raises(ConfigError) as raised:
        plan.raise_first_error()
    assert str(raised.value) == str(plan.errors[0])  # the only error, as it is
    for slot in plan.slots[2:]:
        assert (slot.rule, slot.spec, slot.bytes_per_device) == ("odd/kernel", ("model", None), 3 * 6 * 4)


def test_a_lenient_rule_places_what_it_can_and_says_once_what_stays_whole():
    """A family layout's rule over heads on a model with one key/value head: the plan row names the
    rule and the spec Keras gets (heads whole), one note says so for the rule, and the large
    replicated key/value kernels get no warning of their own besides it."""
    heads = LayoutRule(r"block_\d+/(query|key)/kernel", (None, "model", None), replicate_if_indivisible=True)
    variables = [
        var(f"block_{i}/{kind}/kernel", 1024, heads_count, 128)
        for i in range(2)
        for kind, heads_count in (("query", 8), ("key", 1))
    ]
    rules, bends = with_bends((heads,), MESH_1X8, variables)
    plan = make_plan("toy", MESH_1X8, rules, abstract(variables), "adam", bends=bends)
    assert plan.errors == ()
    placed = by_path(plan.variables)
    assert (placed["block_0/query/kernel"].rule, placed["block_0/query/kernel"].spec) == (
        heads.pattern,
        (None, "model", None),
    )
    assert (placed["block_0/key/kernel"].rule, placed["block_0/key/kernel"].spec) == (
        heads.pattern,
        (None, None, None),
    )
    assert (
        placed["block_1/key/kernel"].bytes_per_device == 1024 * 128 * 4 == placed["block_1/key/kernel"].bytes
    )
    assert (
        placed["block_1/query/kernel"].bytes_per_device == 1024 * 128 * 4
    )  # 8 heads over 8 devices: one each
    assert plan.warnings == (
        f"rule '{heads.pattern}' cannot split dimension 1 of 'block_0/key/kernel' (size 1, shape (1024, 1, "
        "128)) over mesh axis 'model' of size 8, so it keeps that dimension whole, replicated over 'model'; "
        "the same for 1 more path (1.00 MiB in all)",
    )


def test_largest_replicated_is_ordered_by_size_and_skips_sharded_and_scalars():
    variables = [
        var("small", 10),
        var("sharded_huge", 4096, 4096),
        var("medium", 100, 100),
        var("scalar"),
        var("large", 300, 300),
        var("tiny", 2),
        var("wide16", 100, 100, dtype="float16", itemsize=2),
        var("mid", 50, 50),
    ]
    plan = plan_of(variables, [rule("sharded_huge", "data", "model")])
    largest = plan.largest_replicated()
    assert [p.path for p in largest] == ["large", "medium", "wide16", "mid", "small"]
    assert [p.bytes for p in largest] == [360_000, 40_000, 20_000, 10_000, 40]
    assert [p.path for p in plan.largest_replicated(2)] == ["large", "medium"]
    assert len(plan.largest_replicated(100)) == 6  # every replicated variable but the scalar
    assert plan.to_dict()["largest_replicated"] == [{"path": p.path, "bytes": p.bytes} for p in largest]


# --- make_plan: warnings ------------------------------------------------------------------------


def test_large_replicated_warning_needs_one_mib_and_more_than_one_device():
    at_threshold = var("at_threshold", LARGE_REPLICATED_BYTES // 4)  # exactly 1 MiB of float32
    below = var("below", LARGE_REPLICATED_BYTES // 4 - 1)
    sharded = var("sharded", 4 * LARGE_REPLICATED_BYTES // 4)
    variables = [below, at_threshold, sharded]
    rules = [rule("sharded", "model")]
    assert LARGE_REPLICATED_BYTES == MIB

    plan = plan_of(variables, rules)
    assert plan.errors == ()
    assert plan.warnings == (
        "at_threshold (262144, 1.00 MiB) is replicated: every one of the 8 devices holds all of it",
    )
    assert plan.to_dict()["warnings"] == list(plan.warnings)
    assert plan.to_dict()["status"] == "ok"  # warnings do not fail a plan

    assert plan_of(variables, rules, mesh=MESH_1X1).warnings == ()  # one device: nothing to save


def test_large_replicated_warnings_are_capped_and_summarised():
    # 13 replicated variables of 1..13 MiB: the 10 largest are listed, largest first, then one line.
    variables = [var(f"table_{n}", n * MIB // 4) for n in range(1, 14)]
    plan = plan_of(variables, mesh=MESH_8X1, optimizer=False)
    assert len(plan.warnings) == MAX_LISTED + 1 == 11
    listed = [w.split(" ", 1)[0] for w in plan.warnings[:MAX_LISTED]]
    assert listed == [f"table_{n}" for n in range(13, 3, -1)]
    assert plan.warnings[0].startswith("table_13 (3407872, 13.00 MiB) is replicated")
    rest = (1 + 2 + 3) * MIB
    assert plan.warnings[-1] == (
        f"... and 3 more replicated variables of at least 1.00 MiB ({format_bytes(rest)} on every device)"
    )
    assert format_bytes(rest) == "6.00 MiB"

    exactly_ten = plan_of(variables[:MAX_LISTED], mesh=MESH_8X1, optimizer=False)
    assert len(exactly_ten.warnings) == MAX_LISTED
    assert not any(w.startswith("...") for w in exactly_ten.warnings)


# --- make_plan: errors --------------------------------------------------------------------------


def test_every_kind_of_lint_error_is_collected_at_once():
    variables = [
        var("dense/kernel", 64, 256),
        var("emb/embeddings", 1000, 32),
        var("odd/kernel", 10, 6),
        var("ok/kernel", 16, 16),
    ]
    rules = [
        rule("dense/.*", None, "model"),  # with the next: two rules on dense/kernel
        rule(".*/kernel", None, "model"),  # also fits ok/kernel, matched by nothing else
        rule("emb/embeddings", "model"),  # rank 1 for a rank-2 variable
        rule("odd/kernel", "model", None),  # exact key wins over .*/kernel; 10 % 4 != 0
        rule("nothing/here", "data"),  # matches nothing
    ]
    plan = plan_of(variables, rules)
    assert all(isinstance(e, ConfigError) for e in plan.errors)
    messages = [str(e) for e in plan.errors]
    assert len(messages) == 4, messages
    double, rank, indivisible, unused = messages
    assert double.startswith("layout.rules: 'dense/kernel' is matched by 2 rules, 'dense/.*' and '.*/kernel'")
    assert rank.startswith(
        "layout.rules.emb/embeddings: gives 1 axes [model] but variable 'emb/embeddings' has rank 2"
    )
    assert indivisible.startswith(
        "layout.rules.odd/kernel: shards dimension 0 of variable 'odd/kernel' (size 10"
    )
    assert "over mesh axis 'model' of size 4, which does not divide 10 on mesh 2x4" in indivisible
    assert "valid for this dimension: null or data" in indivisible
    assert unused.startswith("layout.rules.nothing/here: matches no variable or output of the model")
    assert [e.key for e in plan.errors] == [
        "layout.rules",
        "layout.rules.emb/embeddings",
        "layout.rules.odd/kernel",
        "layout.rules.nothing/here",
    ]

    placed = by_path(plan.variables)
    assert placed["ok/kernel"].spec == (None, "model")  # the one fit goes through
    assert (
        placed["dense/kernel"].rule is None and placed["dense/kernel"].replicated
    )  # which of two rules: none applies
    for path in ("emb/embeddings", "odd/kernel"):  # a misfit is listed under the rule its error names
        assert placed[path].rule == path and placed[path].spec == by_path(rules)[path].axes
    assert placed["emb/embeddings"].bytes_per_device == 250 * 32 * 4  # the rank it lacks: whole

    data = plan.to_dict()
    assert data["status"] == "error"
    assert data["errors"] == messages
    with pytest.raises(ConfigError) as raised:  # a run stops at the first, counting the rest
        plan.raise_first_error()
    assert raised.value.key == plan.errors[0].key
    assert str(raised.value).startswith(messages[0])
    assert "3 more layout problems" in str(raised.value)
    plan_of(variables[-1:], rules[1:2]).raise_first_error()  # no errors: nothing raised


def test_a_rule_misfitting_many_paths_is_one_error_with_a_count():
    blocks = [var(f"block_{i}/attn/kernel", 6, 8) for i in range(5)]
    pairs = [var(f"pair_{i}/w", 8, 8) for i in range(3)]
    single = [var(f"solo_{i}/w", 2, 8, 3) for i in range(2)]
    rules = [
        rule(r"block_\d+/attn/kernel", "model", None),  # 6 % 4: five times
        rule(r"pair_\d+/w", "model", None),  # with the next, two rules on three paths
        rule(r"pair_.*", None, "model"),
        rule(r"solo_\d+/w", None, "model"),  # rank 2 for rank 3: twice
    ]
    plan = plan_of(blocks + pairs + single, rules)
    messages = [str(e) for e in plan.errors]
    assert len(messages) == 3, messages
    assert messages[0].startswith(
        r"layout.rules.block_\d+/attn/kernel: shards dimension 0 of variable 'block_0/attn/kernel'"
    )
    assert messages[0].endswith("(and 4 more paths matched the same way)")
    assert messages[1].startswith("layout.rules: 'pair_0/w' is matched by 2 rules")
    assert messages[1].endswith("(and 2 more paths matched the same way)")
    assert messages[2].startswith(
        r"layout.rules.solo_\d+/w: gives 2 axes [null, model] but variable 'solo_0/w'"
    )
    assert messages[2].endswith("(and 1 more path matched the same way)")


def test_output_rules_are_planned_and_checked():
    variables = [var("dense/kernel", 16, 32)]
    outputs = [
        TensorSpec("dense/output", (None, 32), is_output=True),
        TensorSpec("head/output", (None, 10), is_output=True),
    ]
    plan = plan_of(variables, [rule("dense/output", "data", "model")], outputs=outputs)
    assert plan.errors == ()
    assert plan.outputs == (
        {"path": "dense/output", "shape": [None, 32], "rule": "dense/output", "spec": ["data", "model"]},
    )
    assert [p.path for p in plan.variables] == ["dense/kernel"]  # outputs hold no bytes
    assert plan.params == 16 * 32

    bad = plan_of(variables, [rule("head/output", "data", "model")], outputs=outputs)
    assert [str(e) for e in bad.errors] == [
        (
            "layout.rules.head/output: shards dimension 1 of output 'head/output' (size 10, shape (?, 10)) "
            "over mesh axis 'model' of size 4, which does not divide "
            "10 on mesh 2x4; valid for this dimension: null or data; "
            "'layout.extra_rules={head/output:[data,null]}' replaces the rule with one that keeps it whole"
        )
    ]
    assert bad.outputs == ()


def test_to_dict_has_every_key_and_is_json():
    variables = [var("dense/kernel", 64, 256), var("dense/bias", 256)]
    outputs = [TensorSpec("dense/output", (None, 256), is_output=True)]
    plan = plan_of(
        variables, [rule("dense/kernel", None, "model"), rule("dense/output", "data", None)], outputs=outputs
    )
    data = plan.to_dict()
    assert set(data) == {
        "status",
        "model",
        "mesh",
        "optimizer",
        "variables",
        "optimizer_variables",
        "outputs",
        "per_device",
        "largest_replicated",
        "errors",
        "warnings",
        "processes",
    }
    assert data["status"] == "ok"
    assert data["processes"] == {
        "count": 1,
        "devices_per_process": 8,
        "axes_across_processes": [],
        "batch_shares": 1,
    }
    assert data["model"] == {
        "name": "toy",
        "params": 64 * 256 + 256,
        "params_bytes": (64 * 256 + 256) * 4,
        "trainable_params": 64 * 256 + 256,
        "frozen_params": 0,
    }
    assert data["mesh"] == {
        "shape": [2, 4],
        "axis_names": ["data", "model"],
        "batch_axis": "data",
        "devices": 8,
        "dcn": [1, 1],
        "across_processes": [],
        "axes": [
            {"name": "data", "size": 2, "in_process": 2, "across_processes": 1},
            {"name": "model", "size": 4, "in_process": 4, "across_processes": 1},
        ],
    }
    assert data["optimizer"] == "adam"
    assert data["per_device"] == {
        "params_bytes": plan.params_bytes_per_device,
        "optimizer_bytes": plan.optimizer_bytes_per_device,
        "total_bytes": plan.params_bytes_per_device + plan.optimizer_bytes_per_device,
    }
    assert data["variables"][0] == {
        "path": "dense/kernel",
        "shape": [64, 256],
        "dtype": "float32",
        "rule": "dense/kernel",
        "origin": "rules",
        "spec": [None, "model"],
        "bytes": 65536,
        "bytes_per_device": 16384,
        "trainable": True,
    }
    assert (
        data["variables"][1]["rule"] is None
        and data["variables"][1]["spec"] == [None]
        and "origin" not in data["variables"][1]
    )
    slots = data["optimizer_variables"]
    assert [("reference" in s) for s in slots] == [False, False, True, True, True, True]
    assert slots[2]["reference"] == "dense/kernel" and slots[2]["spec"] == [None, "model"]
    assert data["outputs"] == [
        {"path": "dense/output", "shape": [None, 256], "rule": "dense/output", "spec": ["data", None]}
    ]
    assert json.loads(json.dumps(data)) == data  # plain JSON types only


def test_format_bytes():
    assert format_bytes(0) == "0 B"
    assert format_bytes(512) == "512 B"
    assert format_bytes(1023) == "1023 B"
    assert format_bytes(1024) == "1.00 KiB"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(MIB) == "1.00 MiB"
    assert format_bytes(MIB - 1) == "1024.00 KiB"  # rounded, not promoted
    assert format_bytes(2 * GIB) == "2.00 GiB"
    assert format_bytes(3_360_129_024) == "3.13 GiB"
    assert format_bytes(1 << 40) == "1.00 TiB"
    assert format_bytes(1 << 50) == "1024.00 TiB"  # no unit beyond TiB


# --- the tables, rendered -------------------------------------------------------------------------


def rendered(plan, width=None, terminal=False) -> str:
    """What `meshrun plan` prints for `plan`: on a terminal `width` columns wide, or into a pipe."""
    from rich.console import Console

    from meshrun.report.render import render_plan

    console = Console(file=io.StringIO(), width=width, force_terminal=terminal, color_system=None)
    render_plan(plan.to_dict(), console=console)
    return console.file.getvalue()


def table_cells(text: str, column: str) -> list[str]:
    """The whole text of `column` in each row of the plan table (the first table), its folded lines joined."""
    lines = text.splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith("┃"))
    index = [cell.strip() for cell in lines[start].split("┃")].index(column)
    cells = []
    for line in lines[start + 1 :]:
        if line.startswith("└"):
            break
        if not line.startswith("│"):
            continue
        parts = [cell.strip() for cell in line.split("│")]
        if parts[1]:  # a row's first line names its path; the lines after it continue its cells
            cells.append(parts[index])
        elif cells:
            cells[-1] += parts[index]
    return cells


LONG_RULE = r"block_\d+/attention/(query|key|value|query_norm|key_norm)/kernel"


def test_rules_are_shown_whole_on_a_narrow_terminal():
    variables = [
        var(f"block_{n}/attention/{p}/kernel", 64, 8, 8) for n in range(2) for p in ("query", "key", "value")
    ]
    plan = plan_of(variables, [rule(LONG_RULE, None, "model", None)])
    text = rendered(plan, width=90, terminal=True)
    assert max(map(len, text.splitlines())) <= 90
    assert table_cells(text, "rule")[:3] == [LONG_RULE] * 3


def test_a_plan_counts_the_models_parameters():
    plan = plan_of(
        [var("dense/kernel", 64, 256), var("dense/bias", 256)], [rule("dense/kernel", None, "model")]
    )
    row = next(line for line in rendered(plan).splitlines() if "model parameters" in line)
    assert "16,640 (65.00 KiB unsharded)" in row


def test_seed_generators_share_a_row_per_kind_whatever_their_numbers():
    # GPT-2's 36 layers: 3 seed generators each, numbered 1..108 across the model.
    variables = [var("token_embedding/embeddings", 512, 64)]
    for n in range(36):
        variables += [
            var(
                f"transformer_layer_{n}/self_attention/seed_generator_{3 * n + 1}/seed_generator_state",
                2,
                dtype="uint32",
                itemsize=4,
            ),
            *(
                var(
                    f"transformer_layer_{n}/seed_generator_{3 * n + k}/seed_generator_state",
                    2,
                    dtype="uint32",
                    itemsize=4,
                )
                for k in (2, 3)
            ),
        ]
    text = rendered(plan_of(variables, mesh=MESH_8X1))
    paths = table_cells(text, "path")
    assert paths == [
        "token_embedding/embeddings",
        "transformer_layer_{0..35}/self_attention/seed_generator_{36 in 1..106}/seed_generator_state",
        "transformer_layer_{0..35}/seed_generator_{72 in 2..108}/seed_generator_state",
    ]
    assert max(map(len, text.splitlines())) < 200


# The docs' example of regex rules on the command line (docs/concepts.md, "Rules on the command line"),
# run as written.
DOCS_REGEX_RULES = (
    r"meshrun plan model=transformer mesh=2x4 'layout.rules={block_\d+/attention/\(query|key|value\)/kernel:"
    r"[null,model,null],block_\[01\]/mlp_up/kernel:[null,model]}'"
)


@pytest.mark.integration
def test_the_docs_regex_rules_parse_on_the_command_line_as_written(capsys):
    import jax  # noqa: F401  started here with conftest's 8 devices: a plan would start it with 1, and later tests need 8

    from meshrun import cli

    assert DOCS_REGEX_RULES in (Path(__file__).parents[1] / "docs" / "concepts.md").read_text()
    _meshrun, *args = shlex.split(DOCS_REGEX_RULES)
    cli.main([*args, "--json"])
    plan = json.loads(capsys.readouterr().out)
    rules = {v["path"]: (v["rule"], v["spec"]) for v in plan["variables"]}
    assert rules["block_1/attention/value/kernel"] == (
        r"block_\d+/attention/(query|key|value)/kernel",
        [None, "model", None],
    )
    assert rules["block_0/mlp_up/kernel"] == ("block_[01]/mlp_up/kernel", [None, "model"])
    assert plan["errors"] == []


# --- the 7B-class transformer in a fresh process --------------------------------------------------

# transformer preset 7b (meshrun/models/transformer.py), written out here so the test checks the
# model against these numbers rather than against itself.
P7B = {"layers": 32, "d_model": 4096, "heads": 32, "ff": 16384, "vocab": 32000, "seq_len": 2048}


def transformer_shapes(layers, d_model, heads, ff, vocab, seq_len):
    """Every variable of the untied-head transformer and its shape, in model order."""
    head_dim = d_model // heads
    shapes = {
        "token_embedding/embeddings": (vocab, d_model),
        "position_embedding/embeddings": (seq_len, d_model),
    }
    for n in range(layers):
        b = f"block_{n}"
        shapes[f"{b}/ln_1/gamma"] = shapes[f"{b}/ln_1/beta"] = (d_model,)
        for proj in ("query", "key", "value"):
            shapes[f"{b}/attention/{proj}/kernel"] = (d_model, heads, head_dim)
            shapes[f"{b}/attention/{proj}/bias"] = (heads, head_dim)
        shapes[f"{b}/attention/attention_output/kernel"] = (heads, head_dim, d_model)
        shapes[f"{b}/attention/attention_output/bias"] = (d_model,)
        shapes[f"{b}/ln_2/gamma"] = shapes[f"{b}/ln_2/beta"] = (d_model,)
        shapes[f"{b}/mlp_up/kernel"] = (d_model, ff)
        shapes[f"{b}/mlp_up/bias"] = (ff,)
        shapes[f"{b}/mlp_down/kernel"] = (ff, d_model)
        shapes[f"{b}/mlp_down/bias"] = (d_model,)
    shapes["final_norm/gamma"] = shapes["final_norm/beta"] = (d_model,)
    shapes["head/embeddings"] = (vocab, d_model)
    return shapes


def tp_spec(path: str, rank: int) -> tuple:
    """Where configs/layout/transformer_tp.yaml puts a variable (Megatron-style over `model`)."""
    name = path.split("/", 1)[1] if path.startswith("block_") else path
    table = {
        "token_embedding/embeddings": ("model", None),
        "head/embeddings": ("model", None),
        "position_embedding/embeddings": (None, "model"),
        "attention/query/kernel": (None, "model", None),
        "attention/key/kernel": (None, "model", None),
        "attention/value/kernel": (None, "model", None),
        "attention/query/bias": ("model", None),
        "attention/key/bias": ("model", None),
        "attention/value/bias": ("model", None),
        "attention/attention_output/kernel": ("model", None, None),
        "mlp_up/kernel": (None, "model"),
        "mlp_up/bias": ("model",),
        "mlp_down/kernel": ("model", None),
    }
    return table.get(name, (None,) * rank)


@pytest.mark.e2e
def test_7b_transformer_plans_fast_in_little_memory_with_exact_bytes(tmp_path):
    done = run_measured(
        ["plan", "model=transformer", "model.preset=7b", "mesh=1x8", "layout=transformer_tp", "--json"],
        tmp_path,
    )
    rc, stdout, stderr, wall, peak_rss = (
        done.returncode,
        done.stdout,
        done.stderr,
        done.wall_s,
        done.peak_rss_bytes,
    )
    assert rc == 0, stderr
    assert "Traceback" not in stderr
    assert 0 < peak_rss < 2 * GIB, f"peak RSS {format_bytes(peak_rss)}"
    assert wall < 60, f"{wall:.1f} s"
    assert list(tmp_path.iterdir()) == []
    plan = json.loads(stdout)
    assert plan["status"] == "ok" and plan["errors"] == [] and plan["warnings"] == []
    assert {
        k: plan["mesh"][k]
        for k in ("shape", "axis_names", "batch_axis", "devices", "dcn", "across_processes")
    } == {
        "shape": [1, 8],
        "axis_names": ["data", "model"],
        "batch_axis": "data",
        "devices": 8,
        "dcn": [1, 1],
        "across_processes": [],
    }
    assert plan["optimizer"] == "adam"

    # Variables: exactly the preset's, shapes and all.
    shapes = transformer_shapes(**P7B)
    variables = {v["path"]: v for v in plan["variables"]}
    assert [v["path"] for v in plan["variables"]] == list(shapes)
    params = sum(math.prod(s) for s in shapes.values())
    d, ff, vocab, layers = P7B["d_model"], P7B["ff"], P7B["vocab"], P7B["layers"]
    per_block = 4 * d * d + 4 * d + 2 * d * ff + ff + d + 4 * d  # attention, MLP, two layer norms
    assert params == layers * per_block + 2 * vocab * d + P7B["seq_len"] * d + 2 * d
    assert 6.7e9 < params < 6.8e9  # 7B-class
    assert plan["model"] == {
        "name": "transformer",
        "params": params,
        "params_bytes": params * 4,
        "trainable_params": params,
        "frozen_params": 0,
    }

    params_per_device = 0
    for path, shape in shapes.items():
        v = variables[path]
        spec = tp_spec(path, len(shape))
        sharded = "model" in spec
        total = math.prod(shape) * 4
        assert total % 8 == 0
        expected = total // 8 if sharded else total
        assert (tuple(v["shape"]), v["dtype"], tuple(v["spec"])) == (shape, "float32", spec), path
        assert (v["bytes"], v["bytes_per_device"]) == (total, expected), path
        assert (v["rule"] is None) == (not sharded), path
        params_per_device += expected

    assert variables["block_31/mlp_up/kernel"]["spec"] == [None, "model"]
    assert variables["block_31/mlp_up/kernel"]["bytes_per_device"] == 4096 * 16384 * 4 // 8
    assert variables["block_0/attention/attention_output/kernel"]["spec"] == ["model", None, None]
    assert variables["token_embedding/embeddings"]["spec"] == ["model", None]
    assert variables["token_embedding/embeddings"]["rule"] == "(token_embedding|head)/embeddings"
    assert variables["block_0/ln_1/gamma"] == {
        "path": "block_0/ln_1/gamma",
        "shape": [4096],
        "dtype": "float32",
        "rule": None,
        "spec": [None],
        "bytes": 16384,
        "bytes_per_device": 16384,
        "trainable": True,
    }

    # Adam: a momentum and a velocity mirroring every variable, plus its own replicated scalars.
    mirrored = [s for s in plan["optimizer_variables"] if "reference" in s]
    scalars = [s for s in plan["optimizer_variables"] if "reference" not in s]
    assert len(mirrored) == 2 * len(shapes)
    for s in mirrored:
        v = variables[s["reference"]]
        assert s["path"] in (
            f"adam/{v['path'].replace('/', '_')}_momentum",
            f"adam/{v['path'].replace('/', '_')}_velocity",
        )
        assert (s["shape"], s["dtype"], s["spec"], s["rule"], s["bytes_per_device"]) == (
            v["shape"],
            v["dtype"],
            v["spec"],
            v["rule"],
            v["bytes_per_device"],
        )
    assert sorted(s["reference"] for s in mirrored) == sorted(list(shapes) * 2)
    assert sorted(s["path"] for s in scalars) == ["adam/iteration", "adam/learning_rate"]
    for s in scalars:
        itemsize = np.dtype(s["dtype"]).itemsize
        assert (s["shape"], s["spec"], s["rule"]) == ([], [], None)
        assert s["bytes"] == s["bytes_per_device"] == itemsize
    scalar_bytes = sum(s["bytes"] for s in scalars)

    assert plan["per_device"] == {
        "params_bytes": params_per_device,
        "optimizer_bytes": 2 * params_per_device + scalar_bytes,
        "total_bytes": 3 * params_per_device + scalar_bytes,
    }
    # The recipe of this plan states its figures as the plan prints them.
    recipe = (Path(__file__).parents[1] / "recipes" / "transformer_7b_tp.yaml").read_text()
    assert (
        f"{format_bytes(params_per_device)} of parameters and {format_bytes(2 * params_per_device)} of Adam"
        in recipe
    )
    assert plan["outputs"] == [
        {
            "path": "head/output",
            "shape": [None, P7B["seq_len"], vocab],
            "rule": "head/output",
            "spec": ["data", None, "model"],
        }
    ]
    # The largest replicated: 16 KiB norms and row-parallel biases (d_model floats each).
    assert [r["bytes"] for r in plan["largest_replicated"]] == [d * 4] * 5
    assert all(variables[r["path"]]["rule"] is None for r in plan["largest_replicated"])


# --- the CLI --------------------------------------------------------------------------------------


def plan_env(tmp_path: Path) -> dict:
    """Environment for a plan subprocess: a private TMPDIR (to see that plan's scratch run dir goes)."""
    scratch = tmp_path / "tmpdir"
    scratch.mkdir()
    return {**os.environ, "TMPDIR": str(scratch)}


def run_plan(args, tmp_path, env=None):
    """`python -m meshrun plan ARGS` in an empty working dir below tmp_path (with `env` added to
    the environment); returns the CompletedProcess after checking that it left nothing behind,
    neither there nor in TMPDIR."""
    cwd = tmp_path / "work"
    cwd.mkdir(parents=True)
    env = {**plan_env(tmp_path), **(env or {})}
    done = subprocess.run(
        [sys.executable, "-m", "meshrun", "plan", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert list(cwd.iterdir()) == [], "plan wrote into the working dir"
    assert list(Path(env["TMPDIR"]).iterdir()) == [], "plan left its scratch run dir behind"
    return done


@dataclass
class Planned:
    """What `meshrun plan` gave in this process: its exit status and what it printed."""

    returncode: int
    stdout: str
    stderr: str


def plan_in_process(args, tmp_path, capsys, monkeypatch, env=None) -> Planned:
    """`meshrun plan ARGS` as run_plan runs it (an empty working dir below tmp_path, a private
    TMPDIR, `env` added to the environment, the same checks that it left nothing behind), but in
    this test process: the same CLI without a fresh process's start-up."""
    import tempfile

    import jax  # noqa: F401  started here with conftest's 8 devices: a plan would start it with 1, and later tests need 8

    from meshrun import cli

    cwd = tmp_path / "work"
    cwd.mkdir(parents=True)
    scratch = plan_env(tmp_path)["TMPDIR"]
    for key, value in {"TMPDIR": scratch, **(env or {})}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(tempfile, "tempdir", scratch)
    monkeypatch.chdir(cwd)
    capsys.readouterr()
    try:
        cli.main(["plan", *args])
        returncode = 0
    except SystemExit as exit_info:
        returncode = exit_info.code if isinstance(exit_info.code, int) else 1
    out, err = capsys.readouterr()
    assert list(cwd.iterdir()) == [], "plan wrote into the working dir"
    assert list(Path(scratch).iterdir()) == [], "plan left its scratch run dir behind"
    monkeypatch.undo()
    return Planned(returncode, out, err)


@pytest.mark.e2e
def test_json_for_the_default_tiny_transformer(tmp_path):
    done = run_plan(["model=transformer", "mesh=2x4", "--json"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.startswith("{\n")  # one job: pretty JSON
    plan = json.loads(done.stdout)
    assert plan["status"] == "ok" and plan["errors"] == []
    assert plan["model"]["name"] == "transformer"
    assert plan["mesh"]["shape"] == [2, 4] and plan["mesh"]["devices"] == 8
    shapes = transformer_shapes(layers=2, d_model=64, heads=8, ff=256, vocab=512, seq_len=32)
    del shapes["head/embeddings"]  # the tiny preset ties its head to the token embedding
    assert {v["path"]: tuple(v["shape"]) for v in plan["variables"]} == shapes
    assert plan["model"]["params"] == sum(math.prod(s) for s in shapes.values())
    for v in plan["variables"]:
        spec = tp_spec(v["path"], len(v["shape"]))
        assert tuple(v["spec"]) == spec, v["path"]
        assert v["bytes_per_device"] == math.prod(v["shape"]) * 4 // (4 if "model" in spec else 1)
    assert plan["per_device"]["params_bytes"] == sum(v["bytes_per_device"] for v in plan["variables"])


@pytest.mark.integration
def test_tables_name_every_variable_and_the_totals(tmp_path, capsys, monkeypatch):
    done = plan_in_process(["model=transformer", "mesh=2x4", "--full"], tmp_path, capsys, monkeypatch)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "plan: transformer on mesh 2x4 ('data', 'model'), all float32" in out  # one dtype: no dtype column
    assert "per device (8 devices)" in out
    for header in ("path", "shape", "rule", "spec", "bytes/device"):
        assert header in out
    assert "block_1/attention/attention_output/kernel" in out
    assert "(token_embedding|head)/embeddings" in out
    assert "(model, None, None)" in out
    assert "replicated" in out and "optimizer state (adam)" in out
    assert "replicated: block_0/ln_1/gamma" in out
    assert "lint" not in out  # nothing to report: no lint table
    rows = [line for line in out.splitlines() if "block_0/mlp_up/kernel" in line]
    assert len(rows) == 1 and "64x256" in rows[0] and "16.00 KiB" in rows[0]  # 64*256*4 / 4


@pytest.mark.integration
@pytest.mark.parametrize(
    "overrides, errors",
    [
        # An MLP width of 250 does not split over a `model` axis of 4: mlp_up's kernel and bias, mlp_down's
        # kernel (heads that do not divide would stay whole: transformer_tp lets them).
        (["model.ff=250"], 3),
        # The cnn's rules match nothing in a transformer.
        (["layout=cnn"], 5),
    ],
    ids=["indivisible-mlp", "rules-match-nothing"],
)
def test_lint_errors_exit_2_with_one_stderr_line_each(tmp_path, overrides, errors, capsys, monkeypatch):
    done = plan_in_process(
        ["model=transformer", "mesh=2x4", *overrides, "--json"], tmp_path, capsys, monkeypatch
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    plan = json.loads(done.stdout)
    assert plan["status"] == "error"
    assert len(plan["errors"]) == errors
    assert all(e.startswith("layout.rules") for e in plan["errors"])
    assert done.stderr.splitlines() == [f"meshrun: error: {e}" for e in plan["errors"]]


ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.mark.integration
def test_a_plan_collapses_repeated_blocks_and_never_wraps_a_path(tmp_path, capsys, monkeypatch):
    narrow = plan_in_process(
        ["model=transformer", "model.layers=12", "mesh=2x4"],
        tmp_path / "narrow",
        capsys,
        monkeypatch,
        env={"COLUMNS": "100", "TTY_COMPATIBLE": "1"},
    )
    assert narrow.returncode == 0, narrow.stderr
    lines = ANSI.sub("", narrow.stdout).splitlines()
    assert max(map(len, lines)) <= 100
    paths = table_cells(ANSI.sub("", narrow.stdout), "path")
    assert "block_{0..11}/attention/query/kernel" in paths and "block_{0..11}/ln_{1..2}/gamma" in paths
    assert "token_embedding/embeddings" in paths and not any(p.startswith("block_0/") for p in paths)
    assert len(paths) < 40  # 12 blocks of 16 variables each would be 199 rows
    assert r"block_\d+/attention/(query|key|value)/kernel" in table_cells(
        ANSI.sub("", narrow.stdout), "rule"
    )  # folded, whole

    full = plan_in_process(
        ["model=transformer", "model.layers=12", "mesh=2x4", "--full"], tmp_path / "full", capsys, monkeypatch
    )
    assert full.returncode == 0, full.stderr
    full_paths = [line.split("│")[1].strip() for line in full.stdout.splitlines() if line.startswith("│ ")]
    assert "block_11/attention/query/kernel" in full_paths and not any("{" in p for p in full_paths)
    piped_widths = {len(line) for line in full.stdout.splitlines() if line.startswith("│ block_")}
    assert len(piped_widths) == 1  # off a terminal the table is printed whole, one line per row


IDLE_MODEL_AXIS = (
    "mesh axis 'model' (size 4) shards no variable, so every step is computed 4 times over; "
    "pick a layout that uses it (layout=...) or give it size 1"
)


@pytest.mark.integration
def test_a_mesh_axis_that_shards_nothing_is_a_warning(tmp_path, capsys, monkeypatch):
    done = plan_in_process(
        ["-m", "layout=replicated,dense_model", "mesh=2x4", "--json"], tmp_path, capsys, monkeypatch
    )
    assert done.returncode == 0, done.stderr
    replicated, dense = [json.loads(line) for line in done.stdout.splitlines()]
    assert replicated["warnings"] == [IDLE_MODEL_AXIS]
    assert dense["warnings"] == []


@pytest.mark.integration
def test_multirun_prints_one_json_line_per_job(tmp_path, capsys, monkeypatch):
    done = plan_in_process(
        ["-m", "model=transformer", "mesh=2x4,1x8", "--json"], tmp_path, capsys, monkeypatch
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2, done.stdout[:2000]
    plans = [json.loads(line) for line in lines]
    assert [p["mesh"]["shape"] for p in plans] == [[2, 4], [1, 8]]
    # Each line says which job it is: the layout, every config group choice and the overrides.
    assert [p["layout"] for p in plans] == ["transformer_tp", "transformer_tp"]
    assert [(p["choices"]["model"], p["choices"]["mesh"]) for p in plans] == [
        ("transformer", "2x4"),
        ("transformer", "1x8"),
    ]
    assert [p["overrides"] for p in plans] == [
        ["model=transformer", "mesh=2x4"],
        ["model=transformer", "mesh=1x8"],
    ]
    assert [p["status"] for p in plans] == ["ok", "ok"]
    assert plans[0]["model"]["params"] == plans[1]["model"]["params"]
    embedding = [next(v for v in p["variables"] if v["path"] == "token_embedding/embeddings") for p in plans]
    assert [e["bytes_per_device"] for e in embedding] == [512 * 64 * 4 // 4, 512 * 64 * 4 // 8]


@pytest.mark.integration
def test_an_explicit_mesh_larger_than_this_machine_plans(tmp_path, capsys, monkeypatch):
    # 256 devices: plan needs none for an explicit shape. The 1b preset (16 heads, d_model 2048,
    # ff 8192, vocab 32000) divides 16 ways on both axes.
    done = plan_in_process(
        ["mesh=16x16", "model=transformer", "model.preset=1b", "layout=transformer_2d", "--json"],
        tmp_path,
        capsys,
        monkeypatch,
    )
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["status"] == "ok"
    assert plan["mesh"]["devices"] == 256 and plan["mesh"]["shape"] == [16, 16]
    variables = {v["path"]: v for v in plan["variables"]}
    emb = variables["token_embedding/embeddings"]
    assert emb["spec"] == ["model", "data"]
    assert emb["bytes_per_device"] == 32000 * 2048 * 4 // 256
    query = variables["block_23/attention/query/kernel"]
    assert query["spec"] == ["data", "model", None]
    assert query["bytes_per_device"] == 2048 * 16 * 128 * 4 // 256
    assert variables["block_0/mlp_down/bias"]["bytes_per_device"] == 2048 * 4  # replicated
