"""`run` and `chat` against the log: continuing a logged conversation (`run --continue`, `--cid`,
`chat --resume ID`) and recording each exchange, where a failing log is one warning and never a lost
answer (log/store.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from localgen.cli import options as o
from localgen.errors import UsageError
from localgen.types import GenerationRequest, Message, SamplingParams, Stats


@dataclass
class Thread:
    """The conversation a run belongs to: its id and the turns logged before this one."""

    cid: str
    turns: list[Message] = field(default_factory=list)
    system: str | None = None
    model_spec: str | None = None  # the model the conversation used, to load again unless -m is given


def thread_for(f: o.Flags) -> Thread:
    """A new conversation, or the one --continue / --cid names (its turns, system prompt and model)."""
    from localgen.log import store

    cid = f.get("cid")
    if not cid and not f.get("continue_"):
        return Thread(store.new_id())
    if not cid:
        cid = store.last_conversation()
        if cid is None:
            raise UsageError("--continue: the log has no conversation yet", hint="run without --continue first")
    return logged_thread(cid)


def logged_thread(cid: str) -> Thread:
    """A logged conversation's turns, system prompt and model (a LogError when there is none)."""
    from localgen.log import store

    entries = store.conversation(cid)
    turns: list[Message] = []
    for e in entries:
        turns += [{"role": "user", "content": e.prompt}, {"role": "assistant", "content": e.response}]
    last = entries[-1]
    return Thread(cid, turns, last.system, last.model_spec if not last.endpoint else None)


def continue_with(f: o.Flags, thread: Thread) -> None:
    """Take the conversation's model and system prompt where the flags do not say otherwise."""
    if thread.model_spec and not f.given("model"):
        f._values["model"] = thread.model_spec
    if thread.system and not f.given("system"):
        f._values["system"] = thread.system


def record(f: o.Flags, err: Any, backend: Any, request: GenerationRequest, cid: str, text: str, stats: Stats | None,
           finish_reason: str, source: str = "run", remote: bool = False) -> None:
    """Log one exchange unless --no-log or `logs off`; a log that fails is one warning."""
    from localgen.log import store

    if f.get("no_log") or not store.enabled():
        return
    if request.messages:
        prompt = _text(request.messages[-1]["content"])
        system = next((_text(m["content"]) for m in request.messages if m["role"] == "system"), None)
    else:
        prompt, system = request.prompt or "", None
    info = backend.describe()["model"]
    endpoint = info.get("endpoint")
    entry = store.Entry(
        conversation_id=cid, source=source, model=str(info.get("name") or ""), prompt=prompt, response=text,
        model_spec=None if remote else f.get("model"), endpoint=", ".join(endpoint) if endpoint else None,
        system=system, settings=_settings(request.sampling), finish_reason=finish_reason,
        prompt_tokens=stats.prompt_tokens if stats else 0, completion_tokens=stats.completion_tokens if stats else 0,
        cached_tokens=stats.cached_tokens if stats else 0, ttft_s=stats.ttft_s if stats else None,
        total_s=stats.total_s if stats else None, decode_tps=stats.decode_tps if stats else None)
    try:
        store.record(entry)
    except store.LogError as e:
        err.warn(f"{e.message}; this answer was not logged")


def _text(content: Any) -> str:
    """A message's text; media.py is read only for content with images or audio (a list of parts)."""
    if isinstance(content, str):
        return content
    from localgen.media import text_of

    return text_of(content)


def _settings(s: SamplingParams) -> dict[str, Any]:
    from localgen import settings

    values = {k: settings.jsonable(getattr(s, k)) for k in settings.KNOBS}
    values["grammar"] = s.grammar is not None
    return values
