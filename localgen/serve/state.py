"""What the routes share: the served models by name (and those on disk, made when first asked for), the API
key, the sampling flags `serve` was given, and the listings' view of them."""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from localgen.serve.apierror import HTTPError
from localgen.serve.served import Served
from localgen.serve.servelog import named
from localgen.serve.worker import Counts, ModelWorker
from localgen.types import ModelRef

if TYPE_CHECKING:
    from localgen.engine.prefixstore import PrefixStore
    from localgen.serve.ondemand import OnDemand
    from localgen.serve.residency import Residency
    from localgen.serve.upstream import Upstreams


LATEST = ":latest"  # Ollama's tag for a name given without one


@dataclass
class ServeState:
    """What the routes share: the workers by model name, the API key, the defaults from the flags."""

    workers: dict[str, ModelWorker]
    api_key: str | None = None
    flag_sampling: dict[str, Any] = field(default_factory=dict)  # the sampling flags `serve` was given
    allow_image_urls: bool = False  # fetch http(s) image URLs (else only data: URIs: no server-side requests)
    allow_mcp_urls: bool = False  # serve --allow-mcp-urls: the Responses API's mcp tool connects to its server_url
    allow_private_urls: bool = False  # serve --allow-private-urls: an mcp server_url may be loopback or private
    started: float = field(default_factory=time.time)
    default: str | None = None  # the model of a request that names none (serve's one -m model, or the default)
    on_demand: OnDemand | None = None  # installed models beside the workers, made when asked for
    residency: Residency | None = None  # which models stay loaded
    counts: Counts | None = None  # serve/metrics.py's counts of each finished generation and decoding step
    offline: bool = False  # serve --offline: /api/pull is refused
    store: PrefixStore | None = None  # the prompt cache on disk (None: --cache-disk 0)
    batch_lines: int = 2  # serve --batch-lines: the Batch API's requests run at once (serve/batchrun.py)
    pulls: set[Any] = field(default_factory=set)  # serve/manage.py's pulls under way (stopped at shutdown)
    toolbox: Any = None  # serve --mcp / --functions: the tools /tools lists and /tools/call runs (a Toolbox)
    tool_timeout: float = 30.0  # serve --tool-timeout: seconds one call may take
    tool_threads: Any = None  # serve/servertools.py's ToolThreads: the tool calls running (ended at shutdown)
    collections: list[str] = field(default_factory=list)  # serve --collection: offered as vector stores
    upstreams: Upstreams | None = None  # serve --endpoint: the models other servers run (serve/upstream.py)
    # (name, why) of the models /api/delete, /api/create or /api/copy is taking away (serve/manage.py's _retired):
    # a request naming one is a 409 until that ends (no worker is made meanwhile from the files being changed)
    retiring: list[tuple[str, str]] = field(default_factory=list)
    # the workers _retired has taken out of `workers` and not stopped yet: serve's end stops them too (a retire
    # cancelled at shutdown would leave a llama.cpp thread running as the interpreter ends)
    stopping: list[Any] = field(default_factory=list)
    _retire: threading.Lock = field(default_factory=threading.Lock, repr=False)  # current()'s taking away
    _taken: weakref.WeakSet[Any] = field(default_factory=weakref.WeakSet, repr=False)  # the workers it took away

    def worker(self, name: object, claude: bool = False) -> Served:
        """The model a request's `model` names, as its handler sees it: one served, or an installed model (its
        worker made now); the default model when none is named. With `claude` (Anthropic's API), a claude-*
        name (what Claude Code asks for unless told) that is not a model here is the default model."""
        if name is not None and not isinstance(name, str):  # a 404 "not served" would send a client looking for it
            raise HTTPError(400, f"`model` must be a model's name, a string, not {str(name)[:40]!r}", param="model")
        if claude and isinstance(name, str) and name.startswith("claude-") and name not in self.workers:
            try:
                return self.worker(name)
            except HTTPError:
                return self.worker(None)
        named(name)  # the access line's model, when no worker answers it (a 404)
        refused = self.upstreams.refusal(name) if self.upstreams is not None else None
        if refused is not None:  # a remote model, at a route that cannot send it on
            raise refused
        w = self._worker(name)
        named(w.name)
        w.counts = self.counts  # every request passes here: pinned and on-demand workers alike
        return w

    def meant(self, name: object) -> object:
        """The model a request's `model` means: itself, or for none the default (or the one worker); Ollama's
        NAME:latest, as its clients send an untagged name, is NAME where no model is called NAME:latest; an Ollama
        model's name in another spelling (ollama:NAME for ollama:NAME:latest, its case, library/) is the one served
        or listed."""
        if name is None or name == "":
            name = self.default
            if name is None and len(self.workers) == 1:
                name = next(iter(self.workers))
        if isinstance(name, str) and name not in self.workers and name.partition(":")[0].lower() == "ollama":
            return self.ollama_name(name)
        if isinstance(name, str) and name.lower().endswith(LATEST) and name not in self.workers:
            bare = name[:-len(LATEST)]
            listed = self.on_demand.listing() if self.on_demand is not None else ()
            if name not in listed and (bare in self.workers or bare in listed):
                return bare
        return name

    def ollama_name(self, name: str) -> str:
        """The served or listed spelling of an Ollama model's name (compared as Ollama's canonical names); the name
        itself when none is (a 404 follows), or it is no `ollama:` name Ollama takes."""
        want = _ollama_display(name)
        if want is None:
            return name
        for n, w in list(self.workers.items()):  # (current() may take one away from a pool thread meanwhile)
            if want in (_ollama_display(n), _ollama_display(w.ref.name)):
                return n
        listed = self.on_demand.listing() if self.on_demand is not None else ()
        return next((n for n in listed if _ollama_display(n) == want), name)

    def _worker(self, name: object) -> ModelWorker:
        if name in (None, "") and self.default is None and self.upstreams is not None:  # --endpoint with no -m
            offered = ", ".join([*self.names(), *(n for n, _ in self.upstreams.listing())][:20])
            raise HTTPError(400, f"name a model: this server has no default model (serve --endpoint without -m); it "
                                 f"serves {offered}", param="model")
        name = self.meant(name)
        if isinstance(name, str) and name in self.workers and self.current(self.workers[name]):
            return self.workers[name]
        why = next((why for n, why in self.retiring if n == name), None)
        if why is not None:
            raise HTTPError(409, f"model {name!r} is being {why}: try again once that ends", param="model")
        if isinstance(name, str) and self.on_demand is not None:
            held = self.on_demand.aliases.get(name)
            if held is not None and held in self.workers:
                self.current(self.workers[held])
            w = self.on_demand.worker(name, self.workers)
            if w is not None:
                self.workers.setdefault(w.name, w)
                return self.workers[w.name]
        raise HTTPError(404, self.not_served(name), "not_found_error", "model")

    def not_served(self, name: object) -> str:
        """What every route says of a model name this server has no model by: the names it has (20 at most)."""
        return f"model {name!r} is not served here (served: {', '.join(self.names()[:20])})"

    def local(self, name: object) -> ModelWorker | None:
        """The local model a batch's request names (its worker made now, as a client's request would make it), None
        for a name no model here has."""
        try:
            return self._worker(name)
        except HTTPError:
            return None

    def current(self, w: ModelWorker) -> bool:
        """Whether a worker serves its model as it is on disk. One made on demand for a preset whose file has
        changed since (`localgen create --force`, `localgen rm`, in another process) is not: it is taken away now
        (it takes no new job, ends those it has, then unloads), so a request makes one from the preset as it is
        now, or finds none. A worker of serve -m stays for the server's life."""
        if self.on_demand is None:
            return True
        # on the event loop and in threads (to_thread) alike: one of those that see it changed takes it away
        with self._retire:
            if w in self._taken:  # taken away already (stopped since, or not yet)
                return False
            if self.on_demand.current(w) or w.pinned:
                return True
            w.close(f"{w.name} changed on disk")
            if self.workers.get(w.name) is w:
                del self.workers[w.name]
            self.on_demand.forget(w)
            self.stopping.append(w)
            self._taken.add(w)
        threading.Thread(target=self._stop_when_idle, args=(w,), name=f"localgen-retire-{w.name}",
                         daemon=True).start()
        return False

    def taken_away(self, w: object) -> bool:
        """Whether current() has taken this worker away (its preset changed on disk)."""
        return w in self._taken

    def _stop_when_idle(self, w: ModelWorker) -> None:
        """A worker taken away: stopped (which frees its model) once the jobs it holds have ended, however long
        they take, as those of a worker in use (a generation ends at its max tokens or its window; serve's stop
        ends them sooner: app.py's Drain)."""
        while w.busy:
            time.sleep(0.05)
        w.stop()
        with contextlib.suppress(ValueError):
            self.stopping.remove(w)

    def current_workers(self) -> dict[str, ModelWorker]:
        """The workers by name, each looked at first (current: one whose preset changed is taken away)."""
        return {n: w for n, w in list(self.workers.items()) if self.current(w)}

    def unloading(self) -> list[ModelWorker]:
        """The workers taken away (a preset changed on disk, a model deleted or replaced) that have not stopped
        yet: they end the requests they answer, and hold their model until then."""
        return list(dict.fromkeys(self.stopping))

    def names(self) -> list[str]:
        """Every model a request may name: those served now, then (on demand) the others on disk."""
        served = list(self.current_workers())
        return self.on_demand.names(served) if self.on_demand is not None else served

    def offered(self) -> list[tuple[str, ModelRef, ModelWorker | None]]:
        """What the listings show: each worker's model, then each model on disk without one yet."""
        out: list[tuple[str, ModelRef, ModelWorker | None]] = [
            (n, w.ref, w) for n, w in self.current_workers().items()]
        if self.on_demand is not None:
            out += [(n, ref, None) for n, ref in self.on_demand.refs(self.workers)]
        return out

    def window(self, ref: ModelRef, worker: ModelWorker | None) -> int:
        """A slot's window: the loaded model's, else the context it will load with."""
        if worker is not None:
            return int(worker.n_ctx)
        n_ctx = int(self.on_demand.load.n_ctx) if self.on_demand is not None else 0
        if ref.context is not None and not (self.on_demand is not None and self.on_demand.ctx_given):
            n_ctx = ref.context  # a preset's num_ctx
        trained = ref.summary.context_length
        if n_ctx == 0:  # --ctx 0 (a preset's num_ctx 0): the model's training context
            return trained or 0
        return min(n_ctx, trained) if trained else n_ctx


def _ollama_display(name: str) -> str | None:
    """An `ollama:` name as Ollama's canonical one (models/ollamastore.py's display, in lower case), or None."""
    from localgen.errors import UsageError
    from localgen.models import ollamastore

    store, colon, rest = name.partition(":")
    if not colon or store.lower() != "ollama":
        return None
    try:
        return ollamastore.parse_name(rest.strip()).display.lower()
    except UsageError:
        return None
