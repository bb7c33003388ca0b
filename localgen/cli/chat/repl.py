"""Line input for the chat REPL (prompt_toolkit): history across runs, emacs keys, multi-line input,
Tab completion of slash commands and their arguments, Ctrl-G to write the message in $EDITOR."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from localgen import paths

COMMANDS = {
    "/help": "show the commands (also /?)",
    "/set": "PARAM VALUE: change a sampling setting, or system / think / verbose / markdown / reasoning / compact",
    "/show": "current model and settings",
    "/system": "[TEXT]: show or set the system prompt",
    "/clear": "start a new conversation (same model and system prompt; the old one stays saved)",
    "/undo": "drop the last exchange",
    "/retry": "regenerate the last answer",
    "/read": "FILE: attach a file to the next message",
    "/image": "FILE: attach an image to the next message (or drop the file on the terminal)",
    "/audio": "FILE: attach an audio clip (WAV, MP3, FLAC) to the next message",
    "/video": "FILE: attach a video (MP4, MOV, WebM, MKV, AVI; needs ffmpeg) to the next message",
    "/detach": "drop what is attached to the next message",
    "/save": "NAME: save the conversation under NAME (and keep saving there until /clear or /load)",
    "/load": "NAME: continue a saved conversation",
    "/model": "NAME: switch model, keep the conversation",
    "/stats": "the last answer's numbers",
    "/context": "tokens used of the context window",
    "/compact": "[N]: summarize all but the last N exchanges (1) now; the messages stay saved",
    "/tools": "the tools the model may call (--functions, --mcp)",
    "/think": "the last answer's thinking, whole (it is folded to one line)",
    "/sources": "the excerpts --rag sent with the last message, in full",
    "/exit": "leave (also /bye, /quit, Ctrl-D)",
}
KEYS_HELP = (
    "Enter sends · Alt-Enter (or Esc Enter) adds a line · a message starting with \"\"\" continues until "
    "a closing \"\"\" (or Ctrl-D) · paste keeps newlines · Ctrl-G opens $EDITOR · Ctrl-C stops an answer · "
    "Ctrl-D leaves"
)


def make_completer(settable: Iterable[str], sessions: Callable[[], list[str]], models: Callable[[], list[str]]) -> Any:
    """Completes /commands, /set names and values, /read paths, /load names and /model names."""
    from prompt_toolkit.completion import Completer, Completion, PathCompleter
    from prompt_toolkit.document import Document

    set_names = [*settable, "system", "think", "verbose", "markdown", "reasoning", "compact"]
    files = PathCompleter(expanduser=True)

    class SlashCompleter(Completer):
        def get_completions(self, document: Any, complete_event: Any) -> Any:
            text = document.text_before_cursor
            if not text.startswith("/"):
                return
            if " " not in text:
                for name, meta in COMMANDS.items():  # with the space before its argument, as a shell's
                    if name.startswith(text):          # completion ends (`/lo<Tab>ha` was `/loadha`)
                        yield Completion(name + " ", -len(text), display=name, display_meta=meta)
                return
            cmd, _, rest = text.partition(" ")
            if cmd in ("/read", "/image", "/audio", "/video"):
                for found in files.get_completions(Document(rest, len(rest)), complete_event):
                    if os.path.isdir(os.path.expanduser(rest + found.text)):  # a folder: with its `/`, as a shell
                        found = Completion(found.text + "/", found.start_position, display=found.display)  # adds it
                    yield found
                return
            words = rest.split(" ")
            options: list[str] = []
            if cmd == "/set" and len(words) == 1:
                options = set_names
            elif cmd == "/set" and len(words) == 2 and words[0] in ("think", "verbose", "markdown", "compact"):
                options = ["on", "off"]
            elif cmd == "/set" and len(words) == 2 and words[0] == "reasoning":
                options = ["on", "off", "default"]
            elif cmd == "/load" and len(words) == 1:
                options = sessions()
            elif cmd == "/model" and len(words) == 1:
                options = models()
            word = words[-1]
            then = " " if cmd == "/set" and len(words) == 1 else ""  # a setting's name: its value follows
            for opt in options:
                if opt.startswith(word):
                    yield Completion(opt + then, -len(word), display=opt)

    return SlashCompleter()


class LineInput:
    """Reads one message; raises EOFError on Ctrl-D and KeyboardInterrupt on Ctrl-C (on an empty prompt, only the
    first press until a line is entered: the chat says how to leave once, and a flood of presses is calm)."""

    def __init__(self, history: Path, completer: Any) -> None:
        from prompt_toolkit import PromptSession
        from prompt_toolkit.application.current import get_app
        from prompt_toolkit.filters import Condition
        from prompt_toolkit.history import FileHistory
        from prompt_toolkit.key_binding import KeyBindings

        with contextlib.suppress(OSError):  # a read-only home: the history is this chat's only (see _History)
            paths.private_dir(history.parent)
            if stat.S_ISREG((st := os.stat(history)).st_mode) and st.st_mode & 0o077:  # one made before it was 0600
                history.chmod(0o600)
        kb = KeyBindings()

        @kb.add("escape", "enter")
        def _newline(event: Any) -> None:
            event.current_buffer.insert_text("\n")

        @kb.add("enter")
        def _enter(event: Any) -> None:
            buf = event.current_buffer
            if open_block(buf.text):
                buf.insert_text("\n")
            else:
                buf.validate_and_handle()

        @kb.add("c-d", filter=Condition(lambda: open_block(get_app().current_buffer.text)))
        def _end_block(event: Any) -> None:
            # end of input, as Ctrl-D ends a heredoc: the block is closed and sent (an empty one is dropped), where
            # prompt_toolkit's own Ctrl-D deletes the character under the cursor, which at the end is nothing
            buf = event.current_buffer
            buf.text = buf.text + ("" if buf.text.endswith("\n") else "\n") + '"""'
            buf.validate_and_handle()

        calm = Condition(lambda: self._told and not get_app().current_buffer.text)

        @kb.add("c-c", filter=calm)
        @kb.add("<sigint>", filter=calm)
        def _calm(event: Any) -> None:
            # Ctrl-C on an empty prompt once the chat has said how to leave: nothing, where a held key or a flood of
            # presses left a new prompt for each (on a line with text it drops the line, as before)
            pass

        @kb.add("c-g")
        def _editor(event: Any) -> None:
            missing = missing_editor()
            if missing is not None:  # prompt_toolkit would open the next editor it finds (vi) without a word
                from prompt_toolkit.application import run_in_terminal

                run_in_terminal(lambda: print(missing, flush=True))
                return
            event.current_buffer.open_in_editor(validate_and_handle=False)

        self.session: Any = PromptSession(
            history=_history(FileHistory, history), completer=completer, key_bindings=kb, multiline=True,
            enable_open_in_editor=True, complete_while_typing=False,
            enable_suspend=True,  # Ctrl-Z suspends, as during an answer (it put a raw 0x1A into the message)
            prompt_continuation=lambda width, line_number, is_soft_wrap: "... ".rjust(width),
        )
        self._previous: list[Any] = []  # the SIGINT handler read() replaced, until give_press or release puts it back
        self._pressed = False  # a Ctrl-C that came once Enter was taken, for the line's command
        self._told = False  # a Ctrl-C stopped a prompt since the last line entered: the chat said how to leave

    def read(self, prompt: str = ">>> ") -> str:
        """One message, with a \"\"\" block's quotes removed. A Ctrl-C that comes once Enter is taken (prompt_toolkit
        still ending its screen, the terminal's ISIG back on) is held for what the line starts, which raises it
        with give_press; release() drops it. prompt_toolkit's own SIGINT handler, still in place then, swallowed it
        (a /model went on loading), or, just after, it stopped read() and the line was dropped unrun."""
        import signal

        self.release()
        started = early = False

        def mark_started() -> None:
            nonlocal started
            started = True
            if early:  # pressed as the prompt was being set up: it is Ctrl-C at the prompt
                app = self.session.app
                app.loop.call_soon(app.key_processor.send_sigint)

        def on_sigint(signum: int, frame: Any) -> None:
            nonlocal early
            app = self.session.app
            loop = app.loop
            if not started:  # before the prompt began: taken once it has (a KeyboardInterrupt raised inside
                early = True  # prompt_toolkit's setup, an event loop half made, ended the chat in a burst)
                return
            if app.is_running and not app.is_done and loop is not None:  # what prompt_toolkit's own handler does
                loop.call_soon_threadsafe(app.key_processor.send_sigint)
            else:
                self._pressed = True

        try:
            if not callable(signal.getsignal(signal.SIGINT)):  # ignored (a background job): left so
                raise ValueError
            self._previous = [signal.signal(signal.SIGINT, on_sigint)]
        except ValueError:  # that, or not the main thread: prompt_toolkit's own handling
            return self._entered(lambda: self.session.prompt(prompt))
        try:
            return self._entered(lambda: self.session.prompt(prompt, handle_sigint=False, pre_run=mark_started))
        except BaseException:
            self.release()
            raise

    def _entered(self, prompt: Callable[[], Any]) -> str:
        """The line `prompt` reads, noting whether Ctrl-C stopped it (until a line is entered, Ctrl-C on an empty
        prompt does nothing)."""
        try:
            text = str(prompt())
        except KeyboardInterrupt:
            self._told = True
            raise
        self._told = False
        return unquote(text)

    def give_press(self) -> None:
        """Put the chat's SIGINT handler back, then hand it the Ctrl-C held since Enter, if one came (it raises
        KeyboardInterrupt, and notes the press as it does any)."""
        import signal

        handler = self._previous[0] if self._previous else None
        self.release(keep=True)
        if self._pressed:
            self._pressed = False
            if callable(handler):
                handler(signal.SIGINT, None)

    def release(self, keep: bool = False) -> None:
        """Put the chat's SIGINT handler back (idempotent); a press held since Enter is dropped, unless `keep`."""
        import signal

        previous, self._previous = self._previous, []
        if previous and previous[0] is not None:  # None: a handler not set from Python, which cannot be put back
            signal.signal(signal.SIGINT, previous[0])
        if not keep:
            self._pressed = False


