"""Models meshrun can train. Importing this package registers every model module listed here: the
zoo, and the specs that build the user's own models (`python`, `keras_hub`)."""

from meshrun.models import cnn, dense_model, factory, hub, transformer, two_tower  # noqa: F401  (register themselves)
from meshrun.models.registry import ModelSpec, get_model, model_names, register_model, zoo_model_names

__all__ = ["ModelSpec", "get_model", "model_names", "register_model", "zoo_model_names"]
