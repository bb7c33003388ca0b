"""The runner of the Batch API's batches (serve/batches.py), one batch at a time, oldest first, in the server's
event loop. Each request of a batch is POSTed to the server's own app in process (httpx's ASGITransport), with
the server's API key: it passes the same gate, route, checks and pipeline as the same body sent by a client,
and its answer (status, request id, body) is the record kept. At most `at_once` requests of the batches run
together (serve --batch-lines), and a new one starts only once the one before has reached its model's worker
and while no request waits for a model's slot, so a client that comes while a batch runs waits at most for the
batch's requests in flight, never behind the rest of the batch; a request whose model is not loaded waits until
no model holds a request, so its load never evicts a model from under a client, and, where the load would unload
another model, until no model a client used is still within its keep-alive: a client that comes back to its
model does not wait for a swap each time the batch takes its turn. A remote model's request (serve
--endpoint) starts once it has a free place in its model's lanes (serve --parallel), so `at_once` of them run
together there too. Cancelling lets the requests in
flight end, and starts no other. At shutdown the runner stops: a request the shutdown ended (its 503) is not
recorded, so the next start runs it again."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import traceback
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from localgen.serve import files
from localgen.serve.apierror import HTTPError
from localgen.serve.batches import Desk, Progress
from localgen.serve.batchinput import Line, input_gone, parse, read_lines
from localgen.serve.jobs import INTERNAL
from localgen.serve.state import ServeState

if TYPE_CHECKING:
    from localgen.serve.remotemodels import Lane

POLL_S = 0.05  # how often a request held back looks again for a free slot
KEPT_POLL_S = 0.5  # how often a load held back for a client's model looks again
RETRY_S = 30.0  # how soon a batch that could not be written tries again (or at the next batch or cancel)


def _first(group: BaseExceptionGroup[OSError]) -> OSError:
    """The first of the faults a batch's requests met."""
    e = group.exceptions[0]
    return e if isinstance(e, OSError) else _first(e)


