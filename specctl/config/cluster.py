"""ClusterConfig: the validated file, plus where it came from and the shapes of its models."""

from pathlib import Path

from pydantic import PrivateAttr

from daemon.cluster_token import CLIENT_TOKEN_FILE
from specctl.config.model_shape import ModelShape, read_model_shape
from specctl.config.schema import ClusterSchema, ModelSpec, NodeSpec


class ClusterConfig(ClusterSchema):
    """A validated cluster.toml. Build it with `load_config(path)` or `load_config_text(...)`,
    which check references across sections and read every model's config.json."""

    _source_path: Path | None = PrivateAttr(None)
    _shapes: dict[str, ModelShape] = PrivateAttr(default_factory=dict)

    @property
    def source_path(self) -> Path | None:
        return self._source_path

    @property
    def config_dir(self) -> Path:
        """Relative paths in the file start here (the file's directory, else the cwd)."""
        return self._source_path.parent if self._source_path else Path.cwd()

    def resolve_path(self, raw: str) -> Path:
        path = Path(raw).expanduser()
        return path if path.is_absolute() else (self.config_dir / path).resolve()

    def node(self, name: str) -> NodeSpec:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"no node named {name!r}")

    def model(self, name: str) -> ModelSpec:
        for model in self.models:
            if model.name == name:
                return model
        raise KeyError(f"no model named {name!r}")

    def token_path(self, node: NodeSpec) -> Path:
        """The cluster token file a specd node is reached with."""
        return self.resolve_path(node.token_file or CLIENT_TOKEN_FILE)

    def model_dir(self, name: str) -> Path:
        return self.resolve_path(self.model(name).path)

    def shape(self, name: str) -> ModelShape:
        """The model's shape from its config.json (read once, at load)."""
        if name not in self._shapes:
            self._shapes[name] = read_model_shape(self.model_dir(name))
        return self._shapes[name]

    def max_model_len(self, name: str) -> int:
        """The context length the model is served with."""
        spec = self.model(name)
        return spec.max_model_len or self.shape(name).max_position_embeddings

    def api_key_path(self) -> Path | None:
        raw = self.server.api_key_file
        return None if raw is None else self.resolve_path(raw)

    def attach(self, source_path: Path | None, shapes: dict[str, ModelShape]) -> None:
        """Called by the loader: where the file was, and the model shapes it read."""
        self._source_path = source_path.resolve() if source_path else None
        self._shapes = dict(shapes)
