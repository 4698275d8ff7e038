"""What the engine teaches the adaptive controller's cost model from its rounds (real engine,
tiny checkpoints)."""

from pathlib import Path

from daemon.runtime.engine.request import Request
from daemon.runtime.sampling.params import SamplingParams
from tests.engine.helpers import make_engine


def test_draft_cost_is_not_learned_from_a_round_that_catches_the_drafter_up(
    target_dir: Path, draft_dir: Path, prompts: list[list[int]]
) -> None:
    """After plain rounds the drafter first feeds what they committed: that round's drafting
    costs more than drafting does, so the cost model does not learn from it."""
    engine = make_engine(target_dir, draft_dir, k=2, batch=2)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    for i, prompt in enumerate(prompts[:2]):
        engine.add_request(Request(f"r{i}", prompt, params))
    samples = engine.controller.costs.draft_samples

    def learned() -> int:
        return len(samples.get(2, ()))

    engine.step()  # admits (the drafter is prefilled with the prompts) and drafts
    engine.step()
    assert learned() == 2
    engine.controller.config.fixed_k = 0
    for _ in range(4):
        engine.step()
    engine.controller.config.fixed_k = 2
    engine.step()  # feeds the drafter the plain rounds' tokens, then drafts
    assert learned() == 2
    engine.step()
    assert learned() == 3
