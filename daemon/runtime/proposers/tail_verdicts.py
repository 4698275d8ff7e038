"""How much of a sampled draft's distribution to list: learned from the verifier's verdicts.

A sampled draft lists its best tokens with their probabilities and sends the rest of its mass
as a tail, whose token the drafter and the verifier each pick by a Gumbel race with shared
noise (sampling/rejection.py). A listed draft x is accepted with min(1, p(x) / q(x)), as with
the full distribution; a tail draft only when the two races pick the same token, which is
rarer when the draft and the target disagree over the unlisted tokens. Where they agree there
(draft = target; a draft distilled well) the tail costs nothing and a short list is all a
proposal needs. Where they do not, every draft drawn from the tail is accepted less often
than it would be listed: on the demo pair at temperature 1 a top-32 list leaves 42-48% of the
mass to the tail, over which the two races agree 66% of the time, and the acceptance rate of a
round of 4 drafts falls to 0.89 of full-distribution drafting
(`python -m bench.proposal_acceptance`).

The drafter cannot measure that loss directly (it would need the target's p), but it sees its
result: the verifier commits a draft or replaces it. Each sequence's `TailVerdicts` counts how
often its tail drafts were committed, a, starting from the belief that the tail costs nothing
(PRIOR_VERDICTS verdicts, all accepted, unless told otherwise). A tail holding mass t then
costs a draft about t (1 - a) of acceptance; the proposer lists, per row, the best tokens
until the tail holds at most TAIL_LOSS / (1 - a) (`listing_mass`), within the byte budget of
`max_listed` tokens (proposers/draft_sampling.py). With a near 1 that is what the base list
already leaves, so nothing widens: no extra bytes, no wider top-k over a real vocabulary.

The counts are per sequence, and the drafts of round j + 1 use the verdicts up to round j - 1,
so that a seeded request drafts, and therefore samples, the same tokens in process, through a
remote drafter in sync mode and in overlapped mode: an overlapped drafter prepares round
j + 1 while round j is verified, before its verdict is known (`listing_mass(with_latest=True)`
while preparing, after the verdict on round j - 1 is the latest; `with_latest=False` when
drafting afresh, after the verdict on round j). Other requests' verdicts do not enter.
"""

from daemon.runtime.proposers.drafts import DraftRecord

TAIL_LOSS = 0.005  # acceptance a draft may lose to its tail's coupling (about 1% of a round's)
# the byte budget the docs suggest where a draft is flat (proposal_max_tokens): on the demo
# pair at T = 1 its lists reach 0.986 of full drafting's acceptance rate at ~28 KB a round
# per sequence (bench/proposal_acceptance.py). Not the default: a widened list costs CPU time
# (docs/remote-speculation.md, "How wide to list").
SUGGESTED_MAX_LISTED = 2048
PRIOR_VERDICTS = 8.0  # the starting belief weighs this many verdicts
MIN_REJECTION = 1e-9


class TailVerdicts:
    """How often the verifier commits one sequence's tail drafts (or, `latest` folded in
    at once, a whole proposer's, for its statistics)."""

    def __init__(self, prior_acceptance: float = 1.0) -> None:
        if not 0.0 <= prior_acceptance <= 1.0:
            raise ValueError(f"prior_acceptance must be in [0, 1], got {prior_acceptance}")
        self.tested = PRIOR_VERDICTS  # tail drafts the verifier decided, before the latest
        self.accepted = PRIOR_VERDICTS * prior_acceptance  # ... and of those it committed
        self.latest = (0, 0)  # (decided, committed) in the latest verdict, not yet folded in

    def acceptance(self, with_latest: bool = True) -> float:
        tested, accepted = self.tested, self.accepted
        if with_latest:
            tested, accepted = tested + self.latest[0], accepted + self.latest[1]
        return accepted / tested

    def listing_mass(self, with_latest: bool) -> float:
        """The mass a sampled draft's list should cover so that its tail costs it at most
        TAIL_LOSS of acceptance (0: any list will do)."""
        rejection = 1.0 - self.acceptance(with_latest)
        return max(0.0, 1.0 - TAIL_LOSS / max(rejection, MIN_REJECTION))

    def observe(self, record: DraftRecord, committed: list[int]) -> None:
        """The verdict on one proposal: `record` its drafts, `committed` the tokens the
        verifier committed from its first draft's position on. The drafts up to the first it
        replaced were decided; the rest were never tested. The previous verdict is folded in."""
        self.tested += self.latest[0]
        self.accepted += self.latest[1]
        decided = kept = 0
        for token, sparse, emitted in zip(record.tokens, record.sparse, committed, strict=False):
            accepted = token == emitted
            if sparse is not None and sparse.from_tail:
                decided, kept = decided + 1, kept + int(accepted)
            if not accepted:
                break
        self.latest = (decided, kept)