class Runner:
    """Runs the desk's batches through `app`, `at_once` requests at a time."""

    def __init__(self, desk: Desk, state: ServeState, app: Any, key: str | None, stopping: Callable[[], bool],
                 at_once: int, log: Callable[[str], None]) -> None:
        self.desk, self.state, self.app, self.key = desk, state, app, key
        self.stopping, self.at_once, self.log = stopping, at_once, log

    async def serve(self) -> None:
        """Run batches as they come, until the server stops; an unexpected fault stops the runner (said in the
        server's log, with its traceback): the next start goes on where it stopped."""
        try:
            while not self.stopping():
                self.desk.wake.clear()
                doc = self.desk.next() if self.desk.batches is not None else None
                if doc is None:
                    await self.desk.wake.wait()
                    continue
                try:
                    await self.run(doc)
                except* OSError as group:  # a full or read-only disk: the batch waits, and nothing is lost
                    fault = _first(group)
                    if files.disk_fault(fault) is None:
                        raise
                    self.log(f"localgen serve: the Batch API waits: its data folder cannot be written ({fault}); "
                             f"it tries again in {RETRY_S:g} s")
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.desk.wake.wait(), RETRY_S)
        except Exception:
            self.log("localgen serve: the Batch API's runner stopped (restart serve to go on with its batches):\n"
                     + traceback.format_exc().rstrip())

    async def run(self, doc: dict[str, Any]) -> None:
        """One batch, from where it stands to its end (or until the server stops)."""
        if doc["status"] == "validating":  # a start that stopped while it was checked
            await asyncio.to_thread(self.desk.validate, doc)
        if doc["status"] == "in_progress":
            if await asyncio.to_thread(self.desk.files.content(doc["input_file_id"]).exists):
                await self.lines(doc, self.desk.progress[doc["id"]])
            else:  # removed by hand, or by a DELETE that raced the batch's creation: it fails, the next ones run
                doc["errors"] = {"object": "list", "data": [input_gone(doc)]}
        if not self.stopping() and doc["status"] in ("in_progress", "finalizing", "cancelling"):
            await asyncio.to_thread(self.desk.finish, doc)

    async def lines(self, doc: dict[str, Any], progress: Progress) -> None:
        """Send the requests not answered yet, in the input's order, `at_once` at most in flight."""
        import httpx

        source = read_lines(self.desk.files.content(doc["input_file_id"]), self.desk.max_line)
        slots = asyncio.Semaphore(self.at_once)
        # the access lines' client (--log-format json) is the batch
        transport = httpx.ASGITransport(app=self.app, raise_app_exceptions=False, client=(doc["id"], 0))
        try:
            async with (httpx.AsyncClient(transport=transport, base_url="http://localhost", timeout=None) as client,
                        asyncio.TaskGroup() as group):
                while (item := await asyncio.to_thread(next, source, None)) is not None:
                    line = parse(*item, doc["endpoint"])
                    if not isinstance(line, Line) or line.custom_id in progress.done:
                        continue
                    await slots.acquire()
                    await self._behind_live()
                    lane = self.state.upstreams.lane_of(line.body.get("model")) \
                        if self.state.upstreams is not None else None
                    if lane is not None:  # a remote model's: sent on once its lanes have a free place
                        await self._room(lane)
                    elif not self._loaded_for(line.body):  # a model to load (and another to evict, maybe)
                        await self._idle(doc["id"], line.body)
                    if doc["status"] != "in_progress" or self.stopping():
                        slots.release()
                        break
                    before = self._outstanding() if lane is None else lane.entered
                    sent = group.create_task(self.one(client, progress, line, slots))
                    # until it reaches a worker, or takes its place in the remote model's lanes (looked at after
                    # POLL_S / 64, then twice as long each time up to POLL_S: a short request, an embedding, is
                    # answered in much less than POLL_S, and a first look only after POLL_S held every line that
                    # long: docs/benchmarks.md, The Batch API)
                    wait = POLL_S / 64
                    while not sent.done() and (self._outstanding() if lane is None else lane.entered) == before:
                        await asyncio.sleep(wait)
                        wait = min(2 * wait, POLL_S)
        finally:
            source.close()

    def _outstanding(self) -> int:
        """The requests the models' workers hold, queued or running."""
        return sum(w.outstanding for w in list(self.state.workers.values()))

    def _loaded_for(self, body: dict[str, Any]) -> bool:
        """Whether the model a request names is loaded now (an unknown name counts as one to load)."""
        name = self.state.meant(body.get("model"))
        workers = self.state.workers
        on_demand = self.state.on_demand
        if isinstance(name, str) and on_demand is not None and name not in workers:
            name = on_demand.aliases.get(name, name)
        w = workers.get(name) if isinstance(name, str) else None
        return w is not None and w.loaded

    async def _idle(self, ident: str, body: dict[str, Any]) -> None:
        """Wait until no model holds a request, ours included: a batch's line that loads a model (and may evict
        one) never takes a model from under a client's request, nor from ours in flight. Where the load would
        unload another model, wait too while a model a client used is within its keep-alive (said once in the
        log): it goes on once that model unloads, or once only batches have used the models loaded."""
        wanted, need = None, None
        try:  # the model's estimate, once (it reads its file); a fault here is the line's own, as a client's
            wanted = self.state.local(body.get("model"))
            need = await asyncio.to_thread(wanted.residence.need_now) if wanted is not None else None
        except Exception:
            wanted = None
        said = False
        while not self.stopping():
            if self._outstanding() > 0:
                await asyncio.sleep(POLL_S)
                continue
            kept = _clients_model(wanted, need, self.state) if wanted is not None and need is not None else None
            if wanted is None or kept is None:
                return
            if not said:
                self.log(f"localgen serve: {ident} waits to load {wanted.name}: that would "
                         f"unload {kept}, which a client used within its keep-alive")
                said = True
            await asyncio.sleep(KEPT_POLL_S)

    async def _behind_live(self) -> None:
        """Wait while a request waits for a model's slot (a client's, or one of ours not yet in its slot), or for a
        place in a remote model's lanes."""
        upstreams = self.state.upstreams
        while not self.stopping() and (any(w.outstanding > w.running for w in list(self.state.workers.values()))
                                       or (upstreams is not None and upstreams.waiting())):
            await asyncio.sleep(POLL_S)

    async def _room(self, lane: Lane) -> None:
        """Wait until a remote model's lanes have a free place (serve --parallel): a line sent on then never
        waits in its queue, nor fills it for a client."""
        while not self.stopping() and lane.outstanding >= lane.parallel:
            await asyncio.sleep(POLL_S)

    async def one(self, client: Any, progress: Progress, line: Line, slots: asyncio.Semaphore) -> None:
        """One request through the app; its answer appended to the output (2xx) or the errors."""
        try:
            headers = {"Content-Type": "application/json"}
            if self.key:
                headers["Authorization"] = f"Bearer {self.key}"
            record: dict[str, Any] = {"id": f"batch_req_{secrets.token_hex(12)}", "custom_id": line.custom_id}
            try:  # JSON's escapes kept as sent (a lone surrogate is the route's 400, as for a client)
                r = await client.post(line.url, content=json.dumps(line.body).encode(), headers=headers)
            except Exception:  # a fault of ours before the app answered: this request fails alone, said in the log
                self.log("localgen serve: a batch request failed:\n" + traceback.format_exc().rstrip())
                record.update(response=None, error={"code": "server_error", "message": INTERNAL})
                ok = False
            else:
                if not r.is_success and self.stopping():
                    return  # ended by the shutdown: no answer, and the next start sends it again
                try:
                    body = r.json()
                except ValueError:
                    body = r.text
                record.update(response={"status_code": r.status_code, "request_id": r.headers.get("x-request-id"),
                                        "body": body}, error=None)
                ok = r.is_success
            await asyncio.to_thread(progress.write, record, ok)
            progress.count(record, ok)
        finally:
            slots.release()


def _clients_model(wanted: Any, need: int, state: ServeState) -> str | None:
    """A loaded model that `wanted`'s load (of `need` bytes) would have to unload while a client may still come
    back to it (a client's request came or ended within its keep-alive), or None when the load unloads no such
    model (or `wanted` has been loaded meanwhile)."""
    import time

    if wanted.loaded or wanted.residence.room_for(need):
        return None
    now = time.monotonic()
    for w in list(state.workers.values()):
        if w is wanted or w.pinned or not w.loaded or w.client_used is None:
            continue
        if w.keep_alive < 0 or now - w.client_used < w.keep_alive:
            return str(w.name)
    return None


@asynccontextmanager
async def running(desk: Desk, state: ServeState, app: Any, key: str | None, stopping: Callable[[], bool],
                  log: Callable[[str], None]) -> AsyncIterator[None]:
    """The runner, while the app runs: batches an earlier start left unfinished go on at once (this server then
    holds the data dir's batches); at shutdown it stops, and lets another server hold them."""
    desk.files.warn = log  # a damaged object, said
    if await asyncio.to_thread(desk.pending):
        try:
            desk.owner()
        except HTTPError as e:
            log(f"localgen serve: the unfinished batches wait: {e.message}")
        except OSError as e:  # a read-only data folder: the server runs, and the batches wait for a start that can
            log(f"localgen serve: the unfinished batches wait: their data folder cannot be written ({e})")
    task = asyncio.create_task(Runner(desk, state, app, key, stopping, state.batch_lines, log).serve())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        desk.release()
