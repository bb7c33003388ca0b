"""A run's window against its model's training: the trained context a prompt is past (no --ctx holds it), and what
an overflow's error says helps, for a single run (execute.py) and each line of many (many.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from localgen.backend import Backend


def past_cap(backend: Backend, tokens: int) -> int | None:
    """The context a local model was trained on, where a prompt of `tokens` tokens is past it: the load caps the
    window there (Backend.window_cap), so no --ctx holds it. None where a larger --ctx could (a remote server's
    window is its own)."""
    from localgen.engine.defaults import window_can_hold

    cap = backend.window_cap()
    return None if cap is None or window_can_hold(tokens, cap) else cap


def overflow_hint(backend: Backend, tokens: int, window: int) -> str | None:
    """What helps a prompt of `tokens` tokens a `window` cannot hold, as a single run's error says it
    (defaults.overflow_hint: a larger --ctx only where one could hold it); None for a remote model."""
    from localgen.engine import defaults

    if getattr(backend, "engine", None) is None:  # a remote server's window is no --ctx of ours
        return None
    return defaults.overflow_hint(window, backend.window_cap(), tokens)

