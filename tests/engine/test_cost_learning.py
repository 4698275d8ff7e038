"""What the engine teaches the adaptive controller's cost model from its rounds (real engine,
tiny checkpoints)."""

from pathlib import Path

from daemon.runtime.engine.request import Request
from daemon.runtime.sampling.params import SamplingParams
from tests.engine.helpers import make_engine


def test_draft_cost_is_learned_from_steady_rounds_and_catch_ups_apart(
    target_dir: Path, draft_dir: Path, prompts: list[list[int]]
) -> None:
    """The engine's first drafting round pays one-time costs: not learned (but noted, as what
    feeding the drafter costs until a catch-up is learned). After plain rounds
    the drafter first feeds what they committed: that round costs more than drafting does, so
    the cost model learns it as drafting's price only where it costs less than the model's
    price (an upper bound that corrects an over-estimate), and as a catch-up always."""
    engine = make_engine(target_dir, draft_dir, k=2, batch=2)
    params = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    for i, prompt in enumerate(prompts[:2]):
        engine.add_request(Request(f"r{i}", prompt, params))
    costs = engine.controller.costs
    samples = costs.draft_samples

    def learned() -> int:
        return costs.draft_count(2)

    def catch_up() -> None:
        engine.controller.config.fixed_k = 0
        for _ in range(4):
            engine.step()
        engine.controller.config.fixed_k = 2
        engine.step()  # feeds the drafter the plain rounds' tokens, then drafts

    engine.step()  # admits (the drafter is prefilled with the prompts) and drafts: the first
    assert learned() == 0
    # ... which prices catch-ups until one is learned: it fed the prompts
    assert costs.first_catch_up is not None
    assert costs.first_catch_up[:2] == (2, max(len(p) for p in prompts[:2]))
    engine.step()
    engine.step()
    assert learned() == 2
    samples[2].clear()
    costs.record_draft(2, 2, 1e-9)  # a price below any real round's
    catch_up()
    assert learned() == 1  # a catch-up dearer than the price: not learned
    # ... as drafting's price, but as a catch-up: the 4 plain rounds' tokens fed first
    assert [behind for behind, _ in costs.catch_up_samples[2]] == [4]
    engine.step()
    assert learned() == 2  # the steady round after it is
    assert len(costs.catch_up_samples[2]) == 1  # and it is no catch-up
    samples[2].clear()
    costs.record_draft(2, 2, 10.0)  # a price far above any real round's
    catch_up()
    assert learned() == 2 and min(s for _, s in samples[2][2]) < 10.0  # learned: it corrects it
