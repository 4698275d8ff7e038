"""Coupled drafting (`proposal_tokens` = 0): the drafter sends the token alone, drawn as
argmax (log q + G) with the position's Gumbel field, and the verifier matches it against its
own argmax (log p + G). Every committed token is then the verifier's own draw, so a seeded
sampled request gives exactly the tokens the target alone gives, whatever k, whichever
drafter, in process or remote, synchronous or overlapped; and a draft equal to the target is
always accepted."""

from pathlib import Path

import pytest

from daemon.runtime.engine.config import EngineConfig
from daemon.runtime.engine.engine import SpecEngine
from daemon.runtime.engine.request import Request
from daemon.runtime.model import load_model
from daemon.runtime.proposers.draft_model import DraftModelProposer
from daemon.runtime.remote.options import RemoteOptions
from daemon.runtime.sampling.params import SamplingParams
from tests.remote.helpers import remote_engine

PROMPTS = [[5, 9, 30], [7, 1, 2, 3, 4, 5, 6, 8], [100, 200], [17] * 12]


def _requests(temperature: float) -> list[Request]:
    return [
        Request(
            f"r{i}",
            p,
            SamplingParams(
                temperature=temperature, max_tokens=24, seed=40 + i, top_p=0.95 if i == 3 else 1.0
            ),
        )
        for i, p in enumerate(PROMPTS)
    ]


def _engine(target_dir: Path, draft_dir: Path | None, k: int) -> SpecEngine:
    batch = len(PROMPTS)
    target = load_model(target_dir, num_slots=batch)
    proposer = (
        None
        if draft_dir is None
        else DraftModelProposer(load_model(draft_dir, num_slots=batch), sparse_top_k=0)
    )
    config = EngineConfig(
        max_batch_size=batch, num_speculative_tokens=k if proposer else 0, draft_sparse_top_k=0
    )
    return SpecEngine(target, proposer, config)


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_seeded_output_is_the_targets_alone(target_dir: Path, close_draft_dir: Path, temperature):
    alone = [o.token_ids for o in _engine(target_dir, None, 0).generate(_requests(temperature))]
    for k in (1, 4):
        engine = _engine(target_dir, close_draft_dir, k)
        assert [o.token_ids for o in engine.generate(_requests(temperature))] == alone, k
        assert 0 < engine.stats.num_accepted_tokens < engine.stats.num_draft_tokens
    for mode in ("sync", "overlapped"):
        options = RemoteOptions(mode=mode)
        with remote_engine(
            target_dir, close_draft_dir, options=options, k=3, batch=len(PROMPTS), sparse_top_k=0
        ) as setup:
            outputs = [o.token_ids for o in setup.engine.generate(_requests(temperature))]
            assert outputs == alone, mode
            assert setup.engine.stats.num_accepted_tokens > 0


def test_draft_equal_to_target_is_always_accepted(target_dir: Path) -> None:
    engine = _engine(target_dir, target_dir, 4)
    engine.generate(_requests(1.0))
    stats = engine.stats
    assert stats.num_draft_tokens > 40
    assert stats.num_accepted_tokens == stats.num_draft_tokens
