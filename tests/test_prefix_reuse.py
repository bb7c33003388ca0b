"""--prefix-reuse all: a cached prefix gives back every token it holds, a conversation's answers too (as llama.cpp
keeps them), where the default, exact, keeps only what gives a fresh evaluation's logits bit for bit
(engine/tokens.py, reusable_prefix)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from localgen.engine.tokens import reusable_prefix
from tests.test_serve import SERVE_GRID, Server

WORDS = ("The quick brown fox jumps over the lazy dog while the committee reviews section %d of the household "
         "handbook on shared appliances, chores, budgets and quiet hours. ")


def _continued(smollm2_path: Any, reuse: str) -> tuple[int, list[int], int]:
    """A 200-token prompt, 30 tokens generated after it (one at a time), then the 300-token prompt that
    continues it: how many tokens the cache held, which, and how many the longer prompt reused."""
    from localgen.engine.llama import Engine
    from localgen.models.resolve import resolve
    from localgen.native.prompt import Prompt
    from localgen.types import LoadParams

    engine = Engine(resolve(str(smollm2_path)), LoadParams(n_ctx=1024, n_batch=256, n_ubatch=128, prefix_reuse=reuse))
    try:
        tokens = engine.tokenize("".join(WORDS % i for i in range(20)), True)[:300]
        engine.kv.evaluate(Prompt.text(tokens[:200]))
        for t in tokens[200:230]:
            engine.kv.decode([t], all_logits=False)
        held, evaluated = engine.kv.held, engine.kv.evaluated
        return evaluated, held, engine.kv.evaluate(Prompt.text(tokens))
    finally:
        engine.close()


def test_all_keeps_a_conversations_answer_and_exact_does_not(smollm2_path: Any) -> None:
    evaluated, held, kept = _continued(smollm2_path, "all")
    assert kept == len(held) > evaluated, "every held token, the generated ones too"
    evaluated, held, kept = _continued(smollm2_path, "exact")
    assert kept == reusable_prefix(len(held), evaluated, 300, 128, 256) <= evaluated < len(held)


def test_the_setting_is_a_load_setting_a_modelfile_takes() -> None:
    from localgen import loadsettings
    from localgen.errors import UsageError
    from localgen.types import LoadParams

    assert LoadParams().prefix_reuse == "exact"
    key, value = loadsettings.parse_load_text("prefix_reuse", "ALL")
    assert LoadParams(**loadsettings.load_fields({key: value})).prefix_reuse == "all"
    with pytest.raises(UsageError, match="--prefix-reuse takes exact or all"):
        loadsettings.parse_load_text("prefix_reuse", "most")


@pytest.fixture(scope="module")
def server(cli_env: dict[str, str]) -> Iterator[Server]:
    s = Server(cli_env, "-np", "1", "--ctx", "1024", "--prefix-reuse", "all")
    yield s
    assert s.stop() == 0


def test_serve_with_prefix_reuse_all_reuses_the_whole_held_conversation(server: Server) -> None:
    conv = [{"role": "system", "content": "You are terse. " * 60}, {"role": "user", "content": "Name a colour."}]
    body = {"model": "smollm2:135m", "max_tokens": 6, "temperature": 0}

    def ask() -> dict[str, Any]:
        r = httpx.post(f"{server.url}/v1/chat/completions", timeout=120, json={**body, "messages": conv})
        assert r.status_code == 200, r.text
        return dict(r.json())

    first = ask()
    conv += [{"role": "assistant", "content": first["choices"][0]["message"]["content"]},
             {"role": "user", "content": "Another one."}]
    second = ask()
    p1, a1, p2 = first["usage"]["prompt_tokens"], first["usage"]["completion_tokens"], second["usage"]["prompt_tokens"]
    cache_n = second["timings"]["cache_n"]
    assert p1 < cache_n <= p1 + a1, "turn 2 reused turn 1's prompt and the answer's tokens"
    third = ask()  # the same conversation again: the slot holds all of its prompt, so all but the last is reused
    assert third["timings"]["cache_n"] == p2 - 1 > reusable_prefix(p2, p2, p2, *SERVE_GRID)
