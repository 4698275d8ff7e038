"""A node's memory as its cgroup allows it, and a KV cache refused, with a message, where it
would not fit: for the specd inventory (the planner's figures) and the shard's load."""

import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from daemon.cgroup_memory import CgroupMemory, cgroup_memory, memory_bytes, memory_cgroup
from daemon.runtime.errors import ModelLoadError
from daemon.runtime.model.kv_cache import KVCache
from daemon.runtime.model.load_ledger import LEDGER_ENV
from daemon.runtime.model.memory_guard import require_room

MIB = 1 << 20
REPO = Path(__file__).resolve().parents[2]


def _tree(
    tmp_path: Path, version: int, levels: dict[str, tuple[str, int, str]], mount_root: str = "/"
) -> Path:
    """A cgroup hierarchy mounted at tmp_path/mnt, the process in mnt/a/b: per level (relative
    to the mount) its limit, usage and memory.stat; /proc/self/cgroup and mountinfo as the
    kernel writes them, beside it."""
    mount = tmp_path / "mnt"
    leaf = mount / "a" / "b"
    leaf.mkdir(parents=True)
    limit_file, usage_file = (
        ("memory.limit_in_bytes", "memory.usage_in_bytes")
        if version == 1
        else ("memory.max", "memory.current")
    )
    for relative, (limit, usage, stat) in levels.items():
        (mount / relative / limit_file).write_text(limit + "\n")
        (mount / relative / usage_file).write_text(f"{usage}\n")
        (mount / relative / "memory.stat").write_text(stat)
    where = "/a/b" if mount_root == "/" else mount_root + "/a/b"
    if version == 1:
        membership = f"12:pids:{where}\n4:cpu,cpuacct:{where}\n7:memory:{where}\n0::/\n"
        kind = "cgroup cgroup rw,memory"
    else:
        membership = f"0::{where}\n"
        kind = "cgroup2 cgroup2 rw"
    (tmp_path / "cgroup").write_text(membership)
    (tmp_path / "mountinfo").write_text(
        "22 27 0:21 / /proc rw,relatime - proc proc rw\n"
        f"40 31 0:30 {mount_root} {mount} rw,relatime shared:9 - {kind}\n"
    )
    return leaf


def _read(tmp_path: Path) -> CgroupMemory | None:
    return cgroup_memory(tmp_path / "cgroup", tmp_path / "mountinfo")


def test_v2_the_tightest_limit_and_the_least_room_up_the_tree(tmp_path: Path) -> None:
    # b: no limit of its own; a: 512 MiB, of which a sibling of b uses most
    stat = "anon 100\nfile 5000\nactive_file 1000\ninactive_file 4000\nfile_mapped 500\n"
    leaf = _tree(
        tmp_path,
        2,
        {"a/b": ("max", 10_000, stat), "a": (str(512 * MIB), 500 * MIB, "inactive_file 0\n")},
    )
    found = _read(tmp_path)
    assert found is not None and found.path == leaf
    assert found.limit_bytes == 512 * MIB  # the parent's: the leaf's own is "max"
    assert found.room_bytes == 12 * MIB  # the parent's room: its children use 500 MiB
    # the leaf limited too: its file pages not mapped (1000 + 4000 - 500) are room
    _tree(tmp_path / "leaf", 2, {"a/b": (str(MIB), 10_000, stat)})
    found = _read(tmp_path / "leaf")
    assert found is not None and found.room_bytes == MIB - (10_000 - 4500)


def test_v1_memory_controller_among_others_and_its_hierarchical_limit(tmp_path: Path) -> None:
    stat = "cache 100\ntotal_inactive_file 300\ntotal_active_file 0\ninactive_file 1\n"
    leaf_stat = stat + f"hierarchical_memory_limit {256 * MIB}\n"
    unlimited = "9223372036854771712"
    leaf = _tree(tmp_path, 1, {"a/b": (unlimited, 1000, leaf_stat), "a": (unlimited, 0, "")})
    found = _read(tmp_path)
    assert found is not None and found.path == leaf
    assert (found.limit_bytes, found.room_bytes) == (256 * MIB, 256 * MIB - 700)


