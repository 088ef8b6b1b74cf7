"""Unit checks of the schema seam: shapes, -1 filling, defaults, batch divisibility (no jax)."""

import pytest

from meshrun.config.checks import check_batch
from meshrun.config.layout_schema import MeshConfig
from meshrun.config.parse import parse_mesh, parse_mesh_shape
from meshrun.errors import ConfigError


@pytest.mark.parametrize(
    "text,shape", [("8", (8,)), ("2x4", (2, 4)), ("2x2x2", (2, 2, 2)), ([1, -1], (1, -1))]
)
def test_mesh_shapes_parse(text, shape):
    assert parse_mesh_shape(text) == shape


@pytest.mark.parametrize("bad", ["2x", "x4", "2*4", "", [], [2, 0], [-1, -1], [2.5, 2], "0x8"])
def test_bad_mesh_shapes_are_config_errors(bad):
    with pytest.raises(ConfigError, match=r"^mesh\.shape: got"):
        parse_mesh_shape(bad)


def test_fill_dimension_takes_the_remaining_devices():
    mesh = parse_mesh({"shape": [2, -1]})
    assert mesh.size is None
    assert mesh.resolved(8).shape == (2, 4)
    with pytest.raises(ConfigError, match="do not divide the 9 available devices"):
        mesh.resolved(9)


def test_default_axis_names_by_rank_and_batch_axis_first():
    assert parse_mesh({"shape": "8"}).axis_names == ("data",)
    mesh = parse_mesh({"shape": "2x4"})
    assert mesh.axis_names == ("data", "model") and mesh.batch_axis == "data"


def test_batch_axis_may_be_any_mesh_axis():
    mesh = parse_mesh({"shape": "2x4", "batch_axis": "model"})
    check_batch(8, mesh)
    with pytest.raises(ConfigError, match="'model' of size 4"):
        check_batch(6, mesh)


def test_batch_check_waits_for_a_fill_batch_axis():
    check_batch(3, MeshConfig(shape=(-1,), axis_names=("data",), batch_axis="data"))
