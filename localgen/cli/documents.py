"""The documents of `embed --store NAME --docs PATH...`, from the flags checked to the chunks: the files the
arguments name, a folder's walked in sorted order (hidden names skipped, linked folders not entered), each
checked to be UTF-8 text from its start and all read whole within one bound, before the model loads (a
folder's file that is not text is skipped, and stderr says so); then each cut into chunks of the embedding
model's own tokens (embeddings/chunk.py). Also the bound, the byte order mark and the id rule that embed's
--file and stdin reading share."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from localgen.errors import LocalgenError, UsageError

MAX_INPUT = 256 * 2**20  # a --file or stdin, or all the documents, read whole before the model loads: bounded
BOM = "\ufeff"  # a byte order mark some editors write at a UTF-8 file's start: not text, dropped
SNIFF_BYTES = 8192  # of each file in a folder, read first: a binary file is skipped without reading the rest
NAMED_SKIPPED = 3  # skipped files named on stderr, at most
CHUNK_TOKENS, CHUNK_OVERLAP = 256, 32  # --docs' defaults


def checked(f: Any) -> list[tuple[str, str]]:
    """--docs: the flags checked (`f`: cli/embed.py's EmbedArgs), then (id, text) of each file of the arguments,
    read before the model loads."""
    if not f.docs:
        flag = "--chunk-tokens" if f.chunk_tokens is not None else "--chunk-overlap"
        raise UsageError(f"{flag} needs --docs (documents cut into chunks)")
    if not f.store:
        raise UsageError("--docs needs --store NAME (the collection the chunks go into)")
    if f.file:
        raise UsageError("--docs takes files and folders as arguments, not --file")
    if not f.texts:
        raise UsageError("--docs needs files or folders as arguments (it does not read stdin)")
    limit = f.chunk_tokens or CHUNK_TOKENS
    if f.chunk_overlap is not None and f.chunk_overlap >= limit:
        raise UsageError(f"--chunk-overlap {f.chunk_overlap:,} must be less than --chunk-tokens ({limit:,})")
    docs = read(f.texts)
    if not any(text.strip() for _, text in docs) and not _exists(f.store):
        # no chunk to store, and no chunks of theirs to remove (files emptied since): the collection would be empty
        raise UsageError(f"nothing to embed: {_some(i for i, _ in docs)} "
                         f"{'is' if len(docs) == 1 else 'are'} empty or only whitespace")
    return docs


def _exists(name: str) -> bool:
    """Whether the collection `name` is there already."""
    from localgen.embeddings import store

    if not store.path().exists():
        return False
    try:
        store.get(name)
    except UsageError:  # no collection of that name
        return False
    return True


def chunked(f: Any, backend: Any, docs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(FILE#N, chunk) of each document, cut by the model's own tokens as it embeds them."""
    from localgen.embeddings.chunk import chunks

    emb = backend.embedder(f.pooling)
    window = emb.n_ctx
    if f.chunk_tokens is not None and f.chunk_tokens > window:
        trained = ", the most this model was trained on" if emb.at_trained else ""  # no --ctx raises it
        raise UsageError(f"--chunk-tokens {f.chunk_tokens:,} is more than the embeddings window ({window:,} "
                         f"tokens{trained})",
                         hint=f"give at most {window:,}" + ("" if trained else ", or a larger --ctx"))
    limit = f.chunk_tokens or min(CHUNK_TOKENS, window)
    overlap = f.chunk_overlap if f.chunk_overlap is not None else min(CHUNK_OVERLAP, limit // 4)
    if overlap >= limit:
        raise UsageError(f"--chunk-overlap {overlap:,} must be less than a chunk's {limit:,} tokens (the "
                         "embeddings window)")

    def count(text: str) -> int:
        return len(emb.engine.tokenize(text, add_special=True))

    return [(f"{ident}#{n}", c.text) for ident, text in docs
            for n, c in enumerate(chunks(text, limit, overlap, count), 1)]


def read(args: list[str]) -> list[tuple[str, str]]:
    """(id, text) of each file of the arguments (a folder's, walked); the files of folders that are not UTF-8
    text, or whose paths an id cannot hold, are skipped with a line on stderr each kind."""
    from localgen.cli.output import ErrWriter, plural

    err = ErrWriter()
    found, unnamable = _files(args)
    if unnamable:
        err.line(f"skipped {plural(len(unnamable), 'file')} whose path holds control characters (a newline, a "
                 f"tab) or bytes that are not UTF-8, which an id cannot: {_some(_quoted(i) for i in unnamable)}")
    docs, skipped = _read(found)
    if skipped:
        err.line(f"skipped {plural(len(skipped), 'file')} that {'is' if len(skipped) == 1 else 'are'} not UTF-8 "
                 f"text: {_some(skipped)}")
    if not docs:
        raise UsageError(f"nothing to embed: no UTF-8 text files in {', '.join(args)}")
    return docs


def _some(names: Iterable[str]) -> str:
    """The first NAMED_SKIPPED names, and how many more."""
    names = list(names)
    more = f" and {len(names) - NAMED_SKIPPED:,} more" if len(names) > NAMED_SKIPPED else ""
    return ", ".join(names[:NAMED_SKIPPED]) + more


def _quoted(path: str) -> str:
    """A path quoted as repr() quotes it (a newline shown as \\n), a byte that is not UTF-8 as \\xe9, as
    types.shown_path writes it elsewhere, not as Python's \\udce9 (an escape follows an even run of backslashes)."""
    import re

    return re.sub(r"(?<!\\)((?:\\\\)*)\\udc([89a-f][0-9a-f])", r"\1\\x\2", repr(path))


def _files(args: list[str]) -> tuple[list[tuple[str, Path, bool]], list[str]]:
    """(id, path, named) of each file the arguments give: a file as typed (normalised), a folder's regular files
    walked in sorted order (hidden files and folders skipped, linked folders not followed) as joined under it;
    each id once. `named`: typed as a file (one that is not text is an error, not skipped). And the folders'
    files whose paths hold control characters or bytes that are not UTF-8 (skipped: an id is one line of text);
    a file or folder so named is an error."""
    import os

    out: dict[str, tuple[str, Path, bool]] = {}
    unnamable: list[str] = []
    for k, arg in enumerate(args, 1):
        if not arg.strip():  # an empty variable in a script: Path("") is the current folder
            raise UsageError(f"--docs: argument {k} is empty: give a file or a folder (. for this one)")
        p = Path(arg)
        if p.is_dir():
            if unnamable_path(arg):
                raise UsageError(f"the folder {_quoted(arg)}: a path with control characters (a newline, a tab) or "
                                 "bytes that are not UTF-8 cannot be an id")
            for rel in _walk(p):
                ident = os.path.normpath(os.path.join(arg, rel))
                if unnamable_path(ident):
                    unnamable.append(ident)
                else:
                    out.setdefault(ident, (ident, p / rel, False))
        elif p.is_file():
            ident = os.path.normpath(arg)
            if unnamable_path(ident):
                raise UsageError(f"the file {_quoted(arg)}: a path with control characters (a newline, a tab) or "
                                 "bytes that are not UTF-8 cannot be an id",
                                 hint="rename it, or store its text with --file")
            out.setdefault(ident, (ident, p, True))
        elif p.exists():
            raise UsageError(f"--docs {arg}: not a file or a folder")
        else:
            raise UsageError(f"--docs {arg}: no such file or folder")
    return list(out.values()), unnamable


def controls(text: str) -> bool:
    """Whether a text holds control characters, C0, DEL or C1 (as JSON ids may not)."""
    return any(ord(c) < 32 or 127 <= ord(c) < 160 for c in text)


def unnamable_path(path: str) -> bool:
    """Whether a path cannot be an id: control characters, or bytes that are not UTF-8 (which Python keeps as
    lone surrogates, and no database or JSON holds)."""
    from localgen.text import problem

    return controls(path) or problem(path) is not None


def _walk(top: Path) -> list[str]:
    """A folder's regular files (and links to them), relative to it, in sorted order; hidden names skipped."""
    import os

    def fail(e: OSError) -> None:
        raise LocalgenError(f"cannot read the folder {e.filename}: {e.strerror}")

    rels = []
    for root, dirs, files in os.walk(top, onerror=fail):  # a linked folder is listed, not entered
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            full = os.path.join(root, name)
            if not name.startswith(".") and os.path.isfile(full):
                rels.append(os.path.relpath(full, top))
    return sorted(rels, key=lambda r: r.split(os.sep))


def _not_text(data: bytes, final: bool = True) -> str | None:
    """Why these bytes are not UTF-8 text (a NUL, or a byte that is not UTF-8: its line), or None; not
    `final`: the start of a file, which may end inside a character."""
    import codecs

    newline = b"\n"
    try:
        codecs.getincrementaldecoder("utf-8")().decode(data, final)
    except UnicodeDecodeError as e:
        return f"byte 0x{data[e.start]:02x} on line {data.count(newline, 0, e.start) + 1:,} is not UTF-8"
    nul = data.find(b"\0")
    if nul >= 0:
        return f"a NUL byte on line {data.count(newline, 0, nul) + 1:,} (a binary file)"
    return None


def _read(found: list[tuple[str, Path, bool]]) -> tuple[list[tuple[str, str]], list[str]]:
    """(id, text) of each file that is UTF-8 text, and the ids of the folders' files that are not. Each file's
    start is read first, and the text files' sizes are added up: past MAX_INPUT, an error before any is read
    whole."""
    import os

    def opened(ident: str, path: Path) -> Any:
        try:
            return path.open("rb")
        except OSError as e:
            raise LocalgenError(f"cannot read {ident}: {e.strerror}") from None

    def not_text(ident: str, named: bool, why: str, skipped: list[str]) -> None:
        if named:
            raise UsageError(f"{ident} is not UTF-8 text: {why}")
        skipped.append(ident)

    texts: list[tuple[str, Path, bool]] = []
    skipped: list[str] = []
    total = 0
    for ident, path, named in found:
        with opened(ident, path) as fh:
            head = fh.read(SNIFF_BYTES)
            why = _not_text(head, final=len(head) < SNIFF_BYTES)
            if why:
                not_text(ident, named, why, skipped)
                continue
            total += os.fstat(fh.fileno()).st_size
            texts.append((ident, path, named))
    _bounded(total)
    out, used = [], 0
    for ident, path, named in texts:
        with opened(ident, path) as fh:
            data = fh.read(MAX_INPUT - used + 1)  # a file that grew since: one byte past the bound at most
        used += len(data)
        _bounded(used)
        why = _not_text(data)
        if why:
            not_text(ident, named, why, skipped)
            continue
        out.append((ident, data.decode("utf-8").removeprefix(BOM).replace("\r\n", "\n").replace("\r", "\n")))
    return out, skipped


def _bounded(size: int) -> None:
    if size > MAX_INPUT:
        raise UsageError(f"the documents are {size / 2**20:,.0f} MiB, more than {MAX_INPUT >> 20} MiB: store "
                         "them in parts")