def test_no_limit_anywhere_is_none(tmp_path: Path) -> None:
    unlimited = "9223372036854771712"
    _tree(tmp_path, 1, {"a/b": (unlimited, 5, ""), "a": (unlimited, 5, "")})
    assert _read(tmp_path) is None
    _tree(tmp_path / "v2", 2, {"a/b": ("max", 5, "")})
    assert _read(tmp_path / "v2") is None


def test_a_namespaced_mount_shows_the_cgroup_at_its_root(tmp_path: Path) -> None:
    """In a container with its own cgroup namespace the mount's root is the container's
    cgroup, and /proc/self/cgroup may name a path that does not exist below the mount."""
    mount = tmp_path / "mnt"
    mount.mkdir()
    (mount / "memory.max").write_text(f"{64 * MIB}\n")
    (mount / "memory.current").write_text(f"{MIB}\n")
    (tmp_path / "cgroup").write_text("0::/docker/abc\n")
    (tmp_path / "mountinfo").write_text(
        f"40 31 0:30 /docker/abc {mount} rw,relatime - cgroup2 cgroup2 rw\n"
    )
    found = _read(tmp_path)
    assert found is not None and found.path == mount
    assert (found.limit_bytes, found.room_bytes) == (64 * MIB, 63 * MIB)
    (tmp_path / "cgroup").write_text("0::/\n")  # the namespace's own view of itself
    assert _read(tmp_path) == found
    (tmp_path / "cgroup").write_text("0::/docker/abcdef\n")  # not below /docker/abc
    assert _read(tmp_path) == found


def test_the_mount_whose_root_holds_the_cgroup_most_closely(tmp_path: Path) -> None:
    """A bind mount of another subtree listed first, and a mount point with a space in it
    (mountinfo writes it \\040)."""
    other, mount = tmp_path / "other", tmp_path / "cg root"
    (other / "x").mkdir(parents=True)
    (other / "memory.max").write_text(f"{MIB}\n")
    (mount / "a" / "b").mkdir(parents=True)
    (mount / "a" / "b" / "memory.max").write_text(f"{128 * MIB}\n")
    (mount / "a" / "b" / "memory.current").write_text("0\n")
    (tmp_path / "cgroup").write_text("0::/a/b\n")
    escaped = str(mount).replace(" ", "\\040")
    (tmp_path / "mountinfo").write_text(
        f"40 31 0:30 /x {other} rw - cgroup2 cgroup2 rw\n"
        f"41 31 0:30 / {escaped} rw - cgroup2 cgroup2 rw\n"
    )
    found = _read(tmp_path)
    assert found is not None and found.path == mount / "a" / "b"
    assert found.limit_bytes == 128 * MIB


def test_unreadable_proc_files_are_no_limit(tmp_path: Path) -> None:
    assert cgroup_memory(tmp_path / "absent", tmp_path / "absent too") is None
    (tmp_path / "cgroup").write_text("0::/\n")
    (tmp_path / "mountinfo").write_text("22 27 0:21 / /proc rw,relatime - proc proc rw\n")
    assert _read(tmp_path) is None


def test_memory_bytes_never_exceeds_the_machine() -> None:
    total, available = memory_bytes()
    assert 0 < available <= total


