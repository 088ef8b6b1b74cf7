"""Hydra, as meshrun uses it past its public API: the jobs of a multirun, split as its basic
sweeper splits them; the run mode taken from the command line alone. Importing this module imports
no Hydra."""

from __future__ import annotations

import contextlib

from meshrun.compat.names import PrivateName, ensure, uses

PRIVATE_NAMES = uses(
    "hydra",
    PrivateName(
        "hydra-core",
        "hydra._internal.core_plugins.basic_sweeper",
        "BasicSweeper.split_arguments",
        "the jobs of a multirun, to tell whether they need different device counts",
    ),
    PrivateName(
        "hydra-core",
        "hydra._internal.hydra",
        "Hydra.get_mode",
        "left out: a whole composition of the config only to read hydra.mode, which meshrun leaves to -m",
    ),
)


@contextlib.contextmanager
def run_mode_from_the_command_line():
    """While Hydra's app runs, its choice between one job and a multirun follows `-m` alone, as
    meshrun's own handling of jobs does. Hydra would first compose the whole config once more just
    to read `hydra.mode` from it (Hydra.get_mode): about 0.2 s of every meshrun command. meshrun
    refuses a `hydra.mode` override (meshrun.app), and none of its configs sets one."""
    ensure("hydra")
    from hydra._internal.hydra import Hydra

    composed_for_the_mode = Hydra.get_mode
    Hydra.get_mode = lambda self, config_name, overrides: None
    try:
        yield
    finally:
        Hydra.get_mode = composed_for_the_mode


def split_sweep(parsed_overrides) -> list[list[str]]:
    """The jobs of a multirun: the override list of each job, as Hydra's basic sweeper makes them."""
    ensure("hydra")
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    (jobs,) = BasicSweeper.split_arguments(parsed_overrides, max_batch_size=None)
    return jobs
