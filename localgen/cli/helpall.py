"""`--help` lists the options most uses need; `--help-all` lists every one. run, chat and serve take every
setting of the table (about 100 options for run): their help would run to several screens, so the rest are
hidden from `--help` (never from parsing: a hidden option works the same) and an epilog says how many and
where they are."""

from __future__ import annotations

from typing import Any

FLAG = "--help-all"
_SAMPLING = {"temperature", "top_k", "top_p", "min_p", "seed", "max_tokens", "stop", "system"}
_LOADING = {"model", "ctx", "threads", "gpu_layers", "offline"}
COMMON: dict[str, frozenset[str]] = {
    "run": frozenset({"prompt_arg", "prompt", "raw", "document", "file", "parallel", "image", "attach", "json_out",
                      "stats", "think", "continue_", "no_log", "grammar", "json_schema", "endpoint", "verbose",
                      *_SAMPLING, *_LOADING}),
    "chat": frozenset({"name", "resume", "list_", "plain", "stats", "think", "no_log", "endpoint", "functions",
                       "mcp", "verbose", *_SAMPLING, *_LOADING}),
    "serve": frozenset({"models", "host", "port", "parallel", "api_key", "api_key_file", "keep_alive", "max_models",
                        "max_memory", "cors", "quiet", "verbose", *_SAMPLING, *_LOADING} - {"system", "model"}),
}


def wanted(args: list[str]) -> tuple[list[str], bool]:
    """The arguments with --help-all made --help, and whether it was given."""
    if FLAG not in args:
        return args, False
    return ["--help" if a == FLAG else a for a in args], True


def trim(group: Any, name: str | None) -> None:
    """Hide from `name`'s help the options not in its common set (click's `hidden`), and say in an epilog how
    many there are and how to see them."""
    common = COMMON.get(name or "")
    command = getattr(group, "commands", {}).get(name) if common else None
    if command is None or common is None:
        return
    hidden = 0
    for param in command.params:
        if param.param_type_name == "option" and param.name not in common:
            param.hidden = True
            hidden += 1
    command.epilog = (f"{hidden} more options (sampling, loading and GPU, and the rest): localgen {name} {FLAG}"
                      + (f"\n\n{command.epilog}" if command.epilog else ""))
