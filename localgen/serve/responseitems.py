"""The Responses API's answers (serve/responses.py reads the requests): the response object with the request's
settings echoed, the output items an answer's pieces become (reasoning, message, function_call; an mcp tool's
mcp_list_tools, mcp_call and mcp_approval_request), and the `response.*` events that stream them, numbered,
each item opened, streamed and closed before the next (a whole answer is the same items, unstreamed); the
response kept in the store when the request asked (a stream's answer, already sent, stays whole when the store
then fails: an `error` event says it was not stored)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from localgen.backend import Completion
from localgen.serve.apierror import HTTPError, without_paths
from localgen.serve.filesearch import DEFAULT_RESULTS, citations
from localgen.serve.jobs import Event, Job
from localgen.serve.pipeline import parts
from localgen.serve.responsestore import ResponseStore
from localgen.serve.servelog import LOG
from localgen.tools.spec import ToolCall
from localgen.tools.stream import AnswerStream
from localgen.tools.stream import Event as Said
from localgen.types import GenerationRequest, final_text

REDACTED = "[redacted]"  # an mcp tool's header values, as a response echoes them

DECLINED = "The user declined to run this tool call."  # what the model is told of a call refused (as run's and chat's
# tool loops tell it)


def new_id(prefix: str) -> str:
    """A new id for a response or an output item: resp_…, msg_…, rs_…, fc_…."""
    return f"{prefix}_{uuid.uuid4().hex}"


class Encoder:
    """One request's response object and its output items: a piece of another kind than the open item's
    (every tool call) closes it and opens its own."""

    media_type = "text/event-stream"

    def __init__(self, body: dict[str, Any], model: str, request: GenerationRequest, store: ResponseStore | None,
                 conversation: list[dict[str, Any]], inputs: int = -1, searched: dict[str, Any] | None = None,
                 sent: tuple[str, ...] = (), given: list[dict[str, Any]] | None = None) -> None:
        self.ident, self.created, self.model, self.store = new_id("resp"), int(time.time()), model, store
        self.conversation = conversation
        self.inputs = inputs  # how many of the conversation's messages are this request's input
        self.given = given  # the request's input as sent, where truncation folded some of it (None: it did not)
        self.seq = 0  # the next event's sequence_number
        # the items closed so far, whole: first the file_search_call the request's search made (serve/filesearch.py)
        self.output: list[dict[str, Any]] = [searched] if searched is not None else []
        self.searched = searched
        self.sent = sent  # the ids of the texts file_search put into the question: what the answer may cite
        self.kind: str | None = None  # the open item's: reasoning or message
        self.item, self.text = "", ""  # the open item's id and text
        self.content = ""  # the answer's, so far
        self.calls: list[ToolCall] = []
        # the messages the stored conversation ends with, when the server ran tools over several rounds (the
        # Responses API's mcp tool: serve/responsemcp.py); None: the answer as one assistant message
        self.tail: list[dict[str, Any]] | None = None
        tools, text = body.get("tools") or [], body.get("text") or {}
        reasoning: dict[str, Any] = body.get("reasoning") or {}
        # what is echoed is what was checked (serve/responses.py): the known fields, never a request's extras
        choice = body.get("tool_choice") or "auto"
        if isinstance(choice, dict) and choice.get("type") == "mcp":
            choice = {"type": "mcp", "server_label": choice.get("server_label"), "name": choice.get("name")}
        elif isinstance(choice, dict):
            choice = {"type": "function", "name": choice.get("name")}
        fmt = text.get("format") or {"type": "text"}
        said = {"format": {k: fmt[k] for k in ("type", "name", "schema", "description", "strict") if k in fmt}}
        if text.get("verbosity") is not None:
            said["verbosity"] = text["verbosity"]
        self.echo = {
            "instructions": body.get("instructions"), "metadata": body.get("metadata") or {},
            "tools": [_echoed_tool(t) for t in tools],
            "tool_choice": choice,
            "parallel_tool_calls": body.get("parallel_tool_calls") is not False,  # checked by parse (flag)
            "temperature": request.sampling.temperature, "top_p": request.sampling.top_p,
            "max_output_tokens": body.get("max_output_tokens"),
            "previous_response_id": body.get("previous_response_id"), "store": self.store is not None,
            "text": said,
            "reasoning": {"effort": reasoning.get("effort"),
                          "summary": reasoning.get("summary") or reasoning.get("generate_summary")},
            "truncation": body.get("truncation") or "disabled", "user": body.get("user"),
        }

    def response(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None = None,
                 error: dict[str, Any] | None = None) -> dict[str, Any]:
        """The response object, with the request's settings echoed."""
        return {"id": self.ident, "object": "response", "created_at": self.created, "status": status,
                "model": self.model, "output": output, "error": error,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                "usage": usage, **self.echo}

    def event(self, kind: str, **doc: Any) -> bytes:
        """One server-sent event, numbered."""
        data = json.dumps({"type": kind, "sequence_number": self.seq, **doc}, ensure_ascii=False)
        self.seq += 1
        return f"event: {kind}\ndata: {data}\n\n".encode()

    def opening(self, first: Event) -> list[bytes]:
        out = [self.event(f"response.{s}", response=self.response("in_progress", [])) for s in ("created",
                                                                                               "in_progress")]
        if self.searched is not None:  # done before the model began: its item's events, then the answer's
            at = {"output_index": 0, "item_id": self.searched["id"]}
            opened = {**self.searched, "status": "in_progress", "queries": [], "results": None}
            out += [self.event("response.output_item.added", output_index=0, item=opened),
                    *(self.event(f"response.file_search_call.{s}", **at) for s in ("in_progress", "searching",
                                                                                   "completed")),
                    self.event("response.output_item.done", output_index=0, item=self.searched)]
        return out

    def said(self, pieces: list[Said]) -> list[bytes]:
        """The events for pieces of the answer (text, reasoning, tool calls)."""
        out: list[bytes] = []
        for p in pieces:
            if isinstance(p, ToolCall):
                out += [*self.close("completed"), *self._call(p)]
                continue
            kind = "reasoning" if p.kind == "reasoning" else "message"
            if kind != self.kind:
                out += [*self.close("completed"), *self.open(kind)]
            self.text += p.text
            at = {"item_id": self.item, "output_index": len(self.output), "content_index": 0}
            if kind == "reasoning":
                out.append(self.event("response.reasoning_text.delta", **at, delta=p.text))
            else:
                self.content += p.text
                out.append(self.event("response.output_text.delta", **at, delta=p.text, logprobs=[]))
        return out

    def open(self, kind: str) -> list[bytes]:
        """Open an output item (reasoning or message) and its content part."""
        self.kind, self.item, self.text = kind, new_id("rs" if kind == "reasoning" else "msg"), ""
        at = {"output_index": len(self.output)}
        return [self.event("response.output_item.added", **at, item=_item(kind, self.item, None, "in_progress")),
                self.event("response.content_part.added", item_id=self.item, **at, content_index=0,
                           part=_part(kind, ""))]

    def close(self, status: str) -> list[bytes]:
        """Close the open item (if any): its .done events, whole."""
        if self.kind is None:
            return []
        at = {"item_id": self.item, "output_index": len(self.output), "content_index": 0}
        cited = citations(self.text, self.sent) if self.kind == "message" and self.sent else []
        item = _item(self.kind, self.item, self.text, "completed" if self.kind == "reasoning" else status, cited)
        out = [self.event("response.output_text.annotation.added", **at, annotation_index=i, annotation=a)
               for i, a in enumerate(cited)]
        out.append(self.event("response.reasoning_text.done", **at, text=self.text) if self.kind == "reasoning" else
                   self.event("response.output_text.done", **at, text=self.text, logprobs=[]))
        out += [self.event("response.content_part.done", **at, part=_part(self.kind, self.text, cited)),
                self.event("response.output_item.done", output_index=len(self.output), item=item)]
        self.output.append(item)
        self.kind = None
        return out

    def _call(self, call: ToolCall) -> list[bytes]:
        self.calls.append(call)
        ident, index = new_id("fc"), len(self.output)
        at = {"item_id": ident, "output_index": index}
        self.output.append(_call_item(ident, call, "completed"))
        return [self.event("response.output_item.added", output_index=index,
                           item=_call_item(ident, call, "in_progress", "")),
                self.event("response.function_call_arguments.delta", **at, delta=call.arguments),
                self.event("response.function_call_arguments.done", **at, arguments=call.arguments),
                self.event("response.output_item.done", output_index=index, item=self.output[-1])]

    def listed(self, label: str, tools: list[dict[str, Any]], error: str | None) -> list[bytes]:
        """An mcp_list_tools item (the tools an MCP server listed, or why it could not) and its events."""
        closed = self.close("completed")  # what the model said before it, first
        ident, index = new_id("mcpl"), len(self.output)
        item = {"type": "mcp_list_tools", "id": ident, "server_label": label, "tools": tools, "error": error}
        self.output.append(item)
        at = {"item_id": ident, "output_index": index}
        return [*closed,
                self.event("response.output_item.added", output_index=index, item={**item, "tools": [], "error": None}),
                self.event("response.mcp_list_tools.in_progress", **at),
                self.event(f"response.mcp_list_tools.{'failed' if error else 'completed'}", **at),
                self.event("response.output_item.done", output_index=index, item=item)]

    def mcp_call(self, label: str, name: str, arguments: str, output: str | None, error: dict[str, Any] | None,
                 approval: str | None = None) -> list[bytes]:
        """An mcp_call item (a call the server ran: its output, or its error) and its events."""
        closed = self.close("completed")
        ident, index = new_id("mcp"), len(self.output)
        item = {"type": "mcp_call", "id": ident, "server_label": label, "name": name, "arguments": arguments,
                "output": output, "error": error, "status": "failed" if error else "completed",
                "approval_request_id": approval}
        self.output.append(item)
        at = {"item_id": ident, "output_index": index}
        opened = {**item, "arguments": "", "output": None, "error": None, "status": "in_progress"}
        return [*closed, self.event("response.output_item.added", output_index=index, item=opened),
                self.event("response.mcp_call.in_progress", **at),
                self.event("response.mcp_call_arguments.delta", **at, delta=arguments),
                self.event("response.mcp_call_arguments.done", **at, arguments=arguments),
                self.event(f"response.mcp_call.{'failed' if error else 'completed'}", **at),
                self.event("response.output_item.done", output_index=index, item=item)]

    def approval(self, ident: str, label: str, name: str, arguments: str) -> list[bytes]:
        """An mcp_approval_request item (a call that waits for the client's mcp_approval_response) and its events."""
        closed = self.close("completed")
        index = len(self.output)
        item = {"type": "mcp_approval_request", "id": ident, "server_label": label, "name": name,
                "arguments": arguments}
        self.output.append(item)
        return [*closed, self.event("response.output_item.added", output_index=index, item=item),
                self.event("response.output_item.done", output_index=index, item=item)]

    def failed(self, e: HTTPError) -> list[bytes]:
        """After the stream began: what was said so far stays in the output, and the response fails."""
        error = {"code": "server_error" if e.status >= 500 else "invalid_prompt", "message": without_paths(e.message)}
        return [*self.close("incomplete"), self.event("response.failed",
                                                      response=self.response("failed", self.output, error=error))]

    async def done(self, c: Completion, job: Job) -> list[bytes]:
        """The stream's end. Its answer is already sent: a store that fails to keep it now (damaged since the
        request's check) is an `error` event saying so, the response marked `store: false` and one line in the
        server's log, never a stream cut short."""
        out, doc = self._end(c)
        try:
            await self._keep(doc)
        except HTTPError as e:
            LOG.get().error(f"{e.logged or e.message} (response {self.ident} was answered but not stored)")
            out.append(self.event("error", code="server_error", param=None,
                                  message=f"the answer was sent but not stored: {without_paths(e.message)}"))
            doc = {**doc, "store": False}
        return [*out, self.event(f"response.{doc['status']}", response=doc)]

    async def whole(self, c: Completion, job: Job | None, answer: AnswerStream | None) -> dict[str, Any]:
        """The whole answer; a store that fails to keep it is its 500 (serve/responsestore.py)."""
        assert answer is not None
        self.said(parts(answer))  # the same items, their events unsent
        doc = self._end(c)[1]
        await self._keep(doc)
        return doc

    async def ended(self, c: Completion) -> dict[str, Any]:
        """The whole answer of items already given (said, listed, called), kept when asked."""
        doc = self._end(c)[1]
        await self._keep(doc)
        return doc

    def _end(self, c: Completion) -> tuple[list[bytes], dict[str, Any]]:
        """The last item closed (an empty answer is one empty message), and the response."""
        status = "incomplete" if c.finish_reason in ("length", "context") else "completed"  # (calls before it too)
        answered = len(self.output) > (self.searched is not None)
        out = [*(self.open("message") if self.kind is None and not answered else []), *self.close(status)]
        return out, self.response(status, self.output, usage(c))

    async def _keep(self, doc: dict[str, Any]) -> None:
        """The response kept when asked, with its conversation and the answer as an assistant message."""
        if self.store is None:
            return
        said: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.calls:
            said["tool_calls"] = [call.to_openai() for call in self.calls]
        tail = self.tail if self.tail is not None else [said]
        conversation, inputs, given = self.conversation, self.inputs, self.given
        prefill = final_text(conversation)
        if prefill is not None and tail and tail[0]["role"] == "assistant":  # the answer went on from it: one message
            if given is None and 0 < inputs <= len(conversation):  # input_items still list the prefill as sent
                given = conversation[len(conversation) - inputs:]
            conversation, tail = conversation[:-1], [{**tail[0], "content": prefill + (tail[0]["content"] or "")},
                                                     *tail[1:]]
            inputs = inputs - 1 if inputs > 0 else inputs
        await asyncio.to_thread(self.store.save, self.ident, doc, [*conversation, *tail], inputs, given)


