"""The `cluster.toml` schema: nodes, models, the deployment and the server.

Each model checks what it can see alone (types, ranges, address and label syntax); checks
across sections (a node or model named elsewhere, layer counts against the model) live in
references.py and shapes.py, where each problem keeps the path of the field it is about.
All strict: a string where a number belongs is an error, not a guess.
"""

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, field_validator, model_validator

from daemon.specd.address import check_host, parse_address
from daemon.specd.labels import label_key_error, label_value_error
from specctl.config.model_shape import DTYPES

LOCAL = "local"
NGRAM = "ngram"
MAX_K = 16
DEFAULT_PROPOSAL_TOKENS = 32
MAX_PROPOSAL_TOKENS = 4095  # what the wire carries per draft (sampling.quantized.MAX_LISTED)
DEFAULT_K = 4
DEFAULT_ADAPTIVE_MAX_K = 8
DEFAULT_PORT = 8000
DEFAULT_MEMORY_UTILIZATION = 0.9
_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?")
_NAME_RULE = "1-63 letters, digits, '-', '_', '.', beginning and ending with a letter or digit"


def _check_name(value: str) -> str:
    if not _NAME.fullmatch(value):
        raise ValueError(f"{value!r} is not a valid name ({_NAME_RULE})")
    return value


Name = Annotated[str, Field(min_length=1, max_length=63)]
Dtype = Literal["auto", "float32", "bfloat16", "float16", "fp8"]
assert set(Dtype.__args__) == set(DTYPES)  # type: ignore[attr-defined]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, validate_default=True)


class GpuDeclaration(_Section):
    """A GPU of a node, described by hand so that `specctl plan` works without reaching the
    node (specd's inventory, when reachable and asked for, takes precedence)."""

    model: str = Field("GPU", min_length=1, description='the GPU\'s name, e.g. "RTX 5090"')
    memory_gib: float = Field(gt=0, le=4096, description="memory of one GPU in GiB")
    count: int = Field(1, ge=1, le=64, description="how many such GPUs the node has")
    unified_memory: bool = Field(
        False, description="shares system memory with the CPU (GB10 in the DGX Spark)"
    )


class NodeSpec(_Section):
    """A machine of the cluster: `[[nodes]]`."""

    name: Name = Field(description="what the deployment calls this node")
    specd: str = Field(
        description='"local" (a Ray node on this machine) or the host:port of the node\'s specd'
    )
    labels: dict[str, str] = Field(default_factory=dict, description="extra Ray node labels")
    token_file: str | None = Field(
        None, description="cluster token for this node's specd (default: ~/.config/specctl)"
    )
    memory_gib: float | None = Field(
        None, gt=0, le=65536, description="system memory in GiB, when specd cannot be asked"
    )
    gpus: list[GpuDeclaration] = Field(
        default_factory=list, description="the node's GPUs, when specd cannot be asked"
    )
    memory_utilization: float = Field(
        DEFAULT_MEMORY_UTILIZATION,
        gt=0,
        le=1,
        description="share of each GPU's memory (of system memory without GPUs) shards may use",
    )

    _name = field_validator("name")(classmethod(lambda cls, v: _check_name(v)))

    @field_validator("specd")
    @classmethod
    def _specd_address(cls, value: str) -> str:
        if value != LOCAL:
            try:
                parse_address(value)
            except ValueError as error:
                raise ValueError(f'must be "local" or host:port: {error}') from None
        return value

    @field_validator("labels")
    @classmethod
    def _label_syntax(cls, labels: dict[str, str]) -> dict[str, str]:
        for key, value in labels.items():
            error = label_key_error(key) or label_value_error(value)
            if error:
                raise ValueError(error)
        return labels

    @property
    def is_local(self) -> bool:
        return self.specd == LOCAL


class ModelSpec(_Section):
    """A model directory (config.json, safetensors, tokenizer): `[[models]]`."""

    name: Name = Field(description="what the deployment calls this model")
    path: str = Field(
        min_length=1, description="the model directory; relative paths start at this file's"
    )
    dtype: Dtype = Field(
        "auto", description='weights dtype; "auto" is the checkpoint\'s own (fp8: planning only)'
    )
    max_model_len: int | None = Field(
        None, ge=16, le=10_485_760, description="context length (default: the model's maximum)"
    )

    _name = field_validator("name")(classmethod(lambda cls, v: _check_name(v)))


def _pipeline_split(value: Any) -> Literal["auto"] | list[int]:
    if value == "auto":
        return "auto"
    is_counts = isinstance(value, list) and all(
        isinstance(n, int) and not isinstance(n, bool) for n in value
    )
    if not is_counts or not value:
        raise ValueError(
            f'must be "auto" or a list of layer counts, one per verifier node, e.g. [64, 16];'
            f" got {value!r}"
        )
    if any(n < 1 for n in value):
        raise ValueError(f"every pipeline stage needs at least one layer, got {value}")
    return value


class VerifierSpec(_Section):
    """The large model that owns the output: `[deployment.verifier]`."""

    model: Name = Field(description="the name of one of the [[models]]")
    nodes: list[Name] = Field(
        min_length=1, max_length=64, description="one node per pipeline stage, in layer order"
    )
    tensor_parallel_size: int = Field(1, ge=1, le=64, description="GPUs per pipeline stage")
    pipeline_split: Annotated[Literal["auto"] | list[int], PlainValidator(_pipeline_split)] = Field(
        "auto", description='layers per node: "auto" (by free memory) or counts [64, 16]'
    )


