"""load_model: a Hugging Face model directory -> a CausalLM (lean runner or HF fallback)."""

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from daemon.runtime.errors import ModelLoadError
from daemon.runtime.model.config import DTYPES, LEAN_ARCHITECTURES, LEAN_ROPE_TYPES, ModelConfig
from daemon.runtime.model.host_memory import keep_freed_host_memory
from daemon.runtime.model.linear import prepack_linears
from daemon.runtime.model.llama import LlamaForCausalLM
from daemon.runtime.model.memory_guard import allocated, loading
from daemon.runtime.model.protocol import CausalLM
from daemon.runtime.model.sharding import (
    ROW_PARALLEL,
    full_shape,
    fused_part,
    rank_part,
    shard_row_parallel,
)
from daemon.runtime.model.static_pass import cuda_graphs_wanted
from daemon.runtime.model.weights import TensorReader, open_checkpoint
from daemon.runtime.parallel.group import TensorParallel

DTYPE_CHOICES = ("auto", *DTYPES)
BACKENDS = ("auto", "lean", "hf")
DEFAULT_MAX_MODEL_LEN = 4096
FUSED_PARTS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}

# Called as weights arrive: (bytes loaded so far, total bytes). Any thread; must not block.
LoadProgress = Callable[[int, int], None]
# weights read are told to the machine's other loads in steps of this (memory_guard.allocated)
ALLOCATED_STEP_BYTES = 256 << 20


def load_model(
    path: str | Path,
    *,
    dtype: str = "auto",
    device: str | torch.device = "cpu",
    num_slots: int = 8,
    max_model_len: int | None = None,
    backend: str = "auto",
    progress: LoadProgress | None = None,
    tp: TensorParallel | None = None,
    layers: tuple[int, int] | None = None,
) -> CausalLM:
    """Load the checkpoint in `path` (config.json + safetensors) with `num_slots` KV-cache slots.

    backend: "lean" (Llama, Qwen2, Qwen3, Mistral), "hf" (transformers' AutoModelForCausalLM),
    or "auto" (lean where supported, else hf). dtype "auto" is the checkpoint's own dtype.
    progress: told (bytes loaded, total bytes) as weights arrive (per tensor on the lean path;
    at start and end on the transformers path).
    tp: load this rank's shard of a tensor-parallel model (lean runner only).
    layers: load a pipeline stage, layers [start, end) (lean runner only).
    """
    model_dir = Path(path)
    raw = read_raw_config(model_dir)
    source = str(model_dir / "config.json")
    check_backend(backend)
    if num_slots < 1:
        raise ModelLoadError(f"num_slots must be at least 1, got {num_slots}")
    torch_dtype = resolve_dtype(dtype, raw, source)
    max_len = resolve_max_model_len(max_model_len, raw, source)
    torch_device = torch.device(device)
    if uses_lean(raw, backend, source):
        config = ModelConfig.from_dict(raw, source=source)
        model = load_lean(
            model_dir, config, torch_dtype, torch_device, num_slots, max_len, progress, tp, layers
        )
        return _ready(model, torch_device)
    check_parallel_on_hf(source, tp.size if tp is not None else 1, layers)
    from daemon.runtime.model.hf_fallback import HFCausalLM

    total_bytes = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
    if progress is not None:
        progress(0, total_bytes)
    model = HFCausalLM.load(
        model_dir,
        dtype=torch_dtype,
        device=torch_device,
        num_slots=num_slots,
        max_model_len=max_len,
    )
    if progress is not None:
        progress(total_bytes, total_bytes)
    return _ready(model, torch_device)


def _ready(model: CausalLM, device: torch.device) -> CausalLM:
    """The loaded model, with the process's host allocator set for running on a CPU: large
    freed blocks (each pass's logits) are kept for reuse from here on (host_memory.py)."""
    if device.type == "cpu":
        keep_freed_host_memory()
    return model


def read_raw_config(model_dir: Path) -> dict[str, Any]:
    if not model_dir.is_dir():
        raise ModelLoadError(f"{model_dir}: model directory does not exist")
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(f"{model_dir}: no config.json in the model directory")
    try:
        raw = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{config_path}: cannot read config: {exc}") from exc
    if not isinstance(raw, dict):
        raise ModelLoadError(f"{config_path}: config is not a JSON object")
    return raw


def resolve_dtype(requested: str, raw: dict[str, Any], source: str) -> torch.dtype:
    """ "auto" -> the checkpoint's `dtype` / `torch_dtype` (float32 if absent)."""
    if requested not in DTYPE_CHOICES:
        raise ModelLoadError(
            f"unsupported dtype '{requested}'; choose one of {', '.join(DTYPE_CHOICES)}"
        )
    if requested != "auto":
        return DTYPES[requested]
    name = raw.get("dtype") or raw.get("torch_dtype") or "float32"
    if name not in DTYPES:
        raise ModelLoadError(f"{source}: unsupported field 'dtype': {name!r}; pass a dtype")
    return DTYPES[name]


def resolve_max_model_len(requested: int | None, raw: dict[str, Any], source: str) -> int:
    """Default min(max_position_embeddings, 4096); more than max_position_embeddings is refused."""
    limit = raw.get("max_position_embeddings") or raw.get("n_positions")
    if requested is None:
        return min(int(limit), DEFAULT_MAX_MODEL_LEN) if limit else DEFAULT_MAX_MODEL_LEN
    if requested < 1:
        raise ModelLoadError(f"max_model_len must be at least 1, got {requested}")
    if limit and requested > int(limit):
        raise ModelLoadError(
            f"{source}: max_model_len {requested} exceeds max_position_embeddings {limit}"
        )
    return requested


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        choices = ", ".join(BACKENDS)
        raise ModelLoadError(f"unsupported backend '{backend}'; choose one of {choices}")


