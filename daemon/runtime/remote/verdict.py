"""The verifier's verdict on a proposal, read back from what it committed.

The engine does not tell a proposer its verdicts; it does not need to: the next request's
token list holds them. If the proposal was d_0..d_{m-1} after n committed tokens and the
sequence now has n + a + 1 tokens ending d_0..d_{a-1} t, the verdict was (a, t): a drafts
accepted, then t (the correction at a < m, the bonus at a == m). Anything else (a round
without drafts in between, a stop) matches no branch.
"""

from dataclasses import dataclass

from daemon.runtime.proposers.drafts import PreparedBranch


@dataclass(slots=True)
class Verdict:
    num_accepted: int
    token: int
    num_drafts: int  # m, of the proposal judged

    @property
    def kind(self) -> str:
        return "all" if self.num_accepted == self.num_drafts else f"a={self.num_accepted}"


def read_verdict(drafts: list[int], num_before: int, token_ids: list[int]) -> Verdict | None:
    """The verdict on `drafts` (proposed when the sequence had `num_before` tokens), or None
    if the tokens committed since are not one verdict's worth."""
    committed = token_ids[num_before:]
    num_accepted = len(committed) - 1
    if not 0 <= num_accepted <= len(drafts) or committed[:num_accepted] != drafts[:num_accepted]:
        return None
    return Verdict(num_accepted, committed[-1], len(drafts))


def find_branch(branches: list[PreparedBranch], verdict: Verdict) -> tuple[int, int] | None:
    """(index, rank) of the branch prepared for `verdict`, rank = its place among the guesses
    for that accepted count (0: the drafter's best guess); None on a miss."""
    rank = 0
    for index, branch in enumerate(branches):
        if branch.num_accepted != verdict.num_accepted:
            continue
        if branch.token == verdict.token:
            return index, rank
        rank += 1
    return None
