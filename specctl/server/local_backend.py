"""The engine in this process: an `EngineLoop` over a `SpecEngine` built from model directories."""

from daemon.runtime.engine.builder import BuildProgress, BuiltEngine, EngineSpec, build_engine
from daemon.runtime.engine.loop import DEFAULT_MAX_WAITING, EngineLoop, Sink
from daemon.runtime.engine.request import Request
from daemon.runtime.errors import EngineStoppedError
from specctl.server.backend import ServedModel


class LocalBackend:
    """`EngineBackend` over an engine loop thread in the serving process."""

    def __init__(
        self, built: BuiltEngine, served_model_name: str, max_waiting: int = DEFAULT_MAX_WAITING
    ) -> None:
        engine = built.engine
        self._engine = engine
        self._max_waiting = max_waiting
        self._loop: EngineLoop | None = None
        self.model = ServedModel(
            name=served_model_name,
            max_model_len=engine.target.max_model_len,
            vocab_size=engine.target.vocab_size,
            tokenizer=built.tokenizer,
            proposer=engine.proposer.name if engine.proposer is not None else "none",
            num_speculative_tokens=engine.config.num_speculative_tokens,
            adaptive=engine.config.adaptive,
            max_batch_size=engine.config.max_batch_size,
            max_requests=engine.config.max_batch_size + max_waiting,
        )

    @classmethod
    def load(
        cls,
        spec: EngineSpec,
        served_model_name: str,
        max_waiting: int = DEFAULT_MAX_WAITING,
        progress: BuildProgress | None = None,
    ) -> "LocalBackend":
        return cls(build_engine(spec, progress), served_model_name, max_waiting)

    def start(self, sink: Sink) -> None:
        self._loop = EngineLoop(self._engine, sink, max_waiting=self._max_waiting)
        self._loop.start()

    def submit(self, request: Request) -> None:
        self._running().submit(request)

    def abort(self, request_id: str) -> None:
        self._running().abort(request_id)

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.stop()

    def _running(self) -> EngineLoop:
        if self._loop is None:
            raise EngineStoppedError("the engine has not been started")
        return self._loop