def missing_editor() -> str | None:
    """Why Ctrl-G cannot open the editor $VISUAL (else $EDITOR) names, where its program is not found; None where it
    is there or neither is set (prompt_toolkit then opens the first of editor, nano, pico, vi, emacs it finds)."""
    import shlex
    import shutil

    for var in ("VISUAL", "EDITOR"):
        value = os.environ.get(var)
        if not value:
            continue
        try:
            words = shlex.split(value)
        except ValueError:  # an unclosed quote
            words = []
        if not words or shutil.which(words[0]) is None:
            return f"error: the editor ${var} names is not found: {value} (set ${var} to an editor here)"
        return None
    return None


def _history(base: Any, path: Path) -> Any:
    """The input history kept across runs in `path`; where it cannot be read or written (a read-only or full disk,
    a folder or a FIFO of that name) it still works for this chat: it is state that may be lost without harm, and
    never stops the chat (prompt_toolkit reads it in a thread of its own, where an error is a traceback on screen).
    Only a regular file is opened: a FIFO would block the read (or the write), /dev/zero never end it."""

    def usable() -> bool:
        try:
            return stat.S_ISREG(os.stat(path).st_mode)
        except FileNotFoundError:
            return True  # the first line typed creates it
        except OSError:
            return False

    class History(base):  # type: ignore[misc,valid-type]
        def load_history_strings(self) -> list[str]:
            if not usable():
                return []
            try:
                return newest_entries(path)
            except OSError:
                return []

        def store_string(self, string: str) -> None:
            if usable():
                with contextlib.suppress(OSError):
                    paths.private_file(path)  # what was typed: made 0600 before FileHistory appends to it
                    super().store_string(string)

    return History(str(path))


