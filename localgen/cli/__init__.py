"""The command-line interface (Typer, Rich and prompt_toolkit live here only)."""


def version_line() -> str:
    """What `localgen --version` prints (main.py answers it alone before Typer is imported; the app's eager
    option answers it among other words)."""
    import localgen

    return f"localgen {localgen.__version__}"