def test_a_kv_cache_past_the_free_memory_is_refused_before_it_is_allocated() -> None:
    """Far past any machine's memory (an allocator refuses it at once, without the check);
    just past the free memory is test_in_a_cgroup_limited_below_the_machine's case."""
    slots = 1 << 28  # [slots, 8 heads, 1024 positions, 64 dims] float32 x 2 (K, V): 1 PiB
    with pytest.raises(ModelLoadError) as error:
        KVCache(
            num_layers=1,
            num_slots=slots,
            num_kv_heads=8,
            max_model_len=1024,
            head_dim=64,
            dtype=torch.float32,
            device=torch.device("cpu"),
        )
    said = str(error.value)
    assert f"the KV cache ({slots} slots x 1024 positions x 1 layers, float32) needs" in said
    assert "lower max_batch_size or max_model_len" in said
    small = KVCache(
        num_layers=2, num_slots=2, num_kv_heads=2, max_model_len=16, head_dim=8,
        dtype=torch.float32, device=torch.device("cpu"),
    )  # fmt: skip
    assert small.keys[0].shape == (2, 2, 16, 8)


def test_require_room_names_the_device_and_sizes() -> None:
    require_room(1, torch.device("cpu"), "one byte", "none")  # fits: nothing said
    with pytest.raises(ModelLoadError, match=r"^weights needs \d+\.\d\d GiB and this node's"):
        require_room(1 << 62, torch.device("cpu"), "weights", "buy memory")
    require_room(1 << 62, torch.device("meta"), "anything", "")  # not known: not refused


@contextlib.contextmanager
def _child_cgroup(limit_bytes: int) -> Iterator[Path]:
    """A memory cgroup below this process's with `limit_bytes`; skips where none can be made
    (not root, no memory controller, a read-only cgroupfs)."""
    located = memory_cgroup()
    if located is None:
        pytest.skip("no memory cgroup mounted")
    parent, _, version = located
    child = parent / f"specctl-test-{uuid.uuid4().hex[:8]}"
    try:
        child.mkdir()
        limit_file = "memory.limit_in_bytes" if version == 1 else "memory.max"
        (child / limit_file).write_text(str(limit_bytes))
    except OSError as exc:
        with contextlib.suppress(OSError):
            child.rmdir()
        pytest.skip(f"cannot make a memory cgroup here: {exc}")
    try:
        yield child
    finally:
        child.rmdir()  # its processes have exited: an error here is a leak worth seeing


CHILD = """
import json, sys, torch
from daemon.specd.host_info import collect_host_info
from daemon.runtime.errors import ModelLoadError
from daemon.runtime.model.config import ModelConfig
from daemon.runtime.model.kv_cache import KVCache
from daemon.runtime.model.load_ledger import LEDGER_ENV
from daemon.runtime.model.llama import LlamaForCausalLM
host = collect_host_info()
said = []
try:  # 16 slots x 8 heads x 2048 positions x 64 dims x 4 bytes: 64 MiB, x 2 (K, V) x 4 layers
    KVCache(num_layers=4, num_slots=16, num_kv_heads=8, max_model_len=2048, head_dim=64,
            dtype=torch.float32, device=torch.device("cpu"))
    said.append(None)
except ModelLoadError as exc:
    said.append(str(exc))
raw = dict(architectures=["LlamaForCausalLM"], hidden_size=2048, intermediate_size=64,
           num_hidden_layers=1, num_attention_heads=16, num_key_value_heads=1, head_dim=128,
           vocab_size=32000, max_position_embeddings=64, rms_norm_eps=1e-5,
           tie_word_embeddings=True)
try:  # a KV cache of 64 KiB, weights of 0.28 GiB (on the meta device: never allocated)
    LlamaForCausalLM(ModelConfig.from_dict(raw, source="big"), max_model_len=64, num_slots=1,
                     dtype=torch.float32, device=torch.device("cpu"))
    said.append(None)
except ModelLoadError as exc:
    said.append(str(exc))
print(json.dumps([host.memory_total_bytes, host.memory_available_bytes, said]))
"""


