"""Layer-wise model parallelism (issue 33): a model's repeated blocks split into contiguous stages
over a `stage` mesh axis, microbatches handed from stage to stage. `schedule` is the GPipe schedule
in jax (shard_map over the stage axis alone, the other mesh axes left to the compiler); `stack` is
the Keras layer that holds the blocks' weights stacked along a leading stage dimension and runs them
through it. Not wired to the config yet."""
