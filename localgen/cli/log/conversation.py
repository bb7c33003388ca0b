"""`run` and `chat` against the log: continuing a logged conversation (`run --continue`, `--cid`,
`chat --resume ID`) and recording each exchange, where a failing log is one warning and never a lost
answer (log/store.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from localgen.cli.run.options import LogOptions
from localgen.errors import LocalgenError
from localgen.types import GenerationRequest, Message, SamplingParams, Stats


@dataclass
class Thread:
    """The conversation a run belongs to: its id and the turns logged before this one."""

    cid: str
    turns: list[Message] = field(default_factory=list)
    system: str | None = None
    model_spec: str | None = None  # the model the conversation used, to load again unless -m is given (None: remote)


def thread_for(log: LogOptions) -> Thread:
    """A new conversation, or the one --continue / --cid names (its turns, system prompt and model)."""
    from localgen.log import store

    cid = log.cid
    if not cid and not log.continue_:
        return Thread(store.new_id())
    if not cid:
        cid = store.last_conversation()
        if cid is None:
            raise LocalgenError("--continue: the log has no conversation yet", hint="run without --continue first")
        return logged_thread(cid)
    try:
        return logged_thread(cid)
    except store.NoConversation:  # --cid NAME: a saved chat's conversation in the log
        named = chats_log_id(cid)
        if named is None:
            raise
        return logged_thread(named)


def chats_log_id(name: str) -> str | None:
    """The log's conversation id of the chat saved as `name`; None where there is no such chat (or it has no
    conversation in the log). One that cannot be read is its own error (a damaged file, a newer format)."""
    from localgen.chat.saved import chats_dir, valid_name

    if not valid_name(name) or not (chats_dir() / f"{name}.json").is_file():
        return None
    from localgen.chat.session import ChatSession

    return ChatSession.load(name).log_id


def logged_thread(cid: str) -> Thread:
    """A logged conversation's turns, system prompt and model (a LogError when there is none)."""
    from localgen.log import store
    from localgen.types import path_from_shown

    entries = store.conversation(cid)
    turns: list[Message] = []
    for e in entries:
        turns += [{"role": "user", "content": e.prompt}, {"role": "assistant", "content": e.response}]
    last = entries[-1]
    if last.endpoint:
        spec = None
    elif last.model_spec:
        spec = path_from_shown(last.model_spec)  # a path as logged
    else:  # logged before the default's name was: the default answered it, whatever LOCALGEN_MODEL says now
        from localgen.models.embedded import DEFAULT_MODEL

        spec = DEFAULT_MODEL
    return Thread(cid, turns, without_summary(last.system), spec)


def without_summary(system: str | None) -> str | None:
    """A logged system prompt without the summary of a compacted chat that an older localgen logged in it (or
    as it: the chat had none): a summary of turns the thread sends whole is no system prompt."""
    import re

    from localgen import compact

    if system is None:
        return None
    found = re.search(r"(?:\A|\n\n)" + re.escape(compact.HEADING) + r" \(\d+ messages?, summarized\):\n", system)
    return system if found is None else (system[:found.start()] or None)


def chat_from_log(cid: str, model: str | None) -> Any:
    """A chat (chat --resume ID) that continues a logged conversation (a `run` thread, or a chat whose file is
    gone), with its model, else `model` (-m's), else the default one."""
    from localgen.chat import session as sessions
    from localgen.log import store
    from localgen.models.embedded import DEFAULT_MODEL

    try:
        thread = logged_thread(cid)
    except store.NoConversation:  # a damaged log says so instead (its own LogError)
        raise LocalgenError(f"no saved conversation named {cid!r}, nor a conversation with that id in the log",
                            hint="see `localgen chat --list` and `localgen logs`") from None
    return sessions.ChatSession(name=cid, model=thread.model_spec or model or DEFAULT_MODEL, system=thread.system,
                                messages=thread.turns, fresh=True, log_id=cid)


class _FromRequest:
    """record()'s system prompt: the request's first system message."""


FROM_REQUEST = _FromRequest()


def record(err: Any, backend: Any, request: GenerationRequest, cid: str, text: str, stats: Stats | None,
           finish_reason: str, *, model: str | None, no_log: bool, source: str = "run", remote: bool = False,
           seed: int | None = None, system: str | _FromRequest | None = FROM_REQUEST) -> None:
    """Log one exchange unless --no-log or `logs off`; a log that fails is one warning. `model`: -m's value
    (the model a continued conversation loads again); `seed`: the one the answer was drawn with (with tools,
    by its last round), as `run --json` reports it, so that a drawn seed can be given again; `system`: the
    conversation's system prompt (a chat's: its request's first system message may be its summary), else
    FROM_REQUEST (run's: the request's)."""
    from localgen.log import store
    from localgen.models.embedded import DEFAULT_MODEL
    from localgen.types import shown_path

    if no_log or not store.enabled():
        return
    if request.messages:
        prompt = _text(request.messages[-1]["content"])
        if isinstance(system, _FromRequest):
            system = next((_text(m["content"]) for m in request.messages if m["role"] == "system"), None)
    else:
        prompt, system = request.prompt or "", None
    info = backend.describe()["model"]
    endpoint = info.get("endpoint")
    entry = store.Entry(
        conversation_id=cid, source=source, model=str(info.get("name") or ""), prompt=prompt, response=text,
        # the model that answered, the default's name too: a conversation gone on with keeps it (not LOCALGEN_MODEL's)
        model_spec=None if remote else shown_path(model or DEFAULT_MODEL),  # valid text, as the log holds only
        endpoint=", ".join(endpoint) if endpoint else None,
        system=system, settings=_sent(request, seed) if remote else _settings(request.sampling, seed),
        finish_reason=finish_reason,
        prompt_tokens=stats.prompt_tokens if stats else 0, completion_tokens=stats.completion_tokens if stats else 0,
        cached_tokens=stats.cached_tokens if stats else 0, ttft_s=stats.ttft_s if stats else None,
        total_s=stats.total_s if stats else None, decode_tps=stats.decode_tps if stats else None)
    try:
        store.record(entry)
    except store.LogError as e:
        # a chat says it once (cli/chat/loop.py), so it says what its later turns meet too
        later = " (nor are the chat's later answers while this lasts)" if source == "chat" else ""
        err.warn(f"{e.message}; this answer was not logged{later}" + (f"; {e.hint}" if e.hint else ""))


def _text(content: Any) -> str:
    """A message's text; media.py is read only for content with images or audio (a list of parts)."""
    if isinstance(content, str):
        return content
    from localgen.media import text_of

    return text_of(content)


def _sent(request: GenerationRequest, seed: int | None) -> dict[str, Any]:
    """A remote exchange's settings: only those sent (as `run --json`'s `sampling`), since the server applied its
    own defaults to the rest and does not say them."""
    from localgen.remote.client import sent_sampling

    if seed is None:
        return {}
    return sent_sampling(request, seed)


def _settings(s: SamplingParams, seed: int | None) -> dict[str, Any]:
    from localgen import settings

    values = {k: settings.jsonable(getattr(s, k)) for k in settings.KNOBS}
    values["grammar"] = s.grammar is not None
    if seed is not None:
        values["seed"] = seed
    return values
