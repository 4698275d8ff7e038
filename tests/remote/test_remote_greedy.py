"""Greedy output through the remote path is token-identical to target-only decoding: sync and
overlapped, batch 1 and a ragged batch of 8, fixed k, adaptive k, n-gram, k = 0 rounds."""

from pathlib import Path

import pytest

from daemon.runtime.engine.request import Request
from daemon.runtime.remote.options import RemoteOptions
from daemon.runtime.sampling.params import SamplingParams
from tests.engine.helpers import run_greedy
from tests.remote.conftest import MAX_TOKENS
from tests.remote.helpers import remote_engine

MODES = ["sync", "overlapped"]


def _tokens(outputs: list) -> list[list[int]]:
    return [o.token_ids for o in outputs]


@pytest.mark.parametrize(
    ("mode", "miss_policy"),
    [("sync", "fresh"), ("overlapped", "fresh"), ("overlapped", "skip"), ("overlapped", "auto")],
)
def test_ragged_batch8_fixed_k(
    target_dir: Path, draft_dir: Path, prompts, reference, mode: str, miss_policy: str
) -> None:
    options = RemoteOptions(mode=mode, miss_policy=miss_policy)
    with remote_engine(target_dir, draft_dir, options=options, k=4, batch=8) as setup:
        assert _tokens(run_greedy(setup.engine, prompts, MAX_TOKENS)) == reference
        stats = setup.remote.stats
        assert setup.engine.stats.num_draft_tokens > 0
        assert 0.2 < setup.engine.stats.acceptance_rate < 0.95  # every verdict kind occurs
        assert stats.num_rounds_without_drafter == 0
        if mode == "sync":
            assert stats.num_with_branches == 0 and stats.num_fresh == stats.num_seq_rounds
            return
        assert stats.num_hits > 0 and stats.num_hidden_drafts > 0
        assert stats.num_hits < stats.num_with_branches  # misses happen too
        if miss_policy == "fresh":
            assert {"all", "a=0"} <= set(stats.hits)  # the main branch and forks won
            assert stats.num_skipped == 0
        elif miss_policy == "skip":
            assert stats.num_fresh == 0 and stats.num_skipped > 0  # never a blocking call


@pytest.mark.parametrize("mode", MODES)
def test_batch1(target_dir: Path, draft_dir: Path, prompts, reference, mode) -> None:
    with remote_engine(target_dir, draft_dir, mode=mode, k=3, batch=1) as setup:
        assert _tokens(run_greedy(setup.engine, prompts[:3], MAX_TOKENS)) == reference[:3]
        assert setup.engine.stats.num_accepted_tokens > 0


@pytest.mark.parametrize("mode", MODES)
def test_adaptive_k(target_dir: Path, draft_dir: Path, prompts, reference, mode) -> None:
    with remote_engine(target_dir, draft_dir, mode=mode, k=6, adaptive=True) as setup:
        assert _tokens(run_greedy(setup.engine, prompts, MAX_TOKENS)) == reference


@pytest.mark.parametrize("mode", MODES)
def test_ngram(target_dir: Path, prompts, reference, mode) -> None:
    repetitive = [p * 3 for p in prompts[:4]]  # so that lookups find something
    with remote_engine(target_dir, None, mode=mode, k=4) as setup:
        outputs = _tokens(run_greedy(setup.engine, repetitive, MAX_TOKENS))
    from tests.engine.helpers import make_engine

    plain = make_engine(target_dir, batch=8)
    assert outputs == _tokens(run_greedy(plain, repetitive, MAX_TOKENS))
    assert setup.engine.stats.num_draft_tokens > 0


def test_k0_for_some_sequences(target_dir: Path, draft_dir: Path, prompts, reference) -> None:
    """max_tokens 1 and 2 leave no room to draft (k = 0) while the others speculate; slots
    are reused as short requests finish."""
    lengths = [1, 2, MAX_TOKENS, 1, MAX_TOKENS, 2, MAX_TOKENS, 3]
    with remote_engine(target_dir, draft_dir, k=4, batch=4) as setup:
        requests = [
            Request(f"r{i}", p, SamplingParams(max_tokens=n, ignore_eos=True))
            for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))
        ]
        outputs = setup.engine.generate(requests)
    for out, ref, n in zip(outputs, reference, lengths, strict=True):
        assert out.token_ids == ref[:n]


def test_k0_for_every_sequence(target_dir: Path, draft_dir: Path, prompts, reference) -> None:
    """A proposal request with k = 0 everywhere (the engine skips the call; a caller may not)."""
    from daemon.runtime.proposers.base import ProposeRequest

    with remote_engine(target_dir, draft_dir, k=4, batch=2) as setup:
        setup.remote.admit([0, 1], prompts[:2])
        request = ProposeRequest([0, 1], prompts[:2], [0, 0], [SamplingParams()] * 2, [0, 0])
        proposals = setup.remote.propose(request)
        assert proposals.num_draft_tokens == [0, 0]
        request.num_to_draft = [3, 0]
        assert setup.remote.propose(request).num_draft_tokens == [3, 0]
        assert setup.server.slots == [0]  # the k = 0 sequence is admitted lazily
