"""The idle share of a pipeline schedule, plain arithmetic (no jax), for plans and benchmarks."""


def bubble_fraction(stages: int, microbatches: int, repeats: int = 1) -> float:
    """The share of a step each stage waits idle: (S - 1) / (M + S - 1) for GPipe, (S - 1) / (RM + S - 1)
    for the circular schedule, whose stages are R times shorter."""
    return (stages - 1) / (repeats * microbatches + stages - 1)


def stage_of_block(block: int, blocks: int, stages: int, repeats: int = 1) -> int:
    """The stage (device along the stage axis) that holds block `block` of `blocks`: contiguous runs
    of blocks / (S R) blocks go to stages 0, 1, ..., S - 1, then round again R times."""
    return block // (blocks // (stages * repeats)) % stages
