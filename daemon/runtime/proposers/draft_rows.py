"""The draft model's step loop: rows of sequences and branches, one forward per step.

A row feeds its next chunk (a catch-up tail, then one token per step) to the main slot of its
sequence or, for a fork row, to a branch slot that reads the parent's context below the fork
position. Each step, every active row gets one new token: a draft (sampled with the keyed
randomness of its absolute position) or, for a row that is guessing, the draft's guesses
for the position the verifier decides next (the bonus token; for a sampled row the first is
coupled to the verifier's draw, see sampling/coupled_bonus.py), the first of which the row
then continues from while the callback may start fork rows for the others.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

from daemon.runtime.model.batch import NO_FORK, ForwardBatch, LogitsMode
from daemon.runtime.model.protocol import CausalLM
from daemon.runtime.proposers.draft_sampling import DraftSampler, RowKey
from daemon.runtime.proposers.drafts import DraftRecord


@dataclass(slots=True)
class SlotState:
    """What the draft's main slot holds: the sequence's first `num_committed` committed
    tokens, then `speculative` (tokens fed past them: own drafts, guesses)."""

    num_committed: int
    speculative: list[int] = field(default_factory=list)


@dataclass(slots=True)
class DraftRow:
    slot: int  # main slot, or the branch slot of a fork row
    chunk: list[int]  # tokens to feed next; chunk[0] sits at next_pos
    next_pos: int
    num_to_draft: int  # drafts still wanted
    temperature: float
    draft_seed: int
    listing_mass: float = 0.0  # sampled drafts: how far to widen their lists (RowKey)
    parent: int = NO_FORK  # fork rows: the parent's main slot
    fork_position: int = 0  # fork rows: first position the branch owns
    is_guessing: bool = False  # the next logits give guesses, not a draft
    is_cancelled: bool = False  # dropped before it finished (another branch took its place)
    state: SlotState | None = None  # main rows: kept in step with what is fed
    record: DraftRecord = field(default_factory=DraftRecord)
    fed: list[int] = field(default_factory=list)  # fork rows: every token fed (branch cache)
    _is_first_feed: bool = True

    @property
    def is_fork(self) -> bool:
        return self.parent != NO_FORK

    @property
    def new_position(self) -> int:
        """Absolute position of the token the next logits decide."""
        return self.next_pos + len(self.chunk)

    def key(self) -> RowKey:
        return RowKey(self.temperature, self.draft_seed, self.new_position, self.listing_mass)


# (the guessing row, its guesses best first, their probabilities) -> rows to start
GuessCallback = Callable[[DraftRow, list[int], list[float]], list[DraftRow]]


def run_rows(
    model: CausalLM,
    sampler: DraftSampler,
    rows: list[DraftRow],
    num_guesses: int = 1,
    on_guess: GuessCallback | None = None,
    with_alternatives: bool = True,
) -> None:
    """Step every row until it has drafted what it wants (or is cancelled by a guess
    callback); records fill in place (with the draft's alternatives if asked)."""
    active = [r for r in rows if r.num_to_draft > 0]
    while active:
        logits = model.forward(_batch(active))  # [A, V]
        assert logits is not None
        for row in active:
            _note_fed(row)
        drafting = [i for i, r in enumerate(active) if not r.is_guessing]
        still: list[DraftRow] = []
        if drafting:
            keys = [active[i].key() for i in drafting]
            # every row drafting (the usual case): no copy of [A, V] logits
            every_row = len(drafting) == len(active)
            rows_logits = logits if every_row else logits[drafting]
            steps = sampler.sample(rows_logits, keys, with_alternatives)
            for i, step in zip(drafting, steps, strict=True):
                row = active[i]
                row.record.append(
                    step.token,
                    step.sparse,
                    step.alternatives,
                    step.token_prob,
                    step.alternative_probs,
                )
                _advance(row, step.token, still)
        guessing = [i for i, r in enumerate(active) if r.is_guessing]
        if guessing:
            keys = [active[i].key() for i in guessing]
            ids, probs = sampler.guesses(logits[guessing], keys, num_guesses)
            for i, guesses, guess_probs in zip(guessing, ids, probs, strict=True):
                row = active[i]
                row.is_guessing = False
                if on_guess is not None:
                    still.extend(on_guess(row, guesses, guess_probs))
                _continue_with(row, guesses[0], still)
        active = [r for r in still if r.num_to_draft > 0 and not r.is_cancelled]


def _batch(rows: list[DraftRow]) -> ForwardBatch:
    has_forks = any(r.is_fork for r in rows)
    return ForwardBatch(
        slots=[r.slot for r in rows],
        token_ids=[r.chunk for r in rows],
        start_positions=[r.next_pos for r in rows],
        logits_mode=LogitsMode.LAST,
        fork_parents=[r.parent for r in rows] if has_forks else None,
        fork_positions=[r.fork_position for r in rows] if has_forks else None,
    )


def _note_fed(row: DraftRow) -> None:
    """The chunk is in the cache now: main rows extend their slot state (the first chunk was
    accounted for when the row was activated), fork rows their branch tokens."""
    if row.is_fork:
        row.fed.extend(row.chunk)
    elif row.state is not None and not row._is_first_feed:
        row.state.speculative.extend(row.chunk)
    row._is_first_feed = False


def _advance(row: DraftRow, token: int, still: list[DraftRow]) -> None:
    row.num_to_draft -= 1
    if row.num_to_draft > 0:
        _continue_with(row, token, still)


def _continue_with(row: DraftRow, token: int, still: list[DraftRow]) -> None:
    row.next_pos, row.chunk = row.new_position, [token]
    still.append(row)
