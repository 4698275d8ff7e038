"""The native pass (native_pass.py) gives the module path's bits: logits and K/V, for decode
steps, verify chunks, ragged chunks, rollbacks, slots out of order and every logits mode; it
takes only the models and batches its kernels run, and the parity tests hold both paths to
transformers."""

from pathlib import Path

import pytest
import torch

from daemon.runtime.errors import RequestError
from daemon.runtime.model import ForwardBatch, LogitsMode, load_model, native
from daemon.runtime.model.batch import NO_FORK
from daemon.runtime.model.forward_metadata import NATIVE_MAX_CHUNK
from daemon.runtime.model.llama import LlamaForCausalLM
from daemon.runtime.model.native_pass import DISABLE_ENV, NativePass
from tests.model.helpers import TinyFactory, assert_caches_match, random_tokens, step
from tests.model.test_parity import VARIANTS

pytestmark = pytest.mark.skipif(native.kernels() is None, reason="the native kernels are not built")

RUNS = ["llama", "llama-tied", "llama-mqa", "llama-mha", "mistral-window"]
MODULES_ONLY = ["llama-bias", "qwen2-bias", "qwen3-qk-norm"]  # biases; q/k norms
PROMPTS = {5: 9, 1: 3, 6: 40}  # slot -> prompt length


def _pair(path: Path) -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    """The same checkpoint twice: the native pass, and the module path."""
    fast = load_model(path, num_slots=8, backend="lean")
    slow = load_model(path, num_slots=8, backend="lean")
    assert isinstance(fast, LlamaForCausalLM) and isinstance(slow, LlamaForCausalLM)
    assert fast.native_pass is not None
    slow.native_pass = None
    return fast, slow


@pytest.mark.parametrize("variant", RUNS)
def test_native_pass_gives_the_module_paths_bits(
    tiny_checkpoint: TinyFactory, variant: str
) -> None:
    arch, kwargs = VARIANTS[variant]
    fast, slow = _pair(tiny_checkpoint(arch, **kwargs))
    generator = torch.Generator().manual_seed(5)
    seq_fast: dict[int, list[int]] = {}
    seq_slow: dict[int, list[int]] = {}
    prompts = {s: random_tokens(generator, n) for s, n in PROMPTS.items()}
    for model, seqs in ((fast, seq_fast), (slow, seq_slow)):
        step(model, seqs, prompts, dict.fromkeys(prompts, 0), LogitsMode.NONE)
    # (tokens per row of slots 5, 1, 6; tokens kept before it: a rollback keeps fewer), mode
    rounds = [((1, 1, 1), 0, LogitsMode.LAST), ((5, 5, 5), 0, LogitsMode.ALL)]
    rounds += [((9, 9, 9), -3, LogitsMode.ALL), ((3, 1, 5), 0, LogitsMode.LAST)]
    rounds += [((1, 4, 2), -2, LogitsMode.ALL), ((3, 3, 3), -7, LogitsMode.NONE)]
    rounds += [((NATIVE_MAX_CHUNK, 1, 2), 0, LogitsMode.ALL), ((1, 1, 1), 0, LogitsMode.ALL)]
    for lengths, keep, mode in rounds:
        for slots in ([5, 1, 6], [6, 1], [1]):  # slots out of order; one row
            sizes = lengths[: len(slots)]
            chunks = {s: random_tokens(generator, n) for s, n in zip(slots, sizes, strict=True)}
            starts = {s: len(seq_slow[s]) + keep for s in slots}
            expected = step(slow, seq_slow, chunks, starts, mode)
            got = step(fast, seq_fast, chunks, starts, mode)
            if mode is LogitsMode.NONE:
                assert got is None and expected is None
                continue
            assert got is not None and expected is not None and got.shape == expected.shape
            if mode is LogitsMode.LAST:
                assert torch.equal(got, expected)
            for b, slot in enumerate(slots):  # ALL: a short chunk's padded positions are garbage
                real = len(chunks[slot])
                assert torch.equal(got[b, :real], expected[b, :real])
    assert seq_fast == seq_slow
    assert_caches_match(fast, slow, seq_slow, exact=True)
    assert not fast.cache.keys[0][[0, 2, 3, 4, 7]].any()  # no other slot written


def test_the_pass_grows_its_workspace_and_keeps_giving_the_same_bits(llama_dir: Path) -> None:
    """A wider batch after narrow ones (the workspace grows), then narrow again."""
    fast, slow = _pair(llama_dir)
    generator = torch.Generator().manual_seed(9)
    for model in (fast, slow):
        model.forward(ForwardBatch([0, 1, 2, 3], [[1, 2, 3]] * 4, [0] * 4, LogitsMode.NONE))
    for rows, chunk in ((1, 1), (4, 9), (2, 1), (4, 16), (1, 3)):
        chunks = [random_tokens(generator, chunk) for _ in range(rows)]
        batch = ForwardBatch(list(range(rows)), chunks, [3] * rows, LogitsMode.ALL)
        assert torch.equal(fast.forward(batch), slow.forward(batch))
    assert fast.native_pass is not None and fast.native_pass.capacity >= 4 * 16


