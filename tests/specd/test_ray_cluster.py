"""Two real specd daemons form a real two-node Ray cluster through their HTTP APIs, report it,
refuse a driver without the token, and tear it down leaving no Ray process behind."""

import os
import subprocess
import sys
import textwrap

import pytest

from daemon.specd.address import is_loopback, parse_address

from .specd_process import SpecdProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

DRIVER = textwrap.dedent(
    """
    import sys, ray
    try:
        ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
    except Exception as error:
        print("REFUSED", type(error).__name__, error)
        sys.exit(3)
    print("CONNECTED", len(ray.nodes()))
    """
)
DRIVER_TIMEOUT_S = 120


def _driver(address: str, token: str | None, home: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env["HOME"] = home  # no ~/.ray/auth_token to fall back on
    if token is not None:
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    # a refused driver retries the GCS once a second, 20 times by default: 3 is enough here
    env["RAY_NUM_REDIS_GET_RETRIES"] = "3"
    return subprocess.run(
        [sys.executable, "-c", DRIVER, address],
        env=env,
        capture_output=True,
        text=True,
        timeout=DRIVER_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )


def test_two_node_cluster_through_the_api(
    specd_pair: tuple[SpecdProcess, SpecdProcess], cluster_token: tuple[object, str], tmp_path
) -> None:
    head, worker = specd_pair
    _, token = cluster_token

    response = head.call("POST", "/v1/ray/start", json={"role": "head", "labels": {"zone": "a"}})
    assert response.status_code == 200, response.text
    assert response.json()["started"] is True
    gcs_address = response.json()["status"]["gcs_address"]

    again = head.call("POST", "/v1/ray/start", json={"role": "head"})
    assert again.status_code == 200 and again.json()["started"] is False  # no-op
    relabel = head.call("POST", "/v1/ray/start", json={"role": "head", "labels": {"zone": "b"}})
    assert relabel.status_code == 409 and relabel.json()["field"] == "labels"
    conflict = head.call("POST", "/v1/ray/start", json={"role": "worker", "address": gcs_address})
    assert conflict.status_code == 409 and conflict.json()["field"] == "role"

    response = worker.call("POST", "/v1/ray/start", json={"role": "worker", "address": gcs_address})
    assert response.status_code == 200, response.text
    host, port = parse_address(gcs_address)  # as Ray advertises it: this machine's route out
    if is_loopback(host):  # the same head, spelled otherwise: a no-op, not a 409
        again = worker.call(
            "POST", "/v1/ray/start", json={"role": "worker", "address": f"localhost:{port}"}
        )
        assert again.status_code == 200 and again.json()["started"] is False, again.text
    else:  # asked again as given, a no-op; by another address, not known to be the same head
        again = worker.call(
            "POST", "/v1/ray/start", json={"role": "worker", "address": gcs_address}
        )
        assert again.status_code == 200 and again.json()["started"] is False, again.text
        other = worker.call(
            "POST", "/v1/ray/start", json={"role": "worker", "address": f"localhost:{port}"}
        )
        assert other.status_code == 409 and gcs_address in other.json()["error"], other.text

    status = head.call("GET", "/v1/ray/status").json()
    assert status["error"] is None, status["error"]
    alive = [node for node in status["nodes"] if node["alive"]]
    names = sorted(node["labels"]["specd.io/node"] for node in alive)
    assert names == ["node-a", "node-b"]
    head_labels = next(n["labels"] for n in alive if n["labels"]["specd.io/node"] == "node-a")
    assert head_labels["zone"] == "a"
    assert head_labels["specd.io/gpu-count"] == "0"  # no NVML on the test machine... or GPUs
    assert head_labels["specd.io/unified-memory"] in {"true", "false"}
    worker_status = worker.call("GET", "/v1/ray/status").json()
    assert worker_status["role"] == "worker" and len(worker_status["nodes"]) >= 2

    # a driver without the token, or with a wrong one, is refused; with the token it connects
    home = str(tmp_path)
    refused = _driver(gcs_address, None, home)
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert "REFUSED" in refused.stdout
    wrong = _driver(gcs_address, "0" * 64, home)
    assert wrong.returncode == 3, wrong.stdout + wrong.stderr
    allowed = _driver(gcs_address, token, home)
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert "CONNECTED 2" in allowed.stdout

    for daemon in (worker, head):
        assert daemon.ray_pids(), "Ray should be running before stop"
        response = daemon.call("POST", "/v1/ray/stop")
        assert response.status_code == 200, response.text
        assert response.json() == {"stopped": True, "leftover_pids": []}
        assert daemon.ray_pids() == []
        assert daemon.call("GET", "/v1/ray/status").json()["running"] is False
    assert head.call("POST", "/v1/ray/stop").json()["stopped"] is False  # stop twice: no-op
