"""The draft model takes a sequence's prompt at its first drafts, not at admission: a sequence
never asked for drafts costs the drafter nothing (real engine, tiny checkpoints)."""

from pathlib import Path

import pytest

from daemon.runtime.engine.engine import SpecEngine
from daemon.runtime.engine.request import Request
from daemon.runtime.errors import RequestError
from daemon.runtime.model.llama import LlamaForCausalLM
from daemon.runtime.proposers.draft_model import DraftModelProposer
from daemon.runtime.sampling.params import SamplingParams
from tests.engine.conftest import MAX_TOKENS
from tests.engine.helpers import make_engine


def _drafter(engine: SpecEngine) -> LlamaForCausalLM:
    assert isinstance(engine.proposer, DraftModelProposer)
    assert isinstance(engine.proposer.model, LlamaForCausalLM)
    return engine.proposer.model


def _written(model: LlamaForCausalLM, slot: int) -> bool:
    """Whether any K/V of the slot was written (the cache starts zeroed)."""
    return any(bool(keys[slot].any()) for keys in model.cache.keys)


def test_plain_rounds_leave_the_drafter_alone_until_a_sequence_first_drafts(
    target_dir: Path, draft_dir: Path, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    engine = make_engine(target_dir, draft_dir, k=2, batch=2)
    draft = _drafter(engine)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    engine.controller.config.fixed_k = 0
    engine.add_request(Request("r0", prompts[1], params))
    for _ in range(4):
        engine.step()
    (seq,) = engine.scheduler.running
    assert not _written(draft, seq.slot)  # four plain rounds: the drafter never ran
    assert seq.drafter_behind == len(prompts[1]) + 4  # its prompt, then the plain rounds'
    engine.controller.config.fixed_k = 2
    engine.step()  # the first drafts: the drafter takes everything committed, then drafts
    assert _written(draft, seq.slot) and seq.drafter_behind == 0
    assert engine.stats.num_draft_tokens > 0
    # a sequence joining a drafting batch: its first drafting round is a catch-up of its
    # prompt, learned as such (not as drafting's steady price)
    engine.add_request(Request("r1", prompts[2], params))
    engine.step()
    behind = [b for b, _ in engine.controller.costs.catch_up_samples[2]]
    assert behind[-1] == len(prompts[2])
    done: dict[str, list[int]] = {}
    while engine.has_unfinished():
        done.update((o.request_id, o.token_ids) for o in engine.step().finished)
    assert done == {"r0": reference[1], "r1": reference[2]}  # greedy: the target's tokens


def test_a_prompt_the_draft_model_cannot_take_fails_at_admission(draft_dir: Path) -> None:
    from daemon.runtime.model import load_model

    proposer = DraftModelProposer(load_model(draft_dir, num_slots=2, max_model_len=64))
    with pytest.raises(RequestError, match="token id out of range"):
        proposer.admit([0], [[1, 2, 100_000]])
    with pytest.raises(RequestError, match="exceed max_model_len 64"):
        proposer.admit([1], [list(range(1, 70))])
