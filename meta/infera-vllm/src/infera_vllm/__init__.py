"""Infera's vLLM general plugin. Import-light on purpose: see ``infera_vllm.plugin``."""

from infera_vllm.version import __version__

__all__ = ["__version__"]
