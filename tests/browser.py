"""Headless Chromium for the chat page's tests and its screenshots (scripts/webui_screenshots.py): Debian's
`chromium` package, which `scripts/install.sh --dev` installs, driven by Playwright for Python. Never a browser
Playwright downloads (`playwright install`): the machine's own, started with the flags below.
LOCALGEN_CHROMIUM names another Chromium binary."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = Path(os.environ.get("LOCALGEN_CHROMIUM", "/usr/bin/chromium"))
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


def missing() -> str | None:
    """Why the browser cannot start here (None: it can)."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright for Python is not installed: run scripts/install.sh --dev (the dev extra brings it)"
    if not CHROMIUM.exists():
        return (f"the chat page's browser tests need Chromium at {CHROMIUM}: run scripts/install.sh --dev (it runs "
                "apt-get install chromium), or set LOCALGEN_CHROMIUM to a Chromium binary")
    return None


@contextmanager
def chromium(*more: str, timeout_ms: float | None = None) -> Iterator[Any]:
    """A headless Chromium (a Playwright Browser) with ARGS and `more` flags, closed after."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=[*ARGS, *more], timeout=timeout_ms)
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def bounded() -> Iterator[Any]:
    """Chromium for a module of page tests: its JavaScript heap bounded and its start under a deadline, so a runaway
    page fails fast; where it cannot start, the test fails (never a skip: a page nobody tested does not work)."""
    import pytest

    why = missing()
    if why is not None:
        pytest.fail(why)
    with chromium("--js-flags=--max-old-space-size=512", timeout_ms=60_000) as b:
        yield b
