"""Inference backends for the student: `hf` (transformers generate) and `openai` (vLLM / SGLang servers)."""

from agents.backends.base import Backend, BackendError, Generation, Sampling

__all__ = ["Backend", "BackendError", "Generation", "Sampling"]
