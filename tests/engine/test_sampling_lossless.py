"""With temperature > 0, speculative sampling must leave the target's distribution unchanged.

End to end through the engine: thousands of seeded five-token requests on a 16-token
vocabulary; the empirical joint distribution of (token 2, token 3) is compared with the exact
one computed from the target's own logits by a chi-square test. Where a GPU is, the same
test runs the engine there too (CUDA graphs, the compiled Triton kernel).
"""

from pathlib import Path

import pytest
import torch
from scipy.stats import chisquare

from daemon.runtime.engine.config import EngineConfig
from daemon.runtime.engine.engine import SpecEngine
from daemon.runtime.engine.request import Request
from daemon.runtime.model import load_model
from daemon.runtime.proposers.draft_model import DraftModelProposer
from daemon.runtime.proposers.ngram import NgramProposer
from daemon.runtime.sampling.params import SamplingParams
from tests.tiny_models import make_tiny_checkpoint

VOCAB = 16
NUM_SAMPLES = 6000
BATCH = 128
PROMPT = [3, 5, 7, 3, 5]  # repeats, so that n-gram lookup proposes "7" after "3 5"
DEVICES = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    kw = {"vocab_size": VOCAB, "with_tokenizer": False, "bos_token_id": 0, "eos_token_id": 1}
    target = make_tiny_checkpoint(tmp_path_factory.mktemp("t"), seed=3, **kw)
    draft = make_tiny_checkpoint(
        tmp_path_factory.mktemp("d"), seed=4, hidden_size=32, num_heads=2, num_kv_heads=1, **kw
    )
    return target, draft


def _truncate(probs: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """probs: [N, V] -> top-k, renormalise, then top-p (the smallest head of the sorted
    distribution whose mass reaches top_p), renormalised. Written independently of the engine."""
    out = probs.clone()
    for row in out:
        order = torch.argsort(row, descending=True).tolist()
        if top_k:
            row[order[top_k:]] = 0.0
            row /= row.sum()
        total, keep = 0.0, []
        for idx in order:
            if total >= top_p:
                break
            keep.append(idx)
            total += float(row[idx])
        mask = torch.ones_like(row, dtype=torch.bool)
        mask[keep] = False
        row[mask] = 0.0
        row /= row.sum()
    return out


def exact_joint(target: Path, params: SamplingParams) -> torch.Tensor:
    """[V, V] P(token2, token3) from the target's logits, computed without the engine.

    Token 1 comes from the prefill; tokens 2 and 3 come from the first speculative round
    (accepted drafts, the correction or the bonus), so their joint law is what is tested:
    P(t2, t3) = sum over t1 of P(t1) P(t2 | t1) P(t3 | t1, t2).
    """
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32)
    grid = torch.cartesian_prod(torch.arange(VOCAB), torch.arange(VOCAB))  # [V*V, 2]
    prompt = torch.tensor(PROMPT)
    with torch.inference_mode():
        first = model(prompt[None]).logits[0, -1]  # [V]
        second = model(torch.cat([prompt.expand(VOCAB, -1), torch.arange(VOCAB)[:, None]], 1))
        third = model(torch.cat([prompt.expand(VOCAB * VOCAB, -1), grid], 1))

    def dist(logits: torch.Tensor) -> torch.Tensor:  # [N, V] -> [N, V] float64
        probs = torch.softmax(logits.double() / params.temperature, dim=-1)
        return _truncate(probs, params.top_k, params.top_p)

    p1 = dist(first[None])[0]  # [V]
    p2 = dist(second.logits[:, -1])  # [V(t1), V(t2)]
    p3 = dist(third.logits[:, -1]).reshape(VOCAB, VOCAB, VOCAB)  # [t1, t2, t3]
    return torch.einsum("a,ab,abc->bc", p1, p2, p3)


def sample_joint(engine: SpecEngine, params: SamplingParams) -> torch.Tensor:
    counts = torch.zeros(VOCAB, VOCAB)
    for start in range(0, NUM_SAMPLES, BATCH):
        reqs = [
            Request(f"s{i}", PROMPT, _with_seed(params, i))
            for i in range(start, min(start + BATCH, NUM_SAMPLES))
        ]
        for out in engine.generate(reqs):
            counts[out.token_ids[1], out.token_ids[2]] += 1
    return counts


