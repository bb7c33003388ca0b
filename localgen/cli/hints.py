"""One-time tips on stderr, shown on a terminal only (pipelines and scripts stay quiet); the note, always
shown, that a model's load settings came from a tuning record; and the way out when a conversation's model is
gone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from localgen.errors import ModelNotFoundError


def tune_tip(tty: bool, say: Callable[[str], object], name: str, path: str,
             origins: dict[str, str] | None = None) -> None:
    """Once per model file: `localgen tune` can make it faster (not when its settings are already tuned)."""
    from localgen.cli.output import ctrl_c_seen

    if not tty or ctrl_c_seen():  # no advice for a command on its way out
        return
    if origins is not None and any(v.startswith(("tuned", "partly tuned")) for v in origins.values()):
        return
    from localgen import tuning

    if tuning.first_sight(path):
        say(f"tip: `localgen tune -m {name}` measures the fastest settings for this model on this machine "
            "(a minute or two) and makes them its defaults")


_NOTED: set[str] = set()  # model files whose tuning record this process has named
_WARNED: list[bool] = []  # whether this process said what of the tuning records cannot be used


def record_note(say: Callable[[str], object], name: str, path: str, values: dict[str, Any],
                origins: dict[str, str]) -> None:
    """Once per model file in a process, whatever the output: the load settings a tuning record gave (a record
    made long ago, or on a busy machine, is never a silent default). `values`: each setting's value. Once in a
    process, where a record could have set something: what of the records' file cannot be read (records are never
    lost without a word)."""
    if not _WARNED and any(o != "flag" for o in origins.values()):
        from localgen import tuning

        _WARNED.append(True)
        if (problem := tuning.problem()) is not None:
            say(f"warning: {problem}")
    taken = {k: o for k, o in origins.items() if o.startswith(("tuned", "partly tuned"))}
    if not taken or path in _NOTED:
        return
    _NOTED.add(path)

    def shown(v: Any) -> str:
        return ("on" if v else "off") if isinstance(v, bool) else str(v)

    say(f"{name}: {' · '.join(f'{k} {shown(values[k])}' for k in taken)} from its tuning record "
        f"({next(iter(taken.values()))}; `localgen tune --show` lists records, `tune --reset` forgets them)")


def model_gone(conversation: str, model: str | None, e: ModelNotFoundError, go_on: str) -> ModelNotFoundError:
    """The error for a conversation (continued or resumed) whose model is not here any more: it names -m.
    `go_on` is the verb the hint uses ("continue", "resume")."""
    return ModelNotFoundError(f"the conversation {conversation} was with {model!r}, which is not here any more "
                              f"({e.message})", hint=f"{go_on} it with another model: add -m MODEL "
                                                     "(`localgen list` shows them)")
