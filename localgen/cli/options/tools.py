"""The tools of --functions and --mcp, opened for run and chat alike before the model loads."""

from __future__ import annotations

import sys
from typing import Any

from localgen.cli.options import ToolOptions

TOOLS_NAMED = 8  # a refused --tool-choice lists this many of the tools' names


def call_cut_note(finish_reason: object, turn: Any, limit: object) -> str | None:
    """run's and chat's warning for an answer whose round -n cut before a word of it: a call (the one a forced
    --tool-choice asks for) was being written, and is left out, and nothing on stdout says why (None otherwise; a
    thinking model that spent -n on its reasoning wrote no call)."""
    if str(finish_reason) != "length" or turn.text.strip() or (turn.reasoning or "").strip() \
            or not isinstance(limit, int) or limit <= 0:
        return None
    return f"the answer reached its limit of {limit:,} tokens (-n) before a word of it, in a tool call, which is " \
           "left out: give a larger -n"


def open_toolbox(tools: ToolOptions | None) -> Any:
    """The tools of --functions and --mcp, loaded and started (None without them); a --tool-choice that
    names none of them is refused here, before the model loads."""
    if tools is None or not tools.any:
        return None
    from localgen.errors import ToolError
    from localgen.tools.loop import Toolbox, named_choice
    from localgen.tools.plan import check_choice

    box = Toolbox.open(list(tools.functions or []), list(tools.mcp or []),
                       lambda text: print(f"warning: {text}", file=sys.stderr))
    for text in box.left_out:
        print(f"warning: {text}", file=sys.stderr)
    try:
        check_choice(box.specs, named_choice(tools.tool_choice or "auto"))
    except ToolError:
        names = ", ".join(t.name for t in box.specs[:TOOLS_NAMED]) + (", ..." if len(box.specs) > TOOLS_NAMED else "")
        box.close()
        raise ToolError(f"--tool-choice names {tools.tool_choice!r}, which is none of the tools: {names or 'none'}",
                        "give auto, none, required or a tool's name") from None
    except BaseException:
        box.close()
        raise
    return box
