#!/usr/bin/env python3
"""Takes the chat page's screenshots for docs/webui.md: a fresh `localgen serve` (the default model, a home of
its own), three short conversations, then the page at desktop width (1280 px, light) and at a phone's width
(390 px, light and dark), in Debian's headless Chromium through Playwright (tests/browser.py). The answers are
the model's, at temperature 0; the figures (time to first token, tokens/s) are this machine's of the day.

    scripts/webui_screenshots.py [--out docs/img]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests import browser as chromium  # noqa: E402

QUESTIONS = [("What is Rayleigh scattering? One paragraph.", 90),
             ("Plan a picnic for four: a short list.", 90),
             ("Write a Python function that reverses a string, in a code block, then one sentence on how it works.",
              160)]


def serve(home: Path) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "LOCALGEN_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "localgen", "serve", "--port", str(port), "--quiet",
                             "-np", "1", "--ctx", "2048"], env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit("localgen serve did not start")
        time.sleep(0.2)
    proc.terminate()
    raise SystemExit("localgen serve did not start in 5 minutes")


def converse(page: Any, question: str, max_tokens: int) -> None:
    """A new conversation: one question at temperature 0, and its whole answer."""
    page.click("#new-chat")
    page.click("#open-settings")
    page.fill("#temperature", "0")
    page.fill("#max_tokens", str(max_tokens))
    page.click("#settings-form button[type=submit]")
    page.fill("#input", question)
    page.press("#input", "Enter")
    page.wait_for_function("() => document.querySelector('article.assistant .stats')")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    args = ap.parse_args(argv)
    why = chromium.missing()
    if why is not None:
        print(f"webui_screenshots: {why}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    shots = []
    with tempfile.TemporaryDirectory() as home:
        proc, url = serve(Path(home))
        try:
            with chromium.chromium() as browser:
                context = browser.new_context(viewport={"width": 1280, "height": 800})
                page = context.new_page()
                page.set_default_timeout(300_000)
                page.emulate_media(color_scheme="light")
                page.goto(f"{url}/")
                page.wait_for_function("() => document.getElementById('model-note').textContent === 'loaded'")
                for question, max_tokens in QUESTIONS:
                    converse(page, question, max_tokens)
                page.mouse.move(0, 0)
                shots.append(args.out / "webui-desktop.png")
                page.screenshot(path=str(shots[-1]))
                page.set_viewport_size({"width": 390, "height": 844})
                page.click("#open-sidebar")
                page.get_by_role("button", name=QUESTIONS[1][0][:60], exact=True).click()  # the list, on the phone
                page.wait_for_function("() => document.getElementById('sidebar').getBoundingClientRect().right <= 0")
                for scheme in ("light", "dark"):
                    page.emulate_media(color_scheme=scheme)
                    shots.append(args.out / f"webui-phone-{scheme}.png")
                    page.screenshot(path=str(shots[-1]))
                context.close()
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    for shot in shots:
        print(shot)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
