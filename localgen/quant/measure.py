"""Measuring a model on a text (engine/perplexity.py): load it as llama-perplexity loads (a window of --ctx, weight
repacking on), perplexity alone or saving its logits, or KL divergence against a reference: a logits file, or a model
measured first into a temporary one (its vocabulary and its tokens of the text must be the model's). The disk a
logits file takes is checked before it is written; an interrupt hands back what was measured."""

from __future__ import annotations

import functools
import math
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localgen.errors import LocalgenError, UsageError
from localgen.types import ModelRef
from localgen.units import format_amount, format_bytes

if TYPE_CHECKING:
    from localgen.engine.perplexity import Text

# (what is measured, windows done, windows in all)
OnChunk = Callable[[str, int, int], None]
LOGITS_MAGIC = b"_logits_"


@dataclass(frozen=True)
class Settings:
    """llama-perplexity's settings: the window, the batches, how many windows (None: every one), threads, GPU layers
    (None: as many as fit)."""

    ctx: int = 512
    batch: int = 2048
    ubatch: int = 512
    chunks: int | None = None
    threads: int | None = None
    gpu_layers: int | None = None
    verbose: bool = False


def fitting_batch(ctx: int, batch: int = 2048) -> int:
    """A batch llama-perplexity takes for windows of `ctx`: `batch` where it is smaller than the context or a
    multiple of it, else the largest multiple below it."""
    return batch if batch < ctx or batch % ctx == 0 else ctx * (batch // ctx)


def check_batch(ctx: int, batch: int) -> None:
    """llama-perplexity's rule, before anything loads: the batch is smaller than the context or a multiple of it."""
    if fitting_batch(ctx, batch) != batch:
        raise UsageError(f"the batch ({batch}) must be smaller than the context ({ctx}) or a multiple of it, as "
                         "llama-perplexity requires", hint=f"give -b {fitting_batch(ctx, batch)}, or -b {ctx - 1}")


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a measurement: `measured` is what it had measured (None before the first window)."""

    def __init__(self, measured: Any) -> None:
        super().__init__()
        self.measured = measured


def is_logits_file(path: str) -> bool:
    """Whether `path` names a logits file (ours or llama-perplexity's --kl-divergence-base): a regular file, stat'd
    before it is opened (a FIFO's open waits for a writer; the model resolver refuses it in its words)."""
    import stat

    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False
        with open(path, "rb") as f:
            return f.read(8) == LOGITS_MAGIC
    except OSError:
        return False


def open_model(ref: ModelRef, s: Settings) -> Any:
    """The model loaded for measuring: a window of s.ctx, threads as given (else the rule), weights repacked as
    llama-perplexity loads them."""
    from localgen.models.load import open_engine
    from localgen.types import LoadParams

    params = LoadParams(n_ctx=s.ctx, n_threads=s.threads, n_threads_batch=s.threads, n_gpu_layers=s.gpu_layers,
                        n_batch=min(s.batch, s.ctx), repack=True)
    return open_engine(ref, params, verbose=s.verbose)


def check_text(ref: ModelRef, text: Text | str, ctx: int, chunks: int | None = None) -> int:
    """Refuse, before anything is made or loaded, a model that predicts no text (its vocabulary adds an end token to
    every text) and a text shorter than two windows of `ctx` in the model's tokens (its vocabulary alone is read, no
    weights; the text only as far as the windows measured take). The bytes the model's logits on those windows take
    (a reference's, kept while others are measured against it)."""
    from localgen.engine.perplexity import Windows, check_length, check_predicts_text, leading_tokens, size_of_logits
    from localgen.native import model as native_model
    from localgen.native import vocab as native_vocab

    ptr = native_model.load(ref.path, native_model.ModelOptions(vocab_only=True))
    if ptr is None:
        raise LocalgenError(f"llama.cpp cannot read {ref.name}'s vocabulary")
    try:
        vocab = native_vocab.of_model(ptr)
        check_predicts_text(vocab, ref.name)
        n = len(leading_tokens(lambda t: native_vocab.tokenize(vocab, t.encode("utf-8", "replace"), True, False),
                               text, max(chunks or 0, 2) * ctx if chunks else None))
        n_vocab = native_vocab.n_tokens(vocab)
    finally:
        native_model.free(ptr)
    check_length(n, ctx)
    n_chunk = min(n // ctx, chunks) if chunks else n // ctx
    return size_of_logits(Windows(None, ctx, n_chunk), n_vocab)


def _run(m: Any, label: str, on_chunk: OnChunk | None) -> Any:
    total = m.w.n_chunk
    try:
        if on_chunk is not None:
            on_chunk(label, 0, total)
        for done in m.run():
            if on_chunk is not None:
                on_chunk(label, done, total)
    except KeyboardInterrupt:
        raise Interrupted(m.measured() if m.done else None) from None
    return m.measured()


def _threads(s: Settings) -> tuple[int, int] | None:
    return (s.threads, s.threads) if s.threads else None


def perplexity(engine: Any, text: Text | str, s: Settings, save: Path | None = None,
               on_chunk: OnChunk | None = None, saving: str = "--save-logits: the logits") -> Any:
    """PPL of a loaded model on the text (with s.chunks, read as far as they take); with `save`, its logits kept
    there (written whole, or not at all); `saving` names them where there is not the room."""
    from localgen.engine import perplexity as ppl

    drop_dead()
    w = ppl.windows(engine, text, s.ctx, s.chunks)
    writer = None
    if save is not None:
        from localgen.unnamed import drop_stale

        drop_stale(save)  # the partial file a killed run left beside it (where the folder takes no unnamed file)
        check_space(save.parent, ppl.size_of_logits(w, engine.n_vocab), saving)
        writer = ppl.LogitsWriter(save, w, engine.n_vocab)
    m = ppl.Perplexity(engine, w, s.batch, s.ubatch, _threads(s), save=writer)
    try:
        result = _run(m, engine.model.name, on_chunk)
        if not math.isfinite(result.ppl):  # its logits kept would poison every measure against them
            raise not_numbers(engine.model.name, f"PPL = {result.ppl}")
    except BaseException:
        if writer is not None:
            writer.discard()  # (a logits file written before stays as it was)
        raise
    finally:
        m.close()
    if writer is not None:
        writer.commit()
    return result


def not_numbers(which: str, figure: str, cause: str = "its weights are likely damaged") -> LocalgenError:
    """A measure whose figures are not numbers (NaN or infinite: damaged weights), one error line and exit 1, not
    `PPL = nan` and 0, which a script or a ladder would take for a measurement."""
    return LocalgenError(f"the figures measured with {which} are not numbers ({figure}): {cause}")


def _starts_with(engine: Any, tokens: Any, mine: list[int], text: Text) -> bool:
    """Whether `text` begins with what the logits file's tokens spell in this model's vocabulary (whitespace aside)
    as far as a little past the first one that differs from `mine` (the text's): the same text, tokenized another
    way. (Only the first 200 were spelled: a text edited past them was taken for another vocabulary.)"""
    import numpy as np

    n = min(len(tokens), len(mine))
    differ = np.flatnonzero(np.asarray(tokens[:n]) != np.asarray(mine[:n], dtype=np.int32))
    upto = (int(differ[0]) if differ.size else n) + 64
    spelled = b"".join(engine.piece(int(t)) for t in tokens[:upto]).decode("utf-8", errors="ignore")
    words = spelled.split()[:-1]  # the last piece may be part of a word
    begins = text.prefix(len(spelled.encode("utf-8")) * 2 + 4096)[0]
    return " ".join(begins.split()).startswith(" ".join(words))


def against(engine: Any, reference: Path, s: Settings, text: Text | str | None = None,
            on_chunk: OnChunk | None = None, users_text: bool = False) -> Any:
    """KL divergence (and PPL) of a loaded model against a logits file. With `text` (read as far as the windows
    measured take: a reference model measured on it), the model must tokenize it
    as the reference did; `users_text`: the text came with a logits file the
    user gave, and may be another one than it was saved from."""
    from localgen.engine import perplexity as ppl

    drop_dead()
    reader = ppl.LogitsReader(reference)
    try:
        if reader.n_vocab != engine.n_vocab:
            raise UsageError(f"the reference has another vocabulary ({reader.n_vocab:,} tokens; {engine.model.name} "
                             f"has {engine.n_vocab:,}): KL divergence compares quantizations of one model")
        if s.ctx != reader.n_ctx:
            raise UsageError(f"the reference was measured at a context of {reader.n_ctx}, not {s.ctx}",
                             hint=f"give --ctx {reader.n_ctx}")
        n_chunk = min(reader.n_chunk, s.chunks) if s.chunks else reader.n_chunk
        if text is not None:
            if isinstance(text, str):
                text = ppl.WholeText(text)
            mine = ppl.leading_tokens(functools.partial(engine.tokenize, add_special=True, parse_special=False),
                                      text, reader.n_ctx * n_chunk)
            if list(reader.tokens[: reader.n_ctx * n_chunk]) != mine:
                if users_text and not _starts_with(engine, reader.tokens[: reader.n_ctx * n_chunk], mine, text):
                    raise UsageError(f"the text differs from the one {reference.name} was saved from",
                                     hint="give that text, or no -f: the logits file holds its tokens")
                raise UsageError(f"{engine.model.name} tokenizes the text differently from the reference: another "
                                 "vocabulary")
        w = ppl.Windows(reader.tokens, reader.n_ctx, n_chunk)
        m = ppl.Perplexity(engine, w, s.batch, s.ubatch, _threads(s), reference=reader)
        try:
            return _run(m, engine.model.name, on_chunk)
        finally:
            m.close()
    finally:
        reader.close()


def check_writable(path: Path, what: str) -> None:
    """One clear error, before any measuring, when a file cannot be written at `path`: a folder there, or no folder
    (or no permission) to write it in."""
    folder = path.parent
    if path.is_dir():
        raise UsageError(f"{what}: {path} is a directory")
    if path.exists() and not path.is_file():  # /dev/null, a pipe: the file written would be renamed over it
        raise UsageError(f"{what}: {path} is not a regular file (a device, a pipe or a socket): it is not replaced",
                         hint="give a file's path")
    if not folder.is_dir():
        raise UsageError(f"{what}: cannot write {path}: no such folder {folder}")
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(f"{what}: cannot write {path}: permission denied")


def check_logits_target(path: Path, text: str | None) -> None:
    """--save-logits FILE checked before any measuring: writable, not the text measured (`text`, -f's), and
    replacing nothing but a logits file written before (its magic), so a re-run refreshes its own logits and never
    overwrites other data."""
    check_writable(path, "--save-logits")
    if not path.exists():
        return
    if text is not None and text != "-" and _same_file(path, Path(text)):
        raise UsageError(f"--save-logits: {path} is the text being measured (-f): give another file")
    if path.stat().st_size > 0 and not is_logits_file(str(path)):
        raise UsageError(f"--save-logits: {path} exists and is not a logits file: it is not overwritten",
                         hint="give a new file, or remove that one first")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def logits_context(path: Path) -> int:
    """The context a logits file was saved at (its header's), which a measure against it must use."""
    from localgen.engine import perplexity as ppl

    reader = ppl.LogitsReader(path)
    try:
        return reader.n_ctx
    finally:
        reader.close()


def check_space(folder: Path, need: int, what: str) -> None:
    """One clear error when `folder` has less free space than `need` bytes for `what` (the logits, named)."""
    free = shutil.disk_usage(folder).free
    if free < need:
        raise LocalgenError(f"{what} take {format_bytes(need)} and {folder} has {format_amount(free)} free",
                            hint="measure fewer windows (--chunks N), or free some space")


def logits_folder() -> Path:
    """Where a reference model's logits are kept while the measurement that needs them runs (made here)."""
    from localgen import paths

    return paths.make_dirs(paths.cache_dir() / "perplexity")


def temp_logits(tag: str) -> Path:
    """A file in logits_folder() for a reference model's logits, this process's."""
    d = logits_folder()
    drop_dead()
    return d / f"reference-{tag}-{os.getpid()}.logits"


def drop_dead() -> None:
    """Remove the reference logits (whole, or the partial file being written) that a process which ended without
    its cleanup left in logits_folder() (killed mid-way): named by a process no longer running. They take
    hundreds of MB. Every measurement starts with it."""
    import re

    from localgen import paths
    from localgen.unnamed import running

    folder = paths.cache_dir() / "perplexity"
    for path in folder.glob("*reference-*") if folder.is_dir() else []:
        m = re.fullmatch(r"\.?reference-\w+-(\d+)\.logits(?:\.\d+\.partial)?", path.name)
        if m and int(m.group(1)) != os.getpid() and not running(int(m.group(1))):
            path.unlink(missing_ok=True)


def same_vocabulary(a: ModelRef, b: ModelRef) -> None:
    """Refuse, before any work, two models whose headers give different vocabulary sizes."""
    va, vb = a.summary.vocab_size, b.summary.vocab_size
    if va and vb and va != vb:
        raise UsageError(f"the reference has another vocabulary ({vb:,} tokens; {a.name} has {va:,}): KL divergence "
                         "compares quantizations of one model")
