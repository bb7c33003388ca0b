"""localgen: chat with and generate from local GGUF models, quietly and scriptably."""

__version__ = "0.1.0"
