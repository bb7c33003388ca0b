"""One-time tips on stderr, shown on a terminal only (pipelines and scripts stay quiet)."""

from __future__ import annotations

from collections.abc import Callable


def tune_tip(tty: bool, say: Callable[[str], object], name: str, path: str,
             origins: dict[str, str] | None = None) -> None:
    """Once per model file: `localgen tune` can make it faster (not when its settings are already tuned)."""
    if not tty:
        return
    if origins is not None and any(v.startswith(("tuned", "partly tuned")) for v in origins.values()):
        return
    from localgen import tuning

    if tuning.first_sight(path):
        say(f"tip: `localgen tune -m {name}` measures the fastest settings for this model on this machine "
            "(a minute or two) and makes them its defaults")
