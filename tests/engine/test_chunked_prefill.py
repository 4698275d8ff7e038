"""Chunked prefill: with `prefill_chunk_tokens` set, a step prefills at most that many prompt
tokens while other sequences decode, and the outputs are those of whole-prompt prefill."""

from pathlib import Path

import pytest
import torch

from daemon.runtime.engine.config import EngineConfig
from daemon.runtime.engine.engine import SpecEngine
from daemon.runtime.engine.request import Request, RequestOutput
from daemon.runtime.engine.stop import FINISH_ABORT, FINISH_ERROR
from daemon.runtime.errors import RequestError
from daemon.runtime.model.batch import ForwardBatch, LogitsMode
from daemon.runtime.sampling.params import SamplingParams
from tests.engine.conftest import MAX_TOKENS
from tests.engine.helpers import make_engine


def _requests(prompts: list[list[int]], params: list[SamplingParams]) -> list[Request]:
    return [Request(f"r{i}", p, q) for i, (p, q) in enumerate(zip(prompts, params, strict=True))]


def _run_checking_budget(
    engine: SpecEngine, requests: list[Request], chunk: int
) -> tuple[list[RequestOutput], int]:
    """Step the engine through `requests` (3 slots: they join and leave mid-run); check every
    step's prefill against the budget while others decode, and that those others gained tokens
    in that step. Returns the outputs in request order and the steps that left a prompt
    partly prefilled."""
    for request in requests:
        engine.add_request(request)
    done: dict[str, RequestOutput] = {}
    split = 0
    while engine.has_unfinished():
        decoding = sum(not s.is_finished for s in engine.scheduler.running)
        step = engine.step()
        stats = step.stats
        if decoding:
            assert stats.num_prefill_tokens <= chunk
            assert stats.batch_size >= decoding and stats.num_emitted_tokens >= decoding
        split += any(0 < s.num_prefilled < s.num_prompt_tokens for s in engine._prefilling)
        done.update((out.request_id, out) for out in step.finished)
    return [done[r.request_id] for r in requests], split


@pytest.mark.parametrize("backend", ["lean", "hf"])
@pytest.mark.parametrize("chunk", [1, 7])
def test_chunked_prefill_is_lossless_while_others_decode(
    target_dir: Path, draft_dir: Path, prompts, reference, chunk: int, backend: str
) -> None:
    engine = make_engine(
        target_dir, draft_dir, k=4, batch=3, backend=backend, prefill_chunk_tokens=chunk
    )
    lengths = [1 + (i * 7) % MAX_TOKENS for i in range(len(prompts))]
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in lengths]
    outputs, split = _run_checking_budget(engine, _requests(prompts, params), chunk)
    for out, ref, n in zip(outputs, reference, lengths, strict=True):
        assert out.token_ids == ref[:n]
        assert out.finish_reason == "length"
    assert split > 0  # prompts did go in over several steps


def test_target_only_chunked_prefill_is_lossless(target_dir: Path, prompts, reference) -> None:
    engine = make_engine(target_dir, batch=3, prefill_chunk_tokens=5)
    lengths = [MAX_TOKENS - (i * 5) % 12 for i in range(len(prompts))]
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in lengths]
    outputs, split = _run_checking_budget(engine, _requests(prompts, params), 5)
    assert [o.token_ids for o in outputs] == [
        r[:n] for r, n in zip(reference, lengths, strict=True)
    ]
    assert split > 0


def test_seeded_sampling_is_the_same_chunked_or_whole(
    target_dir: Path, close_draft_dir: Path, prompts
) -> None:
    """A seeded request's tokens do not depend on how its prompt went into the cache."""
    params = [
        SamplingParams(temperature=0.9, top_p=0.95, max_tokens=16, ignore_eos=True, seed=7 + i)
        for i in range(8)
    ]
    runs = []
    for chunk in (None, 6):
        engine = make_engine(target_dir, close_draft_dir, k=3, batch=3, prefill_chunk_tokens=chunk)
        runs.append([o.token_ids for o in engine.generate(_requests(prompts[:8], params))])
    assert runs[0] == runs[1]
    assert len({tuple(t) for t in runs[0]}) > 1


def _long_prompt_behind_a_decoding_one(
    target_dir: Path, draft_dir: Path, prompts: list[list[int]], backend: str = "auto"
) -> SpecEngine:
    """An engine with request "a" decoding and request "b" (40 tokens, 4 a step) part-prefilled."""
    engine = make_engine(
        target_dir, draft_dir, k=2, batch=2, backend=backend, prefill_chunk_tokens=4
    )
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    engine.add_request(Request("a", prompts[0], params))
    engine.step()
    long_prompt = next(p for p in prompts if len(p) == 40)
    engine.add_request(Request("b", long_prompt, params))
    engine.step()
    assert [s.num_prefilled for s in engine._prefilling] == [4]
    assert engine.num_running == 2
    return engine


