"""Fuzzed requests against a live specd, driven by its own OpenAPI schema: whatever the body,
query or Authorization header, the answer is never a 5xx and never a traceback."""

from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from daemon.specd.api_models import RayStartRequest
from daemon.specd.app import create_app
from daemon.specd.config import SpecdConfig
from daemon.specd.ray_node import RayNode

from .specd_process import SpecdProcess, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CLOSED_PORT = free_port()  # nothing listens here: a worker body pointing at it gets a 400
SAFE_ADDRESSES = {f"127.0.0.1:{CLOSED_PORT}", f"localhost:{CLOSED_PORT}", f"[::1]:{CLOSED_PORT}"}


def _operations(tmp_dir: Path) -> list[tuple[str, str, bool, list[str]]]:
    """(method, path, takes a JSON body, query parameter names) for every route in the schema."""
    config = SpecdConfig(state_dir=str(tmp_dir))
    node = RayNode(config, tmp_dir / "token", lambda: None)  # type: ignore[arg-type, return-value]
    schema = create_app(config, "0" * 64, tmp_dir / "token", node, lambda: None).openapi()  # type: ignore[arg-type, return-value]
    operations = []
    for path, methods in schema["paths"].items():
        for method, operation in methods.items():
            params = [p["name"] for p in operation.get("parameters", []) if p["in"] == "query"]
            operations.append((method.upper(), path, "requestBody" in operation, params))
    return operations


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=20), children, max_size=4)
    ),
    max_leaves=12,
)
label_dicts = st.dictionaries(st.text(max_size=70), json_values | st.text(max_size=70), max_size=5)
near_valid = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["head", "worker", "HEAD", "", "leader"]) | json_values,
        "address": st.sampled_from(sorted(SAFE_ADDRESSES)) | st.text(max_size=60) | json_values,
        "labels": label_dicts | json_values,
    },
)
bodies = near_valid | json_values
header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=80)


def _harmless(body: Any) -> bool:
    """Bodies that would really start Ray (a head, or a worker dialling anything but the closed
    loopback port) are left to the cluster test: the fuzzer must not join other clusters."""
    try:
        request = RayStartRequest.model_validate(body)
    except ValidationError:
        return True
    return request.role == "worker" and request.address in SAFE_ADDRESSES


def test_fuzzed_requests_never_get_a_5xx(specd_single: SpecdProcess, tmp_path: Path) -> None:
    operations = _operations(tmp_path)
    assert {(m, p) for m, p, _, _ in operations} >= {("POST", "/v1/ray/start"), ("GET", "/v1/logs")}

    @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        operation=st.sampled_from(operations),
        body=bodies,
        raw=st.none() | st.binary(max_size=60),
        query=st.lists(header_text, max_size=2),
        auth=st.sampled_from(["good", "none"]) | header_text,
    )
    def check(operation: tuple, body: Any, raw: bytes | None, query: list, auth: str) -> None:
        method, path, has_body, params = operation
        assume(_harmless(body))
        headers = {"content-type": "application/json"}
        if auth == "good":
            headers["Authorization"] = specd_single.headers["Authorization"]
        elif auth != "none" and auth.strip():  # h11 refuses values with outer whitespace
            headers["Authorization"] = auth.strip()
        kwargs: dict[str, Any] = {"params": dict(zip(params, query, strict=False))}
        if has_body:
            kwargs.update({"content": raw} if raw is not None else {"json": body})
        response = httpx.request(
            method, specd_single.url + path, headers=headers, timeout=30, **kwargs
        )
        assert response.status_code < 500, (method, path, body, response.text)
        assert "Traceback" not in response.text
        if response.status_code >= 400:
            assert response.json()["error"]

    check()
    assert specd_single.ray_pids() == []
