"""The automatic pipeline split: layers per stage in proportion to the memory each stage has
left for layers, every stage at least one layer, no stage past what it can hold while another
still has room."""


def split_layers(num_layers: int, room_bytes: list[int], layer_bytes: list[int]) -> list[int]:
    """Layer counts per stage, summing to `num_layers`.

    `room_bytes[i]` is what stage i has left after its fixed costs (embedding or LM head,
    activations, runtime; may be negative), `layer_bytes[i]` what one layer costs it. Layers
    go one at a time to the stage furthest below its proportional share (largest remainder),
    among the stages that can still hold one more; when none can, among all (the plan then
    reports which stage does not fit).
    """
    num_stages = len(room_bytes)
    if num_stages == 0 or num_layers < num_stages:
        raise ValueError(f"cannot split {num_layers} layers into {num_stages} stages")
    weights = [max(room, 0) for room in room_bytes]
    total_weight = sum(weights)
    if total_weight == 0:
        weights, total_weight = [1] * num_stages, num_stages
    share = [num_layers * weight / total_weight for weight in weights]
    capacity = [
        max(room, 0) // max(cost, 1) for room, cost in zip(room_bytes, layer_bytes, strict=True)
    ]
    counts = [1] * num_stages
    for _ in range(num_layers - num_stages):
        open_stages = [i for i in range(num_stages) if counts[i] < capacity[i]]
        candidates = open_stages or list(range(num_stages))
        best = max(candidates, key=lambda i: (share[i] - counts[i], weights[i], -i))
        counts[best] += 1
    return counts
