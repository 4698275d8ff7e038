"""cluster.toml: the schema, loading with errors that name file, line and field, and editing
that keeps the user's comments and order. Importing this never imports torch or textual.

    config = load_config("examples/local.toml")      # ClusterConfig, or ConfigError
    doc = ConfigDocument.load("cluster.toml")         # edit, validate, save
"""

from pathlib import Path

from specctl.config.cluster import ClusterConfig
from specctl.config.document import ConfigDocument
from specctl.config.errors import ConfigError, ConfigIssue
from specctl.config.loader import load_config, load_config_text
from specctl.config.model_shape import ModelShape, ModelShapeError, read_model_shape

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"


def default_config_path() -> Path:
    """examples/local.toml: two local Ray nodes and the bundled demo pair."""
    return EXAMPLES_DIR / "local.toml"


__all__ = [
    "EXAMPLES_DIR",
    "ClusterConfig",
    "ConfigDocument",
    "ConfigError",
    "ConfigIssue",
    "ModelShape",
    "ModelShapeError",
    "default_config_path",
    "load_config",
    "load_config_text",
    "read_model_shape",
]