@pytest.mark.parametrize("backend", ["lean", "hf"])
def test_a_prefill_pass_that_completes_no_prompt_asks_for_no_logits(
    target_dir: Path, draft_dir: Path, prompts, reference, backend: str
) -> None:
    """Pieces of a prompt that leave it unfinished only fill the cache: the LM head runs for
    the piece that completes it (whose last row samples the first token), for no other."""
    engine = _long_prompt_behind_a_decoding_one(target_dir, draft_dir, prompts, backend)
    modes: list[LogitsMode] = []
    forward = engine.target.forward

    def recording(batch: ForwardBatch) -> torch.Tensor | None:
        logits = forward(batch)
        if batch.is_prefill:
            modes.append(batch.logits_mode)
            assert (logits is None) == (batch.logits_mode is LogitsMode.NONE)
        return logits

    engine.target.forward = recording  # type: ignore[method-assign]
    done: dict[str, list[int]] = {}
    while engine.has_unfinished():
        done.update((o.request_id, o.token_ids) for o in engine.step().finished)
    long_index = next(i for i, p in enumerate(prompts) if len(p) == 40)
    assert done == {"a": reference[0], "b": reference[long_index]}
    assert len(modes) >= 3  # pieces of 4 while "a" decodes (then the rest whole, if any)
    assert modes[-1] is LogitsMode.LAST and set(modes[:-1]) == {LogitsMode.NONE}


def test_abort_while_prefilling_frees_the_slot(
    target_dir: Path, draft_dir: Path, prompts, reference
) -> None:
    engine = _long_prompt_behind_a_decoding_one(target_dir, draft_dir, prompts)
    assert engine.abort("b")
    assert not engine.abort("b")  # already ending
    step = engine.step()
    ended = [d for d in step.deltas if d.request_id == "b"]
    assert [(d.finish_reason, d.new_token_ids) for d in ended] == [(FINISH_ABORT, [])]
    assert [o.request_id for o in step.finished] == ["b"]
    assert not engine._prefilling and engine.num_running == 1
    # the slot serves again, and "a" was never disturbed
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    engine.add_request(Request("c", prompts[2], params))
    done: dict[str, list[int]] = {}
    while engine.has_unfinished():
        done.update((o.request_id, o.token_ids) for o in engine.step().finished)
    assert done == {"a": reference[0], "c": reference[2]}


def test_fail_all_ends_a_request_still_prefilling(
    target_dir: Path, draft_dir: Path, prompts, reference
) -> None:
    engine = _long_prompt_behind_a_decoding_one(target_dir, draft_dir, prompts)
    deltas = engine.fail_all("boom")
    assert sorted((d.request_id, d.finish_reason, d.error) for d in deltas) == [
        ("a", FINISH_ERROR, "boom"),
        ("b", FINISH_ERROR, "boom"),
    ]
    assert not engine.has_unfinished() and engine.num_running == 0
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = engine.generate([Request("again", prompts[2], params)])
    assert outputs[0].token_ids == reference[2]


def test_a_new_speculation_length_reaches_a_request_still_prefilling(
    target_dir: Path, draft_dir: Path, prompts, reference
) -> None:
    """Adaptive k up to 6, set while a prompt is part-prefilled: that sequence's acceptance
    estimate is made for the new ceiling too (one sized for the old k failed the choice)."""
    engine = _long_prompt_behind_a_decoding_one(target_dir, draft_dir, prompts)
    engine.set_speculation(6, adaptive=True)
    done: dict[str, list[int]] = {}
    drafted = 0
    while engine.has_unfinished():
        step = engine.step()
        drafted = max(drafted, step.stats.speculation_len)
        done.update((o.request_id, o.token_ids) for o in step.finished)
    long_index = next(i for i, p in enumerate(prompts) if len(p) == 40)
    assert done == {"a": reference[0], "b": reference[long_index]}
    assert 0 < drafted <= 6


def test_a_step_that_fails_after_the_prefill_leaves_the_engine_usable(
    target_dir: Path, draft_dir: Path, prompts, reference, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The draft model refuses the admit of a prompt whose prefill is done: the step raises,
    fail_all ends what was running or prefilling, and the engine serves the next request."""
    engine = _long_prompt_behind_a_decoding_one(target_dir, draft_dir, prompts)
    proposer = engine.proposer
    assert proposer is not None

    def refuse(slots: list[int], prompts: list[list[int]]) -> None:
        raise RuntimeError("the drafter cannot take this prompt")

    monkeypatch.setattr(proposer, "admit", refuse)
    with pytest.raises(RuntimeError, match="cannot take"):
        while engine._prefilling:
            engine.step()
    monkeypatch.undo()
    assert not engine._prefilling  # the prompt that went in whole runs, not prefilled again
    ended = engine.fail_all("drafter refused")
    assert sorted(d.request_id for d in ended) == ["a", "b"]
    assert not engine.has_unfinished()
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = engine.generate([Request("again", prompts[2], params)])
    assert outputs[0].token_ids == reference[2]


def test_a_step_carrying_a_chunk_still_teaches_the_round_overhead(
    target_dir: Path, draft_dir: Path, prompts
) -> None:
    """Under load nearly every step carries a chunk: the round's time outside its passes is
    learned from those steps too (the step less its prefill), or the line stops learning."""
    engine = _long_prompt_behind_a_decoding_one(target_dir, draft_dir, prompts)
    samples = engine.controller.costs.overhead_samples
    before = sum(len(q) for q in samples.values())
    step = engine.step()
    assert step.stats.num_prefill_tokens == 4 and step.stats.batch_size == 1
    assert sum(len(q) for q in samples.values()) == before + 1
    stats = step.stats
    assert stats.round_time_s == pytest.approx(
        stats.step_time_s - stats.prefill_time_s - stats.hand_out_time_s
    )
    assert 0.0 < stats.overhead_time_s < stats.round_time_s


def test_a_chunk_budget_below_one_is_refused() -> None:
    with pytest.raises(RequestError, match="prefill_chunk_tokens must be >= 1, got 0"):
        EngineConfig(prefill_chunk_tokens=0)
