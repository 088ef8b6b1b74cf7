"""two_tower: a recommender scoring (user, item) pairs with two embedding tables and two towers.

user_id -> user_embedding -> user_tower (relu) -> user_projection  \
                                                                    dot -> logit (clicked or not)
item_id -> item_embedding -> item_tower (relu) -> item_projection  /

Variable paths: user_embedding/embeddings (num_users, embedding_dim), item_embedding/embeddings
(num_items, embedding_dim), {user,item}_tower/{kernel,bias}, {user,item}_projection/{kernel,bias}.

The tables hold nearly all the parameters; the `large` preset's tables (100M users, 10M items,
128 wide) take 52.5 GiB in float32, more than one device holds, so the two_tower layout (its default)
shards their rows over the `model` axis. Loss: binary cross-entropy on the logit; data: synthetic
id pairs with learnable labels.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshrun.config.fields import setting
from meshrun.models.registry import (
    ModelSpec,
    fill_from_preset,
    register_model,
    require_positive,
)

PRESETS = {
    "small": dict(num_users=8192, num_items=4096, embedding_dim=32, tower_units=64),
    "large": dict(num_users=100_000_000, num_items=10_000_000, embedding_dim=128, tower_units=256),
}


@dataclass(frozen=True)
class TwoTowerOptions:
    """Table sizes and tower width: a named preset, any field of which can be overridden."""

    preset: str = setting(
        "small",
        "The sizes: small, or large (100M users, 10M items, 52.5 GiB of tables); the keys below override it.",
    )
    num_users: int | None = setting(None, "Rows of the user table; null: the preset's.")
    num_items: int | None = setting(None, "Rows of the item table; null: the preset's.")
    embedding_dim: int | None = setting(None, "The width of both tables; null: the preset's.")
    tower_units: int | None = setting(None, "The width of each tower; null: the preset's.")

    def __post_init__(self):
        fill_from_preset(self, PRESETS)
        require_positive(self, "num_users", "num_items", "embedding_dim", "tower_units")


def build(options: TwoTowerOptions):
    """Builds the functional two-tower model: inputs {user_id, item_id}, output one logit per pair."""
    import keras

    towers = []
    inputs = {}
    for side, rows in (("user", options.num_users), ("item", options.num_items)):
        ids = keras.Input(shape=(), dtype="int32", name=f"{side}_id")
        inputs[f"{side}_id"] = ids
        x = keras.layers.Embedding(rows, options.embedding_dim, name=f"{side}_embedding")(ids)
        x = keras.layers.Dense(options.tower_units, activation="relu", name=f"{side}_tower")(x)
        towers.append(keras.layers.Dense(options.embedding_dim, name=f"{side}_projection")(x))
    score = keras.layers.Dot(axes=-1, name="score")(towers)
    return keras.Model(inputs, score, name="two_tower")


def _loss(options: TwoTowerOptions):
    import keras

    return keras.losses.BinaryCrossentropy(from_logits=True)


def _metrics(options):
    """Accuracy of the logit predictions."""
    import keras

    return [keras.metrics.BinaryAccuracy(threshold=0.0, name="accuracy")]


SPEC = register_model(
    ModelSpec(
        name="two_tower",
        options=TwoTowerOptions,
        build=build,
        layouts=("two_tower", "replicated", "auto"),
        data="id_pairs",
        loss=_loss,
        description="recommender with user and item embedding tables, presets small and large",
        metrics=_metrics,
    )
)
