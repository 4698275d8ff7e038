"""The messages between the verifier's remote proposer and the draft server (see wire.py for
their encoding). One request, one reply; the server applies a request's parts in this order:
reset, releases, admits, updates, propose, prepare."""

from dataclasses import dataclass, field

from daemon.runtime.proposers.drafts import NO_BRANCH, DraftRecord, PreparedBranch

WHOLE_MESSAGE = -1  # `SlotError.slot` of an error that concerns no single slot


@dataclass(slots=True)
class AdmitEntry:
    """A sequence joins (or is resynchronised): its whole token list so far. The only part
    of the protocol whose size grows with the context, sent once per sequence."""

    slot: int
    token_ids: list[int]
    draft_seed: int
    temperature: float  # 0: greedy drafting


@dataclass(slots=True)
class UpdateEntry:
    """The tokens the verifier committed for a slot since the drafter last heard of it, and
    which prepared branch (index into the slot's last branches reply) the verifier now
    proposes from, with how many of its drafts; NO_BRANCH: none (the next proposal is fresh)."""

    slot: int
    new_token_ids: list[int]
    branch: int = NO_BRANCH
    num_used: int = 0


@dataclass(slots=True)
class DraftEntry:
    """Propose: draft k tokens now. Prepare: pre-draft k per branch for the outcomes of the
    slot's outstanding proposal."""

    slot: int
    k: int


@dataclass(slots=True)
class DraftRequest:
    message_id: int
    is_reset: bool = False  # forget every slot first (a resync follows)
    releases: list[int] = field(default_factory=list)
    admits: list[AdmitEntry] = field(default_factory=list)
    updates: list[UpdateEntry] = field(default_factory=list)
    propose: list[DraftEntry] = field(default_factory=list)
    prepare: list[DraftEntry] = field(default_factory=list)
    max_branches: int = 0  # branches per sequence to prepare, at most (0: the drafter's own)
    # the sampled drafts of this message's propose and prepare go coupled (the token alone),
    # whatever list width the drafter was built with (ProposeRequest.coupled)
    coupled: bool = False

    @property
    def is_probe(self) -> bool:
        """An empty request: only asks who is there (the instance id)."""
        return not (
            self.is_reset
            or self.releases
            or self.admits
            or self.updates
            or self.propose
            or self.prepare
        )


@dataclass(slots=True)
class SlotError:
    slot: int  # WHOLE_MESSAGE: the error concerns the request as a whole
    message: str


@dataclass(slots=True)
class SlotDrafts:
    slot: int
    drafts: DraftRecord  # on the wire: tokens and sparse counts (no alternatives)


@dataclass(slots=True)
class SlotBranches:
    slot: int
    branches: list[PreparedBranch]


@dataclass(slots=True)
class DraftReply:
    message_id: int  # the request's
    instance_id: int  # random per DraftServer instance: a restarted drafter has a new one
    errors: list[SlotError] = field(default_factory=list)
    proposals: list[SlotDrafts] = field(default_factory=list)
    branches: list[SlotBranches] = field(default_factory=list)
    draft_time_s: float = 0.0  # the drafter's time proposing
    prepare_time_s: float = 0.0  # the drafter's time preparing branches
