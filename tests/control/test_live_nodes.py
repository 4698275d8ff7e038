"""Counting each listed node's live Ray nodes, as ray.nodes() gives them."""

from daemon.shard.node_context import NODE_LABEL
from specctl.deploy.live_nodes import live_node_counts


def test_a_node_listed_twice_alive_counts_twice_and_dead_ones_not_at_all() -> None:
    nodes = [
        {"Alive": True, "Labels": {NODE_LABEL: "a"}},
        {"Alive": True, "Labels": {NODE_LABEL: "b"}},
        {"Alive": True, "Labels": {NODE_LABEL: "b"}},  # restarted, its old self not yet dead
        {"Alive": False, "Labels": {NODE_LABEL: "c"}},
        {"Alive": True, "Labels": {NODE_LABEL: "other-deployment"}},
        {"Alive": True},  # no labels at all
    ]
    assert live_node_counts(nodes, ["a", "b", "c"]) == {"a": 1, "b": 2, "c": 0}
