"""Chat templates from GGUF files, rendered as untrusted code: in the bounded Jinja sandbox (engine/jinja_sandbox.py:
size caps on every string, list or dict a template builds), with a cap on the size of the template before it
is compiled, a cap on the output, and a time limit enforced inside the render; whatever it raises is a
TemplateError."""

from __future__ import annotations

import contextlib
import datetime
import functools
import sys
import time
from types import FrameType
from typing import Any

from localgen.engine.jinja_caps import MAX_OUTPUT
from localgen.engine.jinja_sandbox import environment
from localgen.errors import TemplateError
from localgen.types import final_text

TIME_LIMIT_S = 2.0
# A template's size before it is compiled (compiling is not under the time limit, and its cost grows with the
# tokens): the longest chat templates published are about 20 KB, 5,000 tokens.
MAX_SOURCE = 1 << 20  # characters
MAX_TOKENS = 50_000
# Put after the text of a message to be continued, to find where the template wrote it: no template writes it
# itself, and it has nothing a template would strip, escape or split on.
_MARK = "LOCALGENCONTINUESHERE7c1f"


class _Timeout(Exception):
    pass


def _check_size(source: str) -> None:
    """Refuse a template too big to compile in reasonable time, before compiling it (compiling is not under
    the time limit: 300,000 tags took 52 s and 2.9 GB)."""
    if len(source) > MAX_SOURCE:
        raise TemplateError(f"the model's chat template is too long to compile: it has {len(source):,} "
                            f"characters, more than the {MAX_SOURCE:,} allowed",
                            hint="use --raw to send the prompt as plain text")
    for count, _token in enumerate(environment().lex(source), 1):
        if count > MAX_TOKENS:
            raise TemplateError(f"the model's chat template is too long to compile: it has more than "
                                f"{MAX_TOKENS:,} Jinja tokens (the longest published templates have about 5,000)",
                                hint="use --raw to send the prompt as plain text")


@functools.lru_cache(maxsize=16)
def _compiled(source: str) -> Any:
    """A template's source compiled once per process: the engine's template and the answer stage's look at
    the same model's (tools/stream.py thinking_opened_by), and serve's models keep theirs."""
    _check_size(source)
    return environment().from_string(source)


class ChatTemplate:
    """A compiled GGUF chat template. Construction compiles it; render() runs it under the limits."""

    def __init__(self, source: str, bos_token: str, eos_token: str) -> None:

        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._template = _compiled(source)
        except TemplateError:
            raise
        except Exception as e:  # compiling untrusted source: a syntax error, or anything else it provokes
            raise TemplateError(
                f"the model's chat template is broken: {_one_line(e)}",
                hint="use --raw to send the prompt as plain text",
            ) from None

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               continue_final: bool = False, **extra: Any) -> str:
        """Render a conversation to prompt text, or raise TemplateError. `continue_final`: a final assistant
        message's text is left open for the model to go on from (see `continued`)."""
        text = final_text(messages) if continue_final else None
        if text is None:
            prompt = self._render(messages, add_generation_prompt, extra)
        elif not text:  # an empty final message: the answer starts where it would have
            prompt = self._render(messages[:-1], True, extra)
        else:
            prompt = self.continued(messages, text, extra)
        if not prompt:  # not the user's empty prompt: nothing the user sends could make one
            raise TemplateError("the model's chat template rendered nothing for this conversation",
                                hint="use --raw to send the prompt as plain text")
        return prompt

    def continued(self, messages: list[dict[str, Any]], text: str, extra: dict[str, Any]) -> str:
        """The conversation up to its final assistant message's text, without the end of turn the template
        writes after it (Hugging Face's continue_final_message): rendered with a mark after the text, and cut
        there, so that what the template writes around an answer (Qwen3's closed thinking block, a channel)
        stays. A template that drops or rewrites the mark: the rest of the conversation with the generation
        prompt, and the text after it (llama-server's way)."""
        last = {**messages[-1], "content": text + _MARK}
        with contextlib.suppress(TemplateError):
            rendered = self._render([*messages[:-1], last], False, extra)
            at = rendered.rfind(_MARK)
            if at >= 0:
                return rendered[:at]
        return self._render(messages[:-1], True, extra) + text

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool, extra: dict[str, Any]) -> str:
        import jinja2

        def raise_exception(message: str) -> None:
            raise jinja2.TemplateError(message)

        def strftime_now(fmt: str) -> str:
            return datetime.datetime.now().strftime(fmt)

        context = {
            "messages": messages,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "add_generation_prompt": add_generation_prompt,
            "raise_exception": raise_exception,
            "strftime_now": strftime_now,
            **extra,
        }
        deadline = time.monotonic() + TIME_LIMIT_S

        def tracer(frame: FrameType, event: str, arg: Any) -> Any:
            if time.monotonic() > deadline:
                raise _Timeout
            return tracer

        out: list[str] = []
        size = 0
        previous = sys.gettrace()
        sys.settrace(tracer)
        try:
            for piece in self._template.generate(context):
                size += len(piece)
                if size > MAX_OUTPUT:
                    raise TemplateError("the model's chat template produced an absurdly long prompt")
                out.append(piece)
        except _Timeout:
            raise TemplateError(
                f"the model's chat template did not finish within {TIME_LIMIT_S:g} s",
                hint="the template may be hostile; use --raw to send the prompt as plain text",
            ) from None
        except TemplateError:
            raise
        except jinja2.exceptions.SecurityError as e:
            raise TemplateError(f"the model's chat template tried something unsafe: {_one_line(e)}") from None
        except RecursionError:
            raise TemplateError("the model's chat template recursed without end") from None
        except MemoryError:
            raise TemplateError("the model's chat template tried to allocate too much memory") from None
        except Exception as e:  # the template is untrusted code: whatever it raises is its fault
            raise TemplateError(
                f"the model's chat template failed: {_one_line(e)}",
                hint="use --raw to send the prompt as plain text",
            ) from None
        finally:
            sys.settrace(previous)
        return "".join(out)


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
