"""Every refusal in OpenAI's shape and status, with the offending parameter in `param`."""

from typing import Any

import httpx
import openai
import pytest

from tests.server.conftest import API_KEY, MAX_MODEL_LEN, MODEL
from tests.server.serve_process import ServeProcess

CHAT = [{"role": "user", "content": "hi"}]
COMPLETION = {"model": MODEL, "prompt": "def f(x):", "max_tokens": 4}
CHAT_BODY = {"model": MODEL, "messages": CHAT, "max_tokens": 4}
LONG_TEXT = "x = 1\n" * MAX_MODEL_LEN  # well past the context in tokens


def _error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    return error


BAD_PARAMETERS = [
    # (path, body, the param named)
    ("/v1/completions", {**COMPLETION, "temperature": -1}, "temperature"),
    ("/v1/completions", {**COMPLETION, "top_p": 0}, "top_p"),
    ("/v1/completions", {**COMPLETION, "top_k": -2}, "top_k"),
    ("/v1/completions", {**COMPLETION, "top_k": 10**20}, "top_k"),  # past int64: found by fuzzing
    ("/v1/completions", {**COMPLETION, "stop_token_ids": [10**20]}, "stop_token_ids"),
    ("/v1/completions", {**COMPLETION, "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {**COMPLETION, "n": 2}, "n"),
    ("/v1/completions", {**COMPLETION, "best_of": 3}, "best_of"),
    ("/v1/completions", {**COMPLETION, "logprobs": 2}, "logprobs"),
    ("/v1/completions", {**COMPLETION, "echo": True}, "echo"),
    ("/v1/completions", {**COMPLETION, "suffix": "x"}, "suffix"),
    ("/v1/completions", {**COMPLETION, "presence_penalty": 0.5}, "presence_penalty"),
    ("/v1/completions", {**COMPLETION, "frequency_penalty": 1}, "frequency_penalty"),
    ("/v1/completions", {**COMPLETION, "logit_bias": {"5": 1.0}}, "logit_bias"),
    ("/v1/completions", {**COMPLETION, "seed": "abc"}, "seed"),
    ("/v1/completions", {**COMPLETION, "stop": [""]}, "stop"),
    ("/v1/completions", {**COMPLETION, "stop": ["a"] * 17}, "stop"),
    ("/v1/completions", {**COMPLETION, "stop": "x" * 513}, "stop"),  # stop.py's look-back
    ("/v1/completions", b'{"prompt": "x", "stop": ["\\ud800"]}', "stop"),
    ("/v1/completions", {**COMPLETION, "stream_options": {}}, "stream_options"),
    ("/v1/completions", {**COMPLETION, "prompt": ""}, "prompt"),
    ("/v1/completions", {**COMPLETION, "prompt": []}, "prompt"),
    ("/v1/completions", {**COMPLETION, "prompt": [1, 99999]}, "prompt"),
    ("/v1/completions", {**COMPLETION, "prompt": ["ok", ""]}, "prompt[1]"),
    ("/v1/completions", {"model": MODEL}, "prompt"),
    # a union's branch tags are no parameters ("prompt.str" before)
    ("/v1/completions", {**COMPLETION, "prompt": None}, "prompt"),
    ("/v1/completions", {**COMPLETION, "prompt": 5}, "prompt"),
    ("/v1/completions", {**COMPLETION, "stop": {"a": "b"}}, "stop"),
    # more prompts than the engine holds at once (batch 4 + queue 256): a 429 never passed
    ("/v1/completions", {**COMPLETION, "prompt": ["a"] * 261}, "prompt"),
    # lone surrogates: the tokenizer raised TypeError (a 500)
    ("/v1/completions", b'{"prompt": "\\ud800", "max_tokens": 2}', "prompt"),
    ("/v1/completions", b'{"prompt": ["ok", "x\\udfff"], "max_tokens": 2}', "prompt[1]"),
    ("/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": "\\udfff"}], "max_tokens": 2}',
     "messages[0].content"),
    ("/v1/chat/completions",
     b'{"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": '
     b'[{"type": "text", "text": "\\ud800"}]}], "max_tokens": 2}',
     "messages[1].content"),
    ("/v1/completions", b'{"prompt": "x", "temperature": Infinity}', "temperature"),
    ("/v1/completions", b'{"prompt": "x", "top_p": NaN}', "top_p"),
    ("/v1/chat/completions", {**CHAT_BODY, "messages": []}, "messages"),
    ("/v1/chat/completions", {**CHAT_BODY, "messages": [{"role": "robot", "content": "x"}]},
     "messages[0].role"),
    ("/v1/chat/completions",
     {**CHAT_BODY, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content[0].type"),
    ("/v1/chat/completions", {**CHAT_BODY, "messages": [{"role": "user", "content": 5}]},
     "messages[0].content"),
    ("/v1/chat/completions", {**CHAT_BODY, "n": 3}, "n"),
    ("/v1/chat/completions", {**CHAT_BODY, "logprobs": True}, "logprobs"),
    ("/v1/chat/completions", {**CHAT_BODY, "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT_BODY, "tools": [{"type": "function"}]}, "tools"),
    ("/v1/chat/completions", {**CHAT_BODY, "tool_choice": "auto"}, "tool_choice"),
    ("/v1/chat/completions", {**CHAT_BODY, "functions": [{"name": "f"}]}, "functions"),
    ("/v1/chat/completions",
     {**CHAT_BODY, "messages": [
         {"role": "user", "content": "weather?"},
         {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                "function": {"name": "w", "arguments": "{}"}}]},
     ]},
     "messages[1].tool_calls"),
    ("/v1/chat/completions", {**CHAT_BODY, "response_format": {"type": "json_object"}},
     "response_format"),
    ("/v1/chat/completions", {**CHAT_BODY, "max_completion_tokens": -1}, "max_completion_tokens"),
    # JSON types: read leniently, true was 1 token and "0.7" a temperature
    ("/v1/completions", {**COMPLETION, "max_tokens": True}, "max_tokens"),
    ("/v1/completions", {**COMPLETION, "max_tokens": "16"}, "max_tokens"),
    ("/v1/completions", {**COMPLETION, "max_tokens": 4.5}, "max_tokens"),
    ("/v1/completions", {**COMPLETION, "temperature": "0.7"}, "temperature"),
    ("/v1/completions", {**COMPLETION, "top_p": True}, "top_p"),
    ("/v1/completions", {**COMPLETION, "seed": False}, "seed"),
    ("/v1/completions", {**COMPLETION, "stream": "false"}, "stream"),
    ("/v1/completions", {**COMPLETION, "ignore_eos": 1}, "ignore_eos"),
    ("/v1/completions", {**COMPLETION, "stream_options": {"include_usage": "yes"}},
     "stream_options.include_usage"),
    ("/v1/chat/completions", {**CHAT_BODY, "max_completion_tokens": "8"},
     "max_completion_tokens"),
    # vLLM's extensions this server lacks: accepted and ignored, a vLLM client got other output
    ("/v1/completions", {**COMPLETION, "min_tokens": 8}, "min_tokens"),
    ("/v1/completions", {**COMPLETION, "repetition_penalty": 1.2}, "repetition_penalty"),
    ("/v1/completions", {**COMPLETION, "min_p": 0.1}, "min_p"),
    ("/v1/completions", {**COMPLETION, "include_stop_str_in_output": True},
     "include_stop_str_in_output"),
    ("/v1/completions", {**COMPLETION, "skip_special_tokens": False}, "skip_special_tokens"),
    ("/v1/completions", {**COMPLETION, "use_beam_search": 1}, "use_beam_search"),
    ("/v1/chat/completions", {**CHAT_BODY, "guided_json": {"type": "object"}}, "guided_json"),
    ("/v1/chat/completions", {**CHAT_BODY, "structured_outputs": {"regex": "a+"}},
     "structured_outputs"),
    ("/v1/chat/completions", {**CHAT_BODY, "continue_final_message": True},
     "continue_final_message"),
    ("/v1/chat/completions", {**CHAT_BODY, "echo": True}, "echo"),
    ("/v1/chat/completions", {**CHAT_BODY, "chat_template_kwargs": {"enable_thinking": False}},
     "chat_template_kwargs"),
]  # fmt: skip


def test_vllm_extensions_at_their_neutral_values_are_accepted(server: ServeProcess) -> None:
    """What a vLLM client sends by default (its SDK's extra_body, a config copied over)."""
    neutral = {
        "min_tokens": 0, "repetition_penalty": 1, "min_p": 0.0, "skip_special_tokens": True,
        "include_stop_str_in_output": False, "guided_json": None, "bad_words": [],
    }  # fmt: skip
    done = server.client.post("/v1/completions", json={**COMPLETION, **neutral})
    assert done.status_code == 200, done.text
    chat = {**CHAT_BODY, "echo": False, "add_generation_prompt": True}
    assert server.client.post("/v1/chat/completions", json=chat).status_code == 200


def test_a_number_may_be_written_as_a_float_without_a_fraction(server: ServeProcess) -> None:
    """16.0 is an integer as JSON goes (some encoders write every number so); an int is a
    float."""
    body = {**COMPLETION, "max_tokens": 3.0, "temperature": 0, "top_k": 1.0}
    done = server.client.post("/v1/completions", json=body)
    assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] <= 3, done.text


