"""The peer engines of `specctl bench` on tiny random checkpoints built here (no downloads)."""

from pathlib import Path

import pytest

from bench.peers.hf_peer import load_causal_lm, run_hf_assisted, run_hf_generate
from bench.peers.result import PeerResult
from bench.peers.vllm_runner import PeerError, run_vllm, vllm_available
from tests.tiny_models import make_tiny_checkpoint

PROMPTS = [[1, 2, 3, 4, 5], [72, 101, 108, 108, 111, 44, 32], [200, 17]]
MAX_TOKENS = 24
K = 4


def _tiny(path: Path, num_layers: int, seed: int) -> Path:
    """A Llama with head_dim 64 (hidden 128, 2 heads): vLLM's CPU attention supports it."""
    return make_tiny_checkpoint(
        path,
        "llama",
        vocab_size=300,
        hidden_size=128,
        num_layers=num_layers,
        num_heads=2,
        num_kv_heads=2,
        seed=seed,
    )


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("peers")
    return _tiny(root / "target", num_layers=2, seed=0), _tiny(root / "draft", num_layers=1, seed=1)


@pytest.fixture(scope="module")
def plain(pair: tuple[Path, Path]) -> PeerResult:
    return run_hf_generate(pair[0], PROMPTS, MAX_TOKENS)


def _check_counts(result: PeerResult) -> None:
    assert result.num_requests == len(PROMPTS)
    assert result.num_tokens == MAX_TOKENS * len(PROMPTS)
    assert result.output_token_ids is not None
    assert [len(ids) for ids in result.output_token_ids] == [MAX_TOKENS] * len(PROMPTS)
    assert result.wall_s > 0
    assert result.tokens_per_s == pytest.approx(result.num_tokens / result.wall_s)


def test_hf_generate_makes_exactly_max_tokens(plain: PeerResult) -> None:
    _check_counts(plain)
    assert plain.engine == "hf-generate" and plain.mode == "sequential"
    assert plain.acceptance_rate is None and plain.mean_acceptance_length is None


def test_hf_generate_accepts_a_preloaded_model(pair: tuple[Path, Path], plain: PeerResult) -> None:
    result = run_hf_generate(load_causal_lm(pair[0]), PROMPTS[:1], MAX_TOKENS)
    assert result.load_s == 0.0
    assert plain.output_token_ids is not None
    assert result.output_token_ids == plain.output_token_ids[:1]


@pytest.mark.parametrize("schedule", ["constant", "heuristic"])
def test_hf_assisted_is_lossless(pair: tuple[Path, Path], plain: PeerResult, schedule: str) -> None:
    result = run_hf_assisted(*pair, PROMPTS, MAX_TOKENS, num_assistant_tokens=K, schedule=schedule)
    _check_counts(result)
    assert result.output_token_ids == plain.output_token_ids
    assert result.acceptance_rate is not None and 0.0 <= result.acceptance_rate <= 1.0
    assert result.mean_acceptance_length is not None
    assert 1.0 <= result.mean_acceptance_length <= K + 1


def test_hf_assisted_with_the_target_as_draft_accepts_everything(pair: tuple[Path, Path]) -> None:
    result = run_hf_assisted(pair[0], pair[0], PROMPTS[:1], MAX_TOKENS, num_assistant_tokens=K)
    assert result.acceptance_rate == pytest.approx(1.0)
    # 24 tokens at K+1 per step: the last step is cut short by max_tokens, so a bit under K+1.
    steps = -(-MAX_TOKENS // (K + 1))
    assert result.mean_acceptance_length == pytest.approx(MAX_TOKENS / steps)


def test_hf_peers_sample_at_a_temperature_and_repeat_with_their_seed(
    pair: tuple[Path, Path], plain: PeerResult
) -> None:
    """Sampled runs make exactly max_tokens, differ from greedy, and repeat (the generator is
    seeded before each timed run); assisted generation at a temperature is speculative
    sampling, with its acceptance measured."""
    first = run_hf_generate(pair[0], PROMPTS, MAX_TOKENS, temperature=1.0)
    again = run_hf_generate(pair[0], PROMPTS, MAX_TOKENS, temperature=1.0)
    _check_counts(first)
    assert first.output_token_ids == again.output_token_ids
    assert first.output_token_ids != plain.output_token_ids
    assert "T=1" in first.note
    assisted = run_hf_assisted(*pair, PROMPTS, MAX_TOKENS, num_assistant_tokens=K, temperature=1.0)
    _check_counts(assisted)
    assert assisted.output_token_ids != plain.output_token_ids
    assert assisted.acceptance_rate is not None and 0.0 <= assisted.acceptance_rate <= 1.0
    assert "T=1" in assisted.note


def test_hf_assisted_rejects_an_unknown_schedule(pair: tuple[Path, Path]) -> None:
    with pytest.raises(ValueError, match="schedule"):
        run_hf_assisted(*pair, PROMPTS[:1], MAX_TOKENS, num_assistant_tokens=K, schedule="x")


def test_vllm_available_says_why_not(tmp_path: Path) -> None:
    ok, reason = vllm_available(tmp_path / "no-venv")
    assert not ok
    assert "not installed" in reason and "setup_vllm_venv.sh" in reason


def test_vllm_peer_names_a_missing_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(PeerError, match=r"has no config\.json"):
        run_vllm(tmp_path / "nothing", None, K, PROMPTS, MAX_TOKENS, concurrency=1, timeout_s=60)


@pytest.fixture(scope="module")
def vllm_venv() -> None:
    """Skips unless bench/.venv-vllm imports vllm (checked only when a vLLM test is selected)."""
    ok, reason = vllm_available()
    if not ok:
        pytest.skip(reason)


@pytest.mark.usefixtures("vllm_venv")
def test_vllm_peer_times_out_with_one_line(pair: tuple[Path, Path]) -> None:
    with pytest.raises(PeerError, match=r"^vLLM peer timed out after 1s$"):
        run_vllm(pair[0], None, K, PROMPTS, MAX_TOKENS, concurrency=1, timeout_s=1)


@pytest.mark.slow
@pytest.mark.usefixtures("vllm_venv")
@pytest.mark.parametrize("with_draft", [False, True], ids=["plain", "draft"])
def test_vllm_greedy_matches_hf(
    pair: tuple[Path, Path], plain: PeerResult, with_draft: bool
) -> None:
    draft = pair[1] if with_draft else None
    result = run_vllm(pair[0], draft, K, PROMPTS, MAX_TOKENS, concurrency=1, timeout_s=900)
    _check_counts(result)
    assert result.engine == "vllm"
    assert result.output_token_ids == plain.output_token_ids
    if with_draft:
        assert result.acceptance_rate is not None
