"""make_plan: place every shard, check its memory, and say why in words.

Per replica, the drafter goes first (its node is fixed by the file), then the verifier's
pipeline stages, whose automatic split sees what the drafter left. Every rank is charged to a
memory pool (a GPU, or a machine's memory on CPU); a shard fits when each of its ranks fits in
what its pool had left.
"""

from collections import Counter
from dataclasses import replace

from specctl.config.cluster import ClusterConfig
from specctl.planner.deployable import not_deployable
from specctl.planner.devices import Device, DevicePool
from specctl.planner.facts import NodeFacts
from specctl.planner.hints import fit_hints
from specctl.planner.memory import (
    ShardLayout,
    fixed_bytes_per_rank,
    layer_bytes_per_rank,
    memory_per_rank,
)
from specctl.planner.narrative import free_now_warnings, model_lines, relation_line
from specctl.planner.plan import (
    Plan,
    ShardPlan,
    SpeculationPlan,
    Verdict,
)
from specctl.planner.records import Placement, shard_plan
from specctl.planner.split import split_layers
from specctl.planner.wording import (
    endpoint_line,
    endpoint_url,
    memory_sum,
    node_line,
    size,
    speculation_line,
)


def make_plan(config: ClusterConfig, facts: dict[str, NodeFacts]) -> Plan:
    """Place the deployment of `config` on the nodes described by `facts` (by node name, as
    `gather_node_facts` returns them). Pure: reads nothing, changes nothing."""
    missing = [node.name for node in config.nodes if node.name not in facts]
    if missing:
        raise ValueError(f"no facts for node(s) {', '.join(missing)}")
    return _Planner(config, facts).plan()


