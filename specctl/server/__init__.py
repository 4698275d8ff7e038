"""The serving process: the OpenAI-compatible endpoint over an engine backend."""
