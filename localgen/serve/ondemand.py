"""Every installed model, offered beside those `serve -m` named (#43): a request that names one makes its
worker (which loads the model on its first job, within serve/residency.py's room, and unloads it when idle);
the listings (/v1/models, /api/tags) name them all. Names are those `localgen list` prints: a request cannot
name a file path, a Hub repo to download, or anything else `run -m` would take."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from localgen.errors import LocalgenError, UsageError
from localgen.types import LoadParams, ModelRef

if TYPE_CHECKING:
    from localgen.serve.worker import ModelWorker


class OnDemand:
    """Installed models, looked up offline by name, and a worker made for each when first asked for."""

    def __init__(self, make: Callable[[ModelRef], ModelWorker], lookup: Callable[[str], ModelRef],
                 listing: Callable[[], list[str]], load: LoadParams, ctx_given: bool = False,
                 peek: Callable[[str], ModelRef] | None = None) -> None:
        self.load = load  # what each loads with (a preset's num_ctx in place of the context, unless --ctx was given)
        self.ctx_given = ctx_given
        self.make = make  # a started ModelWorker for a model (not loaded yet)
        self.lookup = lookup  # a name → its model on disk, without the network (LocalgenError: none)
        self.listing = listing  # the names of the models on disk
        self.peek = peek or lookup  # as lookup, for the listings: nothing assembled (an embedded model in chunks)
        self.aliases: dict[str, str] = {}  # a name asked for → the worker's name, when they differ
        # a preset's worker's name → that worker, and its file's stamp (presets.stamp) as it was looked up
        self.stamps: dict[str, tuple[ModelWorker, tuple[int, ...]]] = {}

    def worker(self, name: str, workers: dict[str, ModelWorker]) -> ModelWorker | None:
        """The worker for `name` (made now unless one serves that model), or None when no such model is here;
        the caller keeps it in `workers`."""
        if name in self.aliases:
            return workers[self.aliases[name]]
        if name not in self.listing():  # only a model on disk by its name: never a path a request makes up
            return None
        from localgen.models import presets

        # before the lookup: a preset replaced from here on is seen at the next request (a stamp taken after the
        # worker was made could be the new file's, and the worker the old one's)
        stamp = presets.stamp(name)
        try:
            ref = self.lookup(name)
        except LocalgenError:
            return None
        same = next((w for w in list(workers.values()) if w.ref.name == ref.name and w.ref.path == ref.path), None)
        try:
            w = same or self.make(ref)
        except UsageError as e:  # a preset's settings this server cannot load (an -ot buffer type it lacks)
            from localgen.serve.apierror import HTTPError

            raise HTTPError(400, f"model {name!r} cannot be loaded here: {e}", param="model",
                            logged=f"model {name!r} was asked for and cannot be loaded here: {e}") from None
        if same is None and stamp is not None and presets.canonical(name) == w.name:
            self.stamps[w.name] = (w, stamp)
        if w.name != name:
            self.aliases[name] = w.name
        return w

    def current(self, w: ModelWorker) -> bool:
        """Whether a worker made here serves its model as it is on disk: false once its preset's file was
        replaced (`localgen create --force` in another process) or removed (`localgen rm`). One stat."""
        made = self.stamps.get(w.name)
        if made is None or made[0] is not w:  # no preset's worker, or one taken away (a new one has its name)
            return True
        from localgen.models import presets

        return presets.stamp(w.name) == made[1]

    def forget(self, w: ModelWorker) -> None:
        """A worker taken away: its stamp and the names that meant it, while they are its own (not those of a
        worker made since under its name)."""
        made = self.stamps.get(w.name)
        if made is None or made[0] is not w:
            return
        del self.stamps[w.name]
        for alias, held in list(self.aliases.items()):
            if held == w.name:
                del self.aliases[alias]

    def names(self, served: list[str]) -> list[str]:
        """The models offered: those served now first, then the rest on disk (each once)."""
        return list(dict.fromkeys([*served, *(n for n in self.listing() if n not in self.aliases)]))

    def refs(self, workers: dict[str, ModelWorker]) -> list[tuple[str, ModelRef]]:
        """The models on disk that no worker serves yet, by name (for the listings)."""
        held = {(w.ref.name, w.ref.path) for w in workers.values()}
        out = []
        for name in self.names(list(workers)):
            if name in workers:
                continue
            try:
                ref = self.peek(name)
            except LocalgenError:
                continue  # gone since it was listed, or a preset whose base is gone
            if (ref.name, ref.path) not in held:
                out.append((name, ref))
        return out
