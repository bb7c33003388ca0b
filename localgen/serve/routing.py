"""A route that takes several methods, each handed to its own handler; and the other paths (llama-server's) that
reach a route."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


def by_method(path: str, **handlers: Callable[[Request], Awaitable[Response]]) -> Route:
    """One route for `path` that hands each method to its handler: one route, not one per method, so that a
    method it does not take gets a 405 whose `Allow` names every method it does take (Starlette's 405 names only
    the first route that matched the path)."""

    async def endpoint(request: Request) -> Response:
        # Starlette lets HEAD through wherever GET is taken
        return await (handlers.get(request.method) or handlers["GET"])(request)

    return Route(path, endpoint, methods=list(handlers))


# llama-server's other spellings of its OpenAI-compatible routes (tools/server/server.cpp's table), each taken
# here by the route it names: a client whose base URL has no /v1 reaches every route, not only some. (llama-server
# answers /completions and /embeddings in its own older shape; here they answer as their /v1 routes do, in the
# shape OpenAI's clients, the ones that leave out /v1, read.)
ALIASES = {"/models": "/v1/models", "/chat/completions": "/v1/chat/completions", "/completions": "/v1/completions",
           "/embeddings": "/v1/embeddings", "/reranking": "/v1/rerank", "/v1/reranking": "/v1/rerank",
           "/responses": "/v1/responses", "/audio/transcriptions": "/v1/audio/transcriptions",
           "/v1/health": "/health"}


class Alias(Route):
    """Another path (ALIASES) of a route: its endpoint for its methods, and `meant`, the route's own path (what
    the metrics and the access line name the request by)."""

    def __init__(self, path: str, route: Route) -> None:
        super().__init__(path, route.endpoint, methods=sorted(route.methods or ()))
        self.meant = route.path


def aliased(routes: list[Route]) -> list[Route]:
    """The routes, then each alias (ALIASES) of one of them."""
    by_path = {r.path: r for r in routes}
    return [*routes, *(Alias(alias, by_path[meant]) for alias, meant in ALIASES.items()
                       if meant in by_path and alias not in by_path)]


def aliases_of(paths: tuple[str, ...]) -> tuple[str, ...]:
    """The aliases of these paths (a policy's paths that are open, or whose bodies the route reads itself)."""
    return tuple(alias for alias, meant in ALIASES.items() if meant in paths)