MAX_HISTORY_READ = 8 << 20  # the newest 8 MiB of the input history (thousands of messages) is what Up walks


def newest_entries(path: Path) -> list[str]:
    """The entries of prompt_toolkit's history file (`# time` then `+line` lines), newest first, as FileHistory
    reads them, but of its newest MAX_HISTORY_READ bytes only: it grows by every message ever sent, and a file of
    gigabytes (or one long line) would be read whole into memory. The file itself is left as it is."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_HISTORY_READ:  # and the byte before: an entry whose `#` line begins the bytes read is whole
            f.seek(size - MAX_HISTORY_READ - 1)
        data = f.read(MAX_HISTORY_READ + 1)
    if size > MAX_HISTORY_READ:  # cut inside an entry: begin at the next one's `#` line (none: nothing whole)
        start = data.find(b"\n#")
        data = data[start + 1:] if start >= 0 else b""
    entries: list[str] = []
    lines: list[str] = []
    for line in data.decode("utf-8", errors="replace").split("\n"):
        if line.startswith("+"):
            lines.append(line[1:])
        elif lines:
            entries.append("\n".join(lines))
            lines = []
    if lines:
        entries.append("\n".join(lines))
    return entries[::-1]


def open_block(text: str) -> bool:
    """Whether the text is a \"\"\" block not closed yet."""
    return text.lstrip().startswith('"""') and text.count('"""') < 2


def unquote(text: str) -> str:
    """Strip the triple quotes of a multi-line block."""
    s = text.strip()
    if s.startswith('"""'):
        s = s[3:]
        if s.endswith('"""'):
            s = s[:-3]
        return s.strip("\n")
    return text


class Between:
    """The terminal from Enter to the next prompt (on a terminal only). It is held as during an answer (cli/echo.py:
    no echo, keys kept for the prompt), also while a command runs, a notice is printed or a tool runs, and across the
    prompt's own start and end (prompt_toolkit puts back the mode it found): a Ctrl-C there was echoed as `^C`, glued
    to the notice that followed it. view.ask gives it back to the user while a question waits.

    It also takes Ctrl-C between prompts: a press stops what the line started once (the chat's own handler raises
    it); the presses after it, and those that come once the line is over (the rest of a burst that stopped an
    answer), are dropped, where one raised at a random point (printing a notice, putting a handler back) ended
    the chat. Use as a context manager around the REPL, with begin() and end() around each line."""

    def __init__(self) -> None:
        from localgen.cli.echo import EchoOff

        self.terminal = EchoOff(for_prompt=True)
        self.armed = False  # a press now is the line's: raised by the chat's handler
        self._previous: Any = None

    def __enter__(self) -> Between:
        import signal

        self.terminal.off()
        previous = signal.getsignal(signal.SIGINT)
        if callable(previous):  # (ignored, a background job: left so)
            with contextlib.suppress(ValueError):  # not the main thread
                signal.signal(signal.SIGINT, self)
                self._previous = previous
        return self

    def __exit__(self, *exc: object) -> None:
        import signal

        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
        self.terminal.restore()

    def __call__(self, signum: int, frame: Any) -> None:
        if self.armed and self._previous is not None:
            self.armed = False
            self._previous(signum, frame)

    def begin(self) -> None:
        """A line was entered: the next press stops what it starts."""
        self.armed = True

    def end(self) -> None:
        """What the line started is over, or a press stopped it: presses until the next prompt change nothing."""
        self.armed = False
