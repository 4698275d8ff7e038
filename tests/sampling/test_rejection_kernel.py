"""The Triton kernel returns exactly the reference's outputs.

On a machine without a GPU the kernel runs under TRITON_INTERPRET=1, which triton reads when
the kernel is decorated; another test module may already have imported it compiled. So the
launcher test below re-runs pytest in a fresh process with the variable set, where the
kernel-only tests here and every `sampler`-parametrised hand-made case run against the kernel.
"""

from pathlib import Path

import pytest
import torch
from sampling_batches import random_batch
from triton_child import is_kernel_child, run_interpreted_child

from daemon.runtime.sampling.rejection import rejection_sample

HERE = Path(__file__).parent


@pytest.mark.skipif(is_kernel_child(), reason="this is the child run")
def test_kernel_matches_reference_interpreted() -> None:
    files = [str(HERE / "test_rejection_cases.py"), str(HERE / "test_rejection_kernel.py")]
    run_interpreted_child(files, "triton")


kernel_only = pytest.mark.skipif(not is_kernel_child(), reason="runs in the interpreted child")


def assert_same(inputs_args: tuple, **kernel_kwargs: int) -> torch.Tensor:
    from daemon.runtime.sampling.rejection_triton import rejection_sample_triton

    ref_out, ref_num = rejection_sample(*inputs_args)
    out, num = rejection_sample_triton(*inputs_args, **kernel_kwargs)
    assert torch.equal(out, ref_out), f"reference\n{ref_out}\nkernel\n{out}"
    assert torch.equal(num, ref_num)
    return ref_num


@kernel_only
@pytest.mark.parametrize("num_sparse", [None, 1, 3, 8])
def test_triton_matches_reference_on_random_batches(num_sparse: int | None) -> None:
    gen = torch.Generator().manual_seed(10 + (num_sparse or 0))
    accepted = []
    for max_k, vocab in ((3, 8), (5, 13), (0, 7)):
        inputs = random_batch(gen, num_seqs=24, max_k=max_k, vocab_size=vocab,
                              num_sparse=num_sparse and min(num_sparse, vocab),
                              with_tails=False)  # fmt: skip
        accepted.append(assert_same(inputs.args()) - 1)
    # the batches exercise both acceptance and rejection
    all_accepted = torch.cat(accepted)
    assert all_accepted.max() >= 2 and (all_accepted == 0).any()


@kernel_only
def test_triton_several_vocab_blocks_and_ties() -> None:
    """Blocks of 4 over V = 18 (a partial last block); uniform targets make every argmax a
    tie, which both must break to the first index, and put CDF ends on block edges."""
    gen = torch.Generator().manual_seed(3)
    inputs = random_batch(gen, num_seqs=16, max_k=3, vocab_size=18, num_sparse=5, with_tails=False)
    assert_same(inputs.args(), max_block_v=4)
    inputs.target_probs = torch.full_like(inputs.target_probs, 1 / 18)
    inputs.emit_uniform = torch.arange(16, dtype=torch.float64) / 16
    inputs.uniform = torch.ones_like(inputs.uniform)  # reject every sampled draft
    num = assert_same(inputs.args(), max_block_v=4)
    assert torch.equal(num[~inputs.is_greedy], torch.ones_like(num[~inputs.is_greedy]))


@kernel_only
def test_triton_all_greedy_and_all_sampled_batches() -> None:
    gen = torch.Generator().manual_seed(4)
    for is_greedy in (True, False):
        inputs = random_batch(gen, num_seqs=12, max_k=4, vocab_size=10, num_sparse=None)
        inputs.is_greedy = torch.full_like(inputs.is_greedy, is_greedy)
        assert_same(inputs.args())


@kernel_only
def test_triton_empty_batch() -> None:
    inputs = random_batch(torch.Generator().manual_seed(5), 0, 2, 6, num_sparse=2, with_tails=False)
    from daemon.runtime.sampling.rejection_triton import rejection_sample_triton

    out, num = rejection_sample_triton(*inputs.args())
    assert out.shape == (0, 3) and num.shape == (0,)
