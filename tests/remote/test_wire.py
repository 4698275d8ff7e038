"""The wire format: round trips, the per-round size budget, and a decoder that only ever
fails with a clear WireError."""

import contextlib

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon.runtime.proposers.drafts import NO_BRANCH, DraftRecord, PreparedBranch, SparseDraw
from daemon.runtime.remote.messages import (
    WHOLE_MESSAGE,
    AdmitEntry,
    DraftEntry,
    DraftReply,
    DraftRequest,
    SlotBranches,
    SlotDrafts,
    SlotError,
    UpdateEntry,
)
from daemon.runtime.remote.wire import (
    VERSION,
    decode_reply,
    decode_request,
    encode_reply,
    encode_request,
)
from daemon.runtime.remote.wire_budget import bytes_per_round_per_seq
from daemon.runtime.remote.wire_io import WireError
from daemon.runtime.sampling.quantized import MAX_LISTED, PROPOSAL_TOTAL, quantize_counts


def _sampled(tokens: list[int], width: int, vocab: int, seed: int = 0) -> DraftRecord:
    """Drafts each with a full top-`width` support (every count non-zero), the draft inside."""
    gen = torch.Generator().manual_seed(seed)
    record = DraftRecord()
    for token in tokens:
        others = torch.randperm(vocab, generator=gen)
        ids = torch.cat([torch.tensor([token]), others[others != token][: width - 1]])
        probs = torch.softmax(torch.randn(width, generator=gen) * 0.3, dim=0)
        record.append(token, SparseDraw(ids, quantize_counts(probs[None])[0]), [])
    return record


def _request() -> DraftRequest:
    return DraftRequest(
        message_id=77,
        is_reset=True,
        releases=[3, 9],
        admits=[AdmitEntry(4, [1, 2, 3, 70000], 2**63 - 1, 0.7)],
        updates=[UpdateEntry(5, [8, 9], 2, 3), UpdateEntry(6, [], NO_BRANCH, 0)],
        propose=[DraftEntry(5, 4), DraftEntry(4, 0)],
        prepare=[DraftEntry(5, 4)],
    )


def _reply(vocab: int = 4096) -> DraftReply:
    greedy = DraftRecord([11, 12], [None, None], [[], []])
    return DraftReply(
        message_id=77,
        instance_id=0xABCDEF,
        errors=[SlotError(WHOLE_MESSAGE, "bad thing ✓"), SlotError(7, "unknown slot 7")],
        proposals=[SlotDrafts(5, _sampled([10, 20, 30, 40], 32, vocab)), SlotDrafts(8, greedy)],
        branches=[SlotBranches(5, [PreparedBranch(4, 99, _sampled([1, 2], 5, vocab, seed=1))])],
        draft_time_s=0.25,
        prepare_time_s=0.5,
    )


def _records_equal(a: DraftRecord, b: DraftRecord) -> None:
    assert a.tokens == b.tokens
    for x, y in zip(a.sparse, b.sparse, strict=True):
        assert (x is None) == (y is None)
        if x is not None and y is not None:
            keep = x.counts > 0
            assert x.ids[keep].tolist() == y.ids.tolist()
            assert x.counts[keep].tolist() == y.counts.tolist()


def test_request_round_trip() -> None:
    request = _request()
    decoded = decode_request(encode_request(request))
    assert decoded == request
    assert DraftRequest(message_id=1).is_probe and not request.is_probe


@pytest.mark.parametrize("vocab", [4096, 151_936], ids=["uint16-ids", "int32-ids"])
def test_reply_round_trip(vocab: int) -> None:
    reply = _reply(vocab)
    if vocab > 65536:
        reply.proposals[1].drafts.tokens[0] = 150_000
    decoded = decode_reply(encode_reply(reply))
    assert (decoded.message_id, decoded.instance_id) == (77, 0xABCDEF)
    assert decoded.errors == reply.errors
    assert decoded.draft_time_s == 0.25 and decoded.prepare_time_s == 0.5
    for mine, theirs in zip(reply.proposals, decoded.proposals, strict=True):
        assert mine.slot == theirs.slot
        _records_equal(mine.drafts, theirs.drafts)
    branch, back = reply.branches[0].branches[0], decoded.branches[0].branches[0]
    assert (back.num_accepted, back.token) == (branch.num_accepted, branch.token)
    _records_equal(branch.drafts, back.drafts)


def test_zero_counts_are_not_sent() -> None:
    record = DraftRecord()
    record.append(5, SparseDraw(torch.tensor([5, 6, 7]), torch.tensor([PROPOSAL_TOTAL, 0, 0])), [])
    reply = DraftReply(1, 2, proposals=[SlotDrafts(0, record)])
    back = decode_reply(encode_reply(reply)).proposals[0].drafts.sparse[0]
    assert back is not None and back.ids.tolist() == [5] and back.counts.tolist() == [32768]


@pytest.mark.parametrize("context_len", [10, 10_000])
def test_round_fits_one_kilobyte_at_k4_top32_sampled(context_len: int) -> None:
    """A sync round per sequence — the update (up to k + 1 committed tokens), the propose
    entry and the reply's four sampled drafts with 32-token supports — is under 1 KB, and
    does not depend on the context length."""
    size = bytes_per_round_per_seq(context_len=context_len, k=4, sparse_top_k=32, sampled=True)
    assert size <= 1024
    assert size == bytes_per_round_per_seq(context_len=10, k=4, sparse_top_k=32, sampled=True)
    greedy = bytes_per_round_per_seq(context_len=context_len, k=4, sparse_top_k=32, sampled=False)
    assert greedy < 64


