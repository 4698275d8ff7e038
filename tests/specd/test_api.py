"""The specd API over real HTTP: authentication on every route but /health, and clear 4xx
errors naming the field for bad requests."""

import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from daemon.specd.app import MAX_BODY_BYTES
from specctl.demo_pair import DEMO_MODELS

from .specd_process import SpecdProcess, free_port

pytestmark = pytest.mark.timeout(120)

PROTECTED = [
    ("GET", "/v1/inventory"),
    ("POST", "/v1/ray/start"),
    ("POST", "/v1/ray/stop"),
    ("GET", "/v1/ray/status"),
    ("GET", "/v1/logs"),
    ("GET", "/v1/model-config?path=/"),
    ("GET", "/v1/no-such-route"),
    ("GET", "/openapi.json"),
    ("GET", "/docs"),
]


def _bad_headers(token: str) -> dict[str, dict[str, str]]:
    return {
        "missing": {},
        "wrong": {"Authorization": "Bearer " + "f" * 64},
        "short": {"Authorization": "Bearer " + token[:-1]},
        "long": {"Authorization": "Bearer " + token + "0"},
        "empty": {"Authorization": "Bearer"},
        "not-bearer": {"Authorization": "Basic " + token},
        "bare-token": {"Authorization": token},
    }


def test_health_needs_no_token_and_leaks_nothing(
    specd_single: SpecdProcess, cluster_token: tuple[object, str]
) -> None:
    response = httpx.get(f"{specd_single.url}/health", timeout=10)
    assert response.status_code == 200 and response.json() == {"status": "ok"}
    assert cluster_token[1] not in response.text and "solo" not in response.text


@pytest.mark.parametrize(("method", "path"), PROTECTED)
def test_every_other_route_rejects_bad_tokens(
    specd_single: SpecdProcess, cluster_token: tuple[object, str], method: str, path: str
) -> None:
    token = cluster_token[1]
    for kind, headers in _bad_headers(token).items():
        response = httpx.request(
            method, f"{specd_single.url}{path}", headers=headers, json={"role": "head"}, timeout=10
        )
        assert response.status_code == 401, (kind, response.text)
        assert "bearer token" in response.json()["error"]
        assert token not in response.text
        assert response.headers["www-authenticate"].startswith("Bearer")


def test_rejections_are_logged(specd_single: SpecdProcess) -> None:
    httpx.get(f"{specd_single.url}/v1/inventory", timeout=10)
    # a path is the caller's: a newline in it forged a log line, and its length was unbounded
    forged = "2026-11-29 07:00:00,000 INFO daemon.specd.ray_node: ray stopped"
    httpx.get(f"{specd_single.url}/x%0A{forged.replace(' ', '%20')}", timeout=10)
    httpx.get(f"{specd_single.url}/{'y' * 5000}", timeout=10)
    lines = specd_single.call("GET", "/v1/logs", params={"lines": 50}).json()["lines"]
    assert any("rejected GET '/v1/inventory' from 127.0.0.1: missing" in line for line in lines)
    assert not any(line.startswith(forged) for line in lines)
    assert any("rejected GET '/x\\n2026-11-29" in line for line in lines)
    assert max(len(line) for line in lines) < 1000


def test_inventory_with_token(specd_single: SpecdProcess) -> None:
    data = specd_single.call("GET", "/v1/inventory").json()
    assert data["node_name"] == "solo"
    assert data["host"]["num_cpus"] >= 1 and data["host"]["memory_total_bytes"] > 0
    assert data["num_gpus"] == len(data["gpus"])


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"role": "leader"}, "body.role"),
        ({}, "body.role"),
        ({"role": "worker"}, "body"),
        ({"role": "head", "address": "127.0.0.1:1"}, "body"),
        ({"role": "worker", "address": "nohost"}, "body.address"),
        ({"role": "worker", "address": "127.0.0.1:99999"}, "body.address"),
        ({"role": "head", "labels": {"ray.io/node-id": "x"}}, "body.labels"),
        ({"role": "head", "labels": {"zone": "has space"}}, "body.labels"),
        ({"role": "head", "labels": {"zone": 3}}, "body.labels.zone"),
        ({"role": "head", "extra": 1}, "body.extra"),
        ([1, 2], "body"),
    ],
)
def test_bad_start_bodies_name_the_field(
    specd_single: SpecdProcess, body: object, field: str
) -> None:
    response = specd_single.call("POST", "/v1/ray/start", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["field"] == field
    assert "Traceback" not in response.text


def test_malformed_json_is_a_422(specd_single: SpecdProcess) -> None:
    response = specd_single.call(
        "POST", "/v1/ray/start", content=b'{"role": ', headers={"content-type": "application/json"}
    )
    assert response.status_code == 422 and "json" in response.json()["error"].lower()


def test_a_body_past_the_limit_is_a_413_before_and_while_it_is_read(
    specd_single: SpecdProcess,
) -> None:
    """specd bounds a body as `specctl serve` does (it read any size, for as long as it took):
    announced too large, refused before a byte is read; sent in chunks with no length,
    refused once the bytes read pass the limit. Either way its JSON error, nothing started."""
    too_large = b'{"role": "head", "labels": {"x": "' + b"y" * MAX_BODY_BYTES + b'"}}'
    announced = specd_single.call("POST", "/v1/ray/start", content=too_large)
    assert announced.status_code == 413, announced.text
    assert f"at most {MAX_BODY_BYTES} bytes" in announced.json()["error"]

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(too_large), 65536):
            yield too_large[start : start + 65536]

    chunked = specd_single.call("POST", "/v1/ray/start", content=chunks())
    assert chunked.status_code == 413, chunked.text
    assert "bytes or more" in chunked.json()["error"]
    assert specd_single.call("GET", "/v1/ray/status").json()["running"] is False


