"""A conversation fitted to a slot's window, for the Responses API's `truncation: "auto"`: when its prompt, with
room left for the answer, does not fit, its oldest turns are folded into a summary the model writes (the
transcript and request of compact.py, as `chat --compact` writes one), sent after the instructions in
their place; the instructions, an earlier summary's successor and the turn being answered stay word for word.
Where no summary can be written (the model failed, or the window cannot hold a summary request), those turns
are left out instead, as OpenAI's truncation leaves them. The conversation kept with the answer is the fitted
one, its summary a system message of its own, so a follow-up goes on from it without folding again."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from starlette.requests import Request

from localgen import compact
from localgen.serve.apierror import HTTPError
from localgen.serve.running import run_whole
from localgen.serve.served import Served
from localgen.serve.tooling import apply_plan
from localgen.tools.plan import ToolPlan
from localgen.types import GenerationRequest, Message

FOLD_WINDOWS = 2  # a conversation to fold is at most this many times a window's bounds (pipeline.py): its summary
# costs the model's time for every turn it reads (in ordinary text of ~4 characters a token, 2 windows' characters
# are ~16 windows of tokens to summarise)
# the threads that run compact.fold (each waits on the model for its summary), apart from the loop's default pool
_FOLDS = ThreadPoolExecutor(4, thread_name_prefix="summary")


@dataclasses.dataclass(frozen=True)
class Fitted:
    """What fitting did: the request the model gets, the conversation to keep, and how many messages were
    folded into the summary (`folded`) or left out without one (`dropped`)."""

    request: GenerationRequest
    conversation: tuple[Message, ...]
    folded: int = 0
    dropped: int = 0
    summary_tokens: int = 0  # the summary requests' prompt and generated tokens (not the answer's: counted apart)


def room(request: GenerationRequest, window: int) -> int:
    """The tokens kept free for the answer: max_tokens, else an eighth of the window; at most half of it."""
    return min(request.sampling.max_tokens if request.sampling.max_tokens > 0 else window // 8, window // 2)


async def prompt_tokens(worker: Served, request: GenerationRequest, plan: ToolPlan | None, http: Request,
                        keep_alive: float | None) -> int | None:
    """The request's prompt tokens (the tools placed as the request places them), or None when it is past the
    window: the prompt evaluated with nothing generated, so the request that follows reuses its cells."""
    probe = dataclasses.replace(request, sampling=dataclasses.replace(request.sampling, max_tokens=0))
    try:
        _, done = await run_whole(worker, apply_plan(plan, probe), http, keep_alive, answers=False)
    except HTTPError as e:
        if e.overflow is not None:
            return None
        raise
    return done.prompt_tokens


async def fit(worker: Served, request: GenerationRequest, said: tuple[Message, ...], plan: ToolPlan | None,
              http: Request, keep_alive: float | None) -> Fitted:
    """The request with its conversation fitted to a slot's window (unchanged when it fits, or when even the
    instructions and the turn being answered do not: then the usual 400 says so)."""
    window = worker.n_ctx
    limit = window - room(request, window)
    loop = asyncio.get_running_loop()

    async def tokens(messages: list[Message]) -> int | None:
        return await prompt_tokens(worker, dataclasses.replace(request, messages=tuple(messages)), plan, http,
                                   keep_alive)

    async def fits(messages: list[Message], within: int) -> bool:
        n = await tokens(messages)
        return n is not None and n <= within

    head, previous, middle, tail = _parts(list(said))
    if not middle or await fits(list(said), limit):
        return Fitted(request, said)
    apart = await _shows_second_system(tokens)
    budget = compact.budget(window)
    # the fewest oldest turns to fold so that the rest fits beside a summary of full size
    keep_from = await least(len(middle), lambda k: fits([*head, *middle[k:], *tail], limit - budget))
    keep_from = _not_a_result(middle, keep_from)
    spent = [0]
    summary = await _summary(worker, request, http, keep_alive, previous, middle[:keep_from], window, budget, loop,
                             spent)
    if summary is not None:
        covered = (previous[1] if previous else 0) + keep_from
        note: Message = {"role": "system", "content": compact.summary_text(covered, summary)}
        rest = middle[keep_from:]
        while rest and not await fits(_model_form([*head, note, *rest, *tail], apart), limit):
            rest = rest[1:]  # a summary longer than its budget: the oldest turns kept go too, with their results
            rest = rest[_lead(rest):]
        kept = [*head, note, *rest, *tail]
        return Fitted(dataclasses.replace(request, messages=tuple(_model_form(kept, apart))), tuple(kept),
                      folded=keep_from, dropped=len(middle) - keep_from - len(rest), summary_tokens=spent[0])
    kept = [*head, *([_summary_message(previous)] if previous else []), *middle[keep_from:], *tail]
    return Fitted(dataclasses.replace(request, messages=tuple(_model_form(kept, apart))), tuple(kept),
                  dropped=keep_from, summary_tokens=spent[0])


def _parts(messages: list[Message]) -> tuple[list[Message], tuple[str, int] | None, list[Message], list[Message]]:
    """The instructions (the leading system messages), an earlier summary (its text and how many messages it
    stands for), the turns that may be folded, and the turn being answered (from the last user message on)."""
    i = 0
    while i < len(messages) and messages[i]["role"] in ("system", "developer") and not _is_summary(messages[i]):
        i += 1
    head, previous = messages[:i], None
    if i < len(messages) and _is_summary(messages[i]):
        previous = _read_summary(str(messages[i]["content"]))
        i += 1
    last_user = max((j for j in range(i, len(messages)) if messages[j]["role"] == "user"), default=len(messages))
    return head, previous, messages[i:last_user], messages[last_user:]


def must_fit(messages: list[Any]) -> list[Any]:
    """What a fit keeps word for word: the instructions and the turn being answered."""
    i = 0
    while i < len(messages) and isinstance(messages[i], dict) and messages[i].get("role") in ("system", "developer") \
            and not _is_summary(messages[i]):
        i += 1
    last_user = max((j for j in range(i, len(messages)) if isinstance(messages[j], dict)
                     and messages[j].get("role") == "user"), default=len(messages))
    return [*messages[:i], *messages[last_user:]]


def _is_summary(m: Message) -> bool:
    return m["role"] == "system" and isinstance(m["content"], str) and m["content"].startswith(compact.HEADING)


def _read_summary(content: str) -> tuple[str, int]:
    """An earlier summary's text, and the number of messages its heading says it stands for."""
    first, _, text = content.partition(":\n")
    digits = "".join(c for c in first.removeprefix(compact.HEADING).split("message")[0] if c.isascii() and c.isdigit())
    return text, int(digits or 0)


