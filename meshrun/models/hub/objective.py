"""What model=keras_hub trains on and what a step of it costs: the next-token loss (averaged over
the labels that weigh, not every position) and the analytic FLOPs of a train step, beside XLA's
count.
"""

from __future__ import annotations

import math

from meshrun.models.hub.layouts import UNTIED_HEAD
from meshrun.models.hub.options import KerasHubOptions


def next_token_loss(options: KerasHubOptions):
    """Cross-entropy of the logits over the labels that weigh: divided by the sum of the sample
    weights (the real tokens), not by every position."""
    import keras

    return keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="mean_with_sample_weight", name="next_token_crossentropy"
    )


def analytic_flops(options: KerasHubOptions, batch_size: int, variables) -> float:
    """(4 * N + 2 * T) * tokens for one train step, N the parameters that take part in a matmul for
    every token (all of them except the input embedding table when the head has its own (untied),
    position embeddings and non-float state) and T those of them that train: 2 N for the forward
    pass, 2 N for the gradients of the activations, 2 T for the gradients of the weights (6 N when
    every weight trains; much less under LoRA). Attention's score and value products are left out."""
    paths = {p.path for p in variables}
    untied = UNTIED_HEAD in paths

    def in_matmuls(p) -> bool:
        lookup = p.path == "token_embedding/embeddings" and untied
        return not lookup and "position_embedding" not in p.path and p.dtype.startswith(("float", "bfloat"))

    matmuls = [p for p in variables if in_matmuls(p)]
    params = sum(math.prod(p.shape) for p in matmuls)
    trained = sum(math.prod(p.shape) for p in matmuls if p.trainable)
    return (4.0 * params + 2.0 * trained) * batch_size * options.seq_len
