"""The Responses API's file_search tool over serve --collection's vector stores: before the model answers, the
request's last user message is searched for in the stores the tool names (serve/vectorstores.py), and the best
texts are put into that message ahead of the question, each under its id, with the instruction to answer from
them (embeddings/retrieve.py's rag_message: what run --rag and chat --rag send), as many as the window holds
with room for the answer, the lowest-scoring left out first (as --rag leaves them). The search is a
`file_search_call` output item before the answer (its results with include ["file_search_call.results"]). The
model is not asked to write the query: a small local model answers better from a search for the question
itself, and the request is answered in one pass. Where the answer cites a text sent as `[id]`, its message
carries a file_citation annotation there. /v1/chat/completions takes the same search as localgen's `file_search`
field (serve/openai.py), its file_search_call item beside the answer."""

from __future__ import annotations

import dataclasses
import re
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from localgen.embeddings.retrieve import Hit, rag_message
from localgen.serve.apierror import HTTPError
from localgen.serve.served import Served
from localgen.serve.state import ServeState
from localgen.serve.vectorstores import check_offered, document, search, search_options
from localgen.types import GenerationRequest, Message

FIELDS = ("vector_store_ids", "max_num_results", "ranking_options", "filters")  # a file_search tool's, but its type
DEFAULT_RESULTS = 5  # excerpts per request: a local model's window is small (OpenAI's default is 10)

# the file_search_call item a request's search made, for the encoder (set by the Responses parser, its results
# those placed in the question)
SEARCHED: ContextVar[dict[str, Any] | None] = ContextVar("localgen_file_search", default=None)
# the ids of the texts placed in the question, which the answer may cite as [id] (its file_citation annotations)
SENT: ContextVar[tuple[str, ...]] = ContextVar("localgen_file_search_sent", default=())


@dataclass(frozen=True)
class FileSearch:
    """A file_search tool: the stores searched, how many texts at most, the lowest score kept."""

    stores: tuple[str, ...]
    count: int
    threshold: float | None
    param: str = "tools"  # the request's field it came in (chat completions': file_search), for its errors


def tool(state: ServeState, t: dict[str, Any], param: str = "tools") -> FileSearch:
    """A file_search tool as OpenAI spells it (or chat completions' `file_search` field: `param`), checked: every
    store one serve offers; what is not done here (filters) a 400."""
    known = FIELDS if param == "file_search" else ("type", *FIELDS)
    unknown = next((k for k in t if k not in known), None)
    if unknown is not None:  # a field not read here is a 400, not silently ignored (max_results for max_num_results)
        said = "a file_search tool" if param == "tools" else f"`{param}`"
        raise HTTPError(400, f"{said} has no field {str(unknown)[:100]!r} (it takes {', '.join(FIELDS)})", param=param)
    ids = t.get("vector_store_ids")
    if not isinstance(ids, list) or not ids:
        said = "a file_search tool" if param == "tools" else f"`{param}`"
        raise HTTPError(400, f"{said} needs vector_store_ids: a non-empty list", param=param)
    try:
        stores = tuple(dict.fromkeys(check_offered(state, i, param) for i in ids))
    except HTTPError as e:
        raise _unchecked(e, param) from None
    count, threshold = search_options(t, DEFAULT_RESULTS, lambda field: (f"file_search's {field}", param))
    return FileSearch(stores, count, threshold, param)


def _unchecked(e: HTTPError, param: str) -> HTTPError:
    """A store the search cannot use (not offered, or removed since serve started), with what to do: leave it out
    of vector_store_ids (on the chat page, whose `file_search` field this is, uncheck it under Documents)."""
    how = "uncheck it under Documents in the chat page's Settings (or leave it out of vector_store_ids)" \
        if param == "file_search" else "leave it out of vector_store_ids"
    return HTTPError(e.status, f"{e.message}; {how}", e.kind, e.param, e.logged)


@dataclass
class Excerpts:
    """What a search found for the question (best first), to be placed in it by the pipeline (`place`)."""

    question: str
    hits: list[Hit]
    item: dict[str, Any]  # the file_search_call item (SEARCHED's)
    results: bool  # include ["file_search_call.results"]

    async def place(self, worker: Served, request: GenerationRequest, plan: Any, http: Request,
                    keep_alive: float | None) -> tuple[GenerationRequest, tuple[Message, ...]]:
        """The request with as many of the texts as fit the window beside the answer's room, in its last user
        message (the question alone when none fits: then the usual 400 says whether it fits at all)."""
        from localgen.serve.fitting import prompt_tokens, room

        messages = list(request.messages or ())
        at = max(i for i, m in enumerate(messages) if m.get("role") == "user")
        if not isinstance(messages[at]["content"], str):  # images or audio beside the question: no excerpts
            self.hits = []
        limit = worker.n_ctx - room(request, worker.n_ctx)
        kept = len(self.hits)
        while kept:
            trial = [*messages[:at], {**messages[at], "content": rag_message(self.question, self.hits[:kept])},
                     *messages[at + 1:]]
            n = await prompt_tokens(worker, dataclasses.replace(request, messages=tuple(trial)), plan, http, keep_alive)
            if n is not None and n <= limit:
                messages = trial
                break
            kept -= 1
        if kept < len(self.hits):
            from localgen.serve.servelog import LOG

            left = self.hits[kept:]
            LOG.get().event("excerpts", worker.name, f"{worker.name}: file_search: {len(left)} excerpt"
                            f"{'s' if len(left) != 1 else ''} left out to fit a slot's window of {worker.n_ctx:,} "
                            f"tokens ({', '.join(h.id for h in left)[:300]}); {kept} sent", left_out=len(left),
                            sent=kept)
        if self.results:
            self.item["results"] = self.item["results"][:kept]
        SEARCHED.set(self.item)
        SENT.set(tuple(h.id for h in self.hits[:kept]))
        return dataclasses.replace(request, messages=tuple(messages)), tuple(messages)


