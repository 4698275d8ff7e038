"""The analytic speedup bound and the per-position acceptance it is fed."""

from pathlib import Path

import pytest
import torch

from bench.costs import (
    CONTEXT_LEN,
    SpeedupBound,
    chain_ceiling,
    end_to_end_bound,
    expected_tokens_per_round,
    forward_seconds,
    pass_seconds,
)
from bench.spec_engine import RunResult
from daemon.runtime.model import load_model
from daemon.runtime.model.batch import ForwardBatch, LogitsMode
from daemon.runtime.model.protocol import CausalLM
from tests.tiny_models import make_tiny_checkpoint


def _run(num_drafts: int, accepted_per_pos: list[int]) -> RunResult:
    return RunResult(
        engine="specctl", mode="spec k=2", concurrency=1, num_requests=1, num_tokens=0,
        wall_s=1.0, tokens_per_s=0.0, acceptance_rate=None, mean_acceptance_length=None,
        num_rounds=num_drafts, num_drafts=num_drafts, accepted_per_pos=accepted_per_pos,
        draft_time_s=0.0, verify_time_s=0.0, prefill_time_s=0.0, overhead_per_round_ms=0.0,
        output_token_ids=[],
    )  # fmt: skip


def test_expected_tokens_per_round() -> None:
    assert expected_tokens_per_round(0.0, 4) == 1.0
    assert expected_tokens_per_round(1.0, 4) == 5.0
    assert abs(expected_tokens_per_round(0.5, 2) - 1.75) < 1e-12


def test_per_position_acceptance_fits_iid_rounds() -> None:
    # 4 rounds at k=2: accepted 2, 2, 1, 0 -> positions reached 2+2+2+1 = 7, accepted 5.
    run = _run(4, accepted_per_pos=[3, 2])
    assert abs((run.per_position_acceptance(2) or 0) - 5 / 7) < 1e-12
    assert _run(0, []).per_position_acceptance(2) is None


def test_speedup_bound() -> None:
    bound = SpeedupBound(
        acceptance=0.5, k=2, target_step_s=0.010, verify_s=0.010, draft_step_s=0.001
    )
    # 1.75 tokens per round of 2 ms drafting + 10 ms verifying, against 10 ms per token.
    assert abs(bound.speedup - 1.75 * 10 / 12) < 1e-12
    assert bound.cost_ratio == 10.0


def _guided_output(
    model: CausalLM, prompt: list[int], length: int, disagree_at: set[int]
) -> list[int]:
    """A continuation of `prompt` that is the model's greedy guess at every position but
    `disagree_at`, where it is another token: how far the model agrees is known by design."""
    output: list[int] = []
    with torch.inference_mode():
        for j in range(length):
            batch = ForwardBatch([0], [prompt + output], [0], LogitsMode.LAST)
            guess = int(model.forward(batch)[0].argmax())  # type: ignore[index]
            output.append((guess + 1) % model.vocab_size if j in disagree_at else guess)
    model.free_slot(0)
    return output


def test_the_chain_ceiling_counts_rounds_on_the_outputs(tmp_path: Path) -> None:
    """A round runs on while the draft agrees with the output and ends at its first
    disagreement (the target's token is that round's last), or at the output's end; the
    first token, from prefill, is not counted."""
    draft = load_model(make_tiny_checkpoint(tmp_path / "m", with_tokenizer=False), num_slots=1)
    prompts = [[5, 9, 17, 3], [40, 2]]
    agreeing = [_guided_output(draft, p, 9, set()) for p in prompts]
    assert chain_ceiling(draft, prompts, agreeing) == 8.0  # one round of 8 tokens each
    never = [_guided_output(draft, p, 9, set(range(1, 9))) for p in prompts]
    assert chain_ceiling(draft, prompts, never) == 1.0  # a round per token
    # agreement 1 2 _ 4 5 _ 7 8: rounds end at 3, at 6 and at the end -> 8 / 3 each
    twice = [_guided_output(draft, p, 9, {3, 6}) for p in prompts]
    assert abs(chain_ceiling(draft, prompts, twice) - 8 / 3) < 1e-12
    # ... ending on a disagreement: 1 2 3 4 5 6 7 _ -> one round, the target's token last
    last = [_guided_output(draft, prompts[0], 9, {8}), _guided_output(draft, prompts[1], 9, {1})]
    assert chain_ceiling(draft, prompts, last) == 16 / (1 + 2)  # (_ 2 3 4 5 6 7 8: two)
    assert chain_ceiling(draft, prompts, [[1], [2]]) is None  # nothing decoded


