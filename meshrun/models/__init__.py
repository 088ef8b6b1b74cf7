"""Models meshrun can train. Importing this package registers every model module listed here."""

from meshrun.models import dense_model  # noqa: F401  (registers itself)
from meshrun.models.registry import ModelSpec, get_model, model_names, register_model

__all__ = ["ModelSpec", "get_model", "model_names", "register_model"]
