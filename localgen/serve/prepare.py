"""Jobs made into the scheduler's work (engine/scheduler.py): a generation job into a Request, an embeddings
or rerank job into an EmbedTask, each error raised as what it is. A job with images or audio has its prompt
made off the model's thread: decoding the pictures and sounds and libmtmd's preprocessing of them (what
llama-server does in its HTTP threads) run in a thread of their own, so a large image delays only its own
request, never the streams the model's thread is decoding."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from localgen.errors import EmptyPrompt, LocalgenError, prompt_too_long

if TYPE_CHECKING:
    from localgen.native.prompt import Prompt
    from localgen.serve.jobs import EmbedJob, Job

THREADS = 1  # media prepared at once per model: decoding competes with the model's threads for the cores


class MediaPrep:
    """Jobs whose prompt is being made in the media thread, by scheduler id; `wake` is called (from that
    thread) when one is ready, so the model's thread need not poll."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        self._pool: ThreadPoolExecutor | None = None
        self._pending: dict[int, tuple[Any, Future[Any]]] = {}

    @property
    def pending(self) -> int:
        """Jobs being prepared."""
        return len(self._pending)

    def jobs(self) -> list[Any]:
        """The jobs being prepared."""
        return [job for job, _ in self._pending.values()]

    def submit(self, job_id: int, job: Job, backend: Any) -> None:
        """Make the job's prompt in the media thread; its model's projector is loaded first, here (in the
        model's thread), where a model that cannot read media is an error."""
        backend.check_generates()
        backend.projector()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(THREADS, thread_name_prefix="localgen-media")
        future = self._pool.submit(backend.prompt, job.request)
        self._pending[job_id] = (job, future)
        future.add_done_callback(lambda _f: self._wake())

    def ready(self) -> list[tuple[int, Any, Any, BaseException | None]]:
        """The jobs whose prompt is made: (id, job, prompt, None), or (id, job, None, the error)."""
        out = []
        for job_id, (job, future) in list(self._pending.items()):
            if future.done():
                del self._pending[job_id]
                error = future.exception()
                out.append((job_id, job, None if error else future.result(), error))
        return out

    def clear(self) -> list[Any]:
        """Forget every pending job (their results are dropped); returns them."""
        jobs = self.jobs()
        for _job, future in self._pending.values():
            future.cancel()
        self._pending.clear()
        return jobs

    def close(self) -> None:
        """Wait for the preparation under way (bounded: media are checked for size before they get here)."""
        self.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def has_media(job: Job) -> bool:
    """Whether a generation job's messages hold images or audio (serve's messages() joins text-only content
    parts into a string, so list content is media)."""
    msgs = job.request.messages
    return job.request.prompt is None and any(isinstance(m.get("content"), list) for m in msgs or ())


def request(backend: Any, pc: Any, job_id: int, job: Job, prompt: Prompt | None = None) -> Any:
    """The job as a scheduler Request, its prompt made here unless given (made in the media thread)."""
    from localgen.engine.batchseq import Request

    if prompt is None:
        backend.check_generates()
        prompt = backend.prompt(job.request)
    if job.request.sampling.grammar:
        backend.engine.check_grammar(job.request.sampling.grammar)
    n = len(prompt.tokens)
    if n == 0 and job.request.sampling.max_tokens != 0:  # "" without a BOS: nothing llama.cpp can decode
        raise EmptyPrompt("messages" if job.request.messages else "prompt")
    if n >= pc.n_ctx_seq and job.request.sampling.max_tokens != 0:  # nothing to generate: counted (count_tokens)
        if job.request.truncate_keep is None or prompt.spans:  # media are never cut through
            raise prompt_too_long(f"the prompt is {n:,} tokens; each slot's context window is {pc.n_ctx_seq:,}", n,
                                  pc.n_ctx_seq)
        prompt = cut(prompt, job.request.truncate_keep, pc.n_ctx_seq - 1, backend.engine.bos)
    return Request(job_id, prompt, job.request.sampling, job.seed, job.request.logprobs, exact=job.request.exact,
                   cancelled=job.cancelled.is_set)


def cut(prompt: Prompt, keep: int, limit: int, bos: int) -> Prompt:
    """A text prompt past the window cut to `limit` tokens as Ollama's runner cuts one: its first `keep` tokens
    (one more where it begins with the BOS; a negative `keep`: all that leave one token of its end), then its end
    (serve/ollamatrim.py logs it)."""
    from localgen.native.prompt import Prompt

    tokens = prompt.tokens
    head = len(tokens) if keep < 0 else keep + (1 if tokens and tokens[0] == bos >= 0 else 0)
    head = min(head, limit - 1)
    return Prompt.text(tokens[:head] + tokens[len(tokens) - (limit - head):])


def task(backend: Any, job_id: int, job: EmbedJob) -> Any:
    """An embeddings or rerank job as a scheduler task (engine/embed.py)."""
    from localgen.engine.embed import EmbedTask

    emb = backend.scorer() if job.query is not None else backend.embedder()
    if job.pooling is not None and emb.pooling != job.pooling:  # another pooling's vectors do not compare
        raise LocalgenError(f"the collection's vectors were made with {job.pooling} pooling, and this model's "
                            f"embeddings here have {emb.pooling} pooling")
    return EmbedTask(job_id, emb, job.texts, True, job.dimensions, job.truncate, job.query, job.cancelled.is_set)
