"""YAML configs (this folder): their pydantic models (configs.models) and their reader (configs.loading)."""

from configs.loading import default_config_path, load_config, parse_config
from configs.models import ConfigError, FlywheelConfig

__all__ = ["ConfigError", "FlywheelConfig", "default_config_path", "load_config", "parse_config"]