def usage(c: Completion) -> dict[str, Any]:
    """The Responses API's usage object for a finished answer."""
    return {"input_tokens": c.prompt_tokens,
            "input_tokens_details": {"cached_tokens": c.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": c.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": c.prompt_tokens + c.completion_tokens}


def _part(kind: str, text: str, cited: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    if kind == "reasoning":
        return {"type": "reasoning_text", "text": text}
    return {"type": "output_text", "text": text, "annotations": cited or [], "logprobs": []}


def _item(kind: str, ident: str, text: str | None, status: str,
          cited: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A reasoning or message item (text None: opened, with no content yet), a message's text with its
    file_citation annotations."""
    if kind == "reasoning":
        return {"type": "reasoning", "id": ident, "summary": [], "status": status,
                "content": [_part(kind, text)] if text else []}
    return {"type": "message", "id": ident, "status": status, "role": "assistant",
            "content": [] if text is None else [_part(kind, text, cited)]}


def without_userinfo(url: str) -> str:
    """An URL as it may be shown: a `user:password@` in it as `[redacted]@`."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        u = urlsplit(url)
    except ValueError:
        return REDACTED
    if "@" not in u.netloc:
        return url
    return urlunsplit(u._replace(netloc=f"{REDACTED}@{u.netloc.rpartition('@')[2]}"))


def _echoed_tool(t: dict[str, Any]) -> dict[str, Any]:
    """A tool as the response echoes it: a function's fields, file_search's (serve/filesearch.py), or an mcp
    tool's, its headers' and authorization's values redacted."""
    if t.get("type") == "mcp":
        headers = t.get("headers")
        url = t.get("server_url")
        return {"type": "mcp", "server_label": t.get("server_label"),
                "server_url": without_userinfo(url) if isinstance(url, str) else url,
                "allowed_tools": t.get("allowed_tools"), "require_approval": t.get("require_approval") or "always",
                "headers": {k: REDACTED for k in headers} if isinstance(headers, dict) else None,
                **({"authorization": REDACTED} if t.get("authorization") is not None else {}),
                "server_description": t.get("server_description")}
    if t.get("type") == "file_search":
        count, ranking = t.get("max_num_results"), t.get("ranking_options") or {}
        return {"type": "file_search", "vector_store_ids": t.get("vector_store_ids"),
                "max_num_results": count if count is not None else DEFAULT_RESULTS,
                "ranking_options": {"ranker": "auto", "score_threshold": ranking.get("score_threshold")},
                "filters": None}
    return {"type": "function", "name": t.get("name"), "description": t.get("description"),
            "parameters": t.get("parameters"), "strict": t.get("strict")}


def _call_item(ident: str, call: ToolCall, status: str, arguments: str | None = None) -> dict[str, Any]:
    return {"type": "function_call", "id": ident, "call_id": call.id, "name": call.name,
            "arguments": call.arguments if arguments is None else arguments, "status": status}


def replayed_answers(raw: Any) -> int:
    """Where a request's fresh mcp_approval_response items start: those before any other kind of item are an
    earlier turn's, sent back with its history (store: false), answered then and not run again."""
    items = raw if isinstance(raw, list) else []
    return 1 + max((at for at, i in enumerate(items)
                    if not (isinstance(i, dict) and i.get("type") == "mcp_approval_response")), default=-1)
