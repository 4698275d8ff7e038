"""The draft takes a long prompt a chunk a round while other sequences draft (the engine's
`prefill_chunk_tokens`), in the verifier's process and behind a drafter's wire protocol: no
round waits for a whole prompt's draft prefill, and the output is target-only decoding's."""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from daemon.runtime.engine.engine import SpecEngine
from daemon.runtime.engine.request import Request
from daemon.runtime.errors import RequestError
from daemon.runtime.model.batch import ForwardBatch, LogitsMode
from daemon.runtime.model.protocol import CausalLM
from daemon.runtime.proposers.draft_model import DraftModelProposer
from daemon.runtime.sampling.params import SamplingParams
from tests.engine.helpers import make_engine
from tests.remote.helpers import remote_engine

CHUNK = 4
LONG_RUN = 120  # tokens "a" generates: it drafts through every round of "b"'s feeding


@dataclass(slots=True)
class Feeds:
    """The draft model's cache-filling passes: (tokens per row, whether "a" was running)."""

    passes: list[tuple[list[int], bool]] = field(default_factory=list)
    a_running: bool = True


def _record_feeds(model: CausalLM, feeds: Feeds) -> None:
    forward = model.forward

    def recording(batch: ForwardBatch) -> torch.Tensor | None:
        if batch.logits_mode is LogitsMode.NONE:
            feeds.passes.append(([len(t) for t in batch.token_ids], feeds.a_running))
        return forward(batch)

    model.forward = recording  # type: ignore[method-assign]


def _requests(prompts: list[list[int]]) -> list[Request]:
    long_prompt = next(p for p in prompts if len(p) == 40)
    return [
        Request("a", prompts[1], SamplingParams(max_tokens=LONG_RUN, ignore_eos=True)),
        Request("b", long_prompt, SamplingParams(max_tokens=24, ignore_eos=True)),
    ]


def _run(engine: SpecEngine, requests: list[Request], feeds: Feeds) -> dict[str, list[int]]:
    """ "a" alone for a step (its drafts start), then "b" joins; to the end."""
    done: dict[str, list[int]] = {}
    engine.add_request(requests[0])
    for _ in range(2):
        done.update((o.request_id, o.token_ids) for o in engine.step().finished)
    engine.add_request(requests[1])
    while engine.has_unfinished():
        finished = engine.step().finished
        done.update((o.request_id, o.token_ids) for o in finished)
        feeds.a_running = feeds.a_running and "a" not in {o.request_id for o in finished}
    return done


@contextmanager
def _engine(
    where: str, target_dir: Path, draft_dir: Path
) -> Iterator[tuple[SpecEngine, DraftModelProposer]]:
    if where == "in-process":
        engine = make_engine(target_dir, draft_dir, k=3, batch=2, prefill_chunk_tokens=CHUNK)
        assert isinstance(engine.proposer, DraftModelProposer)
        yield engine, engine.proposer
        return
    with remote_engine(
        target_dir, draft_dir, mode=where, k=3, batch=2, prefill_chunk_tokens=CHUNK
    ) as setup:
        proposer = setup.server.proposer
        assert isinstance(proposer, DraftModelProposer)
        yield setup.engine, proposer


@pytest.mark.parametrize("where", ["in-process", "sync", "overlapped"])
def test_a_long_prompt_goes_into_the_draft_a_chunk_a_round(
    target_dir: Path, draft_dir: Path, prompts, where: str
) -> None:
    expected = make_engine(target_dir, batch=2).generate(_requests(prompts))
    feeds = Feeds()
    with _engine(where, target_dir, draft_dir) as (engine, proposer):
        _record_feeds(proposer.model, feeds)
        done = _run(engine, _requests(prompts), feeds)
        accepted = engine.stats.num_accepted_tokens
        costs = engine.controller.costs
        learned_behind = [b for q in costs.catch_up_samples.values() for b, _ in q]
    assert done == {o.request_id: o.token_ids for o in expected}
    assert accepted > 0
    # "a", alone, went in whole at its first drafts (its prompt and first token: 18 tokens)
    assert feeds.passes[0] == ([len(prompts[1]) + 1], True)
    # "b" (40 tokens, and a token more each round it decodes meanwhile) while "a" drafted:
    # CHUNK tokens of backlog a round (CHUNK + the one it gained), the rest in the last
    beside_a = [rows for rows, a_running in feeds.passes[1:] if a_running]
    assert len(beside_a) >= 41 // CHUNK
    assert beside_a[:-1] == [[CHUNK + 1]] * (len(beside_a) - 1)
    assert 1 <= beside_a[-1][0] <= CHUNK + 1
    assert len(feeds.passes) == 1 + len(beside_a)  # nothing more: "b" was all in
    # the rounds that fed "b" a chunk are no catch-ups of its whole backlog: the cost model
    # learned none (it took each for one of ~50 tokens, which cost a chunk's time)
    assert all(behind < 40 for behind in learned_behind), learned_behind


def test_a_sequence_alone_goes_in_whole(target_dir: Path, draft_dir: Path, prompts) -> None:
    """Nothing else drafts, so nothing waits: the whole prompt in one pass at once."""
    engine = make_engine(target_dir, draft_dir, k=3, batch=2, prefill_chunk_tokens=CHUNK)
    assert isinstance(engine.proposer, DraftModelProposer)
    feeds = Feeds()
    _record_feeds(engine.proposer.model, feeds)
    long_request = _requests(prompts)[1]
    engine.generate([long_request])
    assert feeds.passes == [([41], True)]


def test_a_chunk_below_one_is_refused(target_dir: Path) -> None:
    from daemon.runtime.model import load_model

    model = load_model(target_dir, num_slots=1, max_model_len=64)
    with pytest.raises(RequestError, match="prefill_chunk_tokens must be >= 1, got 0"):
        DraftModelProposer(model, prefill_chunk_tokens=0)


def test_a_round_that_asks_for_the_new_sequence_alone_still_feeds_a_chunk(
    draft_dir: Path, prompts
) -> None:
    """An overlapped round's message leaves out the sequences whose prepared branch hit: the
    new one may come alone while the others draft. Whether others draft is the drafter's own
    knowledge (it went in whole when the message was all it looked at)."""
    from daemon.runtime.model import load_model
    from daemon.runtime.proposers.base import ProposeRequest

    model = load_model(draft_dir, num_slots=2, max_model_len=256)
    proposer = DraftModelProposer(model, prefill_chunk_tokens=CHUNK)
    feeds = Feeds()
    _record_feeds(model, feeds)
    greedy = SamplingParams()

    def ask(slot: int, tokens: list[int]) -> int:
        request = ProposeRequest([slot], [tokens], [3], [greedy], [0])
        return proposer.propose(request).num_draft_tokens[0]

    proposer.admit([0], [prompts[1]])
    assert ask(0, prompts[1]) == 3  # alone in the drafter: in whole, then drafts
    long_prompt = next(p for p in prompts if len(p) == 40)
    proposer.admit([1], [long_prompt])
    rounds = 0
    while ask(1, long_prompt) == 0:
        rounds += 1
    # 40 tokens, CHUNK + 1 a round (the chunk and the token a sequence being fed gains a
    # round): 8 pieces, drafts in the round of the last
    assert rounds == 7
    assert [rows for rows, _ in feeds.passes] == [[len(prompts[1])]] + [[CHUNK + 1]] * 8
