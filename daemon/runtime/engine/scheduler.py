"""Continuous batching: requests wait, take a free slot when one opens, and leave when done."""

import bisect
import heapq
from collections import deque
from dataclasses import dataclass, field

from daemon.runtime.engine.request import Request
from daemon.runtime.engine.sequence import Sequence


@dataclass(slots=True)
class Scheduler:
    num_slots: int
    first_slot: int = 0  # the slots are first_slot .. first_slot + num_slots - 1
    waiting: deque[Request] = field(default_factory=deque)
    running: list[Sequence] = field(default_factory=list)
    free_slots: list[int] = field(init=False)  # a min-heap: the lowest free slot goes first

    def __post_init__(self) -> None:
        self.free_all()

    def free_all(self) -> None:
        """Every slot free (the engine dropped its sequences)."""
        self.free_slots = list(range(self.first_slot, self.first_slot + self.num_slots))

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def can_admit(self) -> bool:
        return bool(self.waiting) and bool(self.free_slots)

    def admit(self) -> tuple[Request, int]:
        """The oldest waiting request and the lowest free slot: the busy slots stay packed at
        the bottom, so a batch's slots span few more than it has rows (forward_metadata)."""
        return self.waiting.popleft(), heapq.heappop(self.free_slots)

    def remove_waiting(self, request_id: str) -> Request | None:
        """Take a request that has not started out of the queue (None if it is not there)."""
        for request in self.waiting:
            if request.request_id == request_id:
                self.waiting.remove(request)
                return request
        return None

    def find_running(self, request_id: str) -> Sequence | None:
        return next((s for s in self.running if s.request.request_id == request_id), None)

    def start(self, seq: Sequence) -> None:
        """Join the batch, which is kept in slot order (a packed batch reads the KV cache as
        one view, forward_metadata)."""
        bisect.insort(self.running, seq, key=lambda s: s.slot)

    def retire_finished(self) -> list[Sequence]:
        """Remove finished sequences from the batch and free their slots."""
        done = [s for s in self.running if s.is_finished]
        if done:
            self.running = [s for s in self.running if not s.is_finished]
            for seq in done:
                heapq.heappush(self.free_slots, seq.slot)
        return done

    @property
    def has_work(self) -> bool:
        return bool(self.waiting) or bool(self.running)
