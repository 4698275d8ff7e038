"""What is known about each node's hardware, whatever the source: this machine (local nodes),
specd's inventory (`/v1/inventory`), or what cluster.toml declares. JSON-ready (the plan
carries them, so `specctl status` and the TUI can show what the plan was made from)."""

from typing import Any, Literal

from pydantic import BaseModel, Field

from specctl.config.schema import NodeSpec

BYTES_PER_GIB = 2**30

FactsSource = Literal["local", "specd", "declared", "unknown"]


class GpuFacts(BaseModel):
    index: int
    name: str = "GPU"
    uuid: str | None = None
    memory_total_bytes: int | None = None  # None: the GPU cannot report it
    memory_free_bytes: int | None = None  # now, when read live
    unified_memory: bool = False  # memory is the system's (GB10): shared with the CPU


class NodeFacts(BaseModel):
    name: str
    address: str  # "local" or specd's host:port
    source: FactsSource
    machine: str  # nodes on the same machine share its memory (two local nodes, say)
    num_cpus: int | None = None
    memory_total_bytes: int | None = None
    memory_available_bytes: int | None = None  # now, when read live
    gpus: list[GpuFacts] = Field(default_factory=list)
    note: str | None = None  # how the facts were found, or why they could not be

    @property
    def is_known(self) -> bool:
        return self.source != "unknown"


def declared_facts(node: NodeSpec, note: str | None = None) -> NodeFacts:
    """Facts from the node's `memory_gib` / `gpus` in cluster.toml; `unknown` without them."""
    gpus = [
        GpuFacts(
            index=index,
            name=gpu.model,
            memory_total_bytes=int(gpu.memory_gib * BYTES_PER_GIB),
            unified_memory=gpu.unified_memory,
        )
        for index, gpu in enumerate(g for g in node.gpus for _ in range(g.count))
    ]
    memory = int(node.memory_gib * BYTES_PER_GIB) if node.memory_gib is not None else None
    is_declared = memory is not None or bool(gpus)
    return NodeFacts(
        name=node.name,
        address=node.specd,
        source="declared" if is_declared else "unknown",
        machine=f"node:{node.name}",
        memory_total_bytes=memory,
        gpus=gpus,
        note=note if is_declared or note else "no memory_gib or gpus declared",
    )


def facts_from_inventory(
    node: NodeSpec, inventory: dict[str, Any], source: FactsSource, note: str | None = None
) -> NodeFacts:
    """Facts from specd's inventory JSON (daemon/specd/inventory.py: Inventory.to_json())."""
    host = inventory.get("host") or {}
    gpus = [
        GpuFacts(
            index=int(gpu.get("index", position)),
            name=gpu.get("name") or "GPU",
            uuid=gpu.get("uuid"),
            memory_total_bytes=gpu.get("memory_total_bytes"),
            memory_free_bytes=gpu.get("memory_free_bytes"),
            unified_memory=bool(gpu.get("unified_memory", False)),
        )
        for position, gpu in enumerate(inventory.get("gpus") or [])
    ]
    return NodeFacts(
        name=node.name,
        address=node.specd,
        source=source,
        # same host name and memory size: the same machine (two local nodes, two daemons)
        machine=f"host:{host.get('hostname') or node.name}:{host.get('memory_total_bytes')}",
        num_cpus=host.get("num_cpus"),
        memory_total_bytes=host.get("memory_total_bytes"),
        memory_available_bytes=host.get("memory_available_bytes"),
        gpus=gpus,
        note=note,
    )
