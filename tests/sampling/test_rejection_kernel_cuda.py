"""The compiled Triton kernel on a GPU returns exactly the torch reference's outputs.

The interpreted child (test_rejection_kernel.py) holds the kernel's logic on any machine;
this module runs what the engine runs on CUDA: the compiled kernel, at the vocabulary sizes
of real models, and the dispatch that routes a batch to it or to the reference. Every
`sampler`-parametrised case also runs as "triton-cuda" on such a machine (conftest.py).
"""

import pytest
import torch
from sampling_batches import random_batch

from daemon.runtime.sampling.dispatch import rejection_sample_for_device
from daemon.runtime.sampling.rejection import rejection_sample

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _on(device: str, args: tuple) -> tuple:
    return tuple(t.to(device) if isinstance(t, torch.Tensor) else t for t in args)


@pytest.mark.parametrize("num_sparse", [None, 1, 8, 32])
@pytest.mark.parametrize("vocab", [7, 1000, 32_000, 151_936])
def test_compiled_kernel_matches_reference(num_sparse: int | None, vocab: int) -> None:
    from daemon.runtime.sampling.rejection_triton import rejection_sample_triton

    gen = torch.Generator().manual_seed(vocab + (num_sparse or 0))
    max_k = 4
    num_seqs = 16 if vocab > 10_000 else 64
    inputs = random_batch(
        gen, num_seqs, max_k, vocab, num_sparse and min(num_sparse, vocab), with_tails=False
    )
    ref_out, ref_num = rejection_sample(*inputs.args())
    out, num = rejection_sample_triton(*_on("cuda", inputs.args()))
    assert out.is_cuda
    assert torch.equal(out.cpu(), ref_out), f"reference\n{ref_out}\nkernel\n{out}"
    assert torch.equal(num.cpu(), ref_num)
    if vocab <= 1000:  # small vocabularies: the batch reaches both acceptance and rejection
        assert (ref_num > 1).any() and (ref_num == 1).any()


def test_compiled_kernel_with_small_vocab_blocks() -> None:
    """Blocks of 64 over V = 1000: the CDF search crosses many block edges."""
    from daemon.runtime.sampling.rejection_triton import rejection_sample_triton

    gen = torch.Generator().manual_seed(5)
    inputs = random_batch(gen, 48, 3, 1000, 5, with_tails=False)
    ref = rejection_sample(*inputs.args())
    out, num = rejection_sample_triton(*_on("cuda", inputs.args()), max_block_v=64)
    assert torch.equal(out.cpu(), ref[0]) and torch.equal(num.cpu(), ref[1])


@pytest.mark.parametrize("with_tails", [False, True], ids=["listed", "with-tails"])
def test_dispatch_on_cuda_matches_reference(with_tails: bool) -> None:
    """Without tails the dispatch runs the kernel, with tails the reference on CUDA tensors;
    both equal the CPU reference, bonus coupling included."""
    gen = torch.Generator().manual_seed(9)
    inputs = random_batch(gen, 32, 4, 4096, 8, with_tails=with_tails)
    bonus_keys = torch.randint(-(2**62), 2**62, (32,), generator=gen)
    ref_out, ref_num = rejection_sample_for_device(*inputs.args(), bonus_keys=bonus_keys)
    cuda_args = _on("cuda", inputs.args())
    out, num = rejection_sample_for_device(*cuda_args, bonus_keys=bonus_keys.cuda())
    assert out.is_cuda and num.is_cuda
    assert torch.equal(out.cpu(), ref_out)
    assert torch.equal(num.cpu(), ref_num)