def _with_seed(params: SamplingParams, seed: int) -> SamplingParams:
    return SamplingParams(
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        max_tokens=5,
        seed=seed,
        ignore_eos=True,
    )


def assert_same_distribution(counts: torch.Tensor, exact: torch.Tensor) -> None:
    expected = (exact * counts.sum()).flatten()
    observed = counts.flatten()
    assert observed[expected == 0].sum() == 0, "sampled a token the target gives probability 0"
    # Pool cells with small expected counts so that the chi-square approximation holds.
    small = expected < 5
    obs = torch.cat([observed[~small], observed[small].sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = exp > 0
    stat = chisquare(obs[keep].numpy(), exp[keep].numpy())
    assert stat.pvalue > 1e-3, f"chi-square p = {stat.pvalue:.2e}"


def _engine(
    pair: tuple[Path, Path], proposer: str, sparse_k: int, device: str = "cpu"
) -> SpecEngine:
    target_dir, draft_dir = pair
    target = load_model(target_dir, num_slots=BATCH, device=device)
    prop: DraftModelProposer | NgramProposer = NgramProposer()
    if proposer.startswith("draft"):
        draft = load_model(draft_dir, num_slots=BATCH, device=device)
        max_listed = 8 if proposer == "draft-widening" else sparse_k
        # draft-widening: every sequence starts out believing its tail drafts are rejected:
        # its rows list up to 8 tokens, cut at a mass, and a tail
        prior = 0.0 if proposer == "draft-widening" else 1.0
        prop = DraftModelProposer(
            draft, sparse_top_k=sparse_k, max_listed=max_listed, tail_prior=prior
        )
    config = EngineConfig(
        max_batch_size=BATCH, num_speculative_tokens=3, draft_sparse_top_k=sparse_k
    )
    return SpecEngine(target, prop, config)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("proposer", "sparse_k", "params"),
    [
        ("draft", VOCAB, SamplingParams(temperature=1.0)),  # full proposal distribution
        ("draft", 4, SamplingParams(temperature=0.8)),  # sparse top-4 proposal
        ("draft-widening", 2, SamplingParams(temperature=1.0)),  # 2 listed, widened to <= 8
        ("draft", 4, SamplingParams(temperature=1.2, top_k=6, top_p=0.9)),  # truncated target
        ("ngram", 1, SamplingParams(temperature=1.0)),  # point-mass proposals
        ("draft", 0, SamplingParams(temperature=0.8)),  # coupled drafts: the token alone
        ("draft", 0, SamplingParams(temperature=1.2, top_k=6, top_p=0.9)),
    ],
    ids=[
        "full-q",
        "sparse-q",
        "widened-q",
        "sparse-q-truncated-p",
        "ngram-point-mass",
        "coupled",
        "coupled-truncated-p",
    ],
)
def test_output_distribution_is_the_targets(
    pair, proposer: str, sparse_k: int, params, device: str
) -> None:
    engine = _engine(pair, proposer, sparse_k, device)
    counts = sample_joint(engine, params)
    assert engine.stats.num_draft_tokens > 0  # speculation really happened
    assert engine.stats.num_accepted_tokens > 0
    if proposer == "draft-widening":  # lists really widened past the 2 of the base
        assert isinstance(engine.proposer, DraftModelProposer)
        assert engine.proposer.sampler.num_widened_rows > 0
    assert_same_distribution(counts, exact_joint(pair[0], params))


def test_distribution_test_detects_a_biased_sampler(pair) -> None:
    """The check above can fail: samples at the wrong temperature are rejected."""
    engine = _engine(pair, "draft", VOCAB)
    counts = sample_joint(engine, SamplingParams(temperature=1.0))
    with pytest.raises(AssertionError):
        assert_same_distribution(counts, exact_joint(pair[0], SamplingParams(temperature=0.7)))
