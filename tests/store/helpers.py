"""Rows for the store tests."""

import time

from db import DeploymentRow, MetricSample, RequestRecord


def deployment_row(name: str = "local") -> DeploymentRow:
    return DeploymentRow(
        name=name,
        config_path="examples/local.toml",
        config_text="# cluster.toml\n",
        plan_json='{"fits": true}',
        applied_unix_s=time.time(),
        status="running",
    )


def sample(deployment_id: int, time_unix_s: float, tokens_per_s: float = 10.0) -> MetricSample:
    return MetricSample(
        deployment_id=deployment_id,
        time_unix_s=time_unix_s,
        acceptance_rate=0.6,
        per_position_acceptance=[0.9, 0.7, 0.5, 0.3],
        mean_acceptance_length=2.4,
        tokens_per_s=tokens_per_s,
        ttft_p50_ms=12.0,
        ttft_p99_ms=40.0,
        batch_size=2,
        k_in_use=4.0,
    )


def request(deployment_id: int, finished_unix_s: float, request_id: str) -> RequestRecord:
    return RequestRecord(
        request_id=request_id,
        deployment_id=deployment_id,
        num_prompt_tokens=7,
        num_output_tokens=32,
        num_draft_tokens=40,
        num_accepted_tokens=24,
        ttft_ms=11.0,
        e2e_latency_ms=250.0,
        finish_reason="length",
        finished_unix_s=finished_unix_s,
    )
