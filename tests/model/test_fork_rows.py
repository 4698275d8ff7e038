"""Fork rows: a branch reads its parent's cached context and keeps only its own tokens.

Every check compares against the same tokens run on a full copy of the sequence in a plain
slot of a second runner (no forks anywhere), on all four lean architectures.
"""

from pathlib import Path

import pytest
import torch

from daemon.runtime.errors import RequestError
from daemon.runtime.model import CausalLM, ForwardBatch, LogitsMode, load_model
from daemon.runtime.model.batch import NO_FORK
from daemon.runtime.model.llama import LlamaForCausalLM
from tests.model.helpers import ATOL, TinyFactory, random_tokens

ARCHS = {
    "llama": ("llama", {}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {"tie_word_embeddings": True}),
    "mistral-window": ("mistral", {"sliding_window": 5}),
}
NUM_SLOTS, NUM_BRANCHES, BRANCH_LEN = 6, 12, 6


@pytest.fixture(params=list(ARCHS))
def arch_dir(request: pytest.FixtureRequest, tiny_checkpoint: TinyFactory) -> Path:
    arch, kwargs = ARCHS[request.param]
    return tiny_checkpoint(arch, **kwargs)


def _forking(path: Path) -> LlamaForCausalLM:
    model = load_model(path, num_slots=NUM_SLOTS, backend="lean")
    assert isinstance(model, LlamaForCausalLM)
    model.enable_forks(NUM_BRANCHES, BRANCH_LEN)
    return model


def _full(model: CausalLM, tokens: list[int], slot: int = 0) -> torch.Tensor:
    """Logits [T, V] of every position of `tokens`, run from scratch in a plain slot."""
    out = model.forward(ForwardBatch([slot], [tokens], [0], LogitsMode.ALL))
    return out[0]


def test_ragged_batch_mixing_plain_and_fork_rows(arch_dir: Path) -> None:
    model, ref = _forking(arch_dir), load_model(arch_dir, num_slots=1, backend="lean")
    gen = torch.Generator().manual_seed(0)
    contexts = {4: random_tokens(gen, 12), 1: random_tokens(gen, 7), 2: random_tokens(gen, 3)}
    slots = list(contexts)
    model.forward(ForwardBatch(slots, [contexts[s] for s in slots], [0] * 3, LogitsMode.NONE))
    # plain rows append to slots 4 and 2; forks of slot 4 (two, at different positions), of
    # slot 1 (one, whose parent has no plain row) and of slot 2 (at its very end)
    rows = [  # (slot or branch slot, parent, fork position, start, chunk)
        (4, NO_FORK, 0, 12, random_tokens(gen, 2)),
        (7, 4, 5, 5, random_tokens(gen, 3)),
        (0, 4, 11, 11, random_tokens(gen, 1)),
        (9, 1, 4, 4, random_tokens(gen, 4)),
        (2, NO_FORK, 0, 3, random_tokens(gen, 1)),
        (3, 2, 3, 3, random_tokens(gen, 2)),
    ]
    batch = ForwardBatch(
        slots=[r[0] for r in rows],
        token_ids=[r[4] for r in rows],
        start_positions=[r[3] for r in rows],
        logits_mode=LogitsMode.ALL,
        fork_parents=[r[1] for r in rows],
        fork_positions=[r[2] for r in rows],
    )
    logits = model.forward(batch)
    assert logits is not None
    for b, (_, parent, fork, start, chunk) in enumerate(rows):
        owner = parent if parent != NO_FORK else rows[b][0]
        sequence = contexts[owner][: fork if parent != NO_FORK else start] + chunk
        expected = _full(ref, sequence)[-len(chunk) :]
        torch.testing.assert_close(logits[b, : len(chunk)], expected, atol=ATOL, rtol=0)


def test_fork_rows_continue_over_steps_and_last_mode(arch_dir: Path) -> None:
    """A branch fed one token per step (how drafting uses it) matches the full copy."""
    model, ref = _forking(arch_dir), load_model(arch_dir, num_slots=1, backend="lean")
    gen = torch.Generator().manual_seed(1)
    context = random_tokens(gen, 9)
    model.forward(ForwardBatch([3], [context], [0], LogitsMode.NONE))
    own: list[int] = []
    for _ in range(BRANCH_LEN):
        token = random_tokens(gen, 1)
        start = 6 + len(own)
        logits = model.forward(ForwardBatch([5], [token], [start], LogitsMode.LAST, [3], [6]))
        own += token
        expected = _full(ref, context[:6] + own)[-1]
        torch.testing.assert_close(logits[0], expected, atol=ATOL, rtol=0)


def test_promote_then_continue_equals_never_forked(arch_dir: Path) -> None:
    model, ref = _forking(arch_dir), load_model(arch_dir, num_slots=2, backend="lean")
    gen = torch.Generator().manual_seed(2)
    context, own, after = random_tokens(gen, 10), random_tokens(gen, 4), random_tokens(gen, 3)
    model.forward(ForwardBatch([2], [context], [0], LogitsMode.NONE))
    # the parent moves on past the fork point (a different continuation), the branch forks
    # at 7 and writes 4 own tokens
    model.forward(ForwardBatch([2], [random_tokens(gen, 3)], [10], LogitsMode.NONE))
    model.forward(ForwardBatch([1], [own], [7], LogitsMode.NONE, [2], [7]))
    model.promote(branch_slot=1, parent_slot=2, fork_position=7, length=len(own))
    logits = model.forward(ForwardBatch([2], [after], [11], LogitsMode.ALL))
    expected = _full(ref, context[:7] + own + after)[-len(after) :]
    torch.testing.assert_close(logits[0, : len(after)], expected, atol=ATOL, rtol=0)


def test_plain_batches_are_unchanged_by_a_branch_cache(llama_dir: Path) -> None:
    model, ref = _forking(llama_dir), load_model(llama_dir, num_slots=NUM_SLOTS, backend="lean")
    gen = torch.Generator().manual_seed(3)
    chunks = [random_tokens(gen, n) for n in (5, 2, 8)]
    batch = ForwardBatch([0, 3, 5], chunks, [0, 0, 0], LogitsMode.ALL)
    torch.testing.assert_close(model.forward(batch), ref.forward(batch), atol=0, rtol=0)


def test_fork_errors(llama_dir: Path) -> None:
    plain = load_model(llama_dir, num_slots=2, backend="lean")
    fork = ForwardBatch([0], [[1]], [3], LogitsMode.LAST, [1], [3])
    with pytest.raises(RequestError, match="branch cache"):
        plain.forward(fork)
    model = _forking(llama_dir)
    too_long = ForwardBatch([0], [[1] * (BRANCH_LEN + 1)], [3], LogitsMode.LAST, [1], [3])
    with pytest.raises(RequestError, match="branch length"):
        model.forward(too_long)
    with pytest.raises(RequestError, match="branch slot"):
        model.forward(ForwardBatch([NUM_BRANCHES], [[1]], [3], LogitsMode.LAST, [1], [3]))
    with pytest.raises(ValueError, match="fork position"):
        ForwardBatch([0], [[1]], [2], LogitsMode.LAST, [1], [3])
    hf = load_model(llama_dir, num_slots=2, backend="hf")
    assert not hf.supports_forks
    with pytest.raises(RequestError, match="branch cache"):
        hf.forward(fork)
