"""Remote OpenAI-compatible endpoints behind the Backend protocol."""
