"""Hydra, as meshrun uses it past its public API: the jobs of a multirun, split as its basic
sweeper splits them. Importing this module imports no Hydra."""

from __future__ import annotations

from meshrun.compat.names import PrivateName, ensure, uses

uses(
    "hydra",
    PrivateName("hydra-core", "hydra._internal.core_plugins.basic_sweeper", "BasicSweeper.split_arguments",
                "the jobs of a multirun, to tell whether they need different device counts"),
)


def split_sweep(parsed_overrides) -> list[list[str]]:
    """The jobs of a multirun: the override list of each job, as Hydra's basic sweeper makes them."""
    ensure("hydra")
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    (jobs,) = BasicSweeper.split_arguments(parsed_overrides, max_batch_size=None)
    return jobs
