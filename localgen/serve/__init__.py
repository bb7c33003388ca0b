"""localgen serve: OpenAI- and Ollama-compatible HTTP APIs on the continuous-batching engine."""
