"""Keras callbacks as meshrun marks them past Keras' public API: the attribute that lets Keras call
a callback's per-step hooks from worker threads (its CallbackList reads it). Importing this module
imports neither Keras nor jax."""

from __future__ import annotations

from meshrun.compat.names import PrivateName, uses

PRIVATE_NAMES = uses(
    "keras",
    PrivateName(
        "keras",
        "keras.src.callbacks.callback_list",
        "CallbackList",
        "letting Keras fetch step logs on worker threads while "
        "meshrun's callbacks run (their async_safe attribute)",
        source_contains="async_safe",
    ),
)

ASYNC_SAFE = "async_safe"  # the attribute Keras' CallbackList reads on each callback


def mark_async_safe(callback, safe: bool = True):
    """Tells Keras whether it may call the per-step hooks of `callback` (a class or an instance)
    from worker threads while its loop dispatches the next steps; returns `callback`, so it serves
    as a class decorator."""
    setattr(callback, ASYNC_SAFE, safe)
    return callback


def is_async_safe(callback) -> bool:
    """Whether Keras may call the per-step hooks of `callback` from worker threads."""
    return bool(getattr(callback, ASYNC_SAFE, False))