def _summary_message(previous: tuple[str, int]) -> Message:
    return {"role": "system", "content": compact.summary_text(previous[1], previous[0])}


def _lead(messages: list[Message]) -> int:
    """How many tool results lead these messages (their calls folded away): they go with the calls."""
    k = 0
    while k < len(messages) and messages[k]["role"] == "tool":
        k += 1
    return k


def _not_a_result(middle: list[Message], k: int) -> int:
    """A fold that ends before a tool result takes the result too (a result kept without its call is refused
    by most templates)."""
    return k + _lead(middle[k:])


def _model_form(messages: list[Message], apart: bool) -> list[Message]:
    """The conversation as the model gets it: a summary after the instructions in the same system message where
    the template shows only one."""
    if apart:
        return messages
    out: list[Message] = []
    for m in messages:
        if _is_summary(m) and out and out[-1]["role"] == "system" and isinstance(out[-1]["content"], str):
            out[-1] = {**out[-1], "content": f"{out[-1]['content']}\n\n{m['content']}"}
        else:
            out.append(m)
    return out


async def _shows_second_system(tokens: Callable[[list[Message]], Coroutine[Any, Any, int | None]]) -> bool:
    """Whether the template shows a second system message (chat's probe, by token counts: the heading's tokens
    appear, or the template refused it)."""
    one: list[Message] = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]
    try:
        a = await tokens(one)
        b = await tokens([one[0], {"role": "system", "content": compact.HEADING}, one[1]])
    except HTTPError:  # "Conversation roles must alternate": one system message
        return False
    return a is not None and b is not None and b > a


async def least(n: int, ok: Callable[[int], Coroutine[Any, Any, bool]]) -> int:
    """The least k in 1..n for which ok(k) holds (ok is monotone), else n."""
    lo, hi = 1, n
    while lo < hi:
        mid = (lo + hi) // 2
        if await ok(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


async def _summary(worker: Served, request: GenerationRequest, http: Request, keep_alive: float | None,
                   previous: tuple[str, int] | None, turns: list[Message], window: int, budget: int,
                   loop: asyncio.AbstractEventLoop, spent: list[int]) -> str | None:
    """The summary of `turns` (folded into `previous`), written by the model in as many requests as the window
    needs (their tokens added to spent[0]); None when it cannot be written."""

    def wait(coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    def ask(summary: str | None, lines: list[str], max_tokens: int) -> GenerationRequest:
        sampling = dataclasses.replace(request.sampling, max_tokens=max_tokens, temperature=0.0, grammar=None,
                                       grammar_triggers=(), stop=())
        return GenerationRequest(messages=tuple(compact.request_messages(summary, lines)), sampling=sampling)

    async def count(summary: str | None, lines: list[str]) -> bool:
        try:
            _, done = await run_whole(worker, ask(summary, lines, 0), http, keep_alive, answers=False)
        except HTTPError as e:
            if e.overflow is not None:
                return False
            raise
        return done.prompt_tokens + budget <= window

    async def write(summary: str | None, lines: list[str]) -> str:
        _, done = await run_whole(worker, ask(summary, lines, budget), http, keep_alive, answers=False)
        spent[0] += done.prompt_tokens + done.completion_tokens
        text = compact.cleaned(done.text)
        if not text:
            raise compact.CompactionError("the model wrote an empty summary")
        return text

    lines = [compact.line_of(m) for m in turns]
    try:  # in a pool of its own: the thread waits on the model for the whole summary
        text, _ = await loop.run_in_executor(
            _FOLDS, compact.fold, lines, previous[0] if previous else None,
            lambda s, ls: bool(wait(count(s, ls))), lambda s, ls: str(wait(write(s, ls))))
    except (compact.CompactionError, HTTPError):
        return None
    return text
