"""ThreadTransport: a real transport (bytes, in order, one reply each) with faults on cue."""

import time
from collections.abc import Iterator

import pytest

from daemon.runtime.proposers.ngram import NgramProposer
from daemon.runtime.remote.draft_server import DraftServer
from daemon.runtime.remote.messages import DraftRequest
from daemon.runtime.remote.thread_transport import ThreadTransport
from daemon.runtime.remote.transport import DrafterUnavailable
from daemon.runtime.remote.wire import decode_reply, encode_request


def _probe(message_id: int) -> bytes:
    return encode_request(DraftRequest(message_id))


@pytest.fixture
def transport() -> Iterator[ThreadTransport]:
    transport = ThreadTransport(DraftServer(NgramProposer(), instance_id=1))
    yield transport
    transport.close()


def test_replies_in_order(transport: ThreadTransport) -> None:
    calls = [transport.call_async(_probe(i)) for i in range(20)]
    assert [decode_reply(c.result(5.0)).message_id for c in calls] == list(range(20))
    assert decode_reply(transport.call(_probe(99), 5.0)).message_id == 99


def test_latency_is_emulated() -> None:
    transport = ThreadTransport(DraftServer(NgramProposer()), latency_s=0.2)
    try:
        call = transport.call_async(_probe(1))
        assert not call.done()
        with pytest.raises(DrafterUnavailable):
            call.result(0.05)  # a late reply counts as none
        start = time.monotonic()
        transport.call(_probe(2), 5.0)
        assert time.monotonic() - start >= 0.19
    finally:
        transport.close()


def test_kill_fails_pending_and_later_calls(transport: ThreadTransport) -> None:
    transport.hang()
    pending = transport.call_async(_probe(1))
    transport.kill()
    with pytest.raises(DrafterUnavailable, match="died"):
        pending.result(5.0)
    with pytest.raises(DrafterUnavailable, match="dead"):
        transport.call(_probe(2), 5.0)


def test_hang_times_out_then_restart_serves_a_new_instance(transport: ThreadTransport) -> None:
    transport.hang()
    with pytest.raises(DrafterUnavailable, match="within"):
        transport.call(_probe(1), 0.1)
    transport.restart(DraftServer(NgramProposer(), instance_id=2))
    assert decode_reply(transport.call(_probe(3), 5.0)).instance_id == 2


def test_close_fails_pending_calls(transport: ThreadTransport) -> None:
    transport.hang()
    pending = transport.call_async(_probe(1))
    transport.close()
    with pytest.raises(DrafterUnavailable, match="closed"):
        pending.result(5.0)
    with pytest.raises(DrafterUnavailable, match="closed"):
        transport.call(_probe(2), 1.0)
