"""Models meshrun can train: the zoo, and the specs that build the user's own models (`python`,
`keras_hub`). Each module registers its spec; `get_model(name)` imports the module of that name
alone (the table is meshrun.specs.model.MODELS)."""

from meshrun.models.registry import ModelSpec, get_model, model_names, register_model, zoo_model_names

__all__ = ["ModelSpec", "get_model", "model_names", "register_model", "zoo_model_names"]
