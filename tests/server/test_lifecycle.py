"""A full queue answers 429, SIGTERM drains and exits 0, bad options are clear errors."""

import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.server.serve_process import DEMO_TARGET, REPO, ServeProcess, write_key_file

MODEL = "tiny-queue"
LONG = {"model": MODEL, "prompt": "x", "max_tokens": 2000, "ignore_eos": True, "stream": True}


@pytest.fixture(scope="module")
def small_server() -> Iterator[ServeProcess]:
    """Target only, one running slot and one waiting place: the third request has no room."""
    serve = ServeProcess(
        "--target", DEMO_TARGET, "--served-model-name", MODEL, "--dtype", "float32",
        "--max-batch-size", "1", "--max-waiting", "1", "--graceful-timeout-s", "0.3",
    )  # fmt: skip
    try:
        yield serve
    finally:
        serve.close()


def test_full_queue_answers_429(small_server: ServeProcess) -> None:
    s = small_server
    with s.client.stream("POST", "/v1/completions", json=LONG) as running:
        running_lines = running.iter_lines()  # kept: a dropped iterator closes the connection
        next(running_lines)
        with s.client.stream("POST", "/v1/completions", json=LONG) as waiting:
            assert waiting.status_code == 200
            s.wait_for(lambda: s.metric("vllm:num_requests_waiting") == 1, 10, "one waiting")
            assert s.metric("vllm:num_requests_running") == 1
            refused = s.client.post("/v1/completions", json={**LONG, "stream": False})
            assert refused.status_code == 429
            assert refused.headers["retry-after"] == "1"
            error = refused.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert error["code"] == "engine_overloaded"
            client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="unused", max_retries=0)
            with pytest.raises(openai.RateLimitError):
                client.completions.create(model=MODEL, prompt="x", max_tokens=4)
    s.wait_for(lambda: s.metric("vllm:num_requests_running") == 0, 10, "slots freed")
    s.wait_for(lambda: s.metric("vllm:num_requests_waiting") == 0, 10, "queue empty")
    ok = s.client.post("/v1/completions", json={**LONG, "stream": False, "max_tokens": 4})
    assert ok.status_code == 200


def test_sigterm_drains_and_exits_0(small_server: ServeProcess) -> None:
    """Last in the module: it stops the server. A stream in flight gets the grace period, then
    an error event and [DONE]; the process exits 0 and leaves nothing behind."""
    s = small_server
    events: list[str] = []
    with s.client.stream("POST", "/v1/completions", json=LONG) as response:
        lines = response.iter_lines()
        events.append(next(lines))
        start = time.monotonic()
        s.process.send_signal(signal.SIGTERM)
        events.extend(line for line in lines if line)
    assert events[-1] == "data: [DONE]"
    assert '"error"' in events[-2] and "stopping" in events[-2]
    assert s.process.wait(timeout=30) == 0, s.log()
    assert time.monotonic() - start < 15
    assert s.leftover_pids() == []
    assert "stopped (signal 15)" in s.log()


def _serve_cli(*args: str | Path, timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specctl.cli", "serve", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=REPO,
    )


def _assert_clean_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "specctl: error:" in proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


def test_api_key_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    key_file = write_key_file(tmp_path, "sk-123")
    key_file.chmod(0o644)
    proc = _serve_cli("--target", DEMO_TARGET, "--api-key-file", key_file)
    _assert_clean_error(proc, "readable by others", "chmod 600")
    key_file.chmod(0o600)
    key_file.write_text("\n")
    _assert_clean_error(_serve_cli("--target", DEMO_TARGET, "--api-key-file", key_file), "empty")
    missing = tmp_path / "nope.key"
    _assert_clean_error(_serve_cli("--target", DEMO_TARGET, "--api-key-file", missing), "nope.key")


def test_taken_port_and_missing_model_are_clear_errors(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _serve_cli("--target", DEMO_TARGET, "--port", port)
    _assert_clean_error(proc, f"cannot listen on 127.0.0.1:{port}")
    _assert_clean_error(_serve_cli("--target", tmp_path / "none"), "not a model directory")


def test_model_that_fails_to_load_exits_2(tmp_path: Path) -> None:
    """Weights missing: found while loading in the background, after the port is bound."""
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DEMO_TARGET / name, broken / name)
    proc = _serve_cli("--target", broken, "--port", "0")
    _assert_clean_error(proc, "model.safetensors")
