"""How the verifier's remote proposer talks to its drafter."""

from dataclasses import dataclass
from enum import StrEnum

from daemon.runtime.remote.miss_policy import MissPolicy


class RemoteMode(StrEnum):
    SYNC = "sync"  # one call per round: update + propose, then verify
    OVERLAPPED = "overlapped"  # the drafter pre-drafts the next round while the verifier verifies


@dataclass(slots=True)
class RemoteOptions:
    mode: RemoteMode = RemoteMode.OVERLAPPED
    call_timeout_s: float = 10.0  # a fresh propose call (includes the drafter's prefill of admits)
    prepare_timeout_s: float = 10.0  # waiting for prepared branches, from the time they are needed
    probe_every_rounds: int = 8  # rounds without a drafter between two probes ...
    probe_interval_s: float = 1.0  # ... and at least this long between them
    probe_timeout_s: float = 5.0  # an unanswered probe counts as failed after this
    prepare_k: int | None = None  # drafts per prepared branch; None: the k of the round
    max_branches: int = 6  # branches per sequence asked for, at most
    initial_branches: int = 3  # asked for at first; then adapted (branch_budget.py)
    is_adaptive_branches: bool = True  # False: always `initial_branches`
    miss_policy: MissPolicy = MissPolicy.AUTO  # overlapped mode: see miss_policy.py

    def __post_init__(self) -> None:
        self.mode = RemoteMode(self.mode)
        self.miss_policy = MissPolicy(self.miss_policy)
        for name in ("call_timeout_s", "prepare_timeout_s", "probe_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.probe_every_rounds < 1 or self.probe_interval_s < 0:
            raise ValueError(
                "need probe_every_rounds >= 1 and probe_interval_s >= 0, got "
                f"{self.probe_every_rounds}, {self.probe_interval_s}"
            )
        if not 1 <= self.initial_branches <= self.max_branches <= 255:
            raise ValueError(
                "need 1 <= initial_branches <= max_branches <= 255, got "
                f"{self.initial_branches}, {self.max_branches}"
            )
        if self.prepare_k is not None and not 1 <= self.prepare_k <= 255:
            raise ValueError(f"prepare_k must be in [1, 255], got {self.prepare_k}")

    @property
    def is_overlapped(self) -> bool:
        return self.mode is RemoteMode.OVERLAPPED
