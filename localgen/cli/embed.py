"""`localgen embed` (texts to vectors: NDJSON, or one JSON object; --store into a collection),
`localgen similar` (the nearest texts of a collection) and `localgen rerank` (documents by relevance)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from localgen.cli import documents
from localgen.cli import options as o
from localgen.cli.documents import CHUNK_OVERLAP, CHUNK_TOKENS, controls
from localgen.cli.embed_texts import read_texts
from localgen.cli.inputfile import input_path_or_stdin
from localgen.cli.options.knobs import Knobs
from localgen.cli.output import plural
from localgen.errors import UsageError

if TYPE_CHECKING:
    from localgen.cli.output import ErrWriter
    from localgen.embeddings.store import Collection

EMBED = "Embeddings"
DOCS = "Documents"
MIN_CHUNK = 8  # chunk.MIN_LIMIT: room for the special tokens and some text
Pooling = Annotated[
    str | None,
    typer.Option("--pooling", rich_help_panel=EMBED, show_default=False,
                 help="mean, cls or last (default: the model's own; mean for chat models, which name none)."),
]

InputFile = Annotated[
    Path | None,
    typer.Option("--file", path_type=str, callback=input_path_or_stdin, show_default=False, rich_help_panel=EMBED,
                 help='One text per line, or JSON lines {"id": ..., "text": ...}.'),
]


def embed(
    ctx: typer.Context,
    texts: Annotated[
        list[str] | None,
        typer.Argument(metavar="TEXT", show_default=False,
                       help="Texts to embed (default: one per line of stdin, or --file); with --docs, files and "
                            "folders."),
    ] = None,
    file: InputFile = None,
    model: o.Model = None,
    offline: o.Offline = False,
    pooling: Pooling = None,
    docs: Annotated[
        bool, typer.Option("--docs", rich_help_panel=DOCS,
                           help="With --store: the arguments are files and folders (walked in sorted order, hidden "
                                "ones skipped), each cut into chunks stored as PATH#1, PATH#2, ...; storing a file "
                                "again replaces its chunks, embedding only those whose text is not stored yet.")
    ] = False,
    chunk_tokens: Annotated[
        int | None, typer.Option("--chunk-tokens", min=MIN_CHUNK, rich_help_panel=DOCS, show_default=False,
                                 help=f"With --docs: a chunk's most tokens, the model's own as it embeds them (default "
                                      f"{CHUNK_TOKENS}; at most the embeddings window, --ctx).")
    ] = None,
    chunk_overlap: Annotated[
        int | None, typer.Option("--chunk-overlap", min=0, rich_help_panel=DOCS, show_default=False,
                                 help=f"With --docs: tokens a chunk repeats of the one before (default "
                                      f"{CHUNK_OVERLAP}, or a quarter of --chunk-tokens where less; less than "
                                      "--chunk-tokens).")
    ] = None,
    normalize: Annotated[
        bool, typer.Option("--normalize/--no-normalize", rich_help_panel=EMBED, help="Scale each vector to length 1.")
    ] = True,
    dimensions: Annotated[
        int | None, typer.Option("--dimensions", min=1, rich_help_panel=EMBED, show_default=False,
                                 help="Keep the first N dimensions (Matryoshka models), normalised again.")
    ] = None,
    truncate: Annotated[
        bool, typer.Option("--truncate", rich_help_panel=EMBED,
                           help="Embed the first --ctx tokens of a longer text instead of refusing it.")
    ] = False,
    fmt: Annotated[
        str, typer.Option("--format", rich_help_panel=o.OUTPUT_PANEL,
                          help="float (a JSON list) or base64 (little-endian float32, as OpenAI's API sends); not with "
                               "--store.")
    ] = "float",
    json_out: Annotated[
        bool, typer.Option("--json", rich_help_panel=o.OUTPUT_PANEL,
                           help="One JSON object (model, pooling, dimensions, data, tokens) instead of NDJSON; "
                               "not with --store.")
    ] = False,
    store: Annotated[
        str | None, typer.Option("--store", rich_help_panel=EMBED, show_default=False,
                                 help="Keep the vectors, ids and texts in this collection (see `similar`); an "
                                      "unchanged text is not embedded again.")
    ] = None,
    replace: Annotated[
        bool, typer.Option("--replace", rich_help_panel=EMBED,
                           help="With --store: afterwards the collection holds exactly this run's ids (the others "
                                "are removed once every text is stored; a failed run removes nothing).")
    ] = False,
    ctx_size: o.Ctx = 2048,
    threads: o.Threads = None,
    gpu_layers: o.GpuLayers = None,
    repack: o.Repack = None,
    verbose: o.Verbose = False,
) -> None:
    """Turn texts into embedding vectors, one per text: NDJSON lines {"id", "embedding", "tokens"}."""
    run_embed(EmbedArgs(context=ctx, texts=texts, file=file, model=model, offline=offline, pooling=pooling,
                        normalize=normalize, dimensions=dimensions, truncate=truncate, fmt=fmt, json_out=json_out,
                        store=store, replace=replace, docs=docs, chunk_tokens=chunk_tokens,
                        chunk_overlap=chunk_overlap, ctx_size=ctx_size, threads=threads, gpu_layers=gpu_layers,
                        repack=repack, verbose=verbose))


def similar(
    ctx: typer.Context,
    collection: Annotated[str, typer.Argument(metavar="COLLECTION", help="A collection made with `embed --store`.")],
    query: Annotated[str, typer.Argument(metavar="QUERY", help="The text to find neighbours of.")],
    count: Annotated[int, typer.Option("--count", "-n", min=1, help="How many.")] = 10,
    truncate: Annotated[
        bool, typer.Option("--truncate", rich_help_panel=EMBED,
                           help="Embed the first tokens of a query longer than the window (4096 tokens, or the "
                                "model's training context where shorter) instead of refusing it.")
    ] = False,
    offline: o.Offline = False,
    threads: o.Threads = None,
    repack: o.Repack = None,  # as the collection was embedded: the layouts round differently
    verbose: o.Verbose = False,
) -> None:
    """The texts of a collection nearest to a query (cosine similarity), best first, as NDJSON."""
    run_similar(SimilarArgs(context=ctx, collection=collection, query=query, count=count, truncate=truncate,
                            offline=offline, threads=threads, repack=repack, verbose=verbose))


def rerank(
    ctx: typer.Context,
    query: Annotated[str, typer.Argument(metavar="QUERY", help="What the documents are scored against.")],
    documents: Annotated[
        list[str] | None,
        typer.Argument(metavar="DOCUMENT", show_default=False,
                       help="Documents (default: one per line of stdin, or --file)."),
    ] = None,
    file: InputFile = None,
    model: o.Model = None,
    offline: o.Offline = False,
    top: Annotated[int | None, typer.Option("--top", "-n", min=1, show_default=False, help="Only the best N.")] = None,
    truncate: Annotated[
        bool, typer.Option("--truncate", rich_help_panel=EMBED,
                           help="Score the first --ctx tokens of a longer pair instead of refusing it.")
    ] = False,
    ctx_size: o.Ctx = 2048,
    threads: o.Threads = None,
    gpu_layers: o.GpuLayers = None,
    repack: o.Repack = None,
    verbose: o.Verbose = False,
) -> None:
    """Score documents against a query with a reranker model: NDJSON {"id", "score", "document"}, best first."""
    run_rerank(RerankArgs(context=ctx, query=query, documents=documents, file=file, model=model, offline=offline,
                          top=top, truncate=truncate, ctx_size=ctx_size, threads=threads, gpu_layers=gpu_layers,
                          repack=repack, verbose=verbose))


@dataclass(frozen=True, kw_only=True)
class _LoadArgs(o.CommandArgs):
    """What embed, similar and rerank share: how the model loads."""

    offline: bool
    threads: int | None
    repack: bool | None
    verbose: bool

    def knobs(self) -> Knobs:
        """The load settings the command takes (similar's model loads with the default window); --ctx is the
        parameter ctx_size (LOCALGEN_CTX's value is named by the variable in its errors, as run's)."""
        return Knobs.of(self.context, self._settings(), {"ctx": "ctx_size"})

    def _settings(self) -> dict[str, object]:
        return {"threads": self.threads, "repack": self.repack}


@dataclass(frozen=True, kw_only=True)
class _InputArgs(_LoadArgs):
    """What embed and rerank share: the model, the texts' file, and the window."""

    file: Path | None
    model: str | None
    truncate: bool
    ctx_size: int
    gpu_layers: int | None

    def _settings(self) -> dict[str, object]:
        return {"ctx": self.ctx_size, "threads": self.threads, "gpu_layers": self.gpu_layers, "repack": self.repack}


@dataclass(frozen=True, kw_only=True)
class EmbedArgs(_InputArgs):
    """`localgen embed`'s parameters."""

    texts: list[str] | None
    pooling: str | None
    normalize: bool
    dimensions: int | None
    fmt: str
    json_out: bool
    store: str | None
    replace: bool
    docs: bool
    chunk_tokens: int | None
    chunk_overlap: int | None


@dataclass(frozen=True, kw_only=True)
class SimilarArgs(_LoadArgs):
    """`localgen similar`'s parameters."""

    collection: str
    query: str
    count: int
    truncate: bool


@dataclass(frozen=True, kw_only=True)
class RerankArgs(_InputArgs):
    """`localgen rerank`'s parameters."""

    query: str
    documents: list[str] | None
    top: int | None


def _asked(query: str) -> str:
    """The query of similar or rerank: an empty one (an unset shell variable, say) is a usage error, not a
    ranking against nothing."""
    if not query.strip():
        raise UsageError("the query is empty", hint="give the text to rank against")
    return query


def run_rerank(f: RerankArgs) -> None:
    """Score each document (reranker models only) and print them by relevance."""

    from localgen.text import checked

    query = checked(_asked(f.query), "the query")
    items = read_texts(f.documents, f.file, verb="rerank")
    backend = _backend(f, _typed(f.model))
    try:
        scored = backend.rerank(query, [t for _, t in items], f.truncate)
    finally:
        backend.close()
    order = sorted(range(len(items)), key=lambda i: -scored[i][0])[:f.top or len(items)]
    _ndjson({"id": items[i][0], "score": round(scored[i][0], 6), "document": items[i][1]} for i in order)


def _ndjson(docs: Iterable[dict[str, Any]]) -> None:
    """One JSON object a line on stdout, stopping quietly when the reader goes away."""
    import json

    from localgen.cli.output import TextWriter

    out = TextWriter(sys.stdout)
    for d in docs:
        if not out.write(json.dumps(d, ensure_ascii=False) + "\n"):
            return


def _typed(model: str | None) -> str | None:
    """-m's model (or LOCALGEN_MODEL's), a path to nothing a usage error, as any input file's."""
    from localgen.cli.inputfile import check_model

    check_model("-m/--model", model)
    return model


def _kept(model: str | None) -> str | None:
    """-m's model as a collection keeps it, to load again: a file's path made absolute (a relative one would name
    another file, or none, from another folder: `similar`, --rag and `serve --collection` load it from anywhere);
    any other name as typed."""
    import os

    from localgen.errors import LocalgenError
    from localgen.models import names
    from localgen.models.resolve import spec_of

    if model is None:
        return None
    try:
        spec = spec_of(model.strip())
    except LocalgenError:  # (the load said why already)
        return model
    return os.path.abspath(spec.path) if isinstance(spec, names.PathSpec) else model


def _backend(f: _LoadArgs, model: str | None) -> Any:
    from localgen.cli.output import ErrWriter
    from localgen.cli.progress import make_progress
    from localgen.engine.defaults import past_training
    from localgen.engine.local import LocalBackend
    from localgen.models.load import open_engine
    from localgen.models.resolve import resolve

    err = ErrWriter()
    ref = resolve(model, offline=f.offline, progress=make_progress())
    # Embedding is prompt processing only, where llama.cpp's repacked CPU layouts pay (and are its default);
    # generation's reason to leave them off (exact batching) does not apply.
    load = f.knobs().load(**({} if f.repack is not None else {"repack": True}))
    trained = ref.summary.context_length
    if isinstance(f, _InputArgs) and f.given("ctx_size") and past_training(load, trained):  # as run warns
        err.warn(f"--ctx {load.n_ctx:,} is past the {trained:,} tokens {ref.name} was trained on: the window is "
                 f"{trained:,}")
    engine = open_engine(ref, load, verbose=f.verbose, warn=err.warn)
    from localgen.cli.hints import record_note

    record_note(err.line, ref.name, ref.path, vars(engine.params), engine.origins)
    return LocalBackend(engine, warn=err.warn)


def run_embed(f: EmbedArgs) -> None:
    """Embed, print or store."""
    from localgen.cli.signals import term_as_interrupt

    _check_flags(f)
    docs: list[tuple[str, str]] = []
    if f.docs or f.chunk_tokens is not None or f.chunk_overlap is not None:
        docs = documents.checked(f)  # every check and read before the model loads
        items = []
    else:
        items = read_texts(f.texts, f.file, by_content=True, unique=bool(f.store))
    # a SIGTERM or SIGHUP (`timeout`, a closed terminal) stops it as Ctrl-C does, so that what --store embedded is
    # stored; the process then ends by that signal
    with term_as_interrupt():
        try:
            _embed_items(f, items, docs)
        except KeyboardInterrupt:
            if f.store and f.replace:  # said, not a bare "interrupted" (a plain run says what it stored)
                _kept_line(f"{f.store}: nothing was stored or removed: an interrupted --replace run leaves the "
                           "collection as it was")
            raise


def _embed_items(f: EmbedArgs, items: list[tuple[str, str]], docs: list[tuple[str, str]]) -> None:
    """Load the model, embed the texts (or with --docs the documents' chunks), print or store them."""
    from localgen.cli.output import ErrWriter
    from localgen.cli.signals import ignoring_ctrl_c
    from localgen.embeddings import store as collections

    backend = _backend(f, _typed(f.model))
    kept = _kept(f.model)
    reused: dict[str, bytes] = {}
    try:
        name = backend.name
        model_id = None
        if f.store:
            # the collection's model, pooling and size are known now: a mismatch is refused before any work
            model_id = collections.fingerprint(backend.engine.model.path, backend.engine.adapters)
            embedder = backend.embedder(f.pooling)
            if f.dimensions is None or f.dimensions <= embedder.n_embd:  # (more: embed's own error, below)
                collections.check(collections.Collection(f.store, name, kept, embedder.pooling,
                                                         f.dimensions or embedder.n_embd, f.normalize, model_id))
        if f.docs:
            items = documents.chunked(f, backend, docs)
        if f.store:
            # with --replace every text must end up under its own id: one held under another id is stored again
            # (with --docs, a chunk whose text another id holds takes that id's vector: a line added at the top
            # of a file moves its chunks)
            skip = collections.unchanged(f.store, items, any_id=bool(f.texts) and not f.replace and not f.docs)
            if f.docs:
                reused = collections.reusable(f.store, [(i, t) for i, t in items if i not in skip])
            todo = [(i, t) for i, t in items if i not in skip and i not in reused]
        else:
            skip, todo = set(), items
        vectors: list[Any] = []
        interrupted = False
        # printed vectors stream (each step's lines as it ends, none kept): `| head -1` ends it, and 100,000 texts
        # do not hold 100,000 vectors; --json is one object and --store one transaction, made at the end
        emit = None if f.store or f.json_out else _vector_lines(f, todo)
        try:
            _embed_steps(backend, [t for _, t in todo], f, vectors, emit)
        except KeyboardInterrupt:
            if f.store and not vectors and not f.replace:  # before a step was whole: said, not a bare "interrupted"
                _kept_line(f"{f.store}: 0 of {len(todo):,} embedded before the first step ended: nothing was "
                           "stored (the collection is as it was)")
            if not (f.store and vectors) or f.replace:  # --replace: the collection as it was, or as asked
                raise
            interrupted = True  # what was embedded is stored below, then the interrupt goes on
        embedder = backend.embedder(f.pooling)
        pooling, size = embedder.pooling, embedder.n_embd
    finally:
        backend.close()
    if f.store and interrupted:
        with ignoring_ctrl_c():  # another press of a burst would roll the storing back
            _store_part(f, collections.Collection(f.store, name, kept, pooling, len(vectors[0].vector),
                                                  f.normalize, model_id),
                        todo, vectors, [(i, t, reused[i]) for i, t in items if i in reused])
        raise KeyboardInterrupt
    if f.store:
        dims = len(vectors[0].vector) if vectors else (f.dimensions or size)
        # checked (in put) even when every text is unchanged: another model's run must neither store nor remove
        err = ErrWriter()
        made = collections.Collection(f.store, name, kept, pooling, dims, f.normalize, model_id)
        rows: list[tuple[str, str, list[float] | bytes]] = [
            (i, t, v.vector) for (i, t), v in zip(todo, vectors, strict=True)]
        rows += [(i, t, reused[i]) for i, t in items if i in reused]
        # the removal is in put's one transaction, after every row: a run that fails before it removes nothing
        # with --docs, also each file's chunks it no longer yields (a shorter file leaves no stale FILE#7)
        keep = [i for i, _ in items] if f.replace else None
        gone = collections.put(made, rows, keep=keep, waiting=err.line_once, files=[d for d, _ in docs],
                               given=[i for i, _ in items])
        with ignoring_ctrl_c():  # stored: a press now is no "nothing was stored" (an interrupted --replace's words)
            removed = f", {gone:,} removed" if f.replace or gone else ""
            cut = f" {plural(len(docs), 'file')} in {plural(len(items), 'chunk')}:" if f.docs else ""
            err.line(f"{f.store}:{cut} {len(todo):,} embedded and stored, {len(skip) + len(reused):,} unchanged"
                     f"{removed}")
            if f.docs and reused:  # a document's texts came from another: the same file by another path?
                _warn_copies(err, f.store, [d for d, _ in docs])
        return
    if emit is None:
        _print_vectors(f, name, pooling, todo, vectors)


NAMED_COPIES = 3  # documents named in warnings that they hold texts stored already; the rest counted


def _warn_copies(err: Any, store: str, docs: list[str]) -> None:
    """Warn of documents whose texts the collection holds under another document's ids: the same file stored by
    another path. Two files of this run whose texts are equal (copies in one folder) are two files, not that."""
    import os

    from localgen.embeddings import store as collections

    here = set(docs)

    def same_file(a: str, b: str) -> bool:
        try:
            return os.path.samefile(a, b)
        except OSError:
            return False

    found = []
    for copy, others in collections.copies(store, docs).items():
        other = next((o for o in others if o not in here or same_file(copy, o)), None)
        if other is not None:
            found.append((copy, other))
    for copy, other in found[:NAMED_COPIES]:
        err.warn(f"{store}: {copy} holds the same text as {other}, stored already: the same file by another path? "
                 f"The collection now has both; remove one with `localgen collections rm {store} --id ID`, or store "
                 "the folder again with --replace")
    if len(found) > NAMED_COPIES:
        err.warn(f"{store}: {len(found) - NAMED_COPIES:,} more files hold texts stored already under other paths")


def _check_flags(f: EmbedArgs) -> None:
    """The usage errors of embed's flags and their combinations, before anything is read or loaded."""
    from localgen.engine.embed import POOLING
    from localgen.text import checked

    if f.fmt not in ("float", "base64"):
        raise UsageError(f"--format takes float or base64, not {f.fmt!r}")
    if f.pooling is not None and f.pooling not in POOLING:
        raise UsageError(f"--pooling takes mean, cls or last, not {f.pooling!r}")
    if f.pooling == "rank":  # whatever the model: rank pooling is a reranker's scores
        raise UsageError("--pooling rank needs a reranker model and gives relevance scores, not embeddings: "
                         "`localgen rerank -m RERANKER` scores documents", hint="choose --pooling mean, cls or last")
    o.refuse_empty(("--store", f.store))
    if f.store:
        checked(f.store, "--store")  # a byte that is not UTF-8 cannot be a name SQLite stores
    if f.store and controls(f.store):  # one line a collection, wherever listed
        raise UsageError(f"--store {f.store!r}: a collection's name cannot hold control characters (a newline, a tab)")
    if f.store and f.store != f.store.strip():  # listed, it would read as another collection's name
        raise UsageError(f"--store {f.store!r}: a collection's name cannot begin or end with a space",
                         hint=f"--store {f.store.strip()!r}")
    if f.replace and not f.store:
        raise UsageError("--replace needs --store NAME (the collection whose other entries it removes)")
    shaping = [flag for flag, on in (("--json", f.json_out), ("--format", f.given("fmt"))) if on]
    if f.store and shaping:
        raise UsageError(f"{' and '.join(shaping)} shape{'s' if len(shaping) == 1 else ''} the printed vectors; "
                         "--store prints none (it stores them)", hint="leave out " + " and ".join(shaping))


def _vector(f: EmbedArgs, ident: str, v: Any) -> dict[str, Any]:
    """One text's printed entry: {"id", "embedding", "tokens"}, the vector as floats or (--format base64) float32."""
    from localgen.embeddings import store as collections

    return {"id": ident, "embedding": collections.b64(v.vector) if f.fmt == "base64" else v.vector, "tokens": v.tokens}


def _print_vectors(f: EmbedArgs, model: str, pooling: str, todo: list[tuple[str, str]], vectors: list[Any]) -> None:
    """With --json: one object with the model's name and pooling, and every text's entry."""
    data = [_vector(f, i, v) for (i, _), v in zip(todo, vectors, strict=True)]
    doc = {"model": model, "pooling": pooling, "dimensions": len(vectors[0].vector), "normalized": f.normalize,
           "data": data, "tokens": sum(v.tokens for v in vectors)}
    _ndjson([doc])


def _vector_lines(f: EmbedArgs, todo: list[tuple[str, str]]) -> Callable[[int, list[Any]], bool]:
    """What prints each step's vectors as NDJSON lines, `todo[start]`'s first; it says False once the reader has
    gone away."""
    import json

    from localgen.cli.output import TextWriter

    out = TextWriter(sys.stdout)

    def emit(start: int, vectors: list[Any]) -> bool:
        lines = [json.dumps(_vector(f, todo[start + k][0], v), ensure_ascii=False) + "\n"
                 for k, v in enumerate(vectors)]
        return out.write("".join(lines))

    return emit


STEP = 64  # texts embedded at a time: how far it is shows on a terminal, and Ctrl-C with --store keeps them
# no tokenizer makes more tokens of a text than its UTF-8 bytes, but for the special tokens it adds (BOS, EOS, a
# BERT's CLS and SEP, a SentencePiece prefix): a text of fewer bytes than the window less these fits it, and is
# tokenized only when embedded
SPECIAL_ROOM = 8


def _embed_steps(backend: Any, texts: list[str], f: EmbedArgs, done: list[Any],
                 emit: Callable[[int, list[Any]], bool] | None = None) -> None:
    """Embed the texts STEP at a time, saying how far on stderr when it is a terminal and there is more than one
    step: each step's vectors into `done` (so an interrupt leaves what was embedded there), or given `emit`, to it
    and not kept (`emit` saying False, the reader gone, ends it). Without --truncate every text is tokenized
    first: one too long for the window is the error before any is embedded, printed or stored."""
    from localgen.engine.embed import DimensionsOutOfRange

    if not f.truncate:
        embedder = backend.embedder(f.pooling)
        for t in texts:
            if len(t.encode("utf-8", "surrogatepass")) + SPECIAL_ROOM > embedder.n_ctx:  # (else it cannot be)
                embedder.tokens(t)  # raises for a text past the window
    err = sys.stderr
    # (not where the printed lines go to the same terminal: they would run into it)
    show = err is not None and err.isatty() and len(texts) > STEP and (emit is None or not sys.stdout.isatty())
    made = 0
    if show:  # from the start: a first step takes a minute on a slow machine, which looked like nothing at all
        err.write(f"\rembedding: 0 of {len(texts):,}")
        err.flush()
    try:
        for start in range(0, len(texts), STEP):
            try:
                got = backend.embed(texts[start:start + STEP], f.pooling, f.normalize, f.dimensions, f.truncate)
            except DimensionsOutOfRange as e:  # the engine's words name the APIs' field: here it is the flag
                raise UsageError(f"--{e.message}") from None
            made += len(got)
            if emit is None:
                done += got
            elif not emit(start, got):
                return
            if show:
                err.write(f"\rembedding: {made:,} of {len(texts):,}")
                err.flush()
    finally:
        if show:
            err.write("\r\033[K")  # the progress line goes; what follows starts the line
            err.flush()


def _store_part(f: EmbedArgs, made: Collection, todo: list[tuple[str, str]], vectors: list[Any],
                reused: list[tuple[str, str, bytes]]) -> None:
    """After Ctrl-C: store what was embedded, and the texts that take a stored vector (nothing removed: a run that
    ends removes the stale entries), so that the same command again embeds only the rest (stored texts are
    unchanged ones)."""
    from localgen.cli.output import ErrWriter
    from localgen.embeddings import store as collections

    assert f.store is not None
    err = ErrWriter()
    rows: list[tuple[str, str, list[float] | bytes]] = [
        (i, t, v.vector) for (i, t), v in zip(todo, vectors, strict=False)]
    collections.put(made, rows + list(reused), waiting=err.line_once)
    import signal

    from localgen.cli.signals import ended_by_term

    why = signal.Signals(ended_by_term()).name if ended_by_term() else "Ctrl-C"
    _kept_line(f"{f.store}: {len(vectors):,} of {len(todo):,} embedded and stored before {why}; the same command "
               "again embeds the rest", err)


def _kept_line(text: str, err: ErrWriter | None = None) -> None:
    """What an interrupted --store run kept, said in one line: after Ctrl-C it is the "interrupted" line (the exit
    adds no second one); after a SIGTERM or SIGHUP, which the exit says nothing of, a plain line."""
    from localgen.cli.output import ErrWriter
    from localgen.cli.signals import ended_by_term

    err = err or ErrWriter()
    if ended_by_term():
        err.line(text)
    else:
        err.interrupted(text)


def run_similar(f: SimilarArgs) -> None:
    """Embed the query as the collection was made, and rank its texts by cosine similarity."""

    from localgen.embeddings.retrieve import Retriever
    from localgen.text import checked

    checked(f.collection, "the collection")
    query = checked(_asked(f.query), "the query")
    with Retriever(f.collection, lambda spec: _backend(f, spec)) as retriever:
        if not retriever.rows:  # (every entry removed): said before any model loads, not an empty answer unsaid
            from localgen.cli.output import ErrWriter

            ErrWriter().line(f"the collection {f.collection!r} is empty: there is nothing to rank")
            return
        vector = retriever.embed_query(query, truncate=f.truncate)
    hits = retriever.rank(vector, f.count)
    _ndjson({"id": h.id, "score": h.shown_score, "content": h.text} for h in hits)
