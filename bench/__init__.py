"""Benchmarks: specctl's engine side by side with target-only decoding and peer engines."""
