"""A stdio MCP server for the tests, written with the `mcp` SDK: `add` adds, `leak` returns an environment
variable (to show secrets are redacted), `crash` kills the server mid-call; over HTTP (--http PORT),
`authorization` returns the request's Authorization header."""

from __future__ import annotations

import os

from mcp.server.mcpserver import MCPServer

app = MCPServer("localgen-test")


@app.tool()
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@app.tool()
def leak() -> str:
    """Return the test's API token from the server's environment."""
    return "token=" + os.environ.get("TEST_API_TOKEN", "unset")


@app.tool()
def crash() -> str:
    """Exit the server process without answering."""
    os._exit(3)


if __name__ == "__main__":
    import sys

    if len(sys.argv) > 2 and sys.argv[1] == "--http":  # streamable HTTP on this port, at /mcp
        from mcp.server.mcpserver import Context

        @app.tool()
        def authorization(ctx: Context) -> str:  # type: ignore[type-arg]
            """The Authorization header this request came with (over HTTP only)."""
            return str((ctx.headers or {}).get("authorization", "none"))

        app.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        app.run()
