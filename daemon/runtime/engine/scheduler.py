"""Continuous batching: requests wait, take a free slot when one opens, and leave when done."""

from collections import deque
from dataclasses import dataclass, field

from daemon.runtime.engine.request import Request
from daemon.runtime.engine.sequence import Sequence


@dataclass(slots=True)
class Scheduler:
    num_slots: int
    waiting: deque[Request] = field(default_factory=deque)
    running: list[Sequence] = field(default_factory=list)
    free_slots: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.free_slots = list(range(self.num_slots - 1, -1, -1))

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def can_admit(self) -> bool:
        return bool(self.waiting) and bool(self.free_slots)

    def admit(self) -> tuple[Request, int]:
        """The oldest waiting request and the slot it gets."""
        return self.waiting.popleft(), self.free_slots.pop()

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
        self.running.append(seq)

    def retire_finished(self) -> list[Sequence]:
        """Remove finished sequences from the batch and free their slots."""
        done = [s for s in self.running if s.is_finished]
        if done:
            self.running = [s for s in self.running if not s.is_finished]
            self.free_slots.extend(s.slot for s in done)
        return done

    @property
    def has_work(self) -> bool:
        return bool(self.waiting) or bool(self.running)
