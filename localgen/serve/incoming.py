"""What a request brings in: its chat messages, checked (media read off the event loop), and the media at
their http(s) URLs, fetched in the request's own bounded pool (Incoming, set per request by serve/app.py's
FrontDoor), stopping when the client leaves."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from localgen import media
from localgen.fetch import FetchPool
from localgen.serve.apierror import HTTPError


@dataclass(frozen=True)
class Incoming:
    """The request being answered, as fetch_media needs it: the pool for its URLs, and its ASGI receive
    (whose next message, once the body is read, says that the client left)."""

    pool: FetchPool
    receive: Callable[[], Awaitable[dict[str, Any]]]


INCOMING: ContextVar[Incoming | None] = ContextVar("localgen_incoming", default=None)


def _media_urls(raw: list[Any]) -> list[str]:
    """The http(s) URLs of a request's image and video parts (and Ollama's `images`), each once."""
    from localgen import media

    urls = []
    for m in raw:
        if not isinstance(m, dict):
            continue
        content, images = m.get("content"), m.get("images")
        for p in content if isinstance(content, list) else []:
            urls.append(media.part_url(p))
        urls.extend(images if isinstance(images, list) else [])
    return list(dict.fromkeys(u for u in urls if isinstance(u, str) and u[:8].lower().startswith(("http://",
                                                                                                   "https://"))))


async def fetch_media(raw: list[Any]) -> dict[str, Any] | None:
    """The Media at each http(s) URL of a request's messages (read_messages), fetched at once
    in the request's pool: None when there are none, a 400 saying why one failed, a 503 when the pool is full
    or closing; every fetch stops when one fails or the client leaves."""
    import functools

    from localgen.fetch import FetchBusy, FetchError, default_pool

    urls = _media_urls(raw)
    if not urls:
        return None
    incoming = INCOMING.get()
    pool = incoming.pool if incoming is not None else default_pool()

    async def one(url: str) -> Any:
        try:
            return await pool.run(functools.partial(media.fetch, url, pool.fetcher))
        except FetchError as e:  # the pool's own: busy, closing, past the deadline
            if isinstance(e, FetchBusy):
                raise
            raise media.MediaError(f"cannot fetch {url}: {e.message}") from None

    tasks = {url: asyncio.ensure_future(one(url)) for url in urls}
    gone = asyncio.ensure_future(_client_left(incoming.receive)) if incoming is not None else None
    waiting: set[asyncio.Future[Any]] = {*tasks.values(), *([gone] if gone else [])}
    try:
        while not all(t.done() for t in tasks.values()):
            done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if gone is not None and gone in done:
                raise HTTPError(499, "the client went away")
            for t in done:
                t.result()  # the first failure ends them all
    except FetchBusy as e:
        raise HTTPError(503, e.message, "server_error") from None
    except media.MediaError as e:
        raise HTTPError(400, e.message, param="messages") from None
    finally:
        for t in (*tasks.values(), *([gone] if gone else [])):
            t.cancel()  # a fetch told to stop stops reading within fetch.POLL_S
    return {url: t.result() for url, t in tasks.items()}


async def _client_left(receive: Any) -> None:
    """Returns when the client disconnects (the body has been read: nothing else comes)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def read_messages(raw: Any, allow_urls: bool = False,
                        inline: media.Inline = media.OPENAI_WORDS) -> tuple[dict[str, Any], ...]:
    """messages(), off the event loop when they may hold media (content parts, Ollama's `images`): decoding up
    to 64 MiB of base64 must not stall every other client. Image URLs (with allow_urls) are fetched and
    checked first, in the server's own bounded pool (fetch_media), never the loop's default one."""
    if isinstance(raw, list) and any(isinstance(m, dict) and (isinstance(m.get("content"), list) or m.get("images"))
                                     for m in raw):
        fetched = await fetch_media(raw) if allow_urls else None
        return await asyncio.to_thread(messages, raw, allow_urls, fetched, inline)
    return messages(raw, allow_urls)