def test_in_a_cgroup_limited_below_the_machine() -> None:
    """A real cgroup of 400 MiB: specd's inventory reports it, not the machine's memory, and a
    KV cache of 512 MiB is refused at once instead of the kernel killing the process."""
    limit = 400 * MIB
    with _child_cgroup(limit) as child:
        enter = f"echo $$ > {child}/cgroup.procs && exec {sys.executable} -c '{CHILD}'"
        done = subprocess.run(
            ["sh", "-c", enter],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    total, available, (cache, model) = json.loads(done.stdout.strip().splitlines()[-1])
    assert total == limit
    assert 0 < available < limit  # the interpreter and torch are charged to it
    assert cache is not None, "the KV cache of 0.5 GiB was allocated"
    assert cache.startswith("the KV cache (16 slots x 2048 positions x 4 layers, float32) ")
    assert "needs 0.50 GiB and this node's memory (its cgroup's limit: 0.39 GiB) has 0." in cache
    assert cache.endswith("GiB kept free: lower max_batch_size or max_model_len"), cache
    assert model is not None, "a model of 0.28 GiB of weights was let load"
    assert model.startswith("the weights (0.28 GiB) with the KV cache (1 slots x 64 positions")
    assert model.endswith("or spread the model over more nodes"), model


TWO_LOADS = """
import json, sys, time, torch
from pathlib import Path
from daemon.cgroup_memory import cgroup_memory
from daemon.runtime.errors import ModelLoadError
from daemon.runtime.model.kv_cache import KVCache
from daemon.runtime.model.memory_guard import loading
up, go = Path(sys.argv[1]), Path(sys.argv[2])
print("up", flush=True)  # torch imported
while not up.exists():
    time.sleep(0.01)
print(cgroup_memory().room_bytes, flush=True)  # both up: the room they share
while not go.exists() or not go.read_text():
    time.sleep(0.01)
layers = int(go.read_text())  # K and V of [4 slots, 8 heads, 1024, 64] float32: 16 MiB each
try:
    with loading():
        cache = KVCache(num_layers=layers, num_slots=4, num_kv_heads=8, max_model_len=1024,
                        head_dim=64, dtype=torch.float32, device=torch.device("cpu"))
        time.sleep(1.0)  # the weights being read
    said = None
except ModelLoadError as exc:
    said = str(exc)
print(json.dumps(said), flush=True)
time.sleep(1.0)  # serving: the memory stays in use
"""


def test_two_loads_at_once_in_a_cgroup_that_holds_one(tmp_path: Path) -> None:
    """Two shards load at the same moment in one cgroup of 900 MiB, each wanting 0.6 of the
    room left once both are up: both would pass a check of the free memory alone, and the
    kernel would kill one part-way (-9). One waits for the other's load, then is refused with
    a message."""
    up, go = tmp_path / "up", tmp_path / "go"
    with _child_cgroup(900 * MIB) as child:
        run = f"exec {sys.executable} -c '{TWO_LOADS}' {up} {go}"
        enter = f"echo $$ > {child}/cgroup.procs && {run}"
        loads = [
            subprocess.Popen(
                ["sh", "-c", enter],
                cwd=REPO,
                env={**os.environ, "PYTHONPATH": str(REPO), LEDGER_ENV: str(tmp_path / "ledger")},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        try:
            outs = [load.stdout for load in loads if load.stdout is not None]
            assert [out.readline().strip() for out in outs] == ["up", "up"]
            up.touch()
            room = min(int(out.readline()) for out in outs)
            go.write_text(str(int(0.6 * room) // (16 * MIB)))
            done = [load.communicate(timeout=120) for load in loads]
        finally:
            for load in loads:
                load.kill()
                load.wait(timeout=30)
    assert [load.returncode for load in loads] == [0, 0], [err[-2000:] for _, err in done]
    said = sorted((json.loads(out.strip().splitlines()[-1]) for out, _ in done), key=str)
    assert said[0] is None, said  # "None" sorts before "the KV cache"
    assert said[1] is not None and said[1].startswith("the KV cache (4 slots x 1024 positions")
    assert "this node's memory (its cgroup's limit: 0.88 GiB)" in said[1]
