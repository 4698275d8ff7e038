"""A request's line and headers, bounded in arrival time: uvicorn's h11 protocol, one timer more.

uvicorn closes a kept-alive connection that stays idle between requests (`timeout_keep_alive`),
but not a new connection that sends nothing, nor one that sends part of a request line or of
its headers and stops: it holds each for as long as the client likes. Every open connection
counts against the server's cap (`limit_concurrency`), past which every client gets a 503, so
a few thousand such sockets shut the endpoint. Here a connection is closed when a request's
headers are not complete within `timeout_s` of the moment the server starts waiting for them:
when the connection opens, and when the first byte of a later request on it arrives. A
request being answered, however slowly, is never cut (the endpoint bounds a body's arrival
apart: body_limit.py). `specctl serve` and specd both run it.
"""

import asyncio
import logging

from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger(__name__)

DEFAULT_HEADER_TIMEOUT_S = 30.0


class _HeaderTimeoutProtocol(H11Protocol):
    timeout_s = DEFAULT_HEADER_TIMEOUT_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self._cycle_awaited: object = None
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._header_timer is None and (self.cycle is None or self.cycle.response_complete):
            self._arm()  # the first bytes of a later request on a kept-alive connection
        super().data_received(data)
        if self._header_timer is not None and self.cycle is not self._cycle_awaited:
            self._disarm()  # the request's headers are in: it is being answered

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._cycle_awaited = self.cycle
        self._header_timer = self.loop.call_later(self.timeout_s, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.cycle is self._cycle_awaited and not self.transport.is_closing():
            client = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
            logger.info("closing %s: no complete request headers in %g s", client, self.timeout_s)
            self.transport.close()


def header_timeout_protocol(timeout_s: float = DEFAULT_HEADER_TIMEOUT_S) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a deadline of `timeout_s` (> 0) for each request's headers:
    pass it as uvicorn.Config(http=...)."""
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    return type("HeaderTimeoutProtocol", (_HeaderTimeoutProtocol,), {"timeout_s": timeout_s})
