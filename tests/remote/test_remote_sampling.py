"""Sampled output through the remote path: exactly the target's distribution, and, with a
seed, the very same tokens whether drafts come from an in-process proposer, a remote one in
sync mode, or prepared branches in overlapped mode."""

from pathlib import Path

import pytest
import torch

from daemon.runtime.engine.config import EngineConfig
from daemon.runtime.engine.engine import SpecEngine
from daemon.runtime.engine.request import Request
from daemon.runtime.model import load_model
from daemon.runtime.proposers.draft_model import DraftModelProposer
from daemon.runtime.remote.options import RemoteOptions
from daemon.runtime.sampling.params import SamplingParams
from tests.engine.test_sampling_lossless import (
    BATCH,
    PROMPT,
    VOCAB,
    assert_same_distribution,
    exact_joint,
    sample_joint,
)
from tests.remote.helpers import perturbed_copy, remote_engine
from tests.tiny_models import make_tiny_checkpoint

NUM_SAMPLES = 6000


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    kw = {"vocab_size": VOCAB, "with_tokenizer": False, "bos_token_id": 0, "eos_token_id": 1}
    target = make_tiny_checkpoint(tmp_path_factory.mktemp("t"), seed=3, **kw)
    draft = make_tiny_checkpoint(
        tmp_path_factory.mktemp("d"), seed=4, hidden_size=32, num_heads=2, num_kv_heads=1, **kw
    )
    return target, draft


def exact_joint_later(target: Path, params: SamplingParams) -> torch.Tensor:
    """[V, V] P(token 3, token 4) of the output (1-based), from the target's logits alone:
    the sum over tokens 1 and 2 of P(t1) P(t2 | t1) P(t3 | t1, t2) P(t4 | t1, t2, t3)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32)
    prompt = torch.tensor(PROMPT)

    def dist(prefixes: torch.Tensor) -> torch.Tensor:  # [N, t] -> [N, V] float64
        with torch.inference_mode():
            logits = model(torch.cat([prompt.expand(len(prefixes), -1), prefixes], 1)).logits
        return torch.softmax(logits[:, -1].double() / params.temperature, dim=-1)

    grid = [torch.cartesian_prod(*[torch.arange(VOCAB)] * n).view(-1, n) for n in (1, 2, 3)]
    p1 = dist(torch.zeros(1, 0, dtype=torch.long))[0]  # [V]
    p2 = dist(grid[0])  # [t1, t2]
    p3 = dist(grid[1]).view(VOCAB, VOCAB, VOCAB)  # [t1, t2, t3]
    p4 = dist(grid[2]).view(VOCAB, VOCAB, VOCAB, VOCAB)  # [t1, t2, t3, t4]
    return torch.einsum("a,ab,abc,abcd->cd", p1, p2, p3, p4)


def _sample_later(engine: SpecEngine, params: SamplingParams) -> torch.Tensor:
    counts = torch.zeros(VOCAB, VOCAB)
    for start in range(0, NUM_SAMPLES, BATCH):
        seeded = [
            SamplingParams(temperature=params.temperature, max_tokens=5, seed=i, ignore_eos=True)
            for i in range(start, min(start + BATCH, NUM_SAMPLES))
        ]
        requests = [Request(f"s{p.seed}", PROMPT, p) for p in seeded]
        for out in engine.generate(requests):
            counts[out.token_ids[2], out.token_ids[3]] += 1
    return counts


def test_first_round_distribution_through_the_remote_path(pair) -> None:
    params = SamplingParams(temperature=0.8)
    with remote_engine(*pair, mode="sync", k=3, batch=BATCH, sparse_top_k=4) as setup:
        counts = sample_joint(setup.engine, params)
        assert setup.engine.stats.num_accepted_tokens > 0
    assert_same_distribution(counts, exact_joint(pair[0], params))


@pytest.fixture(scope="module")
def close_draft(pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The target with noise: guesses for corrections and bonus tokens often right."""
    return perturbed_copy(pair[0], tmp_path_factory.mktemp("close"), noise=0.03)


def test_prepared_branch_distribution(pair, close_draft: Path) -> None:
    """Tokens 3 and 4 come from the second and third rounds, whose drafts are prepared
    branches whenever the verdict matched one (k = 1: a correction or a bonus branch)."""
    target, _ = pair
    params = SamplingParams(temperature=0.6)
    drafter = {"sparse_top_k": 8, "max_branches": 8, "branch_width": 5}
    fixed = RemoteOptions(max_branches=8, initial_branches=8, is_adaptive_branches=False)
    with remote_engine(target, close_draft, options=fixed, k=1, batch=BATCH, **drafter) as setup:
        counts = _sample_later(setup.engine, params)
        stats = setup.remote.stats
        assert stats.num_hits > 0.3 * stats.num_with_branches  # prepared branches were used
        assert stats.hits["a=0"] > 0 and stats.hits["all"] > 0  # corrections and bonus tokens
        assert setup.engine.stats.num_accepted_tokens > 0
    assert_same_distribution(counts, exact_joint_later(pair[0], params))


def _seeded_outputs(engine: SpecEngine, prompts: list[list[int]]) -> list[list[int]]:
    requests = [
        Request(f"r{i}", p, SamplingParams(temperature=0.3, max_tokens=20, seed=100 + i))
        for i, p in enumerate(prompts)
    ]
    return [o.token_ids for o in engine.generate(requests)]


def test_seeded_output_is_the_same_in_process_and_remote(target_dir, draft_dir, prompts) -> None:
    batch = len(prompts)
    local = SpecEngine(
        load_model(target_dir, num_slots=batch),
        DraftModelProposer(load_model(draft_dir, num_slots=batch), max_listed=2048),
        EngineConfig(max_batch_size=batch, num_speculative_tokens=4),
    )
    expected = _seeded_outputs(local, prompts)
    assert local.stats.num_accepted_tokens > 0
    # the sequences widened their lists as their tail drafts were rejected
    # (proposers/tail_verdicts.py): each learns alike in every mode
    assert isinstance(local.proposer, DraftModelProposer)
    assert local.proposer.sampler.num_widened_rows > 0
    for mode in ("sync", "overlapped"):
        # a fixed k: misses are drafted afresh (skipping them would change k)
        options = RemoteOptions(mode=mode, miss_policy="fresh")
        with remote_engine(
            target_dir, draft_dir, options=options, k=4, batch=batch, sparse_max_listed=2048
        ) as setup:
            assert _seeded_outputs(setup.engine, prompts) == expected, mode
            if mode == "overlapped":
                assert setup.remote.stats.num_hits > 0


def test_bonus_guess_is_coupled_to_the_verifier(target_dir: Path, prompts) -> None:
    """Draft = target at temperature 1: the drafter's guess of the bonus token uses the field
    the verifier draws it with, so a round that accepts every draft finds its bonus branch
    prepared (guessing the draft's likeliest token instead is right about max p of the time,
    well under half here)."""
    options = RemoteOptions(max_branches=1, initial_branches=1, is_adaptive_branches=False)
    with remote_engine(target_dir, target_dir, options=options, k=2, batch=len(prompts)) as setup:
        requests = [
            Request(f"r{i}", p, SamplingParams(temperature=1.0, max_tokens=24, seed=i))
            for i, p in enumerate(prompts)
        ]
        setup.engine.generate(requests)
        stats = setup.remote.stats
    assert stats.outcomes["all"] >= 20
    assert stats.hits["all"] >= 0.95 * stats.outcomes["all"]
