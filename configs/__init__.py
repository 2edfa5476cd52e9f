"""YAML configs (this folder) and the pydantic models that validate them (configs.models)."""

from configs.models import ConfigError, FlywheelConfig, default_config_path, load_config, parse_config

__all__ = ["ConfigError", "FlywheelConfig", "default_config_path", "load_config", "parse_config"]
