"""One chat: a ChatSession bound to a backend, the current sampling settings and the chat's tools. No UI
here: a turn's events go to a `show` callback and each tool call to an `approve` one.

The whole conversation is kept and saved; only what is sent to the model is cut to the window. The window
only moves forward (each turn's prompt then extends the last one, and the KV cache is reused), until /undo or
/clear takes turns back (it starts again after the summary). With compaction
on, the turns the window would leave out are first folded into a summary the model writes (compact.py), sent
after the system prompt; a summary that fails leaves them out as before."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from localgen import compact, paths, settings
from localgen.backend import Backend, overflow_case
from localgen.chat.session import ChatSession, NameTaken, Summary
from localgen.errors import ContextOverflowError, LocalgenError, no_chat_template
from localgen.types import GenerationRequest, Message, SamplingParams, Stats, thinking_args

SETTABLE = sorted(settings.KNOBS)


def answer_room(n_ctx: int, max_tokens: int) -> int:
    """The tokens kept free for the answer in a window of `n_ctx`: --max-tokens where given (-n 8 kept 16, the
    floor below), else a quarter of the window and at least 16; at most half of it. Chat's turns and --rag's
    excerpts (run's and chat's) leave this room."""
    if max_tokens > 0:
        return min(max_tokens, max(1, n_ctx // 2))
    return max(16, n_ctx // 4)


class ChatRunner:
    """Builds each turn's request from the conversation (the backend reuses the cached prefix), sends the
    newest turns that fit the window, and records answers."""

    def __init__(self, session: ChatSession, backend: Backend, sampling: SamplingParams) -> None:
        self.session = session
        self.backend = backend
        self.sampling = sampling
        self.last_stats: Stats | None = None  # the last turn's, over all its rounds of tool calls
        self.last_context = 0  # tokens the conversation took in the window at the end of the last turn
        self.first = self.covered()  # the first message sent to the model (never one the summary covers)
        self.trim_noticed = False
        self.last_request: GenerationRequest | None = None
        self.on_answer: Callable[[GenerationRequest, Any, str], None] | None = None  # told of each recorded answer
        self.toolbox: Any = None  # the chat's tools (tools/loop.py Toolbox), or None
        self.tool_choice = "auto"  # the first round of each answer: auto, required, or a tool's name
        self.tool_steps = 8
        self.tool_timeout = 30.0
        self.json_schema: str | None = None  # sent with every request (a remote server builds its own grammar)
        self.prompt_cache = False  # the system prompt and tools' schemas kept on disk (local backends: --prompt-cache)
        self.thinking: bool | None = None  # the template's thinking switch (--think, /set reasoning); None: default
        self.gen: Any = None  # the generation under way
        self.stopping = False  # the answer under way was asked to stop
        self._plans: dict[tuple[str | None, str, tuple[str, ...]], Any] = {}  # plan() by (template, choice, tools)
        self.warn: Callable[[str], None] = lambda text: None  # told when the conversation's file cannot be written
        self.unsaved: str | None = None  # why the conversation's file is behind it (its last save failed), or None
        self.unsaved_taken = False  # it failed as another chat took the chosen name first (NameTaken)
        self.saving = False  # a save is under way, or an interrupt (Ctrl-C, a signal) cut the last one short
        self.compact = False  # fold the turns the window leaves out into a summary (--compact, /set compact on)
        self.summarizing = False  # a summary is being written: Ctrl-C then stops only it (cli/chat/turn.py)
        self.summary_stopped = False
        self.note: Callable[[str], None] = lambda text: None  # told of each compaction
        self.alert: Callable[[str], None] = lambda text: None  # told when a summary fails (turns are left out)
        self._apart: dict[str | None, bool] = {}  # whether the template shows the summary as a message of its own

    def set(self, name: str, value: str) -> str:
        """Change one sampling setting (validated as flags are); returns a confirmation."""
        key, typed = settings.parse_text(name, value)
        self.sampling = dataclasses.replace(self.sampling, **{key: typed}, asked=self.sampling.asked | {key})
        self.session.settings[key] = settings.jsonable(typed)
        return f"{key} = {settings.as_text(key, typed)}"

    def reserve(self, n_ctx: int | None = None) -> int:
        """Tokens kept free for the answer when deciding whether the history fits a window of `n_ctx` tokens (None:
        the backend's): --max-tokens, else a quarter of the window and at least 16; at most half of it."""
        return answer_room(int(self.backend.n_ctx) if n_ctx is None else n_ctx, self.sampling.max_tokens)

    def request(self, messages: list[Message]) -> GenerationRequest:
        """A request for these messages with the current settings. Without tools, earlier calls and results
        are written as plain turns (a template need not know tool roles). A model here without a chat
        template gets the conversation as plain text to continue (plain_text)."""
        if self.toolbox is None and any(m.get("tool_calls") or m["role"] == "tool" for m in messages):
            from localgen.tools.plan import plain_history

            messages = list(plain_history(tuple(messages)))
        if not has_template(self.backend):
            if self.toolbox is not None:
                raise no_chat_template(self.backend.name, "tools need",
                                       hint="chat without --functions/--mcp, or give a template with "
                                            "--chat-template-file")
            return GenerationRequest(prompt=plain_text(messages, self.backend.name), sampling=self.sampling)
        # what comes before the first user turn is the prompt cache's prefix: with a summary in it, one that never
        # repeats (each compaction writes another), so a compacted conversation's is not kept on disk
        return GenerationRequest(messages=tuple(messages), sampling=self.sampling, json_schema=self.json_schema,
                                 template_args=thinking_args(self.thinking),
                                 prompt_cache=self.prompt_cache and self.session.summary is None)

    def count(self, messages: list[Message]) -> int:
        """Prompt tokens of a conversation as the template renders it (with the tools, when there are any)."""
        request = self.request(messages)
        plan = self.plan()
        if plan is not None:
            from localgen.tools.plan import with_tools

            request = with_tools(plan, request)
        return int(self.backend.count(request))

    def _fits(self, messages: list[Message], limit: int) -> bool:
        """Whether a conversation takes at most `limit` tokens; one past what `limit` tokens could hold by its size
        alone (a history of megabytes of text) does not fit without being rendered, and one the template or the
        window refuses by its length is never an error either: the window leaves it out."""
        from localgen.errors import TemplateError
        from localgen.media import text_of
        from localgen.text import CHARS_PER_TOKEN

        if sum(len(text_of(m.get("content"))) for m in messages) > CHARS_PER_TOKEN * limit:
            return False  # no tokenizer makes fewer tokens of it: nothing rendered (thousands of turns, each checked)
        try:
            return self.count(messages) <= limit
        except (ContextOverflowError, TemplateError):  # past the template's 4 MiB of output, or the window's size
            return False

    def _window(self, limit: int, start: int, head: list[Message]) -> int:
        """The first message of the window that fits `limit` tokens with `head` (session.window_start), past those
        whose characters alone are too many first: counted once, not again at each step (thousands of turns)."""
        from localgen.media import text_of
        from localgen.text import CHARS_PER_TOKEN

        messages = self.session.messages
        chars = sum(len(text_of(m.get("content"))) for m in messages[start:])
        i = start
        while i < len(messages) - 1 and chars > CHARS_PER_TOKEN * limit:
            chars -= len(text_of(messages[i].get("content")))
            i += 1
        while start < i < len(messages) - 1 and messages[i]["role"] != "user":
            i += 1  # a window restarts at a user turn
        return self.session.window_start(lambda conv: self._fits(conv, limit), i, head=head)

    def template(self) -> str | None:
        """The chat template the model renders with (None for a remote one)."""
        from localgen.tools.plan import template_of

        return template_of(self.backend)

    def plan(self, choice: str = "auto") -> Any:
        """The tools' plan for this model (None without tools), made once per template and choice: counting
        each window a turn considers would otherwise build the tools' grammar again every time."""
        from localgen.tools.loop import plan_for

        key = (self.template(), choice, tuple(s.name for s in self.toolbox.specs) if self.toolbox is not None else ())
        if key not in self._plans:  # the tools are a part of the key: those of an MCP server that stopped go
            self._plans[key] = plan_for(key[0], self.toolbox, choice)
        return self._plans[key]

    def covered(self) -> int:
        """How many of the oldest messages the summary stands for (0 without one)."""
        return self.session.summary.covers if self.session.summary is not None else 0

    def head(self, summary: Summary | None = None) -> list[Message]:
        """What goes before the window: the system prompt, then the summary (the conversation's, or `summary`)
        as a system message of its own, or after the system prompt in the same message where the template
        shows only one (one that wants roles to alternate)."""
        summary = summary or self.session.summary
        system = self.session.system
        head: list[Message] = [{"role": "system", "content": system}] if system else []
        if summary is None:
            return head
        text = compact.summary_text(summary.count, summary.text)
        if system and not self._summary_apart():
            return [{"role": "system", "content": f"{system}\n\n{text}"}]
        return [*head, {"role": "system", "content": text}]

    def _summary_apart(self) -> bool:
        """Whether the model's template shows a second system message (found once per template by rendering
        one); a remote server gets it as one, and a model without a template one text anyway."""
        if getattr(self.backend, "engine", None) is None or not has_template(self.backend):
            return True
        key = self.template()
        if key not in self._apart:
            probe = ({"role": "system", "content": "S"}, {"role": "system", "content": compact.HEADING},
                     {"role": "user", "content": "hi"})
            try:
                shown = compact.HEADING in self.backend.render(GenerationRequest(messages=probe))
            except LocalgenError:  # raise_exception("Conversation roles must alternate ..."): one message
                shown = False
            self._apart[key] = shown
        return self._apart[key]

    def sent(self) -> list[Message]:
        """What the model sees now: the system prompt, the summary, and the messages of the window."""
        return self.head() + self.session.messages[max(self.first, self.covered()):]

    def start(self, user_text: str, media: list[Any] | None = None) -> int:
        """Add the user turn (with its images or audio, if any) and get its answer ready (see prepare); returns
        the messages left out of the window. A message that cannot fit even alone is refused and the
        conversation stays as it was."""
        from localgen.media import content

        message = content(user_text, list(media or []))
        # by its size first, as run's prompt is: tens of megabytes would reach the template (its output cap is the
        # error) and the tokenizer before the window could refuse them
        self.backend.check_size(GenerationRequest(messages=({"role": "user", "content": message},)))
        self.session.add("user", message)
        try:
            return self.prepare()
        except BaseException:
            self.session.messages.pop()
            raise

    def prepare(self) -> int:
        """Fit the conversation as it stands to the window for the next answer (used by start and /retry): with
        compaction on, the turns that no longer fit are folded into the summary first; those left out all the
        same (compaction off, or a summary that failed) are counted in the number returned."""
        n_ctx = int(self.backend.n_ctx)
        limit = n_ctx - self.reserve()
        if self.compact and not self._fits(self.sent(), limit):
            self._auto_compact(limit)
        self.first = self._window(limit, max(self.first, self.covered()), self.head())
        need = self.count(self.sent())
        if need > limit:
            raise ContextOverflowError(
                f"this message needs {need:,} tokens with the system prompt, and {self.reserve():,} more are kept "
                f"for the answer; the context window is {n_ctx:,}",
                hint=f"{self._overflow_hint(need)}; the conversation is kept",
            )
        self.last_request = self.request(self.sent())
        return self.first - self.covered()

    def _overflow_hint(self, need: int) -> str:
        """What helps a message that needs `need` tokens with the system prompt, as run's error says it
        (backend.overflow_case): a larger --ctx only where the largest window one gives (Backend.window_cap) holds
        it with the answer's room, else a shorter message, or RoPE scaling."""
        cap = self.backend.window_cap()
        room = self.reserve(cap) if cap else 0  # the answer's, at the largest window
        case = overflow_case(int(self.backend.n_ctx), cap, need, room)
        stretch = "a restart with --rope-scaling linear and a larger --ctx stretches the window, at some cost in " \
            "quality"
        if case == "full":
            return f"shorten it: the window is already the {cap:,} tokens this model was trained on; {stretch}"
        if case == "past":
            return (f"shorten it: with the answer's room ({room:,} tokens in that window; -n sets it) it "
                    f"needs more than the {cap:,} tokens this model was trained on, past which --ctx does not go; "
                    f"{stretch}")
        if case == "grow":
            return f"shorten it, or restart with a larger --ctx, up to the {cap:,} tokens this model was trained on"
        return "shorten it, or restart with a larger --ctx"

    def _auto_compact(self, limit: int) -> None:
        """Fold the oldest turns into the summary, keeping verbatim the newest that fill at most half of `limit`
        with the system prompt and a summary of full size (so that the next turns do not compact again at once).
        A summary that fails or is stopped is one alert, and the window then leaves those turns out."""
        room = limit // 2 - compact.budget(int(self.backend.n_ctx))
        empty = Summary(text="", covers=1, tokens=0, compactions=0, model="", created=0.0)
        end = self._window(room, max(self.first, self.covered()), self.head(empty))
        try:
            self.fold_to(end)
        except compact.CompactionError as e:
            self.alert(f"{e.message}: the oldest turns are left out instead (the conversation is kept whole)")
        except LocalgenError as e:
            self.alert(f"the summary could not be written ({e.message}): the oldest turns are left out instead "
                       "(the conversation is kept whole)")

    def compact_now(self, keep: int) -> Summary | None:
        """/compact: fold every turn but the last `keep` exchanges into the summary now; None when there is
        nothing to fold."""
        users = [i for i, m in enumerate(self.session.messages) if m["role"] == "user"]
        end = users[-keep] if 0 < keep <= len(users) else (0 if keep else len(self.session.messages))
        return self.fold_to(end)

    def fold_to(self, end: int) -> Summary | None:
        """Fold messages[covered:end] (and the summary before, if any) into a new summary the model writes, in
        as many requests as the window needs; the messages stay in the conversation. Raises CompactionError
        (stopped, or an empty summary) or the backend's error, and then nothing changes. None: nothing to fold."""
        covered = self.covered()
        if end <= covered:
            return None
        n_ctx = int(self.backend.n_ctx)
        begin, tokens = self._fold_start(covered, end)
        folding = self.session.messages[begin:end]
        if begin > covered:  # the older ones are left out, as the window leaves them without compaction
            self.note(f"(a compaction folds at most {compact.FOLD_WINDOWS} windows of tokens at a time: the "
                      f"{_n(begin - covered, 'older message')} before the newest {len(folding):,} are left out, as "
                      "without --compact; the saved conversation keeps every message)")
        if tokens > n_ctx:  # more than one request's worth: said before the model's time is spent
            self.note(f"(compacting {_n(len(folding), 'message')} ({tokens:,} tokens) into a summary, in several "
                      "requests ...)")
        size = compact.budget(n_ctx)
        before = self.count(self.head() + self.session.messages[max(self.first, begin):])
        old = self.session.summary
        written: list[int] = []

        def fits(previous: str | None, lines: list[str]) -> bool:
            return int(self.backend.count(self._summary_request(previous, lines, size))) + size <= n_ctx

        def write(previous: str | None, lines: list[str]) -> str:
            text, tokens = self._summarize(self._summary_request(previous, lines, size))
            written.append(tokens)
            return text

        self.summary_stopped = False
        text, pieces = compact.fold([compact.line_of(m) for m in folding], old.text if old else None, fits, write)
        first = self.first
        count = (old.count if old else 0) + end - begin  # (those before `begin` left out, not summarized)
        self.session.summary = Summary(text=text, covers=end, tokens=written[-1],
                                       compactions=(old.compactions if old else 0) + 1, model=self.session.model,
                                       created=time.time(), summarized=None if count == end else count)
        self.first = max(self.first, end)
        after = self.count(self.sent())
        if after >= before:  # a summary as long as what it folds (short turns): nothing gained, nothing changes
            self.session.summary, self.first = old, first
            raise compact.NotSmaller(f"the {written[-1]:,}-token summary would not make the conversation "
                                          f"smaller ({after:,} tokens against {before:,} now)")
        turns = sum(1 for m in folding if m["role"] == "user")
        self.note(f"(compacted {_n(len(folding), 'message')} ({_n(turns, 'turn')}) into a {written[-1]:,}-token "
                  f"summary{f' in {pieces} requests' if pieces > 1 else ''}: the conversation now takes "
                  f"{after:,} tokens instead of {before:,}; the saved conversation keeps every message)")
        return self.session.summary

    def _fold_start(self, covered: int, end: int) -> tuple[int, int]:
        """Where a fold of messages[covered:end] begins, and the tokens of its transcript: the newest messages
        whose lines take at most FOLD_WINDOWS windows of tokens (at least the newest one), from a user turn, so
        that the summary requests a compaction makes are few whatever the history (thousands of turns resumed).
        Each line is counted from the newest back, only until the bound is passed."""
        from localgen.text import CHARS_PER_TOKEN

        bound = compact.FOLD_WINDOWS * int(self.backend.n_ctx)
        counted: list[int] = []  # the tokens of lines end-1, end-2, ... (a line cut to enough characters to pass it)
        total = 0
        for i in range(end - 1, covered - 1, -1):
            line = compact.line_of(self.session.messages[i])[:CHARS_PER_TOKEN * bound + 1]
            tokens = int(self.backend.count(GenerationRequest(prompt=line)))
            if counted and total + tokens > bound:
                break
            counted.append(tokens)
            total += tokens
        begin = end - len(counted)
        if begin > covered:  # from a user turn, as a window begins
            turn = next((j for j in range(begin, end) if self.session.messages[j]["role"] == "user"), begin)
            total -= sum(counted[len(counted) - (turn - begin):])
            begin = turn
        return begin, total

    def _summary_request(self, previous: str | None, lines: list[str], size: int) -> GenerationRequest:
        """The request for a summary of `lines` (into `previous`), at most `size` tokens: the chat's sampling
        without its grammar or stop strings (an answer's constraints), and no tools."""
        sampling = dataclasses.replace(self.sampling, max_tokens=size, grammar=None, grammar_triggers=(), stop=(),
                                       ignore_eos=False, asked=self.sampling.asked | {"max_tokens"})
        messages = compact.request_messages(previous, lines)
        if not has_template(self.backend):
            return GenerationRequest(prompt=plain_text(messages, self.backend.name) + "Summary:", sampling=sampling)
        return GenerationRequest(messages=tuple(messages), sampling=sampling,
                                 template_args=thinking_args(self.thinking))

    def _summarize(self, request: GenerationRequest) -> tuple[str, int]:
        """Generate one summary: its text and tokens. stop_summary() (Ctrl-C) cancels it: CompactionError."""
        if self.summary_stopped:
            raise compact.CompactionError("the summary was stopped")
        gen = None
        self.summarizing = True
        try:
            gen = self.backend.generate(request)
            self.gen = gen
            if self.summary_stopped:  # Ctrl-C came before the generation existed
                gen.cancel()
            for _ in gen:
                pass
        finally:
            self.summarizing = False
            self.gen = None
            if gen is not None:
                gen.close()
        if self.summary_stopped or gen.finish_reason == "cancelled":
            raise compact.CompactionError("the summary was stopped")
        text = compact.cleaned(gen.text)
        if not text:
            raise compact.CompactionError("the model wrote an empty summary")
        return text, gen.stats.completion_tokens if gen.stats is not None else 0

    def stop_summary(self) -> None:
        """Stop the summary being written (the turn then goes on without it)."""
        self.summary_stopped = True
        if self.gen is not None:
            self.gen.cancel()

    def reply(self, show: Callable[[Any], None], approve: Callable[[Any], bool], turn: Any) -> Any:
        """Answer the prepared request into `turn` (tools/loop.py Turn), running the tools the model calls
        (each after `approve`), until a plain answer. `show` sees every event as it happens. Whatever
        raises, `turn` holds what is settled so far (see record)."""
        from localgen.tools.loop import run_turn

        assert self.last_request is not None
        plan = self.plan()
        first = None
        if plan is not None and self.tool_choice != "auto" and (self.tool_choice in ("required", "none") or any(
                s.name == self.tool_choice for s in self.toolbox.specs)):  # not a tool of a server that stopped
            first = self.plan(self.tool_choice)
        return run_turn(self, self.last_request, plan, self.toolbox, approve, show, self.tool_steps,
                        self.tool_timeout, self.template(), first=first, turn=turn,
                        stopped=lambda: self.stopping)

    def generate(self, request: GenerationRequest) -> Any:
        """The backend's generation, kept so that stop() can reach it (reply's rounds come through here)."""
        self.gen = self.backend.generate(request)
        if self.stopping:  # stop() came before this generation existed (Ctrl-C before the answer began)
            self.gen.cancel()
        return self.gen

    def stop(self) -> None:
        """Stop the answer under way between two tokens, or the one about to begin; no further round starts
        (until the next turn clears `stopping`)."""
        self.stopping = True
        if self.gen is not None:
            self.gen.cancel()

    def record(self, turn: Any) -> None:
        """Add the turn's settled messages (also a stopped answer's: what was generated is kept), and save."""
        self.session.messages.extend(turn.messages)
        gen = turn.generations[-1] if turn.generations else None
        self.last_stats = turn.stats()
        if steps := turn.step_stats():
            self.last_context = steps[-1].prompt_tokens + steps[-1].completion_tokens
        try:
            self.save()
        finally:  # whatever the save met, the answer is logged
            if self.on_answer is not None and self.last_request is not None and gen is not None:
                self.on_answer(self.last_request, gen, turn.text)

    def save(self, warn: bool = True, empty: bool = False) -> Path | None:
        """Save the conversation; its path, or None where the file cannot be written (a read-only or full disk).
        That never stops the chat: the answer is already shown and kept in memory, the first failure is a
        warning, each later save tries again, and `unsaved` says why until one succeeds. A new conversation
        with no message yet is not written (a /set before the first exchange would leave an empty file that
        takes the name), unless `empty` (/save NAME asks for the file): its first exchange writes it all."""
        if self.session.fresh and not self.session.messages and not empty:
            return None
        self.saving = True  # until it ends, however it ends: an interrupt leaves it set (save_behind)
        try:
            path = self.session.save()
        except OSError as e:
            # what could not be written (the folder, where it is in the way), but the conversation's file for the
            # temporary one it is written through
            where = e.filename if isinstance(e.filename, str) and not e.filename.endswith(".tmp") else None
            why = f"cannot write {where or self.session.path}: {e.strerror or e}"
            if isinstance(e, FileExistsError | NotADirectoryError) and where:  # ("File exists", "Not a directory")
                blocker = paths.in_the_way_of(Path(where))  # the chats folder or one above it: a file, a broken link
                if blocker is not None:
                    why = f"cannot write {self.session.path}: {paths.in_the_way(blocker)}"
            self._unsaved(why, f"{why}; the chat goes on, but the conversation is not saved", warn)
            self.unsaved_taken = False
            self.saving = False
            return None
        except NameTaken as e:  # another chat saved a conversation of this chat's chosen name first: never overwritten
            self._unsaved(e.message, f"{e.message}; the chat goes on, but this conversation is not saved: /save NAME "
                                     "keeps it under another name", warn)
            self.unsaved_taken = True
            self.saving = False
            return None
        self.unsaved, self.saving = None, False
        if self.session.forked is not None:
            self.warn(f"the conversation {self.session.forked!r} was saved by another chat since this one read it: "
                      f"this chat's turns are kept as {self.session.name!r} (nothing was overwritten)")
            self.session.forked = None
        return path

    def save_behind(self) -> None:
        """Save again where an interrupt cut the last save short (the file may lack the turns the chat holds): at
        the chat's end, before anything closes."""
        if self.saving:
            self.save()

    def _unsaved(self, why: str, warning: str, warn: bool) -> None:
        """A save that failed: the first is a warning (where `warn`), and `unsaved` says why until one succeeds."""
        if warn and self.unsaved is None:
            self.warn(warning)
        self.unsaved = why

    def forget(self) -> None:
        """After /clear or /undo: a summary of messages no longer there (/undo took back a folded one) goes, and the
        window starts again after the summary (or at the first message): the next send fits as many of the turns
        left as the context holds (it had kept the start the longer conversation moved it to, past the end)."""
        if self.session.summary is not None and self.session.summary.covers > len(self.session.messages):
            self.session.summary = None
        self.first = self.covered()

    def context_used(self) -> tuple[int, int, int]:
        """(tokens the conversation takes as the next prompt sends it, context window, the first message sent): the
        window fitted as a send fits it (a resumed or loaded conversation's whole history is not what is sent),
        compaction aside."""
        limit = int(self.backend.n_ctx) - self.reserve()
        start, n = max(self.first, self.covered()), len(self.session.messages)
        first = self._window(limit, start, self.head()) if start < n else n  # (all folded: the summary alone)
        conv = self.head() + self.session.messages[first:]
        return (self.count(conv) if conv else 0), int(self.backend.n_ctx), first

    def switch(self, backend: Backend, model_name: str) -> None:
        """Use another model for the rest of the conversation."""
        old = self.backend
        self.backend = backend
        self.session.model = model_name
        self.first = self.covered()
        old.close()

    def adopt(self, session: ChatSession, sampling: SamplingParams) -> None:
        """Continue another conversation (/load) with its own settings."""
        self.session = session
        self.sampling = sampling
        self.first = self.covered()
        self.trim_noticed = False


def _n(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def has_template(backend: Backend) -> bool:
    """Whether the backend renders messages: a remote one does (its server), a model here where it has a chat
    template (a base model has none)."""
    engine = getattr(backend, "engine", None)
    return engine is None or bool(engine.model.summary.chat_template)


def plain_text(messages: list[Message], model: str) -> str:
    """A conversation as plain text for a model without a chat template to continue: each message's text
    followed by a newline, the system prompt first (as a typed line is sent, the answer continuing it)."""
    parts = []
    for m in messages:
        if not isinstance(m["content"], str):
            raise LocalgenError(f"{model} has no chat template (it may be a base model), which images and audio "
                                "need", hint="give it a template with --chat-template-file")
        parts.append(m["content"] + "\n")
    return "".join(parts)