class _Planner:
    def __init__(self, config: ClusterConfig, facts: dict[str, NodeFacts]) -> None:
        self.config = config
        self.facts = facts
        self.pool = DevicePool(config, facts)
        self.verifier = config.deployment.verifier
        self.drafter = config.deployment.drafter
        self.batch = config.server.max_batch_size
        self.context = config.max_model_len(self.verifier.model)
        self.tokens_per_step = config.deployment.speculation.ceiling_k + 1
        self.shards: list[ShardPlan] = []
        self.labels: dict[str, str] = {}  # shard id -> how the plan's sentences name it
        self.explanation: list[str] = []
        self.problems: list[str] = []
        self.warnings: list[str] = []

    def plan(self) -> Plan:
        for node in self.config.nodes:
            devices = self.pool.of_node(node.name)
            self.explanation.append(
                node_line(self.facts[node.name], devices, node.memory_utilization)
            )
        self.explanation += model_lines(self.config, self.context)
        for replica in range(self.config.deployment.replicas):
            if not self.drafter.is_ngram:
                self._place_drafter(replica)
            self._place_verifier(replica)
        self.explanation.append(relation_line(self.config, self.pool))
        self.explanation.append(speculation_line(self.config))
        self.explanation.append(endpoint_line(self.config))
        self.warnings += free_now_warnings(self.pool)
        self.warnings += [f"apply would refuse it: {r}" for r in not_deployable(self.shards)]
        return self._result()

    # ---- placing ----

    def _place_drafter(self, replica: int) -> None:
        assert self.drafter.node is not None  # the config checks guarantee it
        shape = self.config.shape(self.drafter.model)
        layout = self._layout(
            self.drafter.model,
            num_layers=shape.num_layers,
            has_embedding=True,
            has_lm_head=not shape.tie_word_embeddings,
            tp=self.drafter.tensor_parallel_size,
        )
        label = f"{self._prefix(replica)}drafter {self.drafter.model}"
        self._place(
            Placement(
                f"r{replica}/drafter",
                "drafter",
                replica,
                label,
                self.drafter.model,
                self.drafter.node,
                layout,
            )
        )

    def _place_verifier(self, replica: int) -> None:
        model = self.verifier.model
        shape = self.config.shape(model)
        nodes = self.verifier.nodes
        num_stages = len(nodes)
        layouts = [
            self._layout(
                model,
                num_layers=0,
                has_embedding=stage == 0,
                has_lm_head=stage == num_stages - 1
                and (num_stages > 1 or not shape.tie_word_embeddings),
                tp=self.verifier.tensor_parallel_size,
                samples=stage == num_stages - 1,
            )
            for stage in range(num_stages)
        ]
        counts = self._layer_counts(replica, layouts, shape.num_layers)
        start = 0
        for stage, (node, layout, count) in enumerate(zip(nodes, layouts, counts, strict=True)):
            label = f"{self._prefix(replica)}verifier {model}"
            if num_stages > 1:
                layers = f"layer {start}" if count == 1 else f"layers {start}-{start + count - 1}"
                label += f" stage {stage} ({layers})"
            shard_id = f"r{replica}/verifier/stage{stage}"
            stage_layout = replace(layout, num_layers=count)
            self._place(
                Placement(
                    shard_id, "verifier", replica, label, model, node, stage_layout, stage, start
                )
            )
            start += count

    def _layer_counts(self, replica: int, layouts: list[ShardLayout], num_layers: int) -> list[int]:
        nodes = self.verifier.nodes
        model = self.verifier.model
        prefix = self._prefix(replica)
        if len(nodes) == 1:
            self.explanation.append(
                f"{prefix}verifier {model}: all {num_layers} layers on {nodes[0]} (one pipeline "
                f"stage, tensor parallel {self.verifier.tensor_parallel_size})"
            )
            return [num_layers]
        split = self.verifier.pipeline_split
        ratio = ":".join(nodes)
        if split != "auto":
            self.explanation.append(
                f"{prefix}verifier {model}: {num_layers} layers split "
                f"{':'.join(map(str, split))} across {ratio} as given in pipeline_split"
            )
            return list(split)
        rooms = self._stage_rooms(layouts)
        if rooms is None:
            counts = split_layers(num_layers, [1] * len(nodes), [1] * len(nodes))
            self.explanation.append(
                f"{prefix}verifier {model}: {num_layers} layers split "
                f"{':'.join(map(str, counts))} across {ratio} evenly (the memory of some stage "
                "is unknown)"
            )
            return counts
        costs = [layer_bytes_per_rank(layout) for layout in layouts]
        counts = split_layers(num_layers, rooms, costs)
        self.explanation.append(
            f"{prefix}verifier {model}: {num_layers} layers split "
            f"{':'.join(map(str, counts))} across {ratio} in proportion to free memory after "
            f"fixed costs ({' : '.join(size(room) if room > 0 else 'none' for room in rooms)})"
        )
        return counts

    def _stage_rooms(self, layouts: list[ShardLayout]) -> list[int] | None:
        """Per stage, what a rank has left for layers after the stage's fixed costs; pools
        shared by several stages (nodes on one machine) are divided between them."""
        tp = self.verifier.tensor_parallel_size
        chosen = [self.pool.choose(node, tp) for node in self.verifier.nodes]
        sharing = Counter(id(device) for ranks in chosen for device in ranks)
        rooms = []
        for ranks, layout in zip(chosen, layouts, strict=True):
            if not ranks or any(device.remaining_bytes is None for device in ranks):
                return None
            free = min((d.remaining_bytes or 0) // sharing[id(d)] for d in ranks)
            on_gpu = replace(layout, on_gpu=ranks[0].is_gpu)
            rooms.append(free - fixed_bytes_per_rank(on_gpu))
        return rooms

    def _place(self, placement: Placement) -> None:
        layout = placement.layout
        ranks = self.pool.choose(placement.node, layout.tensor_parallel_size)
        layout = replace(layout, on_gpu=bool(ranks) and ranks[0].is_gpu)
        need = memory_per_rank(layout)
        ranks_per_device = Counter(id(device) for device in ranks)
        free = self._free_per_rank(ranks, ranks_per_device)
        where = _where(placement.node, ranks, layout.tensor_parallel_size)
        verdict = self._verdict(placement, ranks, layout, need.total_bytes, free, where)
        for device in {id(device): device for device in ranks}.values():
            device.charge(placement.shard_id, need.total_bytes * ranks_per_device[id(device)])
        self.labels[placement.shard_id] = _the(placement.label)
        outcome = {
            "fits": f"fits ({size((free or 0) - need.total_bytes)} to spare)",
            "does_not_fit": f"does not fit (short by {size(need.total_bytes - (free or 0))})",
            "unknown": "fit unknown",
        }[verdict]
        self.explanation.append(
            f"{placement.label} on {where}: {memory_sum(need, self.batch, self.context)} of "
            f"{size(free)} free — {outcome}"
        )
        num_stages = len(self.verifier.nodes) if placement.role == "verifier" else 1
        self.shards.append(
            shard_plan(placement, self.config, layout, ranks, need, free, verdict, num_stages)
        )

    def _verdict(
        self,
        placement: Placement,
        ranks: list[Device],
        layout: ShardLayout,
        need_bytes: int,
        free: int | None,
        where: str,
    ) -> Verdict:
        label, node, tp = placement.label, placement.node, layout.tensor_parallel_size
        if not ranks:
            note = self.facts[node].note or "nothing known"
            self.problems.append(
                f"{label}: cannot check the fit on {node}: its memory is unknown ({note}); "
                "declare memory_gib and gpus for it in the cluster file, or make its specd "
                "reachable and plan with --probe"
            )
            return "unknown"
        if ranks[0].is_gpu and len(ranks) < tp:
            self.problems.append(
                f"{label}: tensor_parallel_size {tp} needs {tp} GPUs on {node}, which has "
                f"{len(ranks)}; use tensor_parallel_size {len(ranks)} or a node with more GPUs"
            )
            return "does_not_fit"
        if free is None:
            self.problems.append(
                f"{label}: cannot check the fit on {where}: the GPU does not report its memory; "
                "declare gpus = [{ memory_gib = ... }] for the node in the cluster file"
            )
            return "unknown"
        if need_bytes <= free:
            return "fits"
        hints = fit_hints(
            self.config, self.pool, self.labels, label, node, ranks, layout, need_bytes - free
        )
        self.problems.append(
            f"{label} does not fit on {where}: needs {size(need_bytes)}, {size(free)} free — "
            f"short by {size(need_bytes - free)}. Would help: {'; '.join(hints)}"
        )
        return "does_not_fit"

    @staticmethod
    def _free_per_rank(ranks: list[Device], per_device: Counter[int]) -> int | None:
        if not ranks or any(device.remaining_bytes is None for device in ranks):
            return None
        return min((d.remaining_bytes or 0) // per_device[id(d)] for d in ranks)

    def _layout(
        self,
        model: str,
        num_layers: int,
        has_embedding: bool,
        has_lm_head: bool,
        tp: int,
        samples: bool = True,
    ) -> ShardLayout:
        shape = self.config.shape(model)
        return ShardLayout(
            shape=shape,
            dtype=shape.resolve_dtype(self.config.model(model).dtype),
            num_layers=num_layers,
            has_embedding=has_embedding,
            has_lm_head=has_lm_head,
            samples=samples,
            tensor_parallel_size=tp,
            max_batch_size=self.batch,
            max_model_len=self.context,
            tokens_per_step=self.tokens_per_step,
            on_gpu=False,
        )

    # ---- words ----

    def _prefix(self, replica: int) -> str:
        return f"replica {replica}: " if self.config.deployment.replicas > 1 else ""

    def _result(self) -> Plan:
        verdicts = {shard.verdict for shard in self.shards}
        verdict: Verdict = "fits"
        if "does_not_fit" in verdicts or (self.problems and "unknown" not in verdicts):
            verdict = "does_not_fit"
        elif "unknown" in verdicts:
            verdict = "unknown"
        spec = self.config.deployment.speculation
        source = self.config.source_path
        return Plan(
            config_path=str(source) if source else None,
            deployment=self.config.deployment.name,
            verdict=verdict,
            endpoint=endpoint_url(self.config),
            replicas=self.config.deployment.replicas,
            speculation=SpeculationPlan(
                drafter="ngram" if self.drafter.is_ngram else "model",
                k=None if spec.adaptive else spec.ceiling_k,
                adaptive=spec.adaptive,
                max_k=spec.ceiling_k,
                mode=spec.mode,
            ),
            shards=self.shards,
            devices=[device.to_use() for device in self.pool.devices()],
            nodes=[self.facts[node.name] for node in self.config.nodes],
            explanation=self.explanation,
            problems=self.problems,
            warnings=self.warnings,
        )


def _the(label: str) -> str:
    """ "drafter llama-8b" -> "the drafter llama-8b" (for "moving the drafter ... off")."""
    return label if label.startswith("replica") else f"the {label}"


def _where(node: str, ranks: list[Device], tp: int) -> str:
    if not ranks:
        return node
    if not ranks[0].is_gpu:
        return f"{node} CPU" + (f" ({tp} ranks, per rank)" if tp > 1 else "")
    if tp == 1:
        return ranks[0].label(node)
    indices = ", ".join(d.device.removeprefix("gpu") for d in ranks)
    return f"{node} GPUs {indices} (tensor parallel {tp}, per rank)"