@dataclass(frozen=True)
class Deferred:
    """Chat completions' search, made when the pipeline places its texts (`place`, as Excerpts'): after the request
    was read and checked (its messages, sampling, tools), so a request refused costs no embedding."""

    state: ServeState
    fs: FileSearch
    messages: list[dict[str, Any]]
    ident: str

    async def place(self, worker: Served, request: GenerationRequest, plan: Any, http: Request,
                    keep_alive: float | None) -> tuple[GenerationRequest, tuple[Message, ...]]:
        """The search (its file_search_call item in SEARCHED), then what it found placed as Excerpts.place does."""
        found = await run(self.state, self.fs, self.messages, 0, True, self.ident)
        if found is None:
            return request, tuple(request.messages or ())
        return await found.place(worker, request, plan, http, keep_alive)


async def run(state: ServeState, fs: FileSearch, messages: list[dict[str, Any]], first: int, results: bool,
              ident: str) -> Excerpts | None:
    """Search for the text of the last user message from `first` on (the request's own input); the texts found,
    for the pipeline to place (None when there is nothing to search for, or nothing was found). A conversation
    with no user message at all, or a blank one, is a 400. The file_search_call item, for the encoder, is in
    SEARCHED."""
    at = next((i for i in range(len(messages) - 1, first - 1, -1) if messages[i].get("role") == "user"), None)
    if at is None and not any(m.get("role") == "user" for m in messages[:first]):  # (one before `first`: a chain
        # whose question was searched for then, answered on without a search, as after a tool's output)
        raise HTTPError(400, "file_search searches the stores for the last user message's text: this request has "
                             "no user message", param="messages" if fs.param == "file_search" else "input")
    question = _text(messages[at].get("content")) if at is not None else ""
    if at is not None and not question.strip() and not _media(messages[at].get("content")):
        # as run --rag refuses one: nothing to search for (a question of images or audio alone gets no excerpts)
        raise HTTPError(400, "the question is blank: file_search searches the stores for the last user message's "
                             "text", param="messages" if fs.param == "file_search" else "input")
    if not question.strip():
        SEARCHED.set({"type": "file_search_call", "id": ident, "status": "completed", "queries": [],
                      "results": [] if results else None})
        return None
    found: list[tuple[Hit, str]] = []
    for name in fs.stores:
        try:
            found += [(h, name) for h in await search(state, name, [question], fs.count, fs.threshold)]
        except HTTPError as e:
            if e.param != "vector_store_id":  # the store is gone (serve/vectorstores.py's _gone)
                raise
            raise _unchecked(e, fs.param) from None
    # best first (a tie in the order the stores were named); the same text under the same id in two stores is
    # sent once, from the first
    best: dict[tuple[str, str], tuple[Hit, str]] = {}
    for h, name in sorted(found, key=lambda f: -f[0].score):
        best.setdefault((h.id, h.text), (h, name))
    chosen = list(best.values())[:fs.count]
    hits = [h for h, _ in chosen]
    item = {"type": "file_search_call", "id": ident, "status": "completed", "queries": [question],
            "results": [{"file_id": h.id, "filename": document(h.id), "score": h.shown_score, "text": h.text,
                         "attributes": {"vector_store_id": name}} for h, name in chosen] if results else None}
    SEARCHED.set(item)
    return Excerpts(question, hits, item, results) if hits else None


def citations(text: str, sent: tuple[str, ...]) -> list[dict[str, Any]]:
    """The answer's file_citation annotations: one for each `[id]` it writes of a text it was sent (the
    instruction asks it to cite so), at the index of the bracket, in the order they stand."""
    found = [(m.start(), ident) for ident in dict.fromkeys(sent) for m in re.finditer(re.escape(f"[{ident}]"), text)]
    return [{"type": "file_citation", "file_id": ident, "filename": document(ident), "index": at}
            for at, ident in sorted(found)]


def _media(content: Any) -> bool:
    """Whether a message's content has a part that is not text (an image, audio)."""
    return isinstance(content, list) and any(not (isinstance(p, dict) and p.get("type") in ("text", "input_text"))
                                             for p in content)


def _text(content: Any) -> str:
    """A message's text: its string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""
