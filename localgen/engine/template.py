"""Chat templates from GGUF files, rendered as untrusted code: an immutable Jinja sandbox, size caps on
string and list arithmetic, a cap on the output, and a time limit enforced inside the render."""

from __future__ import annotations

import datetime
import json
import sys
import time
from types import FrameType
from typing import Any

from localgen.errors import TemplateError

TIME_LIMIT_S = 2.0
MAX_OUTPUT = 4 << 20  # characters; a prompt this long would not fit any context anyway
MAX_SEQUENCE = 1 << 20  # result size of `*` on strings and lists


class _Timeout(Exception):
    pass


def _environment() -> Any:
    import jinja2.sandbox
    from jinja2.exceptions import SecurityError

    class Sandbox(jinja2.sandbox.ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            if operator == "**":
                if isinstance(right, (int, float)) and abs(right) > 64:
                    raise SecurityError("exponent too large")
                return left**right
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_SEQUENCE:
                    raise SecurityError("sequence repetition too large")
            return left * right

    env = Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    # HF's tojson keeps non-ASCII text as is.
    env.policies["json.dumps_kwargs"] = {"ensure_ascii": False}
    env.filters["tojson"] = lambda v, indent=None, **kw: json.dumps(v, ensure_ascii=False, indent=indent)
    return env


class ChatTemplate:
    """A compiled GGUF chat template. Construction compiles it; render() runs it under the limits."""

    def __init__(self, source: str, bos_token: str, eos_token: str) -> None:
        import jinja2

        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateError as e:
            raise TemplateError(
                f"the model's chat template is broken: {_one_line(e)}",
                hint="use --raw to send the prompt as plain text",
            ) from None

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = True, **extra: Any) -> str:
        """Render a conversation to prompt text, or raise TemplateError."""
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
        except jinja2.exceptions.SecurityError as e:
            raise TemplateError(f"the model's chat template tried something unsafe: {_one_line(e)}") from None
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
            raise TemplateError(
                f"the model's chat template failed: {_one_line(e)}",
                hint="use --raw to send the prompt as plain text",
            ) from None
        except RecursionError:
            raise TemplateError("the model's chat template recursed without end") from None
        finally:
            sys.settrace(previous)
        return "".join(out)


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
