"""Perplexity and KL divergence, measured as llama-perplexity measures them (tools/perplexity/perplexity.cpp of the
vendored llama.cpp), so that the figures agree with it:

- the text is tokenized (BOS added when the vocabulary adds it, special-token text left as text) and cut into
  windows of n_ctx tokens; a text shorter than two windows is refused; with a number of windows asked, only as
  much of it is read and tokenized as they take (`leading_tokens`);
- each window is evaluated from an empty cache with BOS in its first position (when the vocabulary adds one), and
  only its second half is scored (from n_ctx/2), each position predicting the next token;
- n_batch // n_ctx windows go into one llama_decode, each its own sequence (a context of n_seq × n_ctx cells);
- PPL = exp(mean NLL), ± PPL × sqrt(var(NLL) / (count - 1));
- a reference's log-probabilities are kept in llama-perplexity's own file format (`_logits_`, n_ctx, n_vocab,
  n_chunk, the tokens, then per scored position a scale, a minimum and n_vocab uint16 steps), so its
  --kl-divergence-base files are read and ours are read by it; KL divergence, Δp and "same top token" per position
  are its formulas, in numpy over blocks of rows (float32 as it computes them, sums in float64: engine/scoring.py)."""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from localgen.engine.scoring import Measured, Sums, Work, divergence, kld_sums, mean_err, nll_sums, row_width
from localgen.errors import LocalgenError, UsageError
from localgen.native import context
from localgen.native import vocab as native_vocab
from localgen.native.batch import Batch

if TYPE_CHECKING:
    from localgen.engine.llama import Engine

MAGIC = b"_logits_"
PART_ROWS = 64  # rows of a window one thread scores at a time
# tokens tokenized past those needed: where a text is cut, its last tokens may differ from the whole text's
MARGIN = 64


class Text(Protocol):
    """A text read only as far as it is asked for."""

    def prefix(self, n_bytes: int) -> tuple[str, bool]:
        """About its first `n_bytes`, cut after a whitespace where it can be; and whether that is all of it."""
        ...


class WholeText:
    """A text already in memory, as a Text."""

    def __init__(self, text: str) -> None:
        self.text = text

    def prefix(self, n_bytes: int) -> tuple[str, bool]:
        """The first `n_bytes` characters (at least as many bytes), and whether that is all of it."""
        return self.text[:n_bytes], n_bytes >= len(self.text)


def leading_tokens(tokenize: Any, text: Text | str, need: int | None) -> list[int]:
    """The text's tokens by `tokenize` (a callable: str to tokens); with `need`, only its first `need` as the whole
    text tokenizes them (all of them when it has fewer), its beginning read and tokenized as far as they take."""
    source = WholeText(text) if isinstance(text, str) else text
    if need is None:
        return list(tokenize(source.prefix(2**62)[0]))
    size = 8 * (need + MARGIN) + 4096  # bytes: English is some 4 a token; doubled until it is enough
    while True:
        part, whole = source.prefix(size)
        tokens = tokenize(part)
        if whole or len(tokens) >= need + MARGIN:
            return list(tokens[:need])
        size *= 2


@dataclass(frozen=True)
class Windows:
    """The text's tokens and how they are cut: n_chunk windows of n_ctx tokens."""

    tokens: Any  # numpy int32, at least n_chunk × n_ctx
    n_ctx: int
    n_chunk: int

    @property
    def first(self) -> int:
        """The first scored position of a window."""
        return self.n_ctx // 2

    @property
    def scored(self) -> int:
        """Positions scored per window (each predicts the next token)."""
        return self.n_ctx - 1 - self.first


def check_length(n_tokens: int, n_ctx: int) -> None:
    """A UsageError for a text of `n_tokens` shorter than two windows of `n_ctx`."""
    if n_tokens < 2 * n_ctx:
        tokens = "1 token" if n_tokens == 1 else f"{n_tokens:,} tokens"
        raise UsageError(f"the text is {tokens}; perplexity at a context of {n_ctx} needs at least "
                         f"{2 * n_ctx:,} (two windows)", hint="give a longer text, or a smaller --ctx")


def check_predicts_text(vocab: Any, name: str) -> None:
    """A UsageError for a model whose vocabulary adds an end token to every text (an embedding model's)."""
    if native_vocab.adds_eos(vocab):
        raise UsageError(f"{name}'s vocabulary adds an end token to every text: perplexity needs a model that "
                         "predicts text (llama-perplexity refuses it too)")