def test_unreachable_head_is_a_400_naming_address(specd_single: SpecdProcess) -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    response = specd_single.call(
        "POST", "/v1/ray/start", json={"role": "worker", "address": address}
    )
    assert response.status_code == 400, response.text
    assert response.json()["field"] == "address" and "unreachable" in response.json()["error"]
    assert specd_single.call("GET", "/v1/ray/status").json() == {
        "running": False,
        "role": None,
        "gcs_address": None,
        "labels": {},
        "nodes": [],
        "error": None,
    }
    assert specd_single.ray_pids() == []


@pytest.mark.parametrize("lines", ["0", "-3", "abc", "10001"])
def test_bad_log_line_counts(specd_single: SpecdProcess, lines: str) -> None:
    response = specd_single.call("GET", "/v1/logs", params={"lines": lines})
    assert response.status_code == 422 and response.json()["field"] == "query.lines"


def test_log_tail_length(specd_single: SpecdProcess) -> None:
    assert len(specd_single.call("GET", "/v1/logs", params={"lines": 2}).json()["lines"]) == 2


def test_model_config_is_the_nodes_config_json(specd_single: SpecdProcess) -> None:
    target = DEMO_MODELS / "target"
    response = specd_single.call("GET", "/v1/model-config", params={"path": str(target)})
    assert response.status_code == 200, response.text
    assert response.json() == {"config": json.loads((target / "config.json").read_text())}


@pytest.mark.parametrize(
    ("path", "status", "said"),
    [
        ("relative/model", 422, "path 'relative/model' is not absolute"),
        ("/nonexistent/model", 404, "model directory /nonexistent/model does not exist on this"),
        (str(DEMO_MODELS / "target" / "config.json"), 422, "is a file on this node"),
        (str(DEMO_MODELS), 404, "config.json not found on this node"),
    ],
)
def test_model_config_says_what_is_wrong_with_the_path(
    specd_single: SpecdProcess, path: str, status: int, said: str
) -> None:
    response = specd_single.call("GET", "/v1/model-config", params={"path": path})
    assert response.status_code == status, response.text
    assert said in response.json()["error"] and response.json()["field"] == "path"


def test_model_config_without_a_path_names_the_parameter(specd_single: SpecdProcess) -> None:
    response = specd_single.call("GET", "/v1/model-config")
    assert response.status_code == 422, response.text
    assert response.json()["field"] == "query.path"


def test_model_config_refuses_a_fifo_without_waiting_on_it(
    specd_single: SpecdProcess, tmp_path: Path
) -> None:
    """A FIFO named config.json held the open, and a worker of the shared pool, for ever."""
    os.mkfifo(tmp_path / "config.json")
    response = specd_single.call("GET", "/v1/model-config", params={"path": str(tmp_path)})
    assert response.status_code == 422, response.text
    assert "is not a regular file on this node" in response.json()["error"]
    assert specd_single.call("GET", "/v1/inventory").status_code == 200


def test_model_config_refuses_a_huge_file(specd_single: SpecdProcess, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_bytes(b" " * (4 * 2**20 + 1))
    response = specd_single.call("GET", "/v1/model-config", params={"path": str(tmp_path)})
    assert response.status_code == 422 and "is over 4 MiB" in response.json()["error"]
