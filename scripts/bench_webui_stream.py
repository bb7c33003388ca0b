#!/usr/bin/env python3
"""What drawing a long streamed answer costs the chat page: the page's own files (localgen/serve/page.py) served
with a scripted chat route that streams a Markdown answer of about 80,000 characters in about 4,000 pieces, one
every 2 ms (a fast model's pace), to Debian's headless Chromium (tests/browser.py). The page's animation frames are
timed in the page (each frame draws what came since the last): their number, the main thread's time in them,
the longest, and the mean of the last 100 (the answer longest by then). The model is left out on purpose: what
is measured is the page, at a pace no model on this machine keeps up.

    scripts/bench_webui_stream.py [--pieces 4000] [--every-ms 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import harness

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests import browser as chromium  # noqa: E402

MODEL = "scripted"
# one piece of the answer's Markdown after another: paragraphs, a list, a code block, a table, as answers are
BLOCKS = ["Here is a paragraph of the answer that goes on for a while, with *emphasis*, `code` and a [link]("
          "https://example.com) in it, as a model writes one.\n\n",
          "- a first item\n- a second item with **bold** text\n- a third\n\n",
          "```python\ndef reverse(s):\n    return s[::-1]\n```\n\n",
          "| name | value |\n| --- | ---: |\n| one | 1 |\n| two | 2 |\n\n"]


def answer_pieces(count: int) -> list[str]:
    text = "".join(BLOCKS[k % len(BLOCKS)] for k in range(count // 4))
    size = max(1, len(text) // count)
    return [text[k:k + size] for k in range(0, len(text), size)]


def app(pieces: list[str], every_s: float) -> object:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
    from starlette.routing import Route

    from localgen.serve import page

    async def root(_: Request) -> Response:
        return PlainTextResponse("bench")

    async def models(_: Request) -> Response:
        return JSONResponse({"data": [{"id": MODEL, "max_model_len": 1 << 20, "default": True}]})

    async def loaded(_: Request) -> Response:
        return JSONResponse({"data": [{"id": MODEL, "status": {"value": "loaded"}}]})

    async def show(_: Request) -> Response:
        return JSONResponse({"capabilities": ["completion"]})

    async def empty(_: Request) -> Response:
        return JSONResponse({"data": []})

    async def chat(_: Request) -> Response:
        async def events() -> AsyncIterator[bytes]:
            for text in pieces:
                yield f"data: {json.dumps({'choices': [{'index': 0, 'delta': {'content': text}}]})}\n\n".encode()
                await asyncio.sleep(every_s)
            yield b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n'
        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[*page.routes(root), Route("/v1/models", models), Route("/models", loaded),
                             Route("/api/show", show, methods=["POST"]), Route("/tools", empty),
                             Route("/v1/vector_stores", empty),
                             Route("/v1/chat/completions", chat, methods=["POST"])])


TIME_FRAMES = """() => {
    const raf = window.requestAnimationFrame.bind(window);
    window.frames_ms = [];
    window.requestAnimationFrame = (cb) => raf((t) => {
        const start = performance.now();
        cb(t);
        window.frames_ms.push(performance.now() - start);
    });
}"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pieces", type=int, default=4000)
    parser.add_argument("--every-ms", type=float, default=2.0)
    args = parser.parse_args()
    import uvicorn

    pieces = answer_pieces(args.pieces)
    port = harness.free_port()
    server = uvicorn.Server(uvicorn.Config(app(pieces, args.every_ms / 1000), port=port, log_level="warning"))  # type: ignore[arg-type]
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        with chromium.chromium() as browser:
            page = browser.new_page()
            page.set_default_timeout(600_000)
            page.goto(f"http://127.0.0.1:{port}/")
            page.wait_for_function("() => document.querySelectorAll('#model option').length > 0")
            page.evaluate(TIME_FRAMES)
            started = time.monotonic()
            page.fill("#input", "Write a long answer.")
            page.press("#input", "Enter")
            page.wait_for_function("() => document.getElementById('stop').hidden"
                                   " && document.querySelector('article.assistant:not(.pending)')", polling=100)
            wall = time.monotonic() - started
            frames = page.evaluate("window.frames_ms")
            drawn = page.evaluate("document.querySelector('article.assistant .body').textContent.length")
    finally:
        server.should_exit = True
        thread.join()
    last = frames[-100:]
    print(f"{len(pieces)} pieces, {sum(map(len, pieces))} characters ({drawn} drawn), one every {args.every_ms} ms")
    print(f"wall {wall:.1f} s; {len(frames)} frames, {sum(frames) / 1000:.2f} s in them, longest {max(frames):.1f} ms, "
          f"last 100 mean {sum(last) / len(last):.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
