"""The official `openai` client, unmodified, against a real `specctl serve` on the demo pair."""

import json
import os
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

from tests.server.conftest import API_KEY, MAX_BATCH_SIZE, MAX_MODEL_LEN, MODEL, K
from tests.server.serve_process import DEMO_TARGET, REPO, ServeProcess

PROMPTS = [
    "def parse_args(argv):",
    "import os\nimport sys\n\n",
    "class Stack:\n    def __init__(self):",
    "for i in range(10):",
]
CHAT = [{"role": "user", "content": "Write a function that adds two numbers."}]


@pytest.fixture(scope="module")
def client(server: ServeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)


def test_models(client: openai.OpenAI) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert models[0].max_model_len == MAX_MODEL_LEN  # type: ignore[attr-defined]
    assert client.models.retrieve(MODEL).id == MODEL


def test_completion(client: openai.OpenAI) -> None:
    out = client.completions.create(
        model=MODEL,
        prompt=PROMPTS[0],
        max_tokens=12,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert out.object == "text_completion"
    assert out.choices[0].finish_reason == "length" and out.choices[0].text
    assert out.usage is not None and out.usage.completion_tokens == 12
    assert out.usage.total_tokens == out.usage.prompt_tokens + 12


def test_completion_batch_of_prompts(client: openai.OpenAI) -> None:
    out = client.completions.create(
        model=MODEL,
        prompt=PROMPTS[:3],
        max_tokens=5,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert out.usage is not None and out.usage.completion_tokens == 15
    single = client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=5, temperature=0)
    assert out.choices[1].text == single.choices[0].text


def test_chat_completion(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model=MODEL,
        messages=CHAT,
        max_completion_tokens=10,
        temperature=0,  # type: ignore[arg-type]
    )
    assert out.object == "chat.completion"
    assert out.choices[0].message.role == "assistant"
    assert isinstance(out.choices[0].message.content, str)
    assert out.usage is not None and 0 < out.usage.completion_tokens <= 10
    assert out.choices[0].finish_reason in ("stop", "length")


def test_streamed_chat_with_usage_matches_the_whole_response(client: openai.OpenAI) -> None:
    kwargs = {"model": MODEL, "messages": CHAT, "max_tokens": 24, "temperature": 0}
    whole = client.chat.completions.create(**kwargs)  # type: ignore[call-overload]
    chunks = list(
        client.chat.completions.create(
            **kwargs, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == [whole.choices[0].finish_reason]
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == whole.usage.completion_tokens  # type: ignore[union-attr]
    assert all(c.usage is None for c in chunks[:-1])


def test_stream_ends_with_done_and_stop_strings_are_cut(server: ServeProcess) -> None:
    body = {"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 64, "temperature": 0}
    whole = server.client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    stop = whole[10:13]  # a string the greedy output is known to contain
    events = list(server.sse("/v1/completions", {**body, "stream": True, "stop": [stop]}))
    assert events[-1] == "[DONE]"
    streamed = "".join(e["choices"][0]["text"] for e in events[:-1])
    assert streamed == whole[: whole.index(stop)]
    assert events[-2]["choices"][0]["finish_reason"] == "stop"
    cut = server.client.post("/v1/completions", json={**body, "stop": stop}).json()
    assert cut["choices"][0]["text"] == streamed


def _generate_target_only(prompts: list[str], max_tokens: int) -> list[list[int]]:
    """`specctl generate` with the target alone, greedy, in a subprocess."""
    args = ["--target", str(DEMO_TARGET), "--max-tokens", str(max_tokens), "--ignore-eos"]
    args += ["--dtype", "float32", "--json"]
    for prompt in prompts:
        args += ["--prompt", prompt]
    proc = subprocess.run(
        [sys.executable, "-m", "specctl.cli", "generate", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},  # one torch thread, as the server
    )
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line)["token_ids"] for line in proc.stdout.splitlines()]


def _concurrently(fn, items: list) -> list:  # type: ignore[type-arg, no-untyped-def]
    results: list = [None] * len(items)  # type: ignore[type-arg]

    def run(i: int) -> None:
        results[i] = fn(items[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(items))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


def test_greedy_output_is_token_identical_to_generate_target_only(
    client: openai.OpenAI, server: ServeProcess
) -> None:
    max_tokens = 40
    reference = _generate_target_only(PROMPTS, max_tokens)
    before = server.metric("specctl:batch_size_count")

    def complete(prompt: str) -> list[int]:
        out = client.completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=0,
            extra_body={"ignore_eos": True, "return_token_ids": True},
        )
        return out.choices[0].token_ids  # type: ignore[attr-defined]

    assert _concurrently(complete, PROMPTS) == reference
    assert server.metric("specctl:batch_size_count") > before


def test_concurrent_requests_join_one_batch(server: ServeProcess) -> None:
    def rounds_with_more_than_one() -> float:
        return server.metric("specctl:batch_size_count") - server.metric(
            "specctl:batch_size_bucket", le="1.0"
        )

    before = rounds_with_more_than_one()
    body = {"model": MODEL, "max_tokens": 48, "temperature": 0, "ignore_eos": True}
    _concurrently(
        lambda p: server.client.post("/v1/completions", json={**body, "prompt": p}),
        PROMPTS[:MAX_BATCH_SIZE],
    )
    assert rounds_with_more_than_one() > before
    assert server.metric("vllm:spec_decode_num_draft_tokens_total") > 0
    per_pos = server.metric("vllm:spec_decode_num_accepted_tokens_per_pos_total", position="0")
    assert 0 < per_pos <= server.metric("vllm:spec_decode_num_drafts_total")
    assert server.metric("vllm:time_to_first_token_seconds_count") > 0
    assert server.metric("vllm:inter_token_latency_seconds_count") > 0


def test_seeded_sampling_is_reproducible(client: openai.OpenAI) -> None:
    def sample(seed: int) -> list[int]:
        out = client.completions.create(
            model=MODEL,
            prompt=PROMPTS[2],
            max_tokens=48,
            temperature=1.0,
            top_p=0.95,
            seed=seed,
            extra_body={"ignore_eos": True, "return_token_ids": True, "top_k": 100},
        )
        return out.choices[0].token_ids  # type: ignore[attr-defined]

    first = sample(1234)
    assert sample(1234) == first
    assert sample(4321) != first


def test_disconnected_stream_frees_its_slot(server: ServeProcess) -> None:
    aborted_before = server.metric("vllm:request_success_total", finished_reason="abort")
    body = {"model": MODEL, "prompt": PROMPTS[3], "stream": True, "ignore_eos": True}
    body["max_tokens"] = MAX_MODEL_LEN - 16  # far more than it will be allowed to make
    with server.client.stream("POST", "/v1/completions", json=body) as response:
        lines = response.iter_lines()
        for _ in range(6):
            next(lines)
        assert server.metric("vllm:num_requests_running") == 1
    # the client is gone: the request is aborted and its slot freed at the next round
    server.wait_for(
        lambda: server.metric("vllm:num_requests_running") == 0, 10, "running gauge back to 0"
    )
    server.wait_for(
        lambda: (
            server.metric("vllm:request_success_total", finished_reason="abort")
            == aborted_before + 1
        ),
        10,
        "the abort counted",
    )


def test_client_gone_before_a_whole_response_frees_its_slot(server: ServeProcess) -> None:
    """The client gives up a quarter of the way through a response (the whole of one, timed
    first: a fixed wait was outrun on a faster machine), and the request is aborted."""
    body = {"model": MODEL, "prompt": PROMPTS[1], "ignore_eos": True}
    body["max_tokens"] = MAX_MODEL_LEN - 16
    start = time.perf_counter()
    assert server.client.post("/v1/completions", json=body, timeout=120).status_code == 200
    whole_s = time.perf_counter() - start
    aborted_before = server.metric("vllm:request_success_total", finished_reason="abort")
    with pytest.raises(httpx.ReadTimeout):  # the client gives up waiting
        server.client.post("/v1/completions", json=body, timeout=whole_s / 4)
    server.wait_for(
        lambda: (
            server.metric("vllm:request_success_total", finished_reason="abort")
            == aborted_before + 1
        ),
        10,
        "the abandoned request aborted",
    )
    assert server.metric("vllm:num_requests_running") == 0


def test_wrong_or_missing_api_key_is_refused(server: ServeProcess) -> None:
    wrong = openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        wrong.models.list()
    assert info.value.status_code == 401
    response = httpx.post(f"{server.url}/v1/completions", json={"prompt": "x"})
    assert response.status_code == 401
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "invalid_api_key" and "missing" in error["message"]
    for open_path in ("/health", "/metrics"):  # documented as open
        assert httpx.get(f"{server.url}{open_path}").status_code == 200


def test_health_said_loading_before_ready(server: ServeProcess) -> None:
    assert (503, "loading") in server.health_seen
    assert server.health_seen[-1] == (200, "ready")


def test_request_lines_in_the_log(server: ServeProcess) -> None:
    log = server.log(num_chars=0)
    assert "request cmpl-" in log and "tokens (length), acceptance" in log
    assert f"proposer draft_model, k {K}" in log
