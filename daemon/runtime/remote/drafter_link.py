"""The verifier's line to its drafter: sending requests, checking replies, and finding a lost
drafter again with a cheap probe.

A reply must come from the instance the verifier has been talking to and answer the request
it was sent for; anything else (a restarted or re-placed drafter has a new instance id, a
malformed reply, an error about the whole request) means the drafter's state cannot be
trusted, which the caller treats like an unavailable drafter. While it is lost, a probe (an
empty request) goes out no more often than every `probe_every_rounds` rounds and
`probe_interval_s` seconds, without blocking a round: its reply is looked at when it has
arrived, and the next round resynchronises every sequence with the drafter that answered.
"""

import logging
import time

from daemon.runtime.remote.messages import WHOLE_MESSAGE, DraftReply, DraftRequest
from daemon.runtime.remote.options import RemoteOptions
from daemon.runtime.remote.remote_stats import RemoteRoundStats
from daemon.runtime.remote.transport import DrafterUnavailable, DraftTransport, PendingCall
from daemon.runtime.remote.wire import decode_reply, encode_request
from daemon.runtime.remote.wire_io import WireError

logger = logging.getLogger(__name__)
MAX_MESSAGE_ID = 0xFFFFFFFF


class DrafterLink:
    def __init__(self, transport: DraftTransport, options: RemoteOptions) -> None:
        self.transport = transport
        self.options = options
        self.instance_id: int | None = None  # learnt from the first reply
        self.is_available = True
        self._message_id = 0
        self._probe: tuple[PendingCall, int, float] | None = None  # call, message id, sent at
        self._rounds_down = 0
        self._last_probe_s = float("-inf")

    def new_request(self, coupled: bool = False) -> DraftRequest:
        """The next message; `coupled`: its sampled drafts go coupled (DraftRequest.coupled)."""
        self._message_id = (self._message_id + 1) & MAX_MESSAGE_ID
        return DraftRequest(message_id=self._message_id, coupled=coupled)

    # -- calls ------------------------------------------------------------------------------
    def call(self, request: DraftRequest, timeout_s: float, stats: RemoteRoundStats) -> DraftReply:
        """Send and wait (at most `timeout_s`); raises DrafterUnavailable."""
        payload = encode_request(request)
        stats.bytes_sent += len(payload)
        start = time.perf_counter()
        try:
            data = self.transport.call(payload, timeout_s)
        finally:
            stats.wait_s += time.perf_counter() - start
        return self.accept(request.message_id, data, stats)

    def send(self, request: DraftRequest, stats: RemoteRoundStats) -> PendingCall:
        payload = encode_request(request)
        stats.bytes_sent += len(payload)
        return self.transport.call_async(payload)

    def accept(self, message_id: int, data: bytes, stats: RemoteRoundStats) -> DraftReply:
        """Decode and check a reply; raises DrafterUnavailable if it cannot be trusted."""
        stats.bytes_received += len(data)
        try:
            reply = decode_reply(data)
        except WireError as exc:
            raise DrafterUnavailable(f"malformed reply from the drafter: {exc}") from None
        if self.instance_id is None:
            self.instance_id = reply.instance_id
        if reply.instance_id != self.instance_id:
            raise DrafterUnavailable(
                f"the drafter was replaced (instance {reply.instance_id:x}, "
                f"was {self.instance_id:x}): its state is gone"
            )
        if reply.message_id != message_id:
            raise DrafterUnavailable(
                f"reply to message {reply.message_id} while waiting for {message_id}"
            )
        whole = [e.message for e in reply.errors if e.slot == WHOLE_MESSAGE]
        if whole:
            raise DrafterUnavailable(f"the drafter failed the request: {whole[0]}")
        stats.drafter_draft_s += reply.draft_time_s
        stats.drafter_prepare_s += reply.prepare_time_s
        return reply

    # -- losing and finding the drafter -----------------------------------------------------
    def lose(self, reason: str) -> None:
        if self.is_available:
            logger.warning("drafter unavailable, speculating with k = 0: %s", reason)
        self.is_available = False
        self._rounds_down = 0
        self._probe = None

    def poll(self, stats: RemoteRoundStats) -> bool:
        """Called once per round while lost: True when a probe has found a drafter (whose
        instance id is then the one to talk to)."""
        self._rounds_down += 1
        now = time.monotonic()
        if self._probe is None:
            due = now - self._last_probe_s >= self.options.probe_interval_s
            if self._rounds_down >= self.options.probe_every_rounds and due:
                request = self.new_request()
                self._probe = (self.send(request, stats), request.message_id, now)
                self._last_probe_s, self._rounds_down = now, 0
            return False
        call, message_id, sent_at = self._probe
        if not call.done():
            if now - sent_at > self.options.probe_timeout_s:
                self._probe = None  # a late answer counts as none
            return False
        self._probe = None
        try:
            data = call.result(0.0)
            self.instance_id = None  # whoever answers now is the drafter
            self.accept(message_id, data, stats)
        except DrafterUnavailable as exc:
            logger.info("drafter probe failed: %s", exc)
            return False
        logger.warning("drafter %x is back: resynchronising", self.instance_id)
        self.is_available = True
        return True
