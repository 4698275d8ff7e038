"""The plan's sentences about the whole deployment: the models, how drafter and verifier sit
relative to each other, and memory that is busy right now."""

from specctl.config.cluster import ClusterConfig
from specctl.planner.devices import DevicePool
from specctl.planner.wording import params, size


def model_lines(config: ClusterConfig, context: int) -> list[str]:
    deployment = config.deployment
    roles = [("verifier", deployment.verifier.model)]
    if not deployment.drafter.is_ngram:
        roles.append(("drafter", deployment.drafter.model))
    lines = []
    for role, name in roles:
        shape = config.shape(name)
        dtype = shape.resolve_dtype(config.model(name).dtype)
        lines.append(
            f"{role} {name}: {params(shape.num_params)} parameters ({shape.architecture}, "
            f"{shape.num_layers} layers, {shape.num_attention_heads} heads, "
            f"{shape.num_kv_heads} KV heads) in {dtype}; context {context} tokens"
        )
    return lines


def relation_line(config: ClusterConfig, pool: DevicePool) -> str:
    verifier_nodes = config.deployment.verifier.nodes
    drafter = config.deployment.drafter
    if drafter.is_ngram:
        return (
            f"drafter: n-gram prompt lookup inside the verifier's last stage on "
            f"{verifier_nodes[-1]}: no model, no memory"
        )
    node = drafter.node or ""
    if node in verifier_nodes:
        return (
            f"drafter and verifier share {node}: allowed, but they compete for its memory "
            "(counted together above) and its compute, so overlapped drafting hides less"
        )
    machines = {device.machine for device in pool.of_node(node) or []}
    shared = [
        other
        for other in verifier_nodes
        if machines & {device.machine for device in pool.of_node(other) or []}
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


def free_now_warnings(pool: DevicePool) -> list[str]:
    warnings = []
    for device in pool.devices():
        if device.free_now_bytes is not None and device.planned_bytes > device.free_now_bytes:
            warnings.append(
                f"{device.label(device.nodes[0])}: the plan needs {size(device.planned_bytes)} "
                f"there, {size(device.free_now_bytes)} is free now (other processes hold the "
                "rest); loading may fail until they exit"
            )
    return warnings
