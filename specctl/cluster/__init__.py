"""Bringing Ray nodes up and down: on this machine, or through each node's specd."""
