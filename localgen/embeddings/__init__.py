"""Collections of embeddings (embeddings/store.py)."""