def test_end_to_end_bound_speeds_up_decoding_only() -> None:
    # 10 s of target-only: 3 s prefill, 7 s decoding at 2x -> 3 + 3.5 s.
    assert abs(end_to_end_bound(10.0, 3.0, 2.0) - 10.0 / 6.5) < 1e-12
    assert end_to_end_bound(10.0, 0.0, 2.0) == 2.0  # no prefill: the decode bound itself
    assert abs(end_to_end_bound(10.0, 2.5, 1e9) - 4.0) < 1e-6  # prefill caps it


class _Recording:
    """A real model whose passes are logged (model name, tokens per sequence) as they run."""

    def __init__(self, name: str, model: CausalLM, log: list[tuple[str, int]]) -> None:
        self._name, self._model, self._log = name, model, log

    def forward(self, batch: ForwardBatch) -> torch.Tensor | None:
        self._log.append((self._name, batch.max_chunk_len))
        return self._model.forward(batch)

    def __getattr__(self, name: str) -> object:
        return getattr(self._model, name)


def test_pass_seconds_times_the_passes_round_robin(tmp_path: Path) -> None:
    """Each repeat runs every pass once, in the order given, so a ratio of two passes is taken
    over the same stretch of the machine's drifting speed; a model's context is prefilled
    once."""
    checkpoint = make_tiny_checkpoint(tmp_path / "m", with_tokenizer=False)
    log: list[tuple[str, int]] = []
    target = _Recording("target", load_model(checkpoint, num_slots=2), log)
    draft = _Recording("draft", load_model(checkpoint, num_slots=2), log)
    passes = [(target, 1), (target, 5), (draft, 1)]
    seconds = pass_seconds(passes, batch=2, repeats=3)  # type: ignore[list-item]
    assert len(seconds) == 3 and all(s > 0 for s in seconds)
    assert log[:2] == [("target", CONTEXT_LEN), ("draft", CONTEXT_LEN)]
    assert log[2:] == [("target", 1), ("target", 5), ("draft", 1)] * (3 + 2)  # 2 warm-ups
    assert forward_seconds(target, 3, batch=2, repeats=1) > 0  # and measures again after


class _Positions(_Recording):
    def forward(self, batch: ForwardBatch) -> torch.Tensor | None:
        self._log.append((self._name, batch.start_positions[0]))
        return self._model.forward(batch)


def test_a_pass_given_steps_runs_them_in_a_row_after_the_last(tmp_path: Path) -> None:
    """(draft, 1, 3): three one-token steps, each appended after the last, timed together
    and counted per step, right after the target's pass (as the engine drafts after a verify)."""
    checkpoint = make_tiny_checkpoint(tmp_path / "m", with_tokenizer=False)
    log: list[tuple[str, int]] = []
    target = _Positions("target", load_model(checkpoint, num_slots=1), log)
    draft = _Positions("draft", load_model(checkpoint, num_slots=1), log)
    seconds = pass_seconds([(target, 1), (draft, 1, 3)], repeats=1)  # type: ignore[list-item]
    assert len(seconds) == 2 and all(s > 0 for s in seconds)
    one_repeat = [("target", CONTEXT_LEN)] + [("draft", CONTEXT_LEN + i) for i in range(3)]
    assert log[2:] == one_repeat * (1 + 2)


class _FailingAt5(_Recording):
    def forward(self, batch: ForwardBatch) -> torch.Tensor | None:
        if batch.max_chunk_len == 5:
            raise RuntimeError("a pass that fails")
        return super().forward(batch)

    def free_slot(self, slot: int) -> None:
        self._log.append(("free", slot))
        self._model.free_slot(slot)


def test_a_pass_that_raises_still_frees_the_slots(tmp_path: Path) -> None:
    checkpoint = make_tiny_checkpoint(tmp_path / "m", with_tokenizer=False)
    log: list[tuple[str, int]] = []
    target = _FailingAt5("target", load_model(checkpoint, num_slots=2), log)
    with pytest.raises(RuntimeError, match="a pass that fails"):
        pass_seconds([(target, 1), (target, 5)], batch=2, repeats=1)  # type: ignore[list-item]
    assert log[-2:] == [("free", 0), ("free", 1)]


def test_capture_note_reports_each_engines_graphs_and_seconds() -> None:
    from bench.compare import capture_note
    from daemon.runtime.engine.graphs_ahead import GraphCapture

    note = capture_note([GraphCapture(25, 1.5), GraphCapture(35, 2.5), GraphCapture(35, 4.0)])
    assert note == (
        "CUDA graphs captured at engine start by 3 engines: 25-35 graphs each, "
        "in 1.50-4.00 s (median 2.50 s)"
    )