def messages(raw: Any, allow_urls: bool = False, fetched: dict[str, Any] | None = None,
             inline: media.Inline = media.OPENAI_WORDS) -> tuple[dict[str, Any], ...]:
    """Chat messages with string content (OpenAI's text parts are joined; with an image or audio part, the
    parts stay, each medium read and checked here, a fetched URL as a data: URI; `fetched`: the Media
    read_messages fetched, by URL; `inline`: how the API names inline media): an assistant's tool_calls and a
    tool result's tool_call_id (or Ollama's tool_name, and its `images`) are kept; anything else is a 400."""
    if not isinstance(raw, list) or not raw:
        raise HTTPError(400, "`messages` must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "developer", "tool"):
            raise HTTPError(400, "each message needs a role: system, developer, user, assistant or tool",
                            param="messages")
        content = m.get("content")
        images = m.get("images")  # Ollama: base64 strings beside the text
        if images is not None:
            if not isinstance(images, list) or not all(isinstance(i, str) for i in images):
                raise HTTPError(400, "`images` must be a list of base64 strings", param="messages")
            if content is not None and not isinstance(content, str):  # Ollama's content beside images: text
                raise HTTPError(400, "a message's `content` beside its `images` must be a string",
                                param=f"messages.[{i}].content")
            text = content or ""
            content = [*({"type": "image_url", "image_url": {"url": i}} for i in images),
                       {"type": "text", "text": text}]
        if isinstance(content, list):  # [{"type": "text", "text": ...}, {"type": "image_url", ...}, ...]
            if not all(isinstance(p, dict) for p in content):
                raise HTTPError(400, "each content part must be an object", param="messages")
            if any(p.get("type") == "text" and not isinstance(p.get("text"), str) for p in content):
                raise HTTPError(400, "a text part's `text` must be a string", param=f"messages.[{i}].content")
            if all(p.get("type") == "text" for p in content):
                content = "".join(p["text"] for p in content)
            else:
                parts = []
                for p in content:
                    url = media.part_url(p)
                    if fetched and isinstance(url, str) and url in fetched:
                        got, want = fetched[url], "image" if p.get("type") == "image_url" else "video"
                        try:
                            if got.kind != want:
                                raise media.MediaError(f"{url} is {got.format} {got.kind}, where "
                                                       f"{'an image' if want == 'image' else 'a video'} goes")
                            parts.append(got.with_fps(media.part_fps(p)).part(keep_name=False))
                        except media.MediaError as e:
                            raise HTTPError(400, e.message, param="messages") from None
                        continue
                    try:
                        found = media.part_media(p, allow_http=allow_urls, inline=inline)
                    except media.MediaError as e:
                        raise HTTPError(400, e.message, param="messages") from None
                    if found is not None and found.source.lower().startswith(("http://", "https://")):
                        p = found.part(keep_name=False)  # fetched: carried as a data: URI; else as sent
                    parts.append(p)
                content = parts
        if content is None and m["role"] in ("user", "system", "developer"):  # as OpenAI: only a turn of the
            # model's may be its tool calls alone
            raise HTTPError(400, f"a {m['role']} message needs `content` (a string or content parts), not null",
                            param=f"messages.[{i}].content")
        if content is None:
            content = ""
        if not isinstance(content, (str, list)):
            raise HTTPError(400, "message content must be a string or content parts", param="messages")
        role = "system" if m["role"] == "developer" else m["role"]
        msg: dict[str, Any] = {"role": role, "content": content}
        if role == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = _tool_calls(m["tool_calls"])
        if role == "tool":
            for key in ("tool_call_id", "name", "tool_name"):
                if m.get(key) is not None and not isinstance(m[key], str):
                    raise HTTPError(400, f"a tool message's `{key}` must be a string",
                                    param=f"messages.[{i}].{key}")
                if isinstance(m.get(key), str):
                    msg["name" if key == "tool_name" else key] = m[key]
        out.append(msg)
    return tuple(out)


def unanswered(raw: Any) -> tuple[int, str] | None:
    """The first tool result (its index and id) whose tool_call_id is the id of no tool call made before it in
    the conversation (chat messages, unchecked: what is not a message here is messages()'s to refuse). OpenAI's,
    Anthropic's and the Responses API answer such a result with a 400; a result with no id is left to the
    template (llama-server and Ollama send none)."""
    made: set[str] = set()
    for i, m in enumerate(raw if isinstance(raw, list) else ()):
        if not isinstance(m, dict):
            continue
        calls = m.get("tool_calls") if m.get("role") == "assistant" else None
        if isinstance(calls, list):
            made.update(c["id"] for c in calls if isinstance(c, dict) and isinstance(c.get("id"), str))
        ident = m.get("tool_call_id") if m.get("role") == "tool" else None
        if isinstance(ident, str) and ident and ident not in made:  # "" is no id: left to the template
            return i, ident
    return None


def _tool_calls(raw: Any) -> list[dict[str, Any]]:
    """An assistant message's earlier calls, as OpenAI writes them (Ollama's arguments are an object)."""
    if not isinstance(raw, list):
        raise HTTPError(400, "tool_calls must be a list", param="messages")
    calls = []
    for i, c in enumerate(raw):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise HTTPError(400, "each tool call needs function.name", param="messages")
        args = fn.get("arguments", {})
        if not isinstance(args, (str, dict)):
            raise HTTPError(400, "a tool call's arguments must be a JSON string or an object", param="messages")
        calls.append({"id": str(c.get("id") or f"call_{i}"), "type": "function",
                      "function": {"name": fn["name"], "arguments": args}})
    return calls
