"""Shards: the verifier and the drafter as Ray actors on their nodes.

The classes here are plain Python; the control plane wraps them with `ray.remote` and places
them by node label (`specctl/deploy/`). They never import the control plane.
"""
