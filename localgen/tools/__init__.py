"""Tool calling and reasoning: tool definitions and the calls a model makes to them (spec.py), the model
families' call formats and the grammars that keep calls valid (formats.py), one stream stage that splits an
answer into content, reasoning and calls (stream.py), and the sources of tools for `run` and `chat`: Python
functions (functions.py) and MCP servers (mcp.py), with the loop that runs them (loop.py)."""