def test_every_truncation_is_a_clear_error() -> None:
    for payload, decode in ((encode_request(_request()), decode_request),
                            (encode_reply(_reply()), decode_reply)):  # fmt: skip
        for cut in range(len(payload)):
            with pytest.raises(WireError, match=r"truncated|bad magic|version"):
                decode(payload[:cut])
        with pytest.raises(WireError, match="trailing"):
            decode(payload + b"\0")


def test_a_peer_of_another_version_is_refused() -> None:
    """Version 4 changed the Gumbel field: a version-3 peer's coupled drafts would seldom
    match, so its messages are refused with both versions named."""
    for payload, decode in ((encode_request(_request()), decode_request),
                            (encode_reply(_reply()), decode_reply)):  # fmt: skip
        old = bytearray(payload)
        old[4] = VERSION - 1  # the version byte follows the 4-byte magic
        with pytest.raises(
            WireError, match=f"unsupported version {VERSION - 1} .*speaks {VERSION}"
        ):
            decode(bytes(old))


def test_semantic_checks() -> None:
    """A proposal that is not a distribution containing its draft would break losslessness."""
    record = DraftRecord()
    record.append(5, SparseDraw(torch.tensor([6, 7]), torch.tensor([16384, 16384])), [])
    with pytest.raises(WireError, match="outside its proposal"):
        decode_reply(encode_reply(DraftReply(1, 2, proposals=[SlotDrafts(0, record)])))
    record.sparse[0] = SparseDraw(torch.tensor([5, 7]), torch.tensor([16384, 16383]))
    with pytest.raises(WireError, match="sum with the tail to"):
        decode_reply(encode_reply(DraftReply(1, 2, proposals=[SlotDrafts(0, record)])))
    # a draft outside the listed tokens is fine when the tail holds mass (it came from there)
    record.sparse[0] = SparseDraw(torch.tensor([6, 7]), torch.tensor([16384, 16383]), 1)
    decoded = decode_reply(encode_reply(DraftReply(1, 2, proposals=[SlotDrafts(0, record)])))
    (sent,) = decoded.proposals[0].drafts.sparse
    assert sent is not None and sent.tail == 1 and sent.ids.tolist() == [6, 7]
    # all of the mass in the tail: no token listed, still a sampled draft
    record.sparse[0] = SparseDraw(torch.tensor([6]), torch.tensor([0]), 32768)
    decoded = decode_reply(encode_reply(DraftReply(1, 2, proposals=[SlotDrafts(0, record)])))
    (sent,) = decoded.proposals[0].drafts.sparse
    assert sent is not None and sent.tail == 32768 and sent.ids.numel() == 0
    record.sparse[0] = SparseDraw(torch.tensor([5, 5]), torch.tensor([16384, 16384]))
    with pytest.raises(WireError, match="repeated"):
        decode_reply(encode_reply(DraftReply(1, 2, proposals=[SlotDrafts(0, record)])))
    bad = DraftRequest(1, admits=[AdmitEntry(0, [1], 0, float("nan"))])
    with pytest.raises(WireError, match="temperature"):
        decode_request(encode_request(bad))
    with pytest.raises(WireError, match="expected bytes"):
        decode_request("text")  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400))
def test_fuzz_random_bytes(data: bytes) -> None:
    for decode in (decode_request, decode_reply):
        with contextlib.suppress(WireError):
            decode(data)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_fuzz_mutated_messages(data: st.DataObject) -> None:
    """Valid messages with bytes flipped, cut or spliced: decoded or refused, never a crash."""
    for payload, decode in ((encode_request(_request()), decode_request),
                            (encode_reply(_reply()), decode_reply)):  # fmt: skip
        mutated = bytearray(payload)
        for _ in range(data.draw(st.integers(1, 4))):
            at = data.draw(st.integers(0, len(mutated) - 1))
            mutated[at] = data.draw(st.integers(0, 255))
        cut = data.draw(st.integers(0, len(mutated)))
        with contextlib.suppress(WireError):
            decode(bytes(mutated[:cut]))


@pytest.mark.parametrize("width", [253, 254, 255, 1000, MAX_LISTED])
def test_wide_supports_round_trip_and_wider_ones_are_refused(width: int) -> None:
    """Supports past the width byte's range carry their size as a u16 after an escape byte."""
    record = _sampled([7, 8], width, 151_936)
    reply = DraftReply(1, 2, proposals=[SlotDrafts(0, record)])
    back = decode_reply(encode_reply(reply)).proposals[0].drafts
    for sent, got in zip(record.sparse, back.sparse, strict=True):
        assert sent is not None and got is not None
        assert got.ids.tolist() == sent.ids.tolist()
        assert got.counts.tolist() == sent.counts.tolist()
    too_wide = _sampled([7], MAX_LISTED + 1, 151_936)
    with pytest.raises(ValueError, match="lists"):
        encode_reply(DraftReply(1, 2, proposals=[SlotDrafts(0, too_wide)]))
