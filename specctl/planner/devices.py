"""Memory pools the shards are charged to: each GPU, or a machine's memory for CPU shards.

Nodes on the same machine (two `local` nodes, two specd daemons on one host) share the same
pools, so their shards are counted together. Shards are placed one after the other; a rank
goes to the GPU of its node with the most memory left.
"""

from dataclasses import dataclass, field

from specctl.config.cluster import ClusterConfig
from specctl.planner.facts import GpuFacts, NodeFacts
from specctl.planner.plan import DeviceUse


@dataclass(slots=True)
class Device:
    machine: str
    device: str  # "gpu0", "cpu"
    name: str
    is_gpu: bool
    is_unified: bool
    total_bytes: int | None
    budget_bytes: int | None
    free_now_bytes: int | None
    uuid: str | None = None  # a GPU's own id, when known: the same GPU seen from two nodes
    nodes: list[str] = field(default_factory=list)
    planned_bytes: int = 0
    shards: list[str] = field(default_factory=list)

    @property
    def remaining_bytes(self) -> int | None:
        return None if self.budget_bytes is None else self.budget_bytes - self.planned_bytes

    def label(self, node: str) -> str:
        return f"{node} GPU {self.device.removeprefix('gpu')}" if self.is_gpu else f"{node} CPU"

    def charge(self, shard_id: str, num_bytes: int) -> None:
        self.planned_bytes += num_bytes
        if shard_id not in self.shards:
            self.shards.append(shard_id)

    def to_use(self) -> DeviceUse:
        return DeviceUse(
            machine=self.machine,
            nodes=self.nodes,
            device=self.device,
            name=self.name,
            is_unified=self.is_unified,
            total_bytes=self.total_bytes,
            budget_bytes=self.budget_bytes,
            planned_bytes=self.planned_bytes,
            free_now_bytes=self.free_now_bytes,
            shards=self.shards,
        )


class DevicePool:
    def __init__(self, config: ClusterConfig, facts: dict[str, NodeFacts]) -> None:
        self._by_key: dict[tuple[str, str], Device] = {}
        self._by_node: dict[str, list[Device]] = {}
        for node in config.nodes:
            node_facts = facts[node.name]
            if node_facts.is_known:
                self._by_node[node.name] = self._devices_of(node_facts, node.memory_utilization)

    def devices(self) -> list[Device]:
        return list(self._by_key.values())

    def of_node(self, node: str) -> list[Device] | None:
        """The node's pools (its GPUs, or its machine's memory); None if nothing is known."""
        return self._by_node.get(node)

    def has_gpus(self, node: str) -> bool:
        return any(device.is_gpu for device in self._by_node.get(node) or [])

    def choose(self, node: str, num_ranks: int) -> list[Device]:
        """One device per rank: the GPUs with the most memory left (fewer than `num_ranks`
        when the node has fewer GPUs), or the machine's memory for every rank on CPU."""
        devices = self._by_node.get(node) or []
        if not devices or not devices[0].is_gpu:
            return devices[:1] * num_ranks
        ranked = sorted(devices, key=lambda d: (-(d.remaining_bytes or 0), d.device))
        return ranked[:num_ranks]

    def _devices_of(self, facts: NodeFacts, utilization: float) -> list[Device]:
        if facts.gpus:
            return [self._shared(facts, self._gpu(facts, gpu, utilization)) for gpu in facts.gpus]
        total = facts.memory_total_bytes
        cpu = Device(
            machine=facts.machine,
            device="cpu",
            name="CPU memory",
            is_gpu=False,
            is_unified=False,
            total_bytes=total,
            budget_bytes=None if total is None else int(total * utilization),
            free_now_bytes=facts.memory_available_bytes,
        )
        return [self._shared(facts, cpu)]

    @staticmethod
    def _gpu(facts: NodeFacts, gpu: GpuFacts, utilization: float) -> Device:
        total = gpu.memory_total_bytes
        return Device(
            machine=facts.machine,
            device=f"gpu{gpu.index}",
            uuid=gpu.uuid,
            name=gpu.name,
            is_gpu=True,
            is_unified=gpu.unified_memory,
            total_bytes=total,
            budget_bytes=None if total is None else int(total * utilization),
            free_now_bytes=gpu.memory_free_bytes,
        )

    def _shared(self, facts: NodeFacts, device: Device) -> Device:
        """The machine's existing pool when another node already named it."""
        key = (device.uuid, "") if device.uuid else (device.machine, device.device)
        existing = self._by_key.setdefault(key, device)
        if facts.name not in existing.nodes:
            existing.nodes.append(facts.name)
        if existing.budget_bytes is not None and device.budget_bytes is not None:
            existing.budget_bytes = min(existing.budget_bytes, device.budget_bytes)
        return existing
