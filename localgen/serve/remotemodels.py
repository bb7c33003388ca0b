"""serve --endpoint's remote models by the names a client gives them, and each one's lanes: which endpoint and
which of its server's models a request's `model` means (LABEL/ID, or the bare ID where that means no other
model), how many of its requests go at once and how many wait (Lane: --parallel and --max-queue, as a local
model's slots), what the other APIs answer a remote model (`refusal`), and what /v1/models and /metrics list.
serve/upstream.py's Upstreams sends the requests on."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from localgen.serve.apierror import HTTPError
from localgen.serve.remotes import Remote

# the routes a remote model answers at, and what each appends to the endpoint's base URL
ROUTES = {"/v1/chat/completions": "/chat/completions", "/v1/completions": "/completions",
          "/v1/embeddings": "/embeddings"}


@dataclass
class Lane:
    """One remote model's requests: `parallel` sent at once, `queue` more waiting, the rest refused (503), as a
    local model's slots and --max-queue."""

    parallel: int
    queue: int
    outstanding: int = 0  # sent or waiting
    entered: int = 0  # every request that took a place in line, ever (the Batch API waits for its own to)
    _free: asyncio.Semaphore | None = None

    async def enter(self, name: str) -> None:
        """A place for one request (waiting while `parallel` are sent), or a 503 when the queue is full."""
        if self.outstanding >= self.parallel + self.queue:
            raise HTTPError(503, f"{name}: {self.outstanding} requests are sent or waiting already (serve "
                                 f"--parallel {self.parallel}, --max-queue {self.queue}): try again shortly",
                            "server_error")
        self.outstanding += 1
        self.entered += 1
        if self._free is None:
            self._free = asyncio.Semaphore(self.parallel)
        try:
            await self._free.acquire()
        except BaseException:
            self.outstanding -= 1
            raise

    def leave(self) -> None:
        """The request's answer has ended (or never began)."""
        assert self._free is not None
        self._free.release()
        self.outstanding -= 1


@dataclass
class RemoteModels:
    """The remote models by name, and their lanes. Every remote model answers to `LABEL/ID` (its endpoint's label,
    its server's id), and to its bare `ID` too where that means no other model: not one this server runs, not one
    another endpoint serves."""

    remotes: list[Remote]
    parallel: int = 4
    queue: int = 64
    by_name: dict[str, Remote] = field(init=False)  # every name a remote model answers to
    real: dict[str, str] = field(init=False)  # each of those names: the model's id on its server
    lanes: dict[str, Lane] = field(init=False)  # by LABEL/ID: a model's two names share its lanes

    def __post_init__(self) -> None:
        self.by_name, self.real, self.lanes = {}, {}, {}
        ids = [ident for remote in self.remotes for ident in remote.models]
        for remote in self.remotes:
            for ident in remote.models:
                qualified = f"{remote.label}/{ident}"
                for name in (qualified, ident) if ids.count(ident) == 1 else (qualified,):
                    self.by_name[name], self.real[name] = remote, ident
                self.lanes[qualified] = Lane(self.parallel, self.queue)

    def find(self, name: object) -> Remote | None:
        """The endpoint serving this model name, if a remote one."""
        return self.by_name.get(name) if isinstance(name, str) else None

    def lane_of(self, name: object) -> Lane | None:
        """The lanes of the remote model by this name (None for a local one)."""
        remote = self.find(name)
        return None if remote is None else self.lanes[f"{remote.label}/{self.real[str(name)]}"]

    def waiting(self) -> bool:
        """Whether a request waits for a place in a remote model's lanes."""
        return any(lane.outstanding > lane.parallel for lane in self.lanes.values())

    def refusal(self, name: object) -> HTTPError | None:
        """For a route that cannot send a request on: the 400 a remote model gets there (None for a local one)."""
        remote = self.find(name)
        if remote is None:
            return None
        return HTTPError(400, f"the model {name!r} runs on {remote.label} (serve --endpoint): only "
                              f"{', '.join(ROUTES)} reach it through this server", param="model")

    def check_names(self, local: list[str]) -> list[str]:
        """The bare names that are also this server's models (a -m model, or one on disk offered on demand) are
        left to those; their remote models keep their LABEL/ID. Returns the names so left."""
        shadowed = [n for n in local if self.real.get(n) == n]  # a bare id (a LABEL/ID is never its own id)
        for name in shadowed:
            del self.by_name[name], self.real[name]
        return shadowed

    def names_of(self, remote: Remote) -> list[str]:
        """A remote's models as a client names them: the bare id where it is served so, else LABEL/ID."""
        return [self._listed(remote, ident) for ident in remote.models]

    def shown(self, name: str) -> str:
        """The name /v1/models lists a remote model by (a model's two names are one in the log and /metrics)."""
        return self._listed(self.by_name[name], self.real[name])

    def _listed(self, remote: Remote, ident: str) -> str:
        return ident if self.by_name.get(ident) is remote else f"{remote.label}/{ident}"

    def lines(self) -> list[tuple[str, int, int]]:
        """Each remote model's requests now, by its listed name: those sent on and those waiting (/metrics)."""
        out = []
        for remote in self.remotes:
            for ident in remote.models:
                lane = self.lanes[f"{remote.label}/{ident}"]
                sent = min(lane.outstanding, lane.parallel)
                out.append((self._listed(remote, ident), sent, lane.outstanding - sent))
        return out

    def listing(self) -> list[tuple[str, Remote]]:
        """Every remote model, once, by the name names_of gives it, and its endpoint, in the order given."""
        return [(name, remote) for remote in self.remotes for name in self.names_of(remote)]
