"""Shared helpers for engine tests: engines over tiny checkpoints, reference decoders."""

import threading
import time
from pathlib import Path

import torch

from daemon.runtime.engine.builder import EngineSpec, build_engine
from daemon.runtime.engine.config import EngineConfig
from daemon.runtime.engine.engine import SpecEngine
from daemon.runtime.engine.loop import LoopOutput
from daemon.runtime.engine.request import Request, RequestDelta, RequestOutput
from daemon.runtime.sampling.params import SamplingParams


def make_engine(
    target: Path,
    draft: Path | None = None,
    *,
    ngram: bool = False,
    k: int = 4,
    adaptive: bool = False,
    batch: int = 16,
    backend: str = "auto",
    max_model_len: int | None = 256,
    dtype: str = "auto",
    device: str = "cpu",
    prefill_chunk_tokens: int | None = None,
) -> SpecEngine:
    spec = EngineSpec(
        target=target,
        draft=draft,
        ngram=ngram,
        backend=backend,
        dtype=dtype,
        device=device,
        max_model_len=max_model_len,
        engine=EngineConfig(
            max_batch_size=batch,
            num_speculative_tokens=k if (draft is not None or ngram) else 0,
            adaptive=adaptive,
            prefill_chunk_tokens=prefill_chunk_tokens,
        ),
    )
    return build_engine(spec).engine


def random_prompts(num: int, vocab: int, lengths: list[int], seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randint(3, vocab, (lengths[i % len(lengths)],), generator=gen).tolist()
        for i in range(num)
    ]


def run_greedy(
    engine: SpecEngine, prompts: list[list[int]], max_tokens: int
) -> list[RequestOutput]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return engine.generate(Request(f"r{i}", p, params) for i, p in enumerate(prompts))


def hf_greedy(model_dir: Path, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """transformers' own generate(do_sample=False), one prompt at a time, EOS disabled."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.generation_config.eos_token_id = None
    outs = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            gen = model.generate(
                ids, max_new_tokens=max_tokens, do_sample=False, pad_token_id=0, eos_token_id=None
            )
            outs.append(gen[0, len(prompt) :].tolist())
    return outs


class DeltaCollector:
    """A sink for `LoopOutput`s (from an EngineLoop or a backend) that tests can wait on."""

    def __init__(self) -> None:
        self.outputs: list[LoopOutput] = []
        self.cond = threading.Condition()

    def __call__(self, output: LoopOutput) -> None:
        with self.cond:
            self.outputs.append(output)
            self.cond.notify_all()

    def deltas(self, request_id: str) -> list[RequestDelta]:
        with self.cond:
            return [d for o in self.outputs for d in o.deltas if d.request_id == request_id]

    def tokens(self, request_id: str) -> list[int]:
        return [t for d in self.deltas(request_id) for t in d.new_token_ids]

    def last(self, request_id: str) -> RequestDelta:
        return self.deltas(request_id)[-1]

    def finished(self, ids: list[str]) -> bool:
        with self.cond:
            return self._all_finished(ids)

    def wait_finished(self, ids: list[str], timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while not self._all_finished(ids):
                left = deadline - time.monotonic()
                assert left > 0, f"requests {ids} did not finish in {timeout_s} s"
                self.cond.wait(left)

    def _all_finished(self, ids: list[str]) -> bool:  # under self.cond
        return all(any(d.finished for d in self._of(i)) for i in ids)

    def _of(self, request_id: str) -> list[RequestDelta]:
        return [d for o in self.outputs for d in o.deltas if d.request_id == request_id]
