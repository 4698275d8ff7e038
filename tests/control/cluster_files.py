"""Cluster files and model directories (config.json only) for the control-plane tests."""

import json
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "examples"
MARK = "# <-- here"


def llama_config(**overrides: Any) -> dict[str, Any]:
    """A Llama-family config.json (small by default)."""
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 8,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 1000,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    config.update(overrides)
    return config


def write_model(directory: Path, **overrides: Any) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(llama_config(**overrides)))
    return directory


# Two machines like the seed user's (declared, so nothing is asked over the network), the real
# 70B and 8B shapes from examples/models, and every field spelled out.
SPARK_5090 = f"""\
[[nodes]]
name = "spark"
specd = "spark.local:7601"
memory_gib = 119
gpus = [{{ model = "NVIDIA GB10", memory_gib = 119, unified_memory = true }}]

[[nodes]]
name = "rtx5090"
specd = "desktop.local:7601"
memory_gib = 62
gpus = [{{ model = "NVIDIA GeForce RTX 5090", memory_gib = 31.8 }}]

[[models]]
name = "llama-70b"
path = "{EXAMPLES}/models/llama-3.3-70b-instruct"
dtype = "fp8"
max_model_len = 8192

[[models]]
name = "llama-8b"
path = "{EXAMPLES}/models/llama-3.1-8b-instruct"
dtype = "bfloat16"
max_model_len = 8192

[deployment]
name = "test"

[deployment.verifier]
model = "llama-70b"
nodes = ["spark"]
tensor_parallel_size = 1
pipeline_split = "auto"

[deployment.drafter]
model = "llama-8b"
node = "rtx5090"

[deployment.speculation]
k = 4
mode = "overlapped"

[server]
host = "127.0.0.1"
port = 8000
max_batch_size = 8
"""


def write_cluster(directory: Path, text: str, name: str = "cluster.toml") -> tuple[Path, int]:
    """Write `text`; returns the file and the number of the line marked `# <-- here` (0 if
    none), with the mark removed."""
    lines = text.splitlines()
    marked = [number for number, line in enumerate(lines, start=1) if MARK in line]
    path = directory / name
    path.write_text("\n".join(line.replace(MARK, "").rstrip() for line in lines) + "\n")
    return path, marked[0] if marked else 0


def replace_line(text: str, old: str, new: str, occurrence: int = 0) -> str:
    """`text` with the `occurrence`-th line that is exactly `old` replaced by `new`."""
    lines = text.splitlines()
    found = [index for index, line in enumerate(lines) if line == old]
    assert len(found) > occurrence, f"{old!r} occurs {len(found)} times"
    lines[found[occurrence]] = new
    return "\n".join(lines) + "\n"


def first_config_error(directory: Path, text: str) -> tuple[str, int]:
    """Write `text` (write_cluster), load it, and return the first issue of the ConfigError it
    must raise, with the number of the line marked `# <-- here`."""
    from specctl.config import ConfigError, load_config

    path, number = write_cluster(directory, text)
    try:
        load_config(path)
    except ConfigError as exc:
        return str(exc.issues[0]), number
    raise AssertionError(f"{path} loaded without an error")