class DrafterSpec(_Section):
    """The proposer: a small draft model on a node of its own, or n-gram prompt lookup."""

    model: Name = Field(description='the name of one of the [[models]], or "ngram"')
    node: Name | None = Field(None, description="where the draft model runs (not for ngram)")
    tensor_parallel_size: int = Field(1, ge=1, le=64, description="GPUs the draft model spans")

    @property
    def is_ngram(self) -> bool:
        return self.model == NGRAM


class SpeculationSpec(_Section):
    """How many tokens to draft per round: a fixed `k`, or `adaptive = true` up to `max_k`."""

    k: int | None = Field(None, ge=0, le=MAX_K, description="fixed draft length (0: no drafts)")
    adaptive: bool = Field(False, description="choose k per sequence and round from measurements")
    max_k: int | None = Field(None, ge=1, le=MAX_K, description="the ceiling when adaptive")
    mode: Literal["sync", "overlapped"] = Field(
        "overlapped", description="overlapped: draft round i+1 while round i is verified"
    )
    proposal_tokens: int = Field(
        DEFAULT_PROPOSAL_TOKENS, ge=0, le=MAX_PROPOSAL_TOKENS,
        description=(
            "tokens a sampled draft's proposal lists at most, the rest its tail; 0: coupled "
            "drafting (the token alone, matched against the verifier's own draw)"
        ),
    )  # fmt: skip
    proposal_mass: float = Field(
        1.0, gt=0.0, le=1.0,
        description="list no more of the draft's best tokens than cover this much of its mass",
    )  # fmt: skip
    proposal_max_tokens: int | None = Field(
        None, ge=0, le=MAX_PROPOSAL_TOKENS,
        description=(
            "tokens a sampled draft's list may widen to while the verifier rejects the drafts "
            "drawn from its tail (the byte budget); default proposal_tokens: no widening; "
            "2048 brings a flat draft's acceptance within 2% of full-distribution drafting"
        ),
    )  # fmt: skip

    choose_proposal: bool = Field(
        True,
        description=(
            "sampled requests: measure listed proposals (proposal_tokens > 0) against coupled "
            "drafts (the token alone) per batch size and keep the faster; false: always listed"
        ),
    )

    @model_validator(mode="after")
    def _k_or_adaptive(self) -> "SpeculationSpec":
        if self.adaptive and self.k is not None:
            raise ValueError("give k (fixed) or adaptive = true with max_k, not both")
        if not self.adaptive and self.max_k is not None:
            raise ValueError("max_k applies with adaptive = true; for a fixed length use k")
        if self.proposal_max_tokens is not None and self.proposal_max_tokens < (
            self.proposal_tokens
        ):
            raise ValueError(
                f"proposal_max_tokens ({self.proposal_max_tokens}) must be >= proposal_tokens "
                f"({self.proposal_tokens}): the list widens from the first to the second"
            )
        return self

    @property
    def ceiling_k(self) -> int:
        """The most tokens drafted in one round."""
        if self.adaptive:
            return self.max_k if self.max_k is not None else DEFAULT_ADAPTIVE_MAX_K
        return self.k if self.k is not None else DEFAULT_K


class DeploymentSpec(_Section):
    """What runs where: `[deployment]`."""

    name: Name = Field("default", description="the deployment's name (status, history)")
    verifier: VerifierSpec = Field(description="the large model: [deployment.verifier]")
    drafter: DrafterSpec = Field(description="the proposer: [deployment.drafter]")
    speculation: SpeculationSpec = Field(
        default_factory=SpeculationSpec,  # type: ignore[arg-type]
        description="how many tokens to draft: [deployment.speculation]",
    )
    replicas: int = Field(1, ge=1, le=64, description="independent copies behind the endpoint")

    # it names Ray actors, the state and the history: the rule of node and model names
    _name = field_validator("name")(classmethod(lambda cls, v: _check_name(v)))


class ServerSpec(_Section):
    """The OpenAI-compatible endpoint: `[server]`."""

    host: str = Field("127.0.0.1", min_length=1, description="bind address; 127.0.0.1 is private")
    port: int = Field(DEFAULT_PORT, ge=1, le=65535, description="the endpoint's TCP port")
    api_key_file: str | None = Field(
        None, min_length=1, description="a file (mode 0600) holding the API key"
    )
    max_batch_size: int = Field(16, ge=1, le=4096, description="sequences decoded together")
    prefill_chunk_tokens: int | None = Field(
        None, ge=1, le=1_048_576,
        description=(
            "prompt tokens prefilled per step while other requests decode, the rest of a "
            "prompt in the steps after (a long prompt then holds streams up by a chunk's time, "
            "not its whole prefill's), by the verifier and then the drafter; default: whole "
            "prompts at once"
        ),
    )  # fmt: skip

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        return check_host(value)


class ClusterSchema(_Section):
    """The whole file."""

    nodes: list[NodeSpec] = Field(min_length=1, description="the machines: [[nodes]] tables")
    models: list[ModelSpec] = Field(min_length=1, description="the models: [[models]] tables")
    deployment: DeploymentSpec = Field(description="what runs where: [deployment]")
    server: ServerSpec = Field(
        default_factory=ServerSpec,  # type: ignore[arg-type]
        description="the OpenAI-compatible endpoint: [server]",
    )
