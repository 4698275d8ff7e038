"""The drafter's one entry point: whatever a request says, a reply comes back."""

from pathlib import Path

import pytest

from daemon.runtime.model import load_model
from daemon.runtime.proposers.draft_model import DraftModelProposer
from daemon.runtime.proposers.drafts import NO_BRANCH
from daemon.runtime.proposers.ngram import NgramProposer
from daemon.runtime.remote.draft_server import DraftServer
from daemon.runtime.remote.messages import (
    WHOLE_MESSAGE,
    AdmitEntry,
    DraftEntry,
    DraftReply,
    DraftRequest,
    UpdateEntry,
)
from daemon.runtime.remote.wire import decode_reply, encode_request


@pytest.fixture
def server(draft_dir: Path) -> DraftServer:
    return DraftServer(DraftModelProposer(load_model(draft_dir, num_slots=4)), instance_id=42)


def _send(server: DraftServer, request: DraftRequest) -> DraftReply:
    return decode_reply(server.handle(encode_request(request)))


def _admit(slot: int, tokens: list[int], temperature: float = 0.0) -> AdmitEntry:
    return AdmitEntry(slot, tokens, draft_seed=9, temperature=temperature)


def test_admit_propose_update_prepare(server: DraftServer, prompts) -> None:
    admits = [_admit(0, prompts[0]), _admit(2, prompts[1], 0.8)]
    reply = _send(
        server, DraftRequest(1, admits=admits, propose=[DraftEntry(0, 3), DraftEntry(2, 4)])
    )
    assert (reply.message_id, reply.instance_id, reply.errors) == (1, 42, [])
    assert [len(p.drafts) for p in reply.proposals] == [3, 4]
    assert reply.proposals[0].drafts.sparse == [None] * 3  # greedy: ids only
    assert all(s is not None for s in reply.proposals[1].drafts.sparse)  # sampled: counts
    assert reply.draft_time_s > 0
    first_drafts = reply.proposals[0].drafts.tokens
    reply = _send(server, DraftRequest(2, prepare=[DraftEntry(0, 3), DraftEntry(2, 2)]))
    assert reply.errors == [] and reply.prepare_time_s > 0
    assert [b.slot for b in reply.branches] == [0, 2]
    main = reply.branches[0].branches[0]
    assert main.num_accepted == 3 and len(main.drafts) == 3
    # the verdict matched the all-accepted branch: the update names it, and the next prepare
    # works from its drafts without a fresh proposal
    drafts = first_drafts
    update = UpdateEntry(0, [*drafts, main.token], branch=0, num_used=3)
    reply = _send(server, DraftRequest(3, updates=[update], prepare=[DraftEntry(0, 3)]))
    assert reply.errors == [] and server.token_ids(0) == [*prompts[0], *drafts, main.token]
    assert reply.branches[0].branches[0].num_accepted == 3
    probe = _send(server, DraftRequest(4))
    assert (probe.message_id, probe.instance_id, probe.errors, probe.proposals) == (4, 42, [], [])


def test_k0_and_unknown_slots_and_resync(server: DraftServer, prompts) -> None:
    reply = _send(
        server,
        DraftRequest(
            5,
            admits=[_admit(1, prompts[2])],
            updates=[UpdateEntry(3, [7])],  # never admitted
            propose=[DraftEntry(1, 0), DraftEntry(2, 4)],  # k = 0; slot 2 unknown
            prepare=[DraftEntry(1, 0)],
        ),
    )
    assert reply.proposals[0].slot == 1 and len(reply.proposals[0].drafts) == 0
    assert {e.slot for e in reply.errors} == {3, 2}
    assert all("never admitted" in e.message for e in reply.errors)
    assert reply.branches[0].branches == []
    # a re-admit with a longer token list resynchronises the slot
    longer = prompts[2] + [5, 6, 7]
    reply = _send(server, DraftRequest(6, admits=[_admit(1, longer)], propose=[DraftEntry(1, 2)]))
    assert reply.errors == [] and server.token_ids(1) == longer
    # updates extend it; an update naming a branch that was never prepared is refused
    reply = _send(server, DraftRequest(7, updates=[UpdateEntry(1, [9], branch=4, num_used=2)]))
    assert [e.slot for e in reply.errors] == [1] and "no prepared branch" in reply.errors[0].message
    assert server.token_ids(1) == [*longer, 9]
    # release, reset
    _send(server, DraftRequest(8, releases=[1]))
    assert server.slots == []
    _send(server, DraftRequest(9, admits=[_admit(0, [1, 2])]))
    _send(server, DraftRequest(10, is_reset=True))
    assert server.slots == []


def test_malformed_messages_get_an_error_reply(server: DraftServer) -> None:
    for payload in (b"", b"junk", encode_request(DraftRequest(3))[:-1] + b"\xff\xff"):
        reply = decode_reply(server.handle(payload))
        assert reply.instance_id == 42 and reply.errors[0].slot == WHOLE_MESSAGE
        assert "draft request" in reply.errors[0].message
    reply = _send(server, DraftRequest(4, admits=[_admit(0, [])]))
    assert reply.errors[0].slot == 0 and "no tokens" in reply.errors[0].message
    # the draft model refuses a token outside its vocabulary: an error for that slot
    reply = _send(server, DraftRequest(5, admits=[_admit(1, [3, 99_999])]))
    assert reply.errors[0].slot == 1 and "admit failed" in reply.errors[0].message
    assert server.slots == []


def test_propose_before_admit_then_after(prompts) -> None:
    server = DraftServer(NgramProposer(), instance_id=1)
    reply = _send(server, DraftRequest(1, propose=[DraftEntry(0, 2)]))
    assert reply.errors[0].slot == 0
    reply = _send(
        server, DraftRequest(2, admits=[_admit(0, [1, 2, 1, 2])], propose=[DraftEntry(0, 2)])
    )
    assert reply.proposals[0].drafts.tokens == [1, 2]


def test_ngram_server_prepares_and_adopts(prompts) -> None:
    server = DraftServer(NgramProposer(), instance_id=1)
    tokens = [4, 5, 6, 4, 5, 6, 4, 5]
    reply = _send(server, DraftRequest(1, admits=[_admit(0, tokens)], propose=[DraftEntry(0, 3)]))
    assert reply.proposals[0].drafts.tokens == [6, 4, 5]
    reply = _send(server, DraftRequest(2, prepare=[DraftEntry(0, 3)]))
    branches = reply.branches[0].branches
    assert branches[0].key == (3, 6)  # all accepted, then "6" again
    reply = _send(server, DraftRequest(3, updates=[UpdateEntry(0, [6, 4, 5, 6], 0, 3)]))
    assert reply.errors == []
    reply = _send(server, DraftRequest(4, updates=[UpdateEntry(0, [1], NO_BRANCH, 0)]))
    assert server.token_ids(0) == [*tokens, 6, 4, 5, 6, 1]
