"""The Assign screen's live verdict: the edited document checked as `specctl plan` checks a
file, then planned against what the nodes have (fits / does not fit / unknown, and why).

Node facts are gathered as `specctl plan` gathers them (this machine for local nodes, specd
for nodes that declare no hardware) and kept for a while: a keystroke must not wait for a
node's specd every time.
"""

import threading
import time
from dataclasses import dataclass
from typing import Literal

from specctl.config.cluster import ClusterConfig
from specctl.planner import NodeFacts, Plan, gather_node_facts, make_plan
from tui.core.session import ConfigCheck

VerdictKind = Literal["fits", "does_not_fit", "unknown", "invalid"]
FACTS_TTL_S = 30.0

HEADLINES: dict[VerdictKind, str] = {
    "fits": "Fits",
    "does_not_fit": "Does not fit",
    "unknown": "Fit unknown",
    "invalid": "Invalid",
}


@dataclass(frozen=True, slots=True)
class AssignVerdict:
    revision: int  # the session revision it judged
    kind: VerdictKind
    problems: tuple[str, ...] = ()  # config issues (file:line: field: ...) or plan problems
    warnings: tuple[str, ...] = ()
    explanation: tuple[str, ...] = ()
    plan: Plan | None = None

    @property
    def headline(self) -> str:
        return HEADLINES[self.kind]


class FactsCache:
    """Node facts for a config, reused while the nodes section is unchanged and fresh."""

    def __init__(self, timeout_s: float, ttl_s: float = FACTS_TTL_S) -> None:
        self.timeout_s = timeout_s
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._key: str | None = None
        self._facts: dict[str, NodeFacts] = {}
        self._read_monotonic_s = 0.0

    def facts_for(self, config: ClusterConfig) -> dict[str, NodeFacts]:
        key = "|".join(node.model_dump_json() for node in config.nodes)
        with self._lock:
            is_fresh = time.monotonic() - self._read_monotonic_s < self.ttl_s
            if key == self._key and is_fresh:
                return self._facts
        facts = gather_node_facts(config, mode="auto", timeout_s=self.timeout_s)
        with self._lock:
            self._key, self._facts, self._read_monotonic_s = key, facts, time.monotonic()
        return facts


def judge(check: ConfigCheck, facts: FactsCache, revision: int) -> AssignVerdict:
    if check.config is None:
        problems = tuple(str(issue) for issue in check.issues)
        return AssignVerdict(revision, "invalid", problems)
    plan = make_plan(check.config, facts.facts_for(check.config))
    return AssignVerdict(
        revision=revision,
        kind=plan.verdict,
        problems=tuple(plan.problems),
        warnings=tuple(plan.warnings),
        explanation=tuple(plan.explanation),
        plan=plan,
    )
