"""Memory per rank, checked by hand on a small config and on the 70B's public shape."""

from dataclasses import replace

from specctl.config.model_shape import read_model_shape, shape_from_config
from specctl.planner.memory import (
    CPU_RUNTIME_BYTES,
    GPU_RUNTIME_BYTES,
    ShardLayout,
    fixed_bytes_per_rank,
    layer_bytes_per_rank,
    memory_per_rank,
)

from .cluster_files import EXAMPLES, llama_config

# hidden 64, 4 heads, 2 KV heads of 16, intermediate 128, 8 layers, vocab 1000, untied
SMALL = shape_from_config(llama_config(), "small")


def _layout(**changes: object) -> ShardLayout:
    layout = ShardLayout(
        shape=SMALL,
        dtype="bfloat16",
        num_layers=8,
        has_embedding=True,
        has_lm_head=True,
        samples=True,
        tensor_parallel_size=1,
        max_batch_size=3,
        max_model_len=100,
        tokens_per_step=5,  # k = 4
        on_gpu=False,
    )
    return replace(layout, **changes)  # type: ignore[arg-type]


def test_kv_cache_by_hand() -> None:
    # per token and layer: K and V x 2 KV heads x 16 dims x 2 bytes = 128 bytes
    # 8 layers x 128 bytes x (3 sequences x 100 tokens) = 307,200 bytes
    assert memory_per_rank(_layout()).kv_cache_bytes == 307_200
    # tensor parallel 2: one KV head per rank
    assert memory_per_rank(_layout(tensor_parallel_size=2)).kv_cache_bytes == 153_600
    # float32 doubles it; an fp8 model keeps a bfloat16 cache
    assert memory_per_rank(_layout(dtype="float32")).kv_cache_bytes == 614_400
    assert memory_per_rank(_layout(dtype="fp8")).kv_cache_bytes == 307_200


def test_weights_activations_and_runtime_by_hand() -> None:
    # a layer: q 64x64 + k,v 2 x 64x32 + o 64x64 = 12,288; MLP 3 x 64x128 = 24,576;
    # two norms 128 -> 36,992. Embedding and LM head 64,000 each; final norm 64.
    assert SMALL.layer_params == 36_992
    need = memory_per_rank(_layout())
    assert need.weights_bytes == (8 * 36_992 + 2 * 64_000 + 64) * 2 == 848_000
    assert need.weights_bytes == SMALL.num_params * 2
    # step tokens: max(prefill min(8192, 300), verify 3 x 5) = 300;
    # 300 x (2 x 64 + 2 x 128) x 2 bytes = 230,400; logits and probs 3 x 5 x 1000 x 4 x 2 = 120,000
    assert need.activation_bytes == 230_400 + 120_000
    assert need.runtime_bytes == CPU_RUNTIME_BYTES
    assert memory_per_rank(_layout(on_gpu=True)).runtime_bytes == GPU_RUNTIME_BYTES
    assert need.total_bytes == 848_000 + 307_200 + 350_400 + CPU_RUNTIME_BYTES


def test_memory_is_linear_in_layers() -> None:
    layout = _layout(num_layers=5)
    assert memory_per_rank(layout).total_bytes == (
        fixed_bytes_per_rank(layout) + 5 * layer_bytes_per_rank(layout)
    )
    assert layer_bytes_per_rank(layout) == 36_992 * 2 + 128 * 300  # weights + KV of one layer


def test_the_70b_kv_cache_for_8_sequences_of_8192_tokens_is_20_gib() -> None:
    shape = read_model_shape(EXAMPLES / "models" / "llama-3.3-70b-instruct")
    layout = _layout(shape=shape, num_layers=80, max_batch_size=8, max_model_len=8192)
    # 80 layers x 2 x 8 KV heads x 128 dims x 2 bytes = 320 KiB per token; x 65,536 tokens
    assert memory_per_rank(layout).kv_cache_bytes == 80 * 2 * 8 * 128 * 2 * 65_536 == 20 * 2**30
