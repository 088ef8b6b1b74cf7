"""Layer-wise model parallelism (issue 33): a model's repeated blocks split into contiguous stages
over a `stage` mesh axis, microbatches handed from stage to stage. `blocks` is how a model offers its
blocks (`repeated_blocks`, exported here); `schedule` is the GPipe schedule in jax (shard_map over
the stage axis alone, the other mesh axes left to the compiler); `stack` is the Keras layer that
holds the blocks' weights stacked along a leading stage dimension and runs them through it;
`functional` puts one in place of the blocks a functional model already holds (KerasHub's LMs);
`counting` runs them in turn where XLA's cost analysis counts a step's FLOPs."""

from meshrun.pipeline.blocks import repeated_blocks, stages

__all__ = ["repeated_blocks", "stages"]
