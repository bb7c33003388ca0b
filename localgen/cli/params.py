"""Fast coercion of command-line values: typer's pydantic coercion bypassed for plain types. The patch lives
with localgen's other patches of libraries, in localgen/_compat.py; `install` is its name for the CLI."""

from __future__ import annotations

from localgen._compat import fast_typer_coercion as install

__all__ = ["install"]
