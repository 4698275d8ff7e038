"""Fuzzed request bodies against a live `specctl serve`, drawn by schemathesis from the app's own
OpenAPI schema (bodies that fit it and bodies that do not) and by hypothesis as arbitrary JSON:
never a 5xx, every error in OpenAI's shape, every 200 a well-formed response or a stream
ending in [DONE]."""

import json
import signal
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.generation.modes import GenerationMode

from specctl.server.app import AppOptions, create_app
from tests.server.serve_process import DEMO_DRAFT, DEMO_TARGET, ServeProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

MODEL = "fuzz"
MAX_MODEL_LEN = 48  # keeps every valid request short: at most 47 tokens to generate
NUM_EXAMPLES = 150
PATHS = ("/v1/completions", "/v1/chat/completions")
PATH_REGEX = r"^/v1/(chat/)?completions$"


@pytest.fixture(scope="module")
def fuzz_server() -> Iterator[ServeProcess]:
    serve = ServeProcess(
        "--target", DEMO_TARGET, "--draft", DEMO_DRAFT, "-k", "3", "--dtype", "float32",
        "--served-model-name", MODEL, "--max-model-len", str(MAX_MODEL_LEN),
        "--max-batch-size", "2",
    )  # fmt: skip
    try:
        yield serve
        assert serve.stop(signal.SIGINT) == 0, serve.log()  # Ctrl-C exits cleanly too
    finally:
        assert serve.close() == []


def _cases() -> st.SearchStrategy[tuple[str, Any]]:
    """(path, body) from the generation routes of the app's OpenAPI schema; a body is JSON or
    raw bytes."""
    openapi = create_app(lambda: None, AppOptions(MODEL)).openapi()  # type: ignore[arg-type, return-value]
    routes = schemathesis.openapi.from_dict(openapi).include(path_regex=PATH_REGEX)
    cases = routes.as_strategy(GenerationMode.POSITIVE) | routes.as_strategy(
        GenerationMode.NEGATIVE
    )
    return st.tuples(cases.map(lambda c: (c.path, c.body)), st.sampled_from(MODEL_CHOICES))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=20), children, max_size=4)
    ),
    max_leaves=10,
)
MODEL_CHOICES = ["keep", "served", "absent"]


def _bodies() -> st.SearchStrategy[tuple[str, Any]]:
    # most bodies that fit the schema name a model at random: often point them at the served one
    from_schema = _cases().map(_name_model)
    arbitrary = st.tuples(st.sampled_from(PATHS), json_values)
    return from_schema | arbitrary


def _name_model(drawn: tuple[tuple[str, Any], str]) -> tuple[str, Any]:
    (path, body), how = drawn
    if isinstance(body, dict) and how != "keep":
        body = {k: v for k, v in body.items() if k != "model"}
        if how == "served":
            body["model"] = MODEL
    return path, body


def _check_error(response: httpx.Response) -> None:
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]
    assert error["param"] is None or isinstance(error["param"], str)


def _check_stream(response: httpx.Response) -> None:
    events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert events and events[-1] == "data: [DONE]"
    for event in events[:-1]:
        payload = json.loads(event.removeprefix("data: "))
        assert "error" not in payload, payload
        assert payload["object"] in ("text_completion", "chat.completion.chunk")


def _post(server: ServeProcess, path: str, body: Any) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()  # NaN as NaN
    headers = {"content-type": "application/json"}
    with server.client.stream("POST", path, headers=headers, content=content) as response:
        assert response.status_code < 500, (path, body, response.read())
        if response.status_code >= 400:
            response.read()
            _check_error(response)
        elif response.headers["content-type"].startswith("text/event-stream"):
            _check_stream(response)
        else:
            response.read()
            data = response.json()
            assert data["usage"]["total_tokens"] <= MAX_MODEL_LEN * max(1, len(data["choices"]))


def test_fuzzed_bodies_never_get_a_5xx(fuzz_server: ServeProcess) -> None:
    # derandomized: the same bodies every run, so the share that reaches the engine is fixed
    @settings(
        max_examples=NUM_EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    @given(drawn=_bodies())
    def check(drawn: tuple[str, Any]) -> None:
        _post(fuzz_server, *drawn)

    check()
    served = fuzz_server.metric("vllm:request_success_total")
    assert served >= NUM_EXAMPLES // 10, "the fuzzer should reach the engine, not only refusals"
    fuzz_server.wait_for(
        lambda: fuzz_server.metric("vllm:num_requests_running") == 0, 10, "nothing left running"
    )
    assert fuzz_server.metric("vllm:request_success_total", finished_reason="error") == 0
    assert fuzz_server.client.get("/health").status_code == 200
