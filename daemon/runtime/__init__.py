"""Shard runtime: lean model runner, KV cache, samplers, proposers, the speculative engine."""