def windows(engine: Engine, text: Text | str, n_ctx: int, chunks: int | None = None) -> Windows:
    """The text's windows as llama-perplexity cuts them (with `chunks`, only the first ones, the text read and
    tokenized as far as they take); a text shorter than two windows is a UsageError."""
    import numpy as np

    check_predicts_text(engine.vocab, engine.model.name)
    need = max(chunks, 2) * n_ctx if chunks else None  # two windows at least: the shortest text measured
    tokens = leading_tokens(functools.partial(engine.tokenize, add_special=True, parse_special=False), text, need)
    check_length(len(tokens), n_ctx)
    n_chunk = len(tokens) // n_ctx
    if chunks is not None and chunks > 0:
        n_chunk = min(n_chunk, chunks)
    return Windows(np.asarray(tokens, dtype=np.int32), n_ctx, n_chunk)


# ---- logits files ----------------------------------------------------------------------------------------------


class LogitsReader:
    """A logits file (ours or llama-perplexity's --kl-divergence-base), checked against its size, read by chunk."""

    def __init__(self, path: Path) -> None:
        import numpy as np

        self.path = path
        try:
            size = path.stat().st_size
            with open(path, "rb") as f:
                head = f.read(20)
        except OSError as e:
            raise UsageError(f"cannot read the reference {path}: {e.strerror or e}") from None
        if len(head) < 20 or head[:8] != MAGIC:
            raise UsageError(f"{path} is not a logits file (llama-perplexity's or localgen's --save-logits)")
        self.n_ctx, self.n_vocab, self.n_chunk = (int(x) for x in np.frombuffer(head[8:20], dtype="<i4"))
        if self.n_ctx < 4 or self.n_vocab < 2 or self.n_chunk < 1:
            raise UsageError(f"{path} is a damaged logits file (context {self.n_ctx}, vocabulary {self.n_vocab}, "
                             f"{self.n_chunk} chunks)")
        self.width = row_width(self.n_vocab)
        self.scored = self.n_ctx - 1 - self.n_ctx // 2
        self.data_at = 20 + 4 * self.n_ctx * self.n_chunk
        need = self.data_at + 2 * self.width * self.scored * self.n_chunk
        if size < need:
            raise UsageError(f"{path} ends early: {size:,} bytes of the {need:,} its header announces")
        if size > need:  # llama-perplexity and --save-logits write exactly what the header announces
            raise UsageError(f"{path} is not a logits file as its header describes: {size:,} bytes, not the "
                             f"{need:,} it announces")
        self.tokens = np.fromfile(path, dtype="<i4", count=self.n_ctx * self.n_chunk, offset=20).astype(np.int32)
        bad = (self.tokens < 0) | (self.tokens >= self.n_vocab)
        if bad.any():  # llama.cpp aborts the process on a token id outside the vocabulary
            raise UsageError(f"{path} is a damaged logits file (token id {int(self.tokens[bad][0])} is outside its "
                             f"vocabulary of {self.n_vocab:,})")
        self._rows: Any = np.memmap(path, dtype="<u2", mode="r", offset=self.data_at,
                               shape=(self.n_chunk, self.scored, self.width))

    def chunk(self, i: int) -> Any:
        """Chunk i's rows: scored × width uint16."""
        return self._rows[i]

    def close(self) -> None:
        """Let go of the file."""
        mm = getattr(self._rows, "_mmap", None)
        self._rows = None
        if mm is not None:
            mm.close()


class LogitsWriter:
    """Writes a logits file in llama-perplexity's format whole or not at all (localgen/unnamed.py: a file with no
    name in its folder where the system allows, so a killed run leaves nothing; else a hidden temp file beside
    it), named when complete (`commit`); `discard` removes it."""

    def __init__(self, path: Path, w: Windows, n_vocab: int) -> None:
        import numpy as np

        from localgen.unnamed import open_unnamed, temp_path

        self.path = path
        fd = open_unnamed(path.parent)
        self.tmp: Path | None = None  # the named temp file, where the folder takes no unnamed one
        if fd is None:
            self.tmp = temp_path(path)
            fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_BINARY", 0), 0o666)
        self.f = os.fdopen(fd, "wb")  # closed by commit or discard
        self.f.write(MAGIC + np.array([w.n_ctx, n_vocab, w.n_chunk], dtype="<i4").tobytes())
        self.f.write(np.ascontiguousarray(w.tokens[: w.n_ctx * w.n_chunk], dtype="<i4").tobytes())

    def write(self, rows: bytes) -> None:
        """Append encoded rows (n × width uint16, as bytes)."""
        self.f.write(rows)

    def commit(self) -> None:
        """Close and move into place."""
        from localgen.unnamed import name_it

        if self.tmp is None:
            self.f.flush()
            try:
                name_it(self.f.fileno(), self.path)
            finally:
                self.f.close()
            return
        self.f.close()
        os.replace(self.tmp, self.path)

    def discard(self) -> None:
        """Close and remove."""
        self.f.close()
        if self.tmp is not None:
            self.tmp.unlink(missing_ok=True)


