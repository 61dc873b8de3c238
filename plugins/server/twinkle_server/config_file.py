"""The import path docs/deployment.md published for loading a config file; it lives in
`twinkle_server.config.loading` now (``from twinkle_server.config import ConfigError, load_server_config``)."""

from twinkle_server.config.loading import ConfigError, describe, load_server_config, load_storage

__all__ = ['ConfigError', 'describe', 'load_server_config', 'load_storage']
