"""What `apply` brought up, kept in `$SPECCTL_HOME/state.json`, so that a second `apply`
changes only what changed, `status` can report it, `down` can stop it, and the serving process
knows which shards to reach."""

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

STATE_VERSION = 1


class StateError(Exception):
    """state.json is unreadable or from another version; the message names the file."""


@dataclass(slots=True)
class NodeState:
    name: str
    kind: str  # "local" | "specd"
    address: str  # "local", or the specd host:port
    token_file: str  # the token specd checks (and Ray's cluster token)


@dataclass(slots=True)
class ShardState:
    actor: str  # Ray actor name in specctl's namespace
    role: str  # "verifier" | "drafter"
    replica: int
    node: str
    fingerprint: str  # what it was started with, except the speculation settings
    speculation: str = ""  # k / adaptive / mode, applied live (verifiers only)


@dataclass(slots=True)
class ServerState:
    host: str
    port: int
    api_key_file: str | None
    max_batch_size: int
    fingerprint: str

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        connect = "127.0.0.1" if self.host in {"0.0.0.0", "::"} else host
        return f"http://{connect}:{self.port}"


@dataclass(slots=True)
class AppliedState:
    deployment: str
    config_path: str
    config_text: str
    plan_json: str
    served_model_name: str
    ray_address: str
    token_file: str
    local_root: str | None  # where local Ray nodes keep their state (None: no local node)
    local_nodes: list[str] = field(default_factory=list)
    nodes: list[NodeState] = field(default_factory=list)
    shards: list[ShardState] = field(default_factory=list)
    server: ServerState | None = None
    db_path: str = ""
    deployment_id: int = 0  # its row in the store: the serving process writes samples under it
    version: int = STATE_VERSION

    def verifier_actors(self) -> list[str]:
        verifiers = [s for s in self.shards if s.role == "verifier"]
        return [s.actor for s in sorted(verifiers, key=lambda s: s.replica)]

    def save(self, path: Path) -> None:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        os.replace(tmp, path)

    @staticmethod
    def load(path: Path) -> "AppliedState | None":
        """The state in `path`, or None when nothing was applied."""
        try:
            raw: dict[str, Any] = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise StateError(f"{path}: unreadable deployment state ({exc})") from None
        if not isinstance(raw, dict):
            raise StateError(f"{path}: malformed deployment state (not a JSON object)")
        if raw.get("version") != STATE_VERSION:
            raise StateError(
                f"{path}: deployment state version {raw.get('version')!r}, expected "
                f"{STATE_VERSION}; run `specctl down` with the specctl that applied it"
            )
        try:  # every field its type: `down` signals and deletes what this file names. From the
            # parsed object: pydantic's own JSON parser refuses the \\udcXX escapes json.dumps
            # writes for a path holding bytes that are not UTF-8
            return _STATE.validate_python(raw)
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(part) for part in error["loc"]) or "the whole file"
            raise StateError(
                f"{path}: malformed deployment state ({where}: {error['msg']}, got "
                f"{error.get('input')!r:.80})"
            ) from None


_STATE = TypeAdapter(AppliedState)
