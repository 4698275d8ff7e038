"""The prompts, reference and request helpers shared by the tests that run shards on a real
Ray cluster (split, tensor-parallel and pipeline-parallel shapes)."""

from dataclasses import dataclass
from typing import Any

from daemon.runtime.engine.request import Request
from daemon.runtime.sampling.params import SamplingParams
from specctl.demo_pair import demo_pair_dirs
from specctl.deploy.actors import kill_actor
from specctl.deploy.remote_backend import RemoteBackend, served_model
from tests.engine.helpers import DeltaCollector, make_engine, run_greedy

MAX_TOKENS = 24
FINISH_TIMEOUT_S = 120.0
TEXTS = [
    "def main():",
    "import os\nimport sys\n\n",
    "class Config:\n    def __init__(self, path, *, strict=False):\n        self.path",
    "x",
    "    for i in range(10):\n        if i % 2:\n",
    "def parse_args(argv):\n    parser = argparse.ArgumentParser()\n",
    "return",
    "# utilities\n\ndef read_file(path):\n    with open(path) as f:\n",
]


def greedy(max_tokens: int = MAX_TOKENS) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def target_only(
    prompts: list[list[int]], batch: int = 8, max_tokens: int = MAX_TOKENS
) -> list[list[int]]:
    """Greedy outputs of the demo target alone, in this process."""
    target, _ = demo_pair_dirs()
    engine = make_engine(target, batch=batch, max_model_len=None, dtype="float32")
    return [o.token_ids for o in run_greedy(engine, prompts, max_tokens)]


def run_all(
    backend: RemoteBackend,
    sink: DeltaCollector,
    prompts: list[list[int]],
    tag: str,
    max_tokens: list[int] | None = None,
) -> list[list[int]]:
    """Greedy outputs of `prompts` sent together (a ragged batch) through `backend`."""
    ids = [f"{tag}-{i}" for i in range(len(prompts))]
    lengths = max_tokens or [MAX_TOKENS] * len(prompts)
    for rid, prompt, n in zip(ids, prompts, lengths, strict=True):
        backend.submit(Request(rid, prompt, greedy(n)))
    sink.wait_finished(ids, timeout_s=FINISH_TIMEOUT_S)
    return [sink.tokens(rid) for rid in ids]


def drafted(sink: DeltaCollector, since: int = 0) -> int:
    """Draft tokens proposed in the rounds reported since output `since`."""
    return sum(r.num_draft_tokens for o in sink.outputs[since:] for r in o.rounds)


@dataclass(slots=True)
class Served:
    """A verifier shard behind a RemoteBackend, and every actor it needs (killed by `stop`)."""

    names: list[str]
    verifier: Any
    backend: RemoteBackend
    sink: DeltaCollector

    @staticmethod
    def start(verifier: Any, name: str, actors: list[str], timeout_s: float = 180.0) -> "Served":
        """Wait for the verifier `name` (a handle) to load, then serve it; `actors`: all the
        actors to kill at the end, the verifier's included."""
        model = served_model(verifier, "demo", timeout_s=timeout_s)
        sink = DeltaCollector()
        backend = RemoteBackend(verifier, model, actor_name=name)
        backend.start(sink)
        return Served(actors, verifier, backend, sink)

    def stop(self) -> None:
        self.backend.stop()
        for name in self.names:
            kill_actor(name)

    def run(
        self, prompts: list[list[int]], tag: str, max_tokens: list[int] | None = None
    ) -> list[list[int]]:
        return run_all(self.backend, self.sink, prompts, tag, max_tokens)

    def drafted(self, since: int = 0) -> int:
        return drafted(self.sink, since)