@pytest.mark.parametrize("variant", ["llama", "llama-tied"])
def test_the_embedding_gather_takes_the_edges_and_names_an_id_outside_the_vocabulary(
    tiny_checkpoint: TinyFactory, variant: str
) -> None:
    """The native gather reads the dense table or the tied head's panels: ids 0 and V - 1 (the
    last panel's column) give the module path's bits. An id outside [0, V) is the forward's
    RequestError; the pass itself, called past that check, names it too and writes no K/V."""
    arch, kwargs = VARIANTS[variant]
    fast, slow = _pair(tiny_checkpoint(arch, **kwargs))
    assert fast.native_pass is not None
    assert fast.native_pass.tied == (variant == "llama-tied")
    vocab = fast.vocab_size
    edges = ForwardBatch([0, 1], [[0, vocab - 1, 1], [vocab - 1]], [0, 0], LogitsMode.ALL)
    assert torch.equal(fast.forward(edges), slow.forward(edges))
    keys = fast.cache.keys[0][2].clone()
    for bad in (vocab, -1):
        batch = ForwardBatch([2], [[1, bad]], [0], LogitsMode.LAST)
        with pytest.raises(RequestError, match="token id out of range"):
            fast.forward(batch)
        with pytest.raises(ValueError, match=rf"token id {bad} is outside the vocabulary"):
            fast.native_pass.forward(batch)
    assert torch.equal(fast.cache.keys[0][2], keys)
    if fast.embed_tokens is not None and not fast.native_pass.tied:  # a strided dense table
        weight = fast.embed_tokens.weight.detach()
        fast.embed_tokens.weight = torch.nn.Parameter(weight.t().contiguous().t(), False)
        assert not NativePass.supports(fast)


def test_the_layers_call_names_what_is_wrong() -> None:
    """`layers` (every decoder layer in one native call) refuses head counts it cannot run and
    a wrong argument count with a clear error, before it touches any buffer."""
    module = native.kernels()
    assert module is not None
    # 27 integers (table, layers, buffers, sizes, wide_min, zmm), then eps and scale; heads 3
    # of kv_heads 2
    sizes = [0, 0, *[0] * 12, 1, 1, 3, 2, 8, 16, 24, 56, 24, 64, 1, 0, 0]
    with pytest.raises(ValueError, match="layers: bad head counts or sizes"):
        module.layers(*sizes, 1e-5, 0.125)
    with pytest.raises(TypeError, match="layers takes 29 arguments, got 28"):
        module.layers(*sizes, 1e-5)


def test_prefills_and_fork_rows_take_the_module_path(llama_dir: Path) -> None:
    long_chunk = ForwardBatch([0], [list(range(NATIVE_MAX_CHUNK + 1))], [0])
    assert not NativePass.accepts(long_chunk)
    assert NativePass.accepts(ForwardBatch([0], [list(range(NATIVE_MAX_CHUNK))], [0]))
    fork = ForwardBatch(slots=[0, 0], token_ids=[[1], [2]], start_positions=[3, 3],
                        fork_parents=[NO_FORK, 0], fork_positions=[0, 2])  # fmt: skip
    assert not NativePass.accepts(fork)


@pytest.mark.parametrize("variant", MODULES_ONLY)
def test_models_the_kernels_do_not_run_keep_the_module_path(
    tiny_checkpoint: TinyFactory, variant: str
) -> None:
    arch, kwargs = VARIANTS[variant]
    model = load_model(tiny_checkpoint(arch, **kwargs), num_slots=2, backend="lean")
    assert isinstance(model, LlamaForCausalLM) and model.native_pass is None


def test_bfloat16_pipeline_stages_and_the_switch_keep_the_module_path(
    llama_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bf16 = load_model(llama_dir, num_slots=2, dtype="bfloat16", backend="lean")
    stage = load_model(llama_dir, num_slots=2, layers=(0, 1), backend="lean")
    for model in (bf16, stage):
        assert isinstance(model, LlamaForCausalLM) and model.native_pass is None
    monkeypatch.setenv(DISABLE_ENV, "0")
    off = load_model(llama_dir, num_slots=2, backend="lean")
    assert isinstance(off, LlamaForCausalLM) and off.native_pass is None
    assert not off.enable_native_pass()
