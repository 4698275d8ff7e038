"""The plan's sentences: sizes, node facts, one line per shard, speculation, endpoint."""

from specctl.config.cluster import ClusterConfig
from specctl.planner.devices import Device
from specctl.planner.facts import NodeFacts
from specctl.planner.memory import MemoryNeed

GIB = 2**30
MIB = 2**20


def size(num_bytes: int | None) -> str:
    """1.5 GiB, 21.0 MiB, 512 KiB; "unknown" for None."""
    if num_bytes is None:
        return "unknown"
    if abs(num_bytes) >= GIB:
        return f"{num_bytes / GIB:.1f} GiB"
    if abs(num_bytes) >= MIB:
        return f"{num_bytes / MIB:.1f} MiB"
    return f"{num_bytes / 1024:.0f} KiB"


def params(count: int) -> str:
    if count >= 10**9:
        return f"{count / 10**9:.1f}B"
    return f"{count / 10**6:.1f}M" if count >= 10**6 else f"{count / 10**3:.0f}K"


def node_line(facts: NodeFacts, devices: list[Device] | None, utilization: float) -> str:
    where = {
        "local": "this machine (local Ray node)",
        "specd": f"specd at {facts.address}",
        "declared": facts.note or "declared in the cluster file",
        "unknown": facts.note or "nothing known",
    }[facts.source]
    if not devices:
        return (
            f"{facts.name}: {where}; memory unknown: declare memory_gib and gpus in the "
            "cluster file, or make its specd reachable (--probe)"
        )
    share = f"shards may use {utilization:.0%}"
    others = [n for n in devices[0].nodes if n != facts.name]
    shared = f"; same machine as {', '.join(others)}, memory shared" if others else ""
    gpus = [d for d in devices if d.is_gpu]
    if not gpus:
        cpus = f", {facts.num_cpus} CPUs" if facts.num_cpus else ""
        return (
            f"{facts.name}: {where}: no GPU, CPU memory {size(devices[0].total_bytes)}{cpus}; "
            f"{share} = {size(devices[0].budget_bytes)}{shared}"
        )
    names = sorted({d.name for d in gpus})
    kind = "unified memory" if any(d.is_unified for d in gpus) else "memory"
    each = size(gpus[0].total_bytes) + (" each" if len(gpus) > 1 else "")
    free = (
        f", {size(gpus[0].free_now_bytes)} free now" if gpus[0].free_now_bytes is not None else ""
    )
    return (
        f"{facts.name}: {where}: {len(gpus)} x {' / '.join(names)} with {each} {kind}{free}; "
        f"{share} = {size(gpus[0].budget_bytes)} per GPU{shared}"
    )


def memory_sum(need: MemoryNeed, batch: int, context: int) -> str:
    """ "16.1 GiB weights + 2.1 GiB KV cache for 16 x 4096 tokens + 1.2 GiB activations and
    runtime = 19.4 GiB"."""
    overhead = need.activation_bytes + need.runtime_bytes
    return (
        f"{size(need.weights_bytes)} weights + {size(need.kv_cache_bytes)} KV cache for "
        f"{batch} x {context} tokens + {size(overhead)} activations and runtime "
        f"= {size(need.total_bytes)}"
    )


def speculation_line(config: ClusterConfig) -> str:
    spec = config.deployment.speculation
    drafter = config.deployment.drafter
    source = "n-gram prompt lookup" if drafter.is_ngram else f"draft model {drafter.model}"
    if spec.adaptive:
        length = f"k chosen per sequence and round from measured acceptance, up to {spec.ceiling_k}"
    elif spec.ceiling_k == 0:
        return "speculation: k = 0, no drafting: the verifier decodes alone"
    else:
        length = f"k = {spec.ceiling_k} drafted tokens per round (fixed)"
    mode = (
        "overlapped: the drafter drafts round i+1 while the verifier checks round i"
        if spec.mode == "overlapped"
        else "sync: draft, then verify, one after the other"
    )
    return f"speculation: {source}, {length}; {mode}"


def endpoint_line(config: ClusterConfig) -> str:
    server = config.server
    private = server.host in ("127.0.0.1", "localhost", "::1")
    reach = "private to this machine" if private else f"reachable on {server.host}"
    key = "API key required" if server.api_key_file else "no API key"
    return (
        f"endpoint: {endpoint_url(config)} ({reach}, {key}); up to {server.max_batch_size} "
        "sequences decoded together"
    )


def endpoint_url(config: ClusterConfig) -> str:
    host = config.server.host
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{config.server.port}/v1"
