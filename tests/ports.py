"""Loopback ports for the servers tests start: the product's picker (specctl/cluster/ports.py),
which takes them from below the kernel's ephemeral range and never hands one out twice."""

from specctl.cluster.ports import free_port as free_port
