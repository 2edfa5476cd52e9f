"""YAML configs (this folder): their pydantic models (configs.models; the rl section in configs.rl, the shared base in
configs.base) and their reader (configs.loading)."""

from configs.loading import default_config_path, load_config, parse_config
from configs.models import ConfigError, FlywheelConfig

__all__ = ["ConfigError", "FlywheelConfig", "default_config_path", "load_config", "parse_config"]