def check_parallel_on_hf(source: str, tensor_parallel_size: int, layers: object) -> None:
    """The transformers fallback runs the whole model in one process."""
    if tensor_parallel_size > 1 or layers is not None:
        raise ModelLoadError(
            f"{source}: tensor and pipeline parallelism need the lean runner, which does not "
            "support this architecture"
        )


def uses_lean(raw: dict[str, Any], backend: str, source: str) -> bool:
    architectures = raw.get("architectures") or ["<none>"]
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    supported = architectures[0] in LEAN_ARCHITECTURES and rope_type in LEAN_ROPE_TYPES
    if backend == "lean" and not supported:
        raise ModelLoadError(
            f"{source}: architecture {architectures[0]} with rope type '{rope_type}' is not "
            f"supported by the lean runner (supported: {', '.join(LEAN_ARCHITECTURES)}; "
            f"rope types {', '.join(LEAN_ROPE_TYPES)}); use backend='hf'"
        )
    return backend == "lean" or (backend == "auto" and supported)


def load_lean(
    model_dir: Path,
    config: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    num_slots: int,
    max_model_len: int,
    progress: LoadProgress | None = None,
    tp: TensorParallel | None = None,
    layers: tuple[int, int] | None = None,
) -> LlamaForCausalLM:
    # the room checked for the cache and weights is held for this machine's other loads
    # until they are in memory (memory_guard.loading)
    with loading():
        model = LlamaForCausalLM(
            config,
            max_model_len=max_model_len,
            num_slots=num_slots,
            dtype=dtype,
            device=device,
            tp=tp,
            layers=layers,
        )
        params = model.state_dict()
        total_bytes = sum(p.numel() * p.element_size() for p in params.values())
        done_bytes = told_bytes = 0
        state: dict[str, torch.Tensor] = {}
        with open_checkpoint(model_dir) as reader:
            for name, param in params.items():
                loaded = _load_param(reader, name, param, model)
                state[name] = loaded.to(device=device, dtype=dtype)
                done_bytes += param.numel() * param.element_size()
                # on a CPU a tensor read may still be a view of the file's pages (the free
                # memory does not show it yet): its room stays recorded until the load ends
                if device.type != "cpu" and done_bytes - told_bytes >= ALLOCATED_STEP_BYTES:
                    allocated(device, done_bytes - told_bytes)
                    told_bytes = done_bytes
                if progress is not None:
                    progress(done_bytes, total_bytes)
        model.load_state_dict(state, strict=True, assign=True)
        del state  # the model holds them: packing frees what it repacks, not twice
        prepack_linears(model)
        model.pack_tied_head()
    model.enable_native_pass()
    if model.is_whole and cuda_graphs_wanted(device):  # the device check: never on a CPU
        model.enable_static_passes(capture=True)
    return model.requires_grad_(False).eval()


def _load_param(
    reader: TensorReader, name: str, param: torch.Tensor, model: LlamaForCausalLM
) -> torch.Tensor:
    """The checkpoint tensor(s) for lean parameter `name`, fused parts concatenated on dim 0;
    on a tensor-parallel rank, this rank's shard of them (sharding.py)."""
    sources = checkpoint_sources(name, tuple(param.shape), model)
    module_name, kind = name.rsplit(".", 2)[-2:]
    rank, size = model.tp.rank, model.tp.size
    if module_name in ROW_PARALLEL and size > 1:
        return shard_row_parallel(_checked(reader, *sources[0]), kind, rank, size)
    if module_name not in FUSED_PARTS:
        return _checked(reader, *sources[0])
    tensors = []
    for part, (hf_name, shape) in zip(FUSED_PARTS[module_name], sources, strict=True):
        # each part whole as the checkpoint holds it, then this rank's rows of it
        _, chunks, index = fused_part(model.config, part, rank, size)
        tensors.append(rank_part(_checked(reader, hf_name, shape), 0, index, chunks))
    return torch.cat(tensors, dim=0)


def checkpoint_sources(
    name: str, shape: tuple[int, ...], model: LlamaForCausalLM
) -> list[tuple[str, tuple[int, ...]]]:
    """The checkpoint tensors lean parameter `name` (this rank's `shape`) is read from, each
    with the whole shape config.json implies: the tensor of that name, or a fused
    projection's parts (q/k/v, gate/up) in order."""
    if name.startswith("layers.") and model.layer_offset:  # a pipeline stage's own numbering
        _, index, rest = name.split(".", 2)
        name = f"layers.{int(index) + model.layer_offset}.{rest}"
    hf_name = name if name.startswith("lm_head.") else f"model.{name}"
    prefix, module_name, kind = ("", *hf_name.rsplit(".", 2))[-3:]
    rank, size = model.tp.rank, model.tp.size
    if module_name in ROW_PARALLEL and size > 1:
        return [(hf_name, full_shape(module_name, kind, shape, size))]
    if module_name not in FUSED_PARTS:
        return [(hf_name, shape)]
    return [
        (f"{prefix}.{part}.{kind}", (fused_part(model.config, part, rank, size)[0], *shape[1:]))
        for part in FUSED_PARTS[module_name]
    ]


def _checked(reader: TensorReader, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    tensor = reader.get(name)
    check_shape(reader.directory, name, tuple(tensor.shape), shape)
    return tensor


def check_shape(
    model_dir: Path, name: str, found: tuple[int, ...], expected: tuple[int, ...]
) -> None:
    if found != expected:
        raise ModelLoadError(
            f"{model_dir}: tensor '{name}' has shape {found}, expected {expected} from config.json"
        )
