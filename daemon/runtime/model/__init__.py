"""Model execution: the lean Llama-family runner, the transformers fallback, and their contract."""

from daemon.runtime.model.batch import ForwardBatch, LogitsMode
from daemon.runtime.model.config import ModelConfig
from daemon.runtime.model.loader import load_model
from daemon.runtime.model.protocol import CausalLM

__all__ = ["CausalLM", "ForwardBatch", "LogitsMode", "ModelConfig", "load_model"]
