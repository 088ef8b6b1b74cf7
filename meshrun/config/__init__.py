"""A run's configuration: the typed schema (`schema`), its parsing from a composed config
(`parse`) and the value checks (`checks`). Everything here runs before jax is imported."""

from meshrun.config.checks import check_batch, check_processes, check_rule_axes
from meshrun.config.parse import (
    known_keys,
    other_choice_hint,
    parse_data,
    parse_distributed,
    parse_duration,
    parse_layout,
    parse_mesh,
    parse_mesh_shape,
    parse_run_config,
)
from meshrun.config.schema import (
    CacheConfig,
    CheckpointConfig,
    DataConfig,
    DevicesConfig,
    DistributedConfig,
    EarlyStoppingConfig,
    LayoutConfig,
    LayoutRule,
    LoggingConfig,
    MeshConfig,
    ModelConfig,
    ProfileConfig,
    RunConfig,
    TrainConfig,
)

__all__ = [
    "CacheConfig", "CheckpointConfig", "DataConfig", "DevicesConfig", "DistributedConfig", "EarlyStoppingConfig",
    "LayoutConfig", "LayoutRule", "LoggingConfig", "MeshConfig", "ModelConfig", "ProfileConfig", "RunConfig", "TrainConfig",
    "check_batch", "check_processes", "check_rule_axes", "known_keys", "other_choice_hint", "parse_data",
    "parse_distributed", "parse_duration", "parse_layout", "parse_mesh", "parse_mesh_shape", "parse_run_config",
]
