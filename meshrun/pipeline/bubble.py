"""The idle share of a pipeline schedule, plain arithmetic (no jax), for plans and benchmarks."""


def bubble_fraction(stages: int, microbatches: int) -> float:
    """The share of a GPipe step each stage waits idle: (S - 1) / (M + S - 1)."""
    return (stages - 1) / (microbatches + stages - 1)
