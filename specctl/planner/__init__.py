"""The placement planner: which shard runs on which node and GPUs, with how many layers, and
whether it fits in memory, every choice explained in words. Pure Python, no torch: the TUI
calls it on every change.

    facts = gather_node_facts(config, mode="auto")    # this machine, specd, or declared
    plan = make_plan(config, facts)                    # Plan: JSON-serialisable
"""

from specctl.planner.facts import GpuFacts, NodeFacts
from specctl.planner.gather import InventoryError, ProbeMode, fetch_inventory, gather_node_facts
from specctl.planner.placement import make_plan
from specctl.planner.plan import DeviceUse, MemoryPerRank, Plan, ShardPlan, SpeculationPlan

__all__ = [
    "DeviceUse",
    "GpuFacts",
    "InventoryError",
    "MemoryPerRank",
    "NodeFacts",
    "Plan",
    "ProbeMode",
    "ShardPlan",
    "SpeculationPlan",
    "fetch_inventory",
    "gather_node_facts",
    "make_plan",
]