@pytest.mark.parametrize(("path", "body", "param"), BAD_PARAMETERS)
def test_bad_parameter_is_a_400_naming_it(
    server: ServeProcess, path: str, body: dict[str, Any] | bytes, param: str
) -> None:
    if isinstance(body, bytes):  # Python's JSON literals beyond the standard
        headers = {"content-type": "application/json"}
        response = server.client.post(path, content=body, headers=headers)
    else:
        response = server.client.post(path, json=body)
    error = _error(response, 400)
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"


def test_harmless_fields_are_accepted(server: ServeProcess) -> None:
    body = {**CHAT_BODY, "user": "u-1", "metadata": {"k": "v"}, "some_new_field": 1}
    body.update(n=1, presence_penalty=0, logprobs=False, tool_choice="none")
    body["messages"] = [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "!"}],
        },
    ]
    response = server.client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert "some_new_field" in server.log()  # logged once as ignored


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"[1, 2]",
        b"",
        b'"a string"',
        b'{"prompt": "\xff"}',
        b'{"seed": ' + b"9" * 5000 + b"}",
    ],
    ids=["broken", "array", "empty", "string", "not-utf8", "huge-integer"],
)
def test_body_that_is_not_a_json_object(server: ServeProcess, content: bytes) -> None:
    response = server.client.post(
        "/v1/chat/completions", content=content, headers={"content-type": "application/json"}
    )
    error = _error(response, 400)
    assert error["param"] is None
    assert "error parsing the body" not in error["message"]  # FastAPI's words name nothing
    if content.startswith(b'{"prompt"'):
        assert error["message"] == "the request body is not valid UTF-8 (byte 12)"
    if content.startswith(b'{"seed"'):
        assert "Exceeds the limit (4300 digits) for integer string conversion" in error["message"]
    if content == b"{not json":  # where the JSON breaks
        assert "not valid JSON" in error["message"] and "at character 1" in error["message"]


