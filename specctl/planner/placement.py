"""make_plan: place every shard, check its memory, and say why in words.

Per replica, the drafter goes first (its node is fixed by the file), then the verifier's
pipeline stages, whose automatic split sees what the drafter left. Every rank is charged to a
memory pool (a GPU, or a machine's memory on CPU); a shard fits when each of its ranks fits in
what its pool had left.
"""

from collections import Counter
from dataclasses import replace

from specctl.config.cluster import ClusterConfig
from specctl.planner.devices import Device, DevicePool
from specctl.planner.facts import NodeFacts
from specctl.planner.hints import fit_hints
from specctl.planner.memory import (
    ShardLayout,
    fixed_bytes_per_rank,
    layer_bytes_per_rank,
    memory_per_rank,
)
from specctl.planner.plan import (
    MemoryPerRank,
    Plan,
    Role,
    ShardPlan,
    SpeculationPlan,
    Verdict,
)
from specctl.planner.split import split_layers
from specctl.planner.wording import (
    endpoint_line,
    endpoint_url,
    memory_sum,
    node_line,
    params,
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
        self._explain_models()
        for replica in range(self.config.deployment.replicas):
            if not self.drafter.is_ngram:
                self._place_drafter(replica)
            self._place_verifier(replica)
        self.explanation.append(self._relation_line())
        self.explanation.append(speculation_line(self.config))
        self.explanation.append(endpoint_line(self.config))
        self._warn_free_now()
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
        self._place(f"r{replica}/drafter", "drafter", replica, label, self.drafter.node, layout)

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
            self._place(shard_id, "verifier", replica, label, node, stage_layout, stage, start)
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

    def _place(
        self,
        shard_id: str,
        role: Role,
        replica: int,
        label: str,
        node: str,
        layout: ShardLayout,
        stage: int = 0,
        layer_start: int = 0,
    ) -> None:
        tp = layout.tensor_parallel_size
        model = self.drafter.model if role == "drafter" else self.verifier.model
        ranks = self.pool.choose(node, tp)
        layout = replace(layout, on_gpu=bool(ranks) and ranks[0].is_gpu)
        need = memory_per_rank(layout)
        per_device = Counter(id(device) for device in ranks)
        devices = {id(device): device for device in ranks}
        free = self._free_per_rank(ranks, per_device)
        where = _where(node, ranks, tp)
        verdict = self._verdict(label, node, ranks, tp, need.total_bytes, free, where, layout)
        for key, num_ranks in per_device.items():
            devices[key].charge(shard_id, need.total_bytes * num_ranks)
        self.labels[shard_id] = _the(label)
        outcome = {
            "fits": f"fits ({size((free or 0) - need.total_bytes)} to spare)",
            "does_not_fit": f"does not fit (short by {size(need.total_bytes - (free or 0))})",
            "unknown": "fit unknown",
        }[verdict]
        self.explanation.append(
            f"{label} on {where}: {memory_sum(need, self.batch, self.context)} of "
            f"{size(free)} free — {outcome}"
        )
        self.shards.append(
            ShardPlan(
                id=shard_id,
                replica=replica,
                role=role,
                model=model,
                model_path=str(self.config.model_dir(model)),
                dtype=layout.dtype,
                node=node,
                device="cuda" if layout.on_gpu else "cpu",
                gpu_indices=[int(d.device.removeprefix("gpu")) for d in ranks if d.is_gpu],
                tensor_parallel_size=tp,
                stage=stage,
                num_stages=len(self.verifier.nodes) if role == "verifier" else 1,
                layer_start=layer_start,
                layer_end=layer_start + layout.num_layers,
                has_embedding=layout.has_embedding,
                has_lm_head=layout.has_lm_head or layout.samples,
                max_batch_size=self.batch,
                max_model_len=self.context,
                memory_per_rank=MemoryPerRank(
                    weights_bytes=need.weights_bytes,
                    kv_cache_bytes=need.kv_cache_bytes,
                    activation_bytes=need.activation_bytes,
                    runtime_bytes=need.runtime_bytes,
                    total_bytes=need.total_bytes,
                ),
                free_bytes=free,
                verdict=verdict,
            )
        )

    def _verdict(
        self,
        label: str,
        node: str,
        ranks: list[Device],
        tp: int,
        need_bytes: int,
        free: int | None,
        where: str,
        layout: ShardLayout,
    ) -> Verdict:
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

    def _explain_models(self) -> None:
        roles = [("verifier", self.verifier.model)]
        if not self.drafter.is_ngram:
            roles.append(("drafter", self.drafter.model))
        for role, name in roles:
            shape = self.config.shape(name)
            dtype = shape.resolve_dtype(self.config.model(name).dtype)
            self.explanation.append(
                f"{role} {name}: {params(shape.num_params)} parameters ({shape.architecture}, "
                f"{shape.num_layers} layers, {shape.num_attention_heads} heads, "
                f"{shape.num_kv_heads} KV heads) in {dtype}; context {self.context} tokens"
            )

    def _relation_line(self) -> str:
        verifier_nodes = self.verifier.nodes
        last = verifier_nodes[-1]
        if self.drafter.is_ngram:
            return (
                f"drafter: n-gram prompt lookup inside the verifier's last stage on {last}: "
                "no model, no memory"
            )
        node = self.drafter.node or ""
        if node in verifier_nodes:
            return (
                f"drafter and verifier share {node}: allowed, but they compete for its memory "
                "(counted together above) and its compute, so overlapped drafting hides less"
            )
        drafter_devices = self.pool.of_node(node) or []
        machines = {d.machine for d in drafter_devices}
        shared = [
            n for n in verifier_nodes if machines & {d.machine for d in self.pool.of_node(n) or []}
        ]
        if shared:
            return (
                f"drafter on {node}, verifier on {', '.join(verifier_nodes)}: separate Ray nodes, "
                f"but {node} and {', '.join(shared)} are one machine, so they share its memory "
                "(counted together above)"
            )
        return (
            f"drafter on {node}, verifier on {', '.join(verifier_nodes)}: different machines; "
            "each round carries only token ids and sparse draft probabilities between them"
        )

    def _warn_free_now(self) -> None:
        for device in self.pool.devices():
            if device.free_now_bytes is not None and device.planned_bytes > device.free_now_bytes:
                self.warnings.append(
                    f"{device.label(device.nodes[0])}: the plan needs {size(device.planned_bytes)} "
                    f"there, {size(device.free_now_bytes)} is free now (other processes hold the "
                    "rest); loading may fail until they exit"
                )

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
