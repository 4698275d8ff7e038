"""How much memory one rank of one shard needs: weights, KV cache, activations, runtime.

Per rank of a shard holding `num_layers` decoder layers with tensor parallelism t:

    weights  = (num_layers x layer_params + embedding? + lm_head? + final norm?) / t x dtype bytes
    KV cache = num_layers x 2 (K and V) x kv_heads/t x head_dim x kv bytes
               x max_batch_size x max_model_len        (the runtime preallocates every slot)
    activations = step_tokens x (2 x hidden + 2 x intermediate / t) x activation bytes
               + on the stage that samples: batch x (k + 1) x vocab x 4 bytes x 2 (logits, probs)
    runtime  = a fixed allowance per process (CUDA context and workspaces, or torch on CPU)

step_tokens is the larger of a prefill pass (a GPU's default prefill budget) and a verify pass
(batch x (k + 1)). Everything is linear in num_layers, which the pipeline split relies on.
"""

from dataclasses import dataclass, replace

from specctl.config.model_shape import DTYPE_BYTES, ModelShape

# daemon.runtime.model.batch.GPU_PREFILL_TOKENS (a CPU prefills 512 tokens a pass: there the
# plan over-counts activations, on the safe side)
MAX_PREFILL_TOKENS = 8192
GPU_RUNTIME_BYTES = 1 * 2**30  # CUDA context, cuBLAS/NCCL workspaces, allocator slack
CPU_RUNTIME_BYTES = 2**29  # a Python process with torch and a Ray worker
LOGIT_BYTES = 4  # logits and probabilities are float32 for sampling


def kv_dtype_bytes(dtype: str) -> int:
    """The KV cache is held in the weights' dtype, except FP8 weights keep a bfloat16 cache."""
    return 2 if dtype == "fp8" else DTYPE_BYTES[dtype]


@dataclass(frozen=True, slots=True)
class ShardLayout:
    """What one shard holds and serves (everything the memory depends on)."""

    shape: ModelShape
    dtype: str  # resolved: float32, bfloat16, float16, fp8
    num_layers: int
    has_embedding: bool
    has_lm_head: bool  # holds an LM head matrix of its own (untied, or tied on a later stage)
    samples: bool  # computes logits (the last pipeline stage, or the drafter)
    tensor_parallel_size: int
    max_batch_size: int
    max_model_len: int
    tokens_per_step: int  # k + 1 for the verifier; 1 for the drafter
    on_gpu: bool


@dataclass(frozen=True, slots=True)
class MemoryNeed:
    """Bytes one rank needs."""

    weights_bytes: int
    kv_cache_bytes: int
    activation_bytes: int
    runtime_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes + self.activation_bytes + self.runtime_bytes


def memory_per_rank(layout: ShardLayout) -> MemoryNeed:
    shape = layout.shape
    tp = layout.tensor_parallel_size
    dtype_bytes = DTYPE_BYTES[layout.dtype]
    params = layout.num_layers * shape.layer_params
    params += shape.embedding_params if layout.has_embedding else 0
    params += shape.embedding_params if layout.has_lm_head else 0
    params += shape.hidden_size if layout.samples else 0  # the final norm
    num_tokens = layout.max_batch_size * layout.max_model_len
    kv_per_layer = shape.kv_bytes_per_token_per_layer(kv_dtype_bytes(layout.dtype), tp)
    return MemoryNeed(
        weights_bytes=params * dtype_bytes // tp,
        kv_cache_bytes=layout.num_layers * kv_per_layer * num_tokens,
        activation_bytes=_activation_bytes(layout),
        runtime_bytes=GPU_RUNTIME_BYTES if layout.on_gpu else CPU_RUNTIME_BYTES,
    )


def _activation_bytes(layout: ShardLayout) -> int:
    shape = layout.shape
    tp = layout.tensor_parallel_size
    activation_dtype_bytes = 4 if layout.dtype == "float32" else 2
    step_tokens = max(
        min(MAX_PREFILL_TOKENS, layout.max_batch_size * layout.max_model_len),
        layout.max_batch_size * layout.tokens_per_step,
    )
    width = 2 * shape.hidden_size + 2 * shape.intermediate_size // tp
    hidden_bytes = step_tokens * width * activation_dtype_bytes
    rows = layout.max_batch_size * layout.tokens_per_step
    logits_bytes = rows * shape.vocab_size * LOGIT_BYTES * 2 if layout.samples else 0
    return hidden_bytes + logits_bytes


def layer_bytes_per_rank(layout: ShardLayout) -> int:
    """What one more decoder layer adds to a rank: its weights and its KV cache."""
    one = memory_per_rank(_with_layers(layout, 1)).total_bytes
    none = memory_per_rank(_with_layers(layout, 0)).total_bytes
    return one - none


def fixed_bytes_per_rank(layout: ShardLayout) -> int:
    """A rank's need with no decoder layers: embedding / LM head, activations, runtime."""
    return memory_per_rank(_with_layers(layout, 0)).total_bytes


def _with_layers(layout: ShardLayout, num_layers: int) -> ShardLayout:
    return replace(layout, num_layers=num_layers)
