"""What the HTTP layer drives: an engine loop in this process, or a verifier shard elsewhere.

Both backends speak the same small surface, so the endpoint, its streaming and its metrics
do not know where the verifier runs:

- `LocalBackend` (this process): an `EngineLoop` over a `SpecEngine` built from model
  directories on this machine (`specctl serve --target DIR --draft DIR`).
- `RemoteBackend` (a deployment): the verifier shard is a Ray actor on its node; the backend
  forwards requests to it and polls it for `LoopOutput`s.
"""

from dataclasses import dataclass
from typing import Any, Protocol

from daemon.runtime.engine.loop import Sink
from daemon.runtime.engine.request import Request


@dataclass(frozen=True, slots=True)
class ServedModel:
    """What the endpoint needs to know about the model behind a backend."""

    name: str  # the served model name clients put in "model"
    max_model_len: int  # prompt + output tokens one request may hold
    vocab_size: int
    tokenizer: Any  # a transformers tokenizer: chat template, encode, decode
    proposer: str  # "draft_model" | "ngram" | "none"
    num_speculative_tokens: int  # fixed k, or the ceiling when adaptive
    adaptive: bool
    max_batch_size: int
    max_requests: int | None = None  # running and waiting at once (None: not known)


class EngineBackend(Protocol):
    """An engine the endpoint can feed. `submit` and `abort` may block briefly (a remote
    backend makes a call): the HTTP layer calls them off its event loop."""

    model: ServedModel

    def start(self, sink: Sink) -> None:
        """Begin serving; every `LoopOutput` goes to `sink`, called from a backend thread."""
        ...

    def submit(self, request: Request) -> None:
        """Queue a request. Raises RequestError (it can never be served),
        EngineOverloadedError (queue full) or EngineStoppedError (shutting down or failed)."""
        ...

    def abort(self, request_id: str) -> None:
        """End a request early (a client went away); no-op if it already ended."""
        ...

    def stop(self) -> None:
        """End every request in flight (each gets a last delta) and release the engine."""
        ...
