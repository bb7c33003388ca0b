"""Every installed model, offered beside those `serve -m` named (#43): a request that names one makes its
worker (which loads the model on its first job, within serve/residency.py's room, and unloads it when idle);
the listings (/v1/models, /api/tags) name them all. Names are those `localgen list` prints: a request cannot
name a file path, a Hub repo to download, or anything else `run -m` would take."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from localgen.errors import LocalgenError, ModelNotFoundError, UsageError
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
        # a worker's name → that worker, what its file's stamp was as it was looked up (a preset's file: presets.stamp;
        # another model's: its GGUF's), and how to take it again
        self.stamps: dict[str, tuple[ModelWorker, tuple[int, ...], Callable[[], tuple[int, ...] | None]]] = {}

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
        except ModelNotFoundError:  # gone since it was listed
            return None
        except LocalgenError as e:  # there, but it cannot be made ready here (its data folder cannot be written)
            from localgen.serve.apierror import HTTPError

            said = e.message + (f" ({e.hint})" if e.hint else "")
            raise HTTPError(500, f"model {name!r} cannot be loaded here: {said}", "server_error", param="model",
                            logged=f"model {name!r} was asked for and cannot be loaded here: {said}") from None
        same = next((w for w in list(workers.values()) if w.ref.name == ref.name and w.ref.path == ref.path), None)
        try:
            w = same or self.make(ref)
        except UsageError as e:  # a preset's settings this server cannot load (an -ot buffer type it lacks)
            from localgen.serve.apierror import HTTPError

            raise HTTPError(400, f"model {name!r} cannot be loaded here: {e}", param="model",
                            logged=f"model {name!r} was asked for and cannot be loaded here: {e}") from None
        if same is None and stamp is not None and presets.canonical(name) == w.name:
            self.stamps[w.name] = (w, stamp, lambda: presets.stamp(w.name))
        elif same is None and stamp is None and (found := file_stamp(ref.path)) is not None:
            self.stamps[w.name] = (w, found, lambda: file_stamp(ref.path))
        if w.name != name:
            self.aliases[name] = w.name
        return w

    def current(self, w: ModelWorker) -> bool:
        """Whether a worker made here serves its model as it is on disk: false once its preset's file, or its
        model's, was replaced (`localgen create --force`, a pull of a new revision, in another process) or removed
        (`localgen rm`). One stat."""
        made = self.stamps.get(w.name)
        if made is None or made[0] is not w:  # no worker of a file, or one taken away (a new one has its name)
            return True
        return made[2]() == made[1]

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


def file_stamp(path: str | None) -> tuple[int, ...] | None:
    """What tells a model's file was removed or replaced (the file its link in the cache leads to): its device,
    inode, size and modification time; None when there is none."""
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
