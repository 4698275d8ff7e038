"""Acceptance estimates per draft position, with exponential forgetting.

Position i (0-based) is *reached* when drafts 0..i-1 were all accepted; alpha_i is the
probability that draft i is accepted once reached. The chance that draft i is accepted is
P(i) = alpha_0 * ... * alpha_i, and a round drafting k tokens emits on average
E(k) = 1 + P(0) + ... + P(k-1) tokens (the +1 is the correction or bonus token).
"""

from dataclasses import dataclass, field


@dataclass(slots=True)
class AcceptanceEstimate:
    max_k: int
    decay: float = 0.9  # weight kept by old observations at each update
    accepted: list[float] = field(default_factory=list)  # [max_k]
    reached: list[float] = field(default_factory=list)  # [max_k]

    def __post_init__(self) -> None:
        self.accepted = [0.0] * self.max_k
        self.reached = [0.0] * self.max_k

    def update(self, num_drafted: int, num_accepted: int) -> None:
        """One round's verdict: `num_accepted` of `num_drafted` drafts were accepted."""
        if num_drafted == 0:
            return
        for i in range(min(num_drafted, num_accepted + 1, self.max_k)):
            self.reached[i] = self.reached[i] * self.decay + 1.0
            self.accepted[i] = self.accepted[i] * self.decay + float(i < num_accepted)

    def alphas(self, prior: list[float], prior_weight: float) -> list[float]:
        """[max_k] conditional acceptance per position, shrunk towards `prior`."""
        return [
            (a + prior_weight * p) / (r + prior_weight)
            for a, r, p in zip(self.accepted, self.reached, prior, strict=True)
        ]

    def chained_alphas(self, first_prior: float, prior_weight: float) -> list[float]:
        """[max_k] conditional acceptance per position, each shrunk towards the estimate of
        the position before it (position 0 towards `first_prior`): a position seldom reached
        takes its shallower neighbour's rate, not a flat guess."""
        out: list[float] = []
        prior = first_prior
        for a, r in zip(self.accepted, self.reached, strict=True):
            prior = (a + prior_weight * prior) / (r + prior_weight)
            out.append(prior)
        return out


def accept_probs(alphas: list[float]) -> list[float]:
    """[k] P(draft i is accepted) = product of alphas up to i."""
    out: list[float] = []
    running = 1.0
    for alpha in alphas:
        running *= alpha
        out.append(running)
    return out


def expected_tokens(probs: list[float], k: int) -> float:
    """Expected tokens emitted by a round that drafts k tokens: 1 + sum of P(i) for i < k."""
    return 1.0 + sum(probs[:k])
