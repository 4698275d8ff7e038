"""Parallel shapes of one model: tensor parallelism across ranks of one node."""
