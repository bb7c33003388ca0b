"""The Responses API's file_search tool over serve --collection's vector stores: before the model answers, the
request's last user message is searched for in the stores the tool names (serve/vectorstores.py), and the best
texts are put into that message ahead of the question, each under its id, with the instruction to answer from
them (embeddings/retrieve.py's rag_message: what run --rag and chat --rag send). The search is a
`file_search_call` output item before the answer (its results with include ["file_search_call.results"]). The
model is not asked to write the query: a small local model answers better from a search for the question
itself, and the request is answered in one pass."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from localgen.embeddings.retrieve import Hit, rag_message
from localgen.serve.apierror import HTTPError
from localgen.serve.state import ServeState
from localgen.serve.vectorstores import MAX_RESULTS, check_offered, search

DEFAULT_RESULTS = 5  # excerpts per request: a local model's window is small (OpenAI's default is 10)

# the file_search_call item a request's search made, for the encoder (set by the Responses parser)
SEARCHED: ContextVar[dict[str, Any] | None] = ContextVar("localgen_file_search", default=None)


@dataclass(frozen=True)
class FileSearch:
    """A file_search tool: the stores searched, how many texts at most, the lowest score kept."""

    stores: tuple[str, ...]
    count: int
    threshold: float | None


def tool(state: ServeState, t: dict[str, Any]) -> FileSearch:
    """A file_search tool as OpenAI spells it, checked: every store one serve offers; what is not done here
    (filters) a 400."""
    ids = t.get("vector_store_ids")
    if not isinstance(ids, list) or not ids:
        raise HTTPError(400, "a file_search tool needs vector_store_ids: a non-empty list", param="tools")
    stores = tuple(dict.fromkeys(check_offered(state, i, "tools") for i in ids))
    count = t.get("max_num_results", DEFAULT_RESULTS)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_RESULTS:
        raise HTTPError(400, f"file_search's max_num_results must be a whole number from 1 to {MAX_RESULTS}",
                        param="tools")
    if t.get("filters") is not None:
        raise HTTPError(400, "file_search's filters are not supported: a collection's entries have no attributes",
                        param="tools")
    ranking = t.get("ranking_options") or {}
    threshold = ranking.get("score_threshold") if isinstance(ranking, dict) else None
    if not isinstance(ranking, dict) or (threshold is not None and (
            isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not -1 <= threshold <= 1)):
        raise HTTPError(400, "file_search's ranking_options.score_threshold must be a number from -1 to 1",
                        param="tools")
    return FileSearch(stores, count, None if threshold is None else float(threshold))


async def run(state: ServeState, fs: FileSearch, messages: list[dict[str, Any]], first: int, results: bool,
              ident: str) -> list[dict[str, Any]]:
    """Search for the text of the last user message from `first` on (the request's own input), and the messages
    with the best texts put into it (unchanged when there is none to search for); the file_search_call item,
    for the encoder, in SEARCHED."""
    at = next((i for i in range(len(messages) - 1, first - 1, -1) if messages[i].get("role") == "user"), None)
    question = _text(messages[at]["content"]) if at is not None else ""
    if not question.strip():
        SEARCHED.set({"type": "file_search_call", "id": ident, "status": "completed", "queries": [],
                      "results": [] if results else None})
        return messages
    hits: list[Hit] = []
    for name in fs.stores:
        hits += await search(state, name, [question], fs.count, fs.threshold)
    hits = sorted(hits, key=lambda h: -h.score)[:fs.count]
    SEARCHED.set({"type": "file_search_call", "id": ident, "status": "completed", "queries": [question],
                  "results": [{"file_id": h.id, "filename": h.id, "score": h.shown_score, "text": h.text,
                               "attributes": {}} for h in hits] if results else None})
    if not hits:
        return messages
    assert at is not None
    out = list(messages)
    out[at] = {**messages[at], "content": _with_excerpts(messages[at]["content"], hits)}
    return out


def _with_excerpts(content: Any, hits: list[Hit]) -> Any:
    if isinstance(content, str):
        return rag_message(content, hits)
    parts = [p for p in content if not (isinstance(p, dict) and p.get("type") == "text")]
    return [{"type": "text", "text": rag_message(_text(content), hits)}, *parts]


def _text(content: Any) -> str:
    """A message's text: its string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""