def size_of_logits(w: Windows, n_vocab: int) -> int:
    """The bytes a logits file of these windows takes."""
    return 20 + 4 * w.n_ctx * w.n_chunk + 2 * row_width(n_vocab) * w.scored * w.n_chunk


# ---- the run -----------------------------------------------------------------------------------------------------


class Perplexity:
    """One measurement on an Engine's model: a context of its own (n_seq windows of n_ctx cells), then `run()`
    yields the chunks done after each decode, and `measured()` gives the figures so far. `save` writes the
    log-probabilities of every scored position (a reference); `reference` measures KL divergence against one."""

    def __init__(self, engine: Engine, w: Windows, n_batch: int = 2048, n_ubatch: int = 512,
                 threads: tuple[int, int] | None = None, save: LogitsWriter | None = None,
                 reference: LogitsReader | None = None) -> None:
        n_ctx = w.n_ctx
        n_seq = max(1, n_batch // n_ctx)
        if not (n_batch < n_ctx or n_batch % n_ctx == 0):
            raise UsageError(f"the batch ({n_batch}) must be smaller than the context ({n_ctx}) or a multiple of it",
                             hint="as llama-perplexity requires")
        if reference is not None and reference.n_vocab != engine.n_vocab:
            raise UsageError(f"the reference has another vocabulary ({reference.n_vocab:,} tokens; "
                             f"{engine.model.name} has {engine.n_vocab:,}): KL divergence compares the same model's "
                             "quantizations")
        self.engine, self.w, self.save, self.reference = engine, w, save, reference
        self.n_seq = n_seq
        self.n_batch = min(n_batch, n_seq * n_ctx)
        p = engine.params
        self.threads = threads or (p.n_threads or 1, p.n_threads_batch or p.n_threads or 1)
        given = engine.origins.get("flash_attn") == "flag"
        engine.release_context()  # its own single window is not used: free its cells
        from localgen.types import KV_CACHE_TYPES

        self.ctx = context.new(
            engine.model_ptr, n_ctx=n_seq * n_ctx, n_batch=self.n_batch, n_ubatch=min(n_ubatch, self.n_batch),
            n_seq_max=n_seq, n_threads=self.threads[0], n_threads_batch=self.threads[1],
            flash_attn_type=(1 if engine.flash_attn else 0) if given else -1,
            type_k=KV_CACHE_TYPES[p.cache_type_k], type_v=KV_CACHE_TYPES[p.cache_type_v], no_perf=True)
        if not self.ctx:
            from localgen.native import logs

            raise LocalgenError(f"llama.cpp could not make a context of {n_seq} × {n_ctx} tokens: "
                                f"{logs.first_error() or 'see --verbose'}", hint="try a smaller --batch-size")
        # a decode holds n_batch tokens (2048 by default: seconds on a busy CPU): Ctrl-C stops it where it is
        self._abort = context.stop_on_ctrl_c(self.ctx)
        self.batch = Batch(self.n_batch)
        import threading
        from concurrent.futures import ThreadPoolExecutor

        self._local = threading.local()
        # the scoring between two decodes, on as many threads as the decode uses (llama-perplexity's workers)
        self.pool = ThreadPoolExecutor(max(1, self.threads[1]), thread_name_prefix="perplexity")
        self.layout: int | None = None  # rows of the batch laid out (positions, sequences, outputs), when one decode
        self.sums = Sums()
        self.done = 0
        self.seconds = 0.0
        self.add_bos = native_vocab.adds_bos(engine.vocab)
        self.bos = native_vocab.bos(engine.vocab)

    def run(self) -> Iterator[int]:
        """Evaluate the windows, n_seq at a time; yields the number of windows done after each group."""
        import numpy as np

        from localgen.native import logs

        w, n_ctx, first = self.w, self.w.n_ctx, self.w.first
        num_batches = (n_ctx + self.n_batch - 1) // self.n_batch
        mem = context.memory(self.ctx)
        tokens = w.tokens
        for i in range(self.done, w.n_chunk, self.n_seq):
            t0 = time.perf_counter()
            start = i * n_ctx
            n_seq_batch = min(self.n_seq, w.n_chunk - i)
            context.clear(mem, True)
            kept: list[Any] = []
            for j in range(num_batches):
                batch_start = start + j * self.n_batch
                size = min(start + n_ctx - batch_start, self.n_batch)
                b = self.batch
                if num_batches == 1:  # the same rows every time but their tokens: laid out once, tokens set at once
                    n_out = self._tokens(tokens, start, n_seq_batch)
                else:
                    b.n_tokens = 0
                    n_out = 0
                    for seq in range(n_seq_batch):
                        seq_start = batch_start + seq * n_ctx
                        for k in range(size):
                            pos = j * self.n_batch + k
                            tok = self.bos if (self.add_bos and j == 0 and k == 0) else int(tokens[seq_start + k])
                            b.add(tok, pos, seq, pos >= first)
                            n_out += pos >= first
                rc = context.decode(self.ctx, b)
                logs.raise_deferred()
                if rc != 0:
                    raise LocalgenError(f"llama.cpp failed to decode a window (code {rc})")
                if num_batches > 1 and n_out:
                    kept.append(np.array(context.logits(self.ctx, n_out, self.engine.n_vocab)))
            per = n_ctx - first
            if num_batches > 1:
                everything = np.concatenate(kept)
            else:
                everything = context.logits(self.ctx, per * n_seq_batch, self.engine.n_vocab)
            parts = [(seq, a, min(a + PART_ROWS, w.scored)) for seq in range(n_seq_batch)
                     for a in range(0, w.scored, PART_ROWS)]

            # parts in the pool's threads (numpy lets go of the GIL), each with buffers of its own; sums and the
            # saved rows taken back in order
            score = functools.partial(self._score, everything, per, start, i)
            for sums, encoded in self.pool.map(score, parts):
                self.sums.add(sums)
                for block in encoded:
                    self.save.write(block)  # type: ignore[union-attr]  # only saving encodes
            self.done = i + n_seq_batch
            self.seconds += time.perf_counter() - t0
            yield self.done

    def _score(self, everything: Any, per: int, start: int, i: int,
               part: tuple[int, int, int]) -> tuple[Sums, list[bytes]]:
        """One part of a window (rows a to z of window i + seq): its sums, and its rows encoded when saving."""
        seq, a, z = part
        n_ctx, first = self.w.n_ctx, self.w.first
        rows = everything[seq * per + a: seq * per + z]
        at = start + seq * n_ctx + first + 1
        targets = self.w.tokens[at + a: at + z]
        sums, encoded = Sums(), []
        work = self._work()
        if self.reference is not None:
            kld_sums(rows, targets, self.reference.chunk(i + seq)[a:z], sums, work)
        elif self.save is not None:
            nll_sums(rows, targets, sums, work, lambda r: encoded.append(r.tobytes()))
        else:
            nll_sums(rows, targets, sums, work)
        return sums, encoded

    def _work(self) -> Work:
        """The calling thread's buffers."""
        work: Work | None = getattr(self._local, "work", None)
        if work is None:
            work = self._local.work = Work(self.engine.n_vocab)
        return work

    def _tokens(self, tokens: Any, start: int, n_seq_batch: int) -> int:
        """One decode's rows for n_seq_batch whole windows from `start` (the windows one after another: a shorter
        last group is a prefix of the layout); the outputs it asks for."""
        n_ctx, first = self.w.n_ctx, self.w.first
        b = self.batch
        if self.layout is None:
            b.n_tokens = 0
            for seq in range(self.n_seq):
                for k in range(n_ctx):
                    b.add(0, k, seq, k >= first)
            self.layout = self.n_seq
            self.view = b.token_view()
        n = n_seq_batch * n_ctx
        self.view[:n] = tokens[start:start + n]
        if self.add_bos:
            self.view[0:n:n_ctx] = self.bos
        b.n_tokens = n
        return n_seq_batch * (n_ctx - first)

    def measured(self) -> Measured:
        """The figures so far (PPL over the positions scored; with a reference, the divergence)."""
        s = self.sums
        if self.reference is not None:
            log_ppl, err = mean_err(s.nll, s.nll2, s.count)
            ppl, ppl_err = math.exp(log_ppl), math.exp(log_ppl) * err
        else:
            mean = s.nll / s.count if s.count else 0.0
            var = s.nll2 / s.count - mean * mean if s.count else 0.0
            ppl = math.exp(mean)
            ppl_err = math.sqrt(var / (s.count - 1)) * ppl if var > 0 and s.count > 1 else 0.0
        evaluated = self.done * self.w.n_ctx
        return Measured(
            model=self.engine.model.name, n_ctx=self.w.n_ctx, n_batch=self.n_batch, n_seq=self.n_seq,
            threads=self.threads[1], chunks=self.done, chunks_total=self.w.n_chunk, tokens=s.count, ppl=ppl,
            ppl_err=ppl_err, seconds=self.seconds, tokens_per_s=evaluated / self.seconds if self.seconds else 0.0,
            complete=self.done >= self.w.n_chunk,
            divergence=divergence(s) if self.reference is not None and s.count > 1 else None)

    def close(self) -> None:
        """Free the context and the batch."""
        if self.ctx is not None:
            self.pool.shutdown()
            context.drop(self)
