"""Hybrid meshes: `mesh.dcn` says how many processes (hosts) each mesh axis spans across the slow
network. Its parsing and checks, the default for a job of several processes, the device order jax's
create_hybrid_device_mesh gives, the plan's figures (the axes across processes, what a step sends
between them) and warning, layout=auto and sweeps keeping tensor parallelism within processes, and
the plan from the CLI. The two-process jobs that train on such a mesh are in test_multiprocess.py."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from conftest import cli_here, error_line_here
from meshrun.app import shapes_within_processes
from meshrun.config.layout_schema import LayoutRule, MeshConfig
from meshrun.config.parse import parse_run_config
from meshrun.config.slices import spans, with_dcn
from meshrun.errors import ConfigError
from meshrun.placement.auto import derive_layout
from meshrun.placement.devices import mesh_order
from meshrun.placement.layout import TensorSpec
from meshrun.placement.plan import make_plan
from meshrun.placement.traffic import Activations
from meshrun.run.build import AbstractModel

TWO = "distributed.local_processes=2"


def mesh(shape, names=("data", "model"), batch="data", dcn=None) -> MeshConfig:
    return MeshConfig(
        shape=tuple(shape), axis_names=tuple(names), batch_axis=batch, dcn=tuple(dcn) if dcn else None
    )


def raw(**sections) -> dict:
    base = {"mesh": {"shape": "2x4"}, "model": {"name": "dense_model"}}
    return {**base, **{k: {**base.get(k, {}), **v} for k, v in sections.items()}}


# --- mesh.dcn read and checked ------------------------------------------------------------------


@pytest.mark.parametrize("given", [[1, 2], "1x2"])
def test_dcn_is_read_as_a_list_or_as_shape_text(given):
    config = parse_run_config(raw(mesh={"dcn": given}, distributed={"local_processes": 2}))
    assert config.mesh.dcn == (1, 2)


@pytest.mark.parametrize(
    "sections, message",
    [
        (
            {"mesh": {"dcn": [2]}, "distributed": {"local_processes": 2}},
            "mesh.dcn: got [2] (1 size) for the 2-D mesh 2x4; give one "
            "slice count per axis (data or model), e.g. mesh.dcn=[2,1]",
        ),
        (
            {"mesh": {"dcn": [1, 3]}},
            "mesh.dcn: got [1, 3]: 3 slices do not divide axis 'model' "
            "of size 4 (mesh 2x4); valid for that axis: 1, 2 or 4",
        ),
        (
            {"mesh": {"dcn": [0, 1]}},
            "mesh.dcn: got [0, 1]; expected one positive slice count per mesh axis, e.g. mesh.dcn=[2,1] (the "
            "first axis spans 2 processes), or null for the default",
        ),
        (
            {"mesh": {"dcn": [2, 2]}, "distributed": {"local_processes": 2}},
            "mesh.dcn: got [2, 2], 4 slices, but the job has 2 processes (distributed.local_processes); give "
            "slice counts whose product is 2, one slice per process",
        ),
        (
            {"mesh": {"dcn": [2, 1]}},
            "mesh.dcn: got [2, 1], 2 slices, but the job has 1 process (distributed.mode=off); give slice "
            "counts whose product is 1, one slice per process",
        ),
    ],
)
def test_bad_dcn_is_one_error_naming_the_key_the_value_and_what_is_valid(sections, message):
    with pytest.raises(ConfigError) as caught:
        parse_run_config(raw(**sections))
    assert str(caught.value) == message


def test_a_dcn_of_a_mesh_with_minus_one_is_checked_once_the_devices_fill_it():
    filled = mesh((4, 2), dcn=(3, 1))
    with pytest.raises(ConfigError, match="3 slices do not divide axis 'data' of size 4"):
        with_dcn(filled, 3)


# --- the default and the device order ---------------------------------------------------------


@pytest.mark.parametrize(
    "shape, names, batch, processes, expected",
    [
        ((2, 4), ("data", "model"), "data", 1, (1, 1)),
        ((2, 4), ("data", "model"), "data", 2, (2, 1)),  # the batch axis across processes
        ((2, 4), ("model", "data"), "data", 2, (1, 2)),  # wherever it stands
        ((2, 4), ("data", "model"), "data", 4, (2, 2)),  # then the others, outermost first
        ((1, 8), ("data", "model"), "data", 2, (1, 2)),  # a batch axis of 1 cannot
        (
            (2, 2, 2),
            ("stage", "data", "model"),
            "data",
            2,
            (2, 1, 1),
        ),  # stages first: their steps send little
    ],
)
def test_the_default_dcn_puts_stages_then_the_batch_axis_across_processes(
    shape, names, batch, processes, expected
):
    assert with_dcn(mesh(shape, names, batch), processes, first=("stage",)).dcn == expected


def test_a_mesh_that_cannot_be_cut_into_one_slice_per_process_is_one_error():
    with pytest.raises(ConfigError) as caught:
        with_dcn(mesh((6,), names=("data",)), 4, key="distributed.num_processes")
    assert str(caught.value) == (
        "mesh.dcn: mesh 6 cannot be cut along its axes into 4 equal slices, one per process "
        "(distributed.num_processes); give mesh.dcn, one "
        "slice count per axis with product 4, or another shape"
    )


def owners(mesh: MeshConfig) -> list[int]:
    """The process holding each device of `mesh`, devices in mesh (row-major) order: the slices,
    numbered row-major over the dcn shape, each a contiguous block."""
    parts = spans(mesh)
    owner = []
    for flat in range(math.prod(mesh.shape)):
        slice_index, rest = 0, flat
        coords = []
        for part in reversed(parts):
            coords.append(rest % part.size)
            rest //= part.size
        for part, coord in zip(parts, reversed(coords), strict=True):
            slice_index = slice_index * part.across_processes + coord // part.in_process
        owner.append(slice_index)
    return owner


@pytest.mark.parametrize("dcn", [(2, 1), (1, 2), (2, 2)])
def test_each_process_holds_one_contiguous_slice_of_the_mesh_in_the_order_jax_gives(dcn):
    hybrid = mesh((2, 4), dcn=dcn)
    processes = dcn[0] * dcn[1]
    per_process = 8 // processes
    devices = [
        SimpleNamespace(id=i, process_index=i // per_process, device_kind="cpu", platform="cpu")
        for i in range(8)
    ]
    ordered = mesh_order(devices, hybrid, processes)
    assert [d.process_index for d in ordered] == owners(hybrid)
    grid = [ordered[row * 4 : (row + 1) * 4] for row in range(2)]
    in_data, in_model = (span.in_process for span in spans(hybrid))
    for process in range(processes):  # its devices form one in_data x in_model block of the grid
        cells = [(r, c) for r in range(2) for c in range(4) if grid[r][c].process_index == process]
        rows, cols = {r for r, _ in cells}, {c for _, c in cells}
        assert len(rows) == in_data and len(cols) == in_model and max(cols) - min(cols) == in_model - 1


# --- the plan: across processes, the slow network, the warning -----------------------------------


def planned(variables, rules, hybrid, processes, samples=16, outputs=()):
    abstract = AbstractModel(tensors=tuple(variables) + tuple(outputs), slots=())
    activations = Activations(samples=samples, itemsize=4, layer_positions={"attn": 32})
    return make_plan("toy", hybrid, tuple(rules), abstract, "adam", processes, activations=activations)


KERNEL = TensorSpec("dense/kernel", (64, 256))  # 64 KiB


def test_gradients_all_reduce_over_the_batch_axis_across_processes():
    plan = planned([KERNEL], [], mesh((2, 4), dcn=(2, 1)), 2)
    data = plan.to_dict()
    assert data["mesh"]["across_processes"] == ["data"]
    assert data["mesh"]["axes"] == [
        {"name": "data", "size": 2, "in_process": 1, "across_processes": 2},
        {"name": "model", "size": 4, "in_process": 4, "across_processes": 1},
    ]
    # A ring all-reduce over 2 processes sends 2 x 1/2 of the 64 KiB gradient from each.
    assert data["slow_network"] == {
        "bytes_per_step": 65536,
        "gradients": 65536,
        "fsdp_all_gathers": 0,
        "tensor_activations": 0,
        "stage_activations": 0,
        "tensor_axes_across_processes": [],
    }
    assert not [w for w in plan.warnings if "slow network" in w]


def test_fsdp_variables_are_gathered_and_reduce_scattered_across_processes():
    plan = planned([KERNEL], [LayoutRule("dense/kernel", ("data", "model"))], mesh((2, 4), dcn=(2, 1)), 2)
    assert plan.traffic.fsdp_all_gathers == 65536 // 2 and plan.traffic.gradients == 65536 // 2


def test_tensor_parallelism_across_processes_costs_activations_and_is_a_warning_with_the_fix():
    column = LayoutRule("dense/kernel", (None, "model"))
    row = LayoutRule("attn/out/kernel", ("model", None))
    variables = [KERNEL, TensorSpec("attn/out/kernel", (256, 64))]
    plan = planned(variables, [column, row], mesh((2, 4), dcn=(1, 2)), 2)
    # Column-parallel: the input gradient, 16 rows x 64; row-parallel: the output, 16 samples x 32 positions x
    # 64; each all-reduced over 2 processes (2 x 1/2 of it from each), 4 bytes an element.
    assert plan.traffic.tensor_activations == 16 * 64 * 4 + 16 * 32 * 64 * 4
    assert plan.traffic.gradients == 0  # the batch axis stays within each process
    assert plan.warnings[-1] == (
        "mesh axis 'model' splits variables (tensor parallelism) across 2 processes, over the slow network: "
        "about 132.00 KiB of activations a step from each process; keep it within a process: mesh.dcn=[2,1]"
    )


def test_stage_activations_cross_when_the_stage_axis_spans_processes():
    staged = mesh((2, 2, 2), names=("stage", "data", "model"), dcn=(2, 1, 1))
    abstract = AbstractModel(tensors=(KERNEL,), slots=())
    activations = Activations(
        samples=16, itemsize=4, stage_axis="stage", stage_rounds=2, block_output_bytes_per_row=512
    )
    plan = make_plan("toy", staged, (), abstract, "adam", 2, activations=activations)
    assert plan.traffic.stage_activations == 2 * 2 * 16 * 512  # forward and back, twice round, every row
    assert plan.traffic.gradients == 0 and "stage" in plan.to_dict()["mesh"]["across_processes"]


# --- layout=auto and sweeps keep tensor parallelism within processes -------------------------------


def test_layout_auto_splits_nothing_over_an_axis_that_spans_processes_and_says_why():
    variables = [TensorSpec("dense/kernel", (1024, 1024))]
    within = derive_layout(variables, mesh((2, 4), dcn=(2, 1)), 1 << 20, fsdp=False)
    assert [r.axes for r in within.rules] == [(None, "model")] or [r.axes for r in within.rules] == [
        ("model", None)
    ]
    across = derive_layout(variables, mesh((2, 4), dcn=(1, 2)), 1 << 20, fsdp=False)
    assert across.rules == ()
    assert across.warnings == (
        "layout=auto splits nothing over mesh axis 'model': it spans 2 processes (mesh.dcn), and tensor "
        "parallelism over the slow network between them costs more than it "
        "saves; keep that axis within a process (mesh.dcn) or give it size 1",
    )


def test_a_sweep_of_several_processes_leaves_out_shapes_that_split_variables_across_them(capsys):
    config = parse_run_config(raw(distributed={"local_processes": 2}))
    kept = shapes_within_processes([(8, 1), (4, 2), (2, 4), (1, 8)], config, 2, 2)
    assert kept == [(8, 1), (4, 2), (2, 4)]
    assert "left out 1x8" in capsys.readouterr().out


# --- from the CLI ------------------------------------------------------------------------------


@pytest.mark.integration
def test_the_plan_of_a_hybrid_mesh_from_the_cli(in_tmp, capsys):
    """By the CLI in this process: a plan starts no process of the job."""
    done = cli_here(["plan", TWO, "mesh=2x4", "layout=dense_model", "mesh.dcn=[1,2]", "--json"], capsys)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["mesh"]["dcn"] == [1, 2] and plan["mesh"]["across_processes"] == ["model"]
    assert plan["processes"]["batch_shares"] == 1
    # dense_model's d1/kernel (784x200) split column-wise over 'model': its input gradient, 16 rows of 784,
    # crosses.
    assert plan["slow_network"]["tensor_activations"] == 16 * 784 * 4
    assert any(
        w.startswith("mesh axis 'model' splits variables (tensor parallelism) across 2 processes")
        for w in plan["warnings"]
    )
    text = cli_here(["plan", TWO, "mesh=2x4", "layout=dense_model", "mesh.dcn=[1,2]"], capsys)
    assert "data 2 in a process x 1 across; model 2 in a process x 2 across" in text.stdout
    assert "about 49.00 KiB a step from each process (tensor activations 49.00 KiB)" in text.stdout


@pytest.mark.integration
def test_a_dcn_that_does_not_fit_the_processes_is_one_line_before_any_process_starts(in_tmp, capsys):
    """By the CLI in this process, the launcher that would start the job's processes."""
    line = error_line_here(["train", TWO, "mesh=2x4", "mesh.dcn=[2,2]"], capsys)
    assert line == (
        "meshrun: error: mesh.dcn: got [2, 2], 4 slices, but the job has 2 processes "
        "(distributed.local_processes); give slice counts whose product is 2, one slice per process"
    )
    assert not list(in_tmp.rglob("process-*.log"))
