"""A path with a trailing slash is served as the path without it (ASGI middleware, outermost).

Starlette answers `POST /v1/completions/` with a 307 to `/v1/completions` and an empty body:
curl prints nothing, httpx (which follows no redirect unless asked) hands the client a 307,
and a client that follows it sends the body twice. OpenAI clients built on a base URL with a
trailing slash, or hand-joined paths, make such requests; the endpoint they mean is clear.
"""

from starlette.types import ASGIApp, Receive, Scope, Send


class TrailingSlashMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and len(path) > 1 and path.endswith("/"):
            scope = {**scope, "path": path.rstrip("/") or "/"}
            raw = scope.get("raw_path")
            if raw:
                scope["raw_path"] = raw.rstrip(b"/") or b"/"
        await self.app(scope, receive, send)
