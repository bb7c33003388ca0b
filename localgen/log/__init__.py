"""The log of every `run` and `chat` exchange (log/store.py)."""
