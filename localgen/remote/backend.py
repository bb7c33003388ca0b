"""Remote endpoints behind the Backend protocol (backend.py): a single stream goes to the first endpoint that
answers (one that is down is passed over, with a warning, for the next, and later streams start at the one that
answered); `run --file` spreads lines over all of them, with up to N in flight on each, and moves the lines of an
endpoint that dies to the others."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from localgen.backend import Completion, Indexed
from localgen.errors import RemoteError, UsageError
from localgen.remote.client import RemoteClient, RemoteGeneration, count, first_that_answers
from localgen.remote.endpoints import Endpoint
from localgen.types import GenerationRequest


def served_models(endpoint: Endpoint) -> list[str]:
    """The model ids an endpoint serves: from endpoints.toml, else its /models (empty when it lists none)."""
    return [m["id"] for m in _listed(endpoint)]


def _listed(endpoint: Endpoint, needed: bool = False) -> list[dict[str, Any]]:
    """The entries of an endpoint's model list (endpoints.toml's names, else its /models). `needed`: a /models
    that is not a JSON document is an error saying what came instead (a 404, a redirect, a web page)."""
    if endpoint.models:
        return [{"id": m} for m in endpoint.models]
    client = RemoteClient(endpoint, "")
    try:
        doc = client.get("/models", refused=True, needed=needed)
    finally:
        client.close()
    data = doc.get("data") if isinstance(doc, dict) else None
    return [m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)] if isinstance(data, list) else []


def check_served(endpoint: Endpoint, name: str) -> None:
    """A ModelNotFoundError where the endpoint lists its models, `name` is not among them, and it does not answer
    GET /models/NAME either (a server may take names it does not list: localgen serve's `smollm2` for
    `smollm2:135m`). An endpoint that lists nothing, or cannot be asked now, is taken at its word later."""
    from urllib.parse import quote

    from localgen.errors import LocalgenError, ModelNotFoundError

    try:
        served = served_models(endpoint)
        if not served or name in served:
            return
        if endpoint.models:  # endpoints.toml's list is the one -m may name
            known = False
        else:
            client = RemoteClient(endpoint, "")
            try:
                known = isinstance(client.get(f"/models/{quote(name, safe='')}"), dict)
            finally:
                client.close()
    except LocalgenError:
        return
    if not known:
        shown = ", ".join(served[:8]) + (f" and {len(served) - 8} more" if len(served) > 8 else "")
        raise ModelNotFoundError(f"{endpoint.label} does not serve {name!r} (it serves {shown})")


def pick_model(endpoints: list[Endpoint]) -> str:
    """The model when -m is not given: the first endpoint's only one (from endpoints.toml or its /models), or the
    one it marks as its default (localgen serve offers every model it has, its default marked). An endpoint that
    cannot be reached is passed over for the next, as a fan-out drops it."""
    gone: list[RemoteError] = []
    for ep in endpoints:
        try:
            return _picked(ep)
        except RemoteError as e:
            if not e.down:
                raise
            gone.append(e)
    if len(gone) == 1:
        raise gone[0]
    raise RemoteError(f"no endpoint could be asked for its models: {gone[0].message} (and "
                      f"{len(gone) - 1} more)", hint="name the model with -m, or check the endpoints")


def _picked(ep: Endpoint) -> str:
    if ep.models:
        return ep.models[0]
    listed = _listed(ep, needed=True)
    ids: list[str] = [m["id"] for m in listed]
    if len(ids) == 1:
        return ids[0]
    # the one it marks default: localgen serve's model for a request that names none
    chosen: list[str] = [m["id"] for m in listed if m.get("default") is True]
    if len(chosen) == 1:
        return chosen[0]
    if not ids:
        raise RemoteError(f"{ep.label} did not list its models", hint="name the model with -m")
    raise UsageError(f"{ep.label} serves {len(ids)} models: name one with -m ({', '.join(ids[:8])})")


class RemoteBackend:
    """One or more OpenAI-compatible endpoints serving `model`, behind the Backend protocol. A single
    stream goes to the first that answers; run --file spreads lines over all of them. `warn` hears of an endpoint
    a single stream passed over."""

    def __init__(self, endpoints: list[Endpoint], model: str, assumed_ctx: int | None = None,
                 warn: Callable[[str], None] | None = None) -> None:
        self.endpoints = endpoints
        self.clients = [RemoteClient(e, model) for e in endpoints]
        self.name = model
        self.defaults: dict[str, Any] = {}  # the server applies its own
        self._assumed_ctx = assumed_ctx  # --ctx: only for a server that does not report its window
        self._n_ctx: int | None = None
        self._first = 0  # where a single stream starts: past the endpoints found down
        self._warn = warn

    def _in_order(self) -> list[RemoteClient]:
        """The clients in the order a single stream tries them: from the last that answered, round the list."""
        return self.clients[self._first:] + self.clients[:self._first]

    def _passed_over(self, client: RemoteClient, e: RemoteError) -> None:
        """A single stream found `client`'s endpoint down: the next streams start past it, and the user hears."""
        self._first = (self.clients.index(client) + 1) % len(self.clients)
        if self._warn is not None:
            self._warn(f"{client.scrubbed(e).message}: asking {self.clients[self._first].endpoint.label} instead")

    @property
    def n_ctx(self) -> int:
        """The server's context window where it says (vLLM's max_model_len, llama-server's /props), else
        the --ctx value, else 4096. Asked once."""
        if self._n_ctx is None:
            self._n_ctx = self._server_ctx() or self._assumed_ctx or 4096
        return self._n_ctx

    def _server_ctx(self) -> int | None:
        return first_that_answers(self._in_order(), self._ctx_of, self._passed_over)[1]

    def _ctx_of(self, c: RemoteClient) -> int | None:
        models = c.get("/models")
        listed = models.get("data") if isinstance(models, dict) else None
        for m in listed if isinstance(listed, list) else []:
            if isinstance(m, dict) and m.get("id") == self.name:
                for key in ("max_model_len", "context_length", "n_ctx"):
                    if count(m.get(key)) > 0:
                        return count(m[key])
        props = c.get(c.endpoint.url.rsplit("/v1", 1)[0] + "/props") if c.endpoint.url.endswith("/v1") else None
        settings = props.get("default_generation_settings") if isinstance(props, dict) else None
        return (count(settings.get("n_ctx")) or None) if isinstance(settings, dict) else None

    def window_cap(self) -> int | None:
        """None: the server's window is its own, capped by no --ctx of ours."""
        return None

    def generate(self, request: GenerationRequest, started: float | None = None) -> RemoteGeneration:
        """A stream from the first endpoint that answers."""
        first, *others = self._in_order()
        return RemoteGeneration(first, request, started if started is not None else time.perf_counter(),
                                fallbacks=others, passed_over=self._passed_over)

    def count(self, request: GenerationRequest) -> int:
        """An estimate (the server tokenizes): 1 token per 3 characters, plus a few per message."""
        if request.raw:
            return len(request.prompt or "") // 3 + 1
        return sum(len(m["content"]) // 3 + 4 for m in request.messages) + 2

    def check_size(self, request: GenerationRequest) -> None:
        """Nothing: the server templates and counts (count's estimate takes no template's time here)."""

    def render(self, request: GenerationRequest) -> str:
        """The server applies its chat template; this is the conversation as it is sent."""
        if request.raw:
            return request.prompt or ""
        return json.dumps(list(request.messages), ensure_ascii=False, indent=1)

    def save_conversation(self, name: str) -> None:
        """Nothing to keep: the server holds (or reuses) its own cache."""

    def restore_conversation(self, name: str, request: GenerationRequest) -> int:
        """Nothing to restore."""
        return 0

    def describe(self) -> dict[str, Any]:
        """The model and where it runs."""
        return {"model": {"name": self.name, "file": None, "endpoint": [e.url for e in self.endpoints]},
                "load": {"remote": True}}

    def close(self) -> None:
        """Close every connection."""
        for c in self.clients:
            c.close()

    def run_many(self, requests: Iterable[Indexed], parallel: int, on_done: Callable[[Completion], None],
                 exact: bool | None = None) -> dict[str, float]:
        """Up to `parallel` requests in flight per endpoint. A request whose endpoint dies goes back to the
        front of the line for the others; only when every endpoint is gone do the rest fail."""
        lock = threading.Condition()
        source = iter(requests)
        retry: deque[Indexed] = deque()
        stop = threading.Event()
        counts = {"requests": 0.0, "retried": 0.0}
        moved: set[int] = set()  # lines taken back off an endpoint that died (counted once another answers them)
        gone: dict[int, str] = {}  # each dead endpoint's reason, by its place in the list
        flying = [0]  # lines in flight: while any is, a line may yet come back from an endpoint that dies
        failed: list[BaseException] = []  # what stopped a worker (the reader of stdout went away): raised here

        def take(client: RemoteClient) -> Indexed | None:
            with lock:
                while not stop.is_set() and client.dead is None:
                    if retry:
                        item = retry.popleft()
                        moved.add(item.index)  # moved: counted once a live endpoint answers it
                    else:
                        try:
                            item = next(source)
                        except StopIteration:
                            if not flying[0]:
                                return None
                            lock.wait(0.2)  # an endpoint may die with a line: this one takes it then
                            continue
                    flying[0] += 1
                    return item
                return None

        def work(client: RemoteClient) -> None:
            try:
                lines(client)
            except BaseException as e:  # printing an answer failed (`| head -1`): every worker stops, the caller hears
                with lock:
                    failed.append(e)
                    stop.set()
                    lock.notify_all()

        def lines(client: RemoteClient) -> None:
            while not stop.is_set() and client.dead is None:
                item = take(client)
                if item is None:
                    return
                try:
                    c = self._complete(client, item, stop)
                finally:  # whatever happened to this line, it is no longer in flight: the others must not wait
                    with lock:
                        flying[0] -= 1
                        lock.notify_all()
                with lock:
                    if c is None:  # the endpoint is gone: another takes the line
                        retry.appendleft(item)
                        # the reason the endpoint went, not this line's fate: no line that fails for it has a part
                        reason = client.dead.message if client.dead else "gone"
                        gone[self.clients.index(client)] = reason.removesuffix("; the answer is partial")
                        return
                    counts["requests"] += 1
                    counts["retried"] += item.index in moved
                    on_done(c)

        threads = [threading.Thread(target=work, args=(c,), daemon=True)
                   for _ in range(max(1, parallel)) for c in self.clients]
        for t in threads:
            t.start()
        try:
            for t in threads:
                while t.is_alive():
                    t.join(0.2)
        except KeyboardInterrupt:
            stop.set()
            raise
        if failed:
            raise failed[0]
        _fail_the_rest(itertools.chain(retry, source), gone, on_done)
        return {"steps": 0.0, "rows": 0.0, **counts}

    def _complete(self, client: RemoteClient, item: Indexed, stop: threading.Event) -> Completion | None:
        """One line on one endpoint: its Completion (an error one for a bad line), or None when the
        endpoint died under it."""
        gen = RemoteGeneration(client, _with_seed(item.request, item.seed), time.perf_counter())
        try:
            for _ in gen:
                if stop.is_set():
                    gen.close()
        except RemoteError as e:
            if e.down:
                client.dead = e
                return None
            return Completion(item.index, "", f"error: {e.message}", 0, 0, 0.0, 0.0, item.seed, error=e)
        s = gen.stats
        assert s is not None
        return Completion(item.index, gen.text, s.finish_reason, s.prompt_tokens, s.completion_tokens,
                          s.ttft_s or 0.0, s.total_s, item.seed, gen.logprobs, s.cached_tokens, stats=s,
                          server_timings=gen.server_timings)


def _with_seed(request: GenerationRequest, seed: int) -> GenerationRequest:
    import dataclasses

    if request.sampling.seed == seed:
        return request
    return dataclasses.replace(request, sampling=dataclasses.replace(request.sampling, seed=seed))


def _fail_the_rest(left: Iterable[Indexed], gone: dict[int, str], on_done: Callable[[Completion], None]) -> None:
    """Every endpoint is gone (`gone`: each one's reason, by its place in the list): each line `left` fails with it."""
    said = [gone[i] for i in sorted(gone)]  # in the order they were given (the last to die is a race's)
    reason = ("every endpoint is gone" if not said else f"every endpoint is gone (last: {said[0]})"
              if len(said) == 1 else f"every endpoint is gone ({'; '.join(said)})")
    for item in left:
        on_done(Completion(item.index, "", f"error: {reason}", 0, 0, 0.0, 0.0, item.seed))
