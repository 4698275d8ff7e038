"""Tiny random Hugging Face checkpoints for tests: config.json + safetensors + byte-level tokenizer.

Nothing is downloaded: the model is built from a config with a fixed seed and saved with
`save_pretrained`, so both the lean runner and transformers itself can load it offline.
"""

import functools
import json
from pathlib import Path
from typing import Any

import torch

BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|eos|>"
NUM_BYTE_TOKENS = 256
BOS_TOKEN_ID = NUM_BYTE_TOKENS  # 256
EOS_TOKEN_ID = NUM_BYTE_TOKENS + 1  # 257
INIT_STD = 0.1  # larger than HF's 0.02 so greedy outputs of a random model vary

ARCHITECTURES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mistral": "MistralForCausalLM",
}


def _config_class(arch: str) -> Any:
    import transformers

    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown tiny arch {arch!r}; choose one of {sorted(ARCHITECTURES)}")
    return getattr(transformers, ARCHITECTURES[arch].replace("ForCausalLM", "Config"))


def _model_class(arch: str) -> Any:
    import transformers

    return getattr(transformers, ARCHITECTURES[arch])


def tiny_config(
    arch: str,
    *,
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    tie_word_embeddings: bool,
    rope_scaling: dict[str, Any] | None,
    **config_overrides: Any,
) -> Any:
    """The transformers config of a tiny model (rope_scaling: a `rope_parameters` dict)."""
    fields: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": hidden_size // num_heads,
        "max_position_embeddings": 512,
        "initializer_range": INIT_STD,
        "tie_word_embeddings": tie_word_embeddings,
        "bos_token_id": BOS_TOKEN_ID,
        "eos_token_id": EOS_TOKEN_ID,
        "architectures": [ARCHITECTURES.get(arch, arch)],
    }
    rope = {"rope_type": "default", "rope_theta": 10000.0, **(rope_scaling or {})}
    fields["rope_parameters"] = rope
    fields.update(config_overrides)
    return _config_class(arch)(**fields)


@functools.lru_cache(maxsize=1)
def _tokenizer_files() -> dict[str, str]:
    """Byte-level BPE tokenizer (256 byte symbols, no merges, bos/eos), as file name -> text."""
    import tempfile

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_to_unicode = sorted(alphabet, key=_byte_of_symbol)
    vocab = {symbol: i for i, symbol in enumerate(byte_to_unicode)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([BOS_TOKEN, EOS_TOKEN])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=BOS_TOKEN, eos_token=EOS_TOKEN
    )
    with tempfile.TemporaryDirectory() as tmp:
        fast.save_pretrained(tmp)
        return {p.name: p.read_text() for p in Path(tmp).iterdir() if p.is_file()}


def _byte_of_symbol(symbol: str) -> int:
    """The byte a ByteLevel alphabet symbol stands for (GPT-2's bytes_to_unicode, inverted)."""
    code = ord(symbol)
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    if code in printable:
        return code
    missing = [b for b in range(256) if b not in printable]
    return missing[code - 256]


def write_tokenizer(dirpath: Path) -> None:
    """Write the byte-level tokenizer files into `dirpath` (AutoTokenizer-loadable offline)."""
    for name, text in _tokenizer_files().items():
        (dirpath / name).write_text(text)


def _shard_size(model: torch.nn.Module) -> int:
    total_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return max(total_bytes // 3, 1)


def make_tiny_checkpoint(
    dirpath: str | Path,
    arch: str = "llama",
    *,
    vocab_size: int = 320,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    tie_word_embeddings: bool = False,
    rope_scaling: dict[str, Any] | None = None,
    with_tokenizer: bool = True,
    sharded: bool = False,
    **config_overrides: Any,
) -> Path:
    """Build a random tiny `arch` model with transformers and save it (safetensors) in `dirpath`."""
    path = Path(dirpath)
    path.mkdir(parents=True, exist_ok=True)
    config = tiny_config(
        arch,
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        tie_word_embeddings=tie_word_embeddings,
        rope_scaling=rope_scaling,
        **config_overrides,
    )
    torch.manual_seed(seed)
    model = _model_class(arch)(config).to(dtype)
    model.config.dtype = dtype
    max_shard_size = _shard_size(model) if sharded else "10GB"
    model.save_pretrained(path, max_shard_size=max_shard_size)
    if with_tokenizer:
        write_tokenizer(path)
    return path


def read_config(dirpath: str | Path) -> dict[str, Any]:
    """The saved config.json of a checkpoint, as a dict."""
    return json.loads((Path(dirpath) / "config.json").read_text())
