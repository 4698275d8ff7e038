"""check_checkpoint: what `load_model` would refuse in a model directory, found from config.json
and the safetensors headers alone. It reads no weights, so a model can be checked on its node in
about a second, before a working shard is stopped to load it in its place."""

from pathlib import Path

import torch

from daemon.runtime.model.config import ModelConfig
from daemon.runtime.model.llama import LlamaForCausalLM
from daemon.runtime.model.loader import (
    check_backend,
    check_parallel_on_hf,
    check_shape,
    checkpoint_sources,
    read_raw_config,
    resolve_dtype,
    resolve_max_model_len,
    uses_lean,
)
from daemon.runtime.model.weights import INDEX_FILE, SINGLE_FILE, read_headers
from daemon.runtime.parallel.group import TensorParallel

META = torch.device("meta")  # shapes only: the model is built without memory behind it


def check_checkpoint(
    path: str | Path,
    *,
    dtype: str = "auto",
    max_model_len: int | None = None,
    backend: str = "auto",
    tensor_parallel_size: int = 1,
    layers: tuple[int, int] | None = None,
) -> None:
    """Raise ModelLoadError where `load_model` with these arguments would: config.json, the
    dtype, the context length, the backend, the parallel split, and (lean runner) every tensor
    it reads present with the shape config.json implies. Data corrupted inside a tensor, or too
    little memory, are found only by loading."""
    model_dir = Path(path)
    raw = read_raw_config(model_dir)
    source = str(model_dir / "config.json")
    check_backend(backend)
    torch_dtype = resolve_dtype(dtype, raw, source)
    max_len = resolve_max_model_len(max_model_len, raw, source)
    if not uses_lean(raw, backend, source):
        check_parallel_on_hf(source, tensor_parallel_size, layers)
        # transformers reads the checkpoint its own way (it may be .bin files): the files
        # are opened where they are safetensors, and no tensor is asked for
        if (model_dir / SINGLE_FILE).is_file() or (model_dir / INDEX_FILE).is_file():
            read_headers(model_dir)
        return
    headers = read_headers(model_dir)
    model = LlamaForCausalLM(
        ModelConfig.from_dict(raw, source=source),
        max_model_len=max_len,
        num_slots=1,
        dtype=torch_dtype,
        device=META,
        tp=TensorParallel(0, tensor_parallel_size),
        layers=layers,
    )
    for name, param in model.state_dict().items():
        for hf_name, shape in checkpoint_sources(name, tuple(param.shape), model):
            check_shape(model_dir, hf_name, headers.require(model_dir, hf_name), shape)
