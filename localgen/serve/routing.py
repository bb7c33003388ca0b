"""A route that takes several methods, each handed to its own handler."""

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