def test_unknown_model_is_a_404(server: ServeProcess) -> None:
    for path, body in (("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT_BODY)):
        error = _error(server.client.post(path, json={**body, "model": "gpt-17"}), 404)
        assert error["code"] == "model_not_found" and error["param"] == "model"
        assert "gpt-17" in error["message"]
    error = _error(server.client.get("/v1/models/gpt-17"), 404)
    assert error["code"] == "model_not_found"
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-17", messages=CHAT)  # type: ignore[arg-type]


def test_unknown_route_and_method(server: ServeProcess) -> None:
    assert _error(server.client.get("/v1/engines"), 404)["code"] == "not_found"
    assert _error(server.client.get("/v1/completions"), 405)["code"] == "method_not_allowed"


def test_a_trailing_slash_is_the_same_route(server: ServeProcess) -> None:
    """`/v1/completions/` is served as `/v1/completions` (Starlette answered a 307 with an
    empty body), behind the same key; an unknown route stays a 404 with or without one."""
    client = server.client
    done = client.post("/v1/completions/", json=COMPLETION)
    assert done.status_code == 200 and done.json()["object"] == "text_completion", done.text
    chat = client.post("/v1/chat/completions/", json=CHAT_BODY)
    assert chat.status_code == 200 and chat.json()["object"] == "chat.completion", chat.text
    models = client.get("/v1/models/")
    assert models.status_code == 200 and models.json()["data"][0]["id"] == MODEL
    assert client.get(f"/v1/models/{MODEL}/").json()["id"] == MODEL
    assert client.get("/health/").status_code == 200
    keyless = httpx.post(f"{server.url}/v1/completions/", json=COMPLETION, timeout=30)
    assert _error(keyless, 401)["code"] == "invalid_api_key"
    assert _error(client.get("/v1/engines/"), 404)["code"] == "not_found"


def test_prompt_longer_than_the_context(server: ServeProcess) -> None:
    body = {**COMPLETION, "prompt": LONG_TEXT}
    error = _error(server.client.post("/v1/completions", json=body), 400)
    assert error["code"] == "context_length_exceeded" and error["param"] == "prompt"
    assert str(MAX_MODEL_LEN) in error["message"]
    chat = {**CHAT_BODY, "messages": [{"role": "user", "content": LONG_TEXT}]}
    error = _error(server.client.post("/v1/chat/completions", json=chat), 400)
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    ids = {**COMPLETION, "prompt": [5] * MAX_MODEL_LEN}
    assert _error(server.client.post("/v1/completions", json=ids), 400)["param"] == "prompt"


def test_prompt_plus_max_tokens_past_the_context(server: ServeProcess) -> None:
    body = {**COMPLETION, "prompt": [5] * 100, "max_tokens": MAX_MODEL_LEN - 99}
    error = _error(server.client.post("/v1/completions", json=body), 400)
    assert error["code"] == "context_length_exceeded" and error["param"] == "max_tokens"
    assert "at most 412" in error["message"]
    chat = {**CHAT_BODY, "max_tokens": None, "max_completion_tokens": MAX_MODEL_LEN}
    error = _error(server.client.post("/v1/chat/completions", json=chat), 400)
    assert error["param"] == "max_completion_tokens"


def test_unset_max_tokens_is_the_room_left(server: ServeProcess) -> None:
    """A chat request without max_tokens may run to the end of the context."""
    body = {"model": MODEL, "prompt": [5] * (MAX_MODEL_LEN - 3), "ignore_eos": True}
    out = server.client.post("/v1/completions", json=body).json()  # default 16, clamped
    assert out["usage"]["completion_tokens"] == 3
    assert out["choices"][0]["finish_reason"] == "length"
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "x " * 200}]}
    out = server.client.post("/v1/chat/completions", json={**chat, "ignore_eos": True}).json()
    assert out["usage"]["total_tokens"] == MAX_MODEL_LEN


def test_unknown_field_names_cannot_forge_log_lines(server: ServeProcess) -> None:
    forged = "x\n2026-11-29 00:00:00,000 ERROR specctl.serve: FORGED LOG LINE"
    response = server.client.post("/v1/completions", json={**COMPLETION, forged: 1})
    assert response.status_code == 200, response.text
    log = server.log()
    assert "FORGED LOG LINE" in log  # told, escaped on the warning's own line
    assert not any(line.startswith("2026-11-29 00:00:00,000") for line in log.splitlines())
