"""docs/api.md's promises that no other file holds, against a real `localgen serve` on SmolLM2: Ollama's
`keep_alive: 0` (and LM Studio's `ttl: 0`) unloads the model that once, and the next request keeps it loaded for
its keep-alive again; /v1/completions' `logprobs: 0` gives the chosen tokens' log-probabilities; its refusals
name the field sent (`suffix`, `tools`, `reasoning_effort`); a method /v1/responses/{id} does not take is a 405
whose `Allow` names both the methods it does; the routes table names every route the server has, and no
other; Ollama's load-time options are ignored, and /api/tags gives the fields the table names."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT
from tests.test_serve import Server

MODEL = "smollm2:135m"
pytestmark = pytest.mark.slow  # every test talks to a server on SmolLM2


@pytest.fixture(scope="module")
def child(cli_env: dict[str, str]) -> Iterator[Server]:
    s = Server(cli_env, "-np", "2", "--ctx", "1024")  # keep-alive: the default five minutes
    yield s
    assert s.stop() == 0


def _post(s: Server, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{s.url}{path}", json={"model": MODEL, **body}, timeout=120)


def _unloaded(s: Server) -> bool:
    deadline = time.monotonic() + 30
    while s.health()["loaded"] and time.monotonic() < deadline:
        time.sleep(0.1)
    return s.health()["loaded"] is False


def _seconds_left(s: Server) -> float:
    """How long /api/ps says the model stays loaded (0 when it is not loaded)."""
    for m in httpx.get(f"{s.url}/api/ps", timeout=10).json()["models"]:
        if m["name"] == MODEL:
            return (datetime.fromisoformat(m["expires_at"]) - datetime.now(UTC)).total_seconds()
    return 0.0


@pytest.mark.parametrize("path, unload", [
    ("/api/generate", {"prompt": "", "keep_alive": 0}),  # `ollama stop`'s request
    ("/api/generate", {"prompt": "Hi", "keep_alive": 0, "stream": False, "options": {"num_predict": 1}}),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 1, "ttl": 0}),
])
def test_keep_alive_0_unloads_once_and_the_next_request_keeps_the_model(child: Server, path: str,
                                                                         unload: dict[str, Any]) -> None:
    assert _post(child, path, unload).status_code == 200
    assert _unloaded(child), "keep_alive 0 unloads the model"
    r = _post(child, "/v1/completions", {"prompt": "Hi", "max_tokens": 1})
    assert r.status_code == 200, r.text
    # the server's keep-alive (5 minutes) again: not 0, which unloaded it after every later request
    assert _seconds_left(child) > 60 and child.health()["loaded"] is True


def test_completions_logprobs_0_gives_the_chosen_tokens(child: Server) -> None:
    r = _post(child, "/v1/completions", {"prompt": "The capital of France is", "max_tokens": 2, "logprobs": 0})
    assert r.status_code == 200, r.text
    doc = r.json()
    lp = doc["choices"][0]["logprobs"]
    assert lp is not None, "logprobs 0 asks for them (OpenAI's legacy API: no alternatives)"
    n = doc["usage"]["completion_tokens"]
    assert len(lp["tokens"]) == n and len(lp["token_logprobs"]) == n
    assert all(isinstance(x, float) and x <= 0 for x in lp["token_logprobs"]) and lp["top_logprobs"] == [{}] * n
    plain = _post(child, "/v1/completions", {"prompt": "The capital of France is", "max_tokens": 1}).json()
    assert plain["choices"][0]["logprobs"] is None, "none asked for, none given"


@pytest.mark.parametrize("extra, param", [
    ({"suffix": "y"}, "suffix"),
    ({"echo": True}, "echo"),
    ({"best_of": 3}, "best_of"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
    ({"reasoning_effort": "huge"}, "reasoning_effort"),
])
def test_completions_refusals_name_the_field(child: Server, extra: dict[str, Any], param: str) -> None:
    r = _post(child, "/v1/completions", {"prompt": "x", "max_tokens": 1, **extra})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert f"`{param}`" in r.json()["error"]["message"] or param in r.json()["error"]["message"]


def test_a_stored_responses_405_names_get_and_delete(child: Server) -> None:
    r = _post(child, "/v1/responses", {"input": "Hi", "max_output_tokens": 1})
    ident = r.json()["id"]
    put = httpx.put(f"{child.url}/v1/responses/{ident}", json={}, timeout=30)
    assert put.status_code == 405
    allowed = {m.strip() for m in put.headers["allow"].split(",")}
    assert {"GET", "DELETE"} <= allowed, put.headers["allow"]
    assert httpx.get(f"{child.url}/v1/responses/{ident}", timeout=30).json()["id"] == ident
    gone = httpx.delete(f"{child.url}/v1/responses/{ident}", timeout=30)
    assert gone.json() == {"id": ident, "object": "response.deleted", "deleted": True}
    assert httpx.get(f"{child.url}/v1/responses/{ident}", timeout=30).status_code == 404


def _table() -> set[tuple[str, str]]:
    """The routes docs/api.md's table names, as (method, path) with Starlette's `{name}` for a variable part."""
    table = (ROOT / "docs" / "api.md").read_text().split("## Routes", 1)[1].split("\n## ", 1)[0]
    rows = [row.split(" | ")[0] for row in table.splitlines() if row.startswith("| `")]
    found = {(m, p) for row in rows for m, p in re.findall(r"`(GET|POST|DELETE|HEAD) (/[^`]*)`", row)}
    return {(m, p.replace("/webui/FILE", "/webui/{name}")) for m, p in found}


def test_the_routes_table_names_every_route_served_and_no_other() -> None:
    from starlette.routing import Route

    from localgen.serve.app import build
    from localgen.serve.state import ServeState

    served = set()
    for r in build(ServeState(workers={})).routes:
        assert isinstance(r, Route)
        # HEAD: Starlette answers it for every GET route; the table names it where a client uses it (`/`)
        path = re.sub(r"\{(\w+):\w+\}", r"{\1}", r.path)  # /v1/models/{id:path}: the table says {id}
        served |= {(m, path) for m in r.methods or () if m != "HEAD" or r.path == "/"}
    assert _table() == served


# Ollama's options that set how a model loads, and llama.cpp's: docs/api.md names each as ignored
LOAD_OPTIONS = ("num_ctx", "num_batch", "num_gpu", "num_thread", "main_gpu", "use_mmap", "use_mlock",
                "numa", "low_vram", "f16_kv", "vocab_only", "penalize_newline", "tfs_z", "n_cpu_moe", "cpu_moe",
                "override_tensor", "kv_unified")


def test_load_time_options_are_ignored_and_any_other_is_a_400(child: Server) -> None:
    page = " ".join((ROOT / "docs" / "api.md").read_text().split())
    assert all(f"`{name}`" in page for name in LOAD_OPTIONS)
    values = {"use_mmap": True, "use_mlock": False, "numa": False, "low_vram": False, "f16_kv": True,
              "vocab_only": False, "penalize_newline": True, "tfs_z": 1.0, "cpu_moe": False,
              "override_tensor": "x=CPU", "kv_unified": True}
    options = {name: values.get(name, 1) for name in LOAD_OPTIONS}
    r = _post(child, "/api/generate", {"prompt": "Hi", "stream": False, "options": {**options, "num_predict": 1}})
    assert r.status_code == 200 and r.json()["eval_count"] == 1, r.text
    bad = _post(child, "/api/generate", {"prompt": "Hi", "stream": False, "options": {"num_predict": 1, "bogus": 1}})
    assert bad.status_code == 400 and "bogus" in bad.json()["error"], bad.text
    # ignored, but of the kind Ollama's FromMap checks (a red team's: these were a 200 where Ollama says 400)
    for wrong, says in (({"num_ctx": "big"}, "options.num_ctx must be an integer, not 'big'"),
                        ({"use_mmap": "maybe"}, "options.use_mmap must be true or false, not 'maybe'"),
                        ({"num_thread": True}, "options.num_thread must be an integer, not true")):
        bad = _post(child, "/api/chat", {"messages": [{"role": "user", "content": "Hi"}], "stream": False,
                                         "options": {"num_predict": 1, **wrong}})
        assert bad.status_code == 400 and bad.json()["error"] == says, bad.text
    # the options Ollama 0.12 no longer knows are let be whatever they hold, as its FromMap lets them be (its log:
    # "invalid option provided"); these were 400s
    for old in ({"numa": 5}, {"use_mlock": "maybe"}, {"tfs_z": [1]}, {"penalize_newline": "no"}, {"f16_kv": 2}):
        ok = _post(child, "/api/chat", {"messages": [{"role": "user", "content": "Hi"}], "stream": False,
                                        "options": {"num_predict": 1, **old}})
        assert ok.status_code == 200, (old, ok.text)


def test_an_integer_option_sent_as_a_float_is_cut_to_its_integer_as_ollama_cuts_it(child: Server) -> None:
    """`"top_k": 40.0` was a 400 (`must be an integer`); Ollama's options.FromMap takes a JSON number into an int
    field as Go's int() does, cut toward zero: 40.0 is 40, and 1.9 is 1. A bool, a string or an infinity is still
    the 400."""
    whole = {"num_predict": 2.0, "top_k": 40.0, "seed": 7.0, "repeat_last_n": 64.0, "num_keep": 4.0, "num_ctx": 1024.0}
    r = _post(child, "/api/generate", {"prompt": "Hi", "stream": False, "options": whole})
    assert r.status_code == 200 and r.json()["eval_count"] == 2, r.text
    r = _post(child, "/api/chat", {"messages": [{"role": "user", "content": "Hi"}], "stream": False,
                                   "options": {"num_predict": 1.9, "top_k": 40.5, "temperature": 0.0}})
    assert r.status_code == 200 and r.json()["eval_count"] == 1, r.text
    for bad, says in (({"top_k": True}, "options.top_k must be an integer, not true"),
                      ({"top_k": "40"}, "options.top_k must be an integer, not '40'"),
                      ({"num_keep": "4"}, "`options.num_keep` must be an integer")):
        r = _post(child, "/api/generate", {"prompt": "Hi", "stream": False, "options": {"num_predict": 1, **bad}})
        assert r.status_code == 400 and r.json()["error"] == says, r.text
    r = httpx.post(f"{child.url}/api/generate", timeout=30, headers={"content-type": "application/json"},
                   content=b'{"model": "smollm2:135m", "prompt": "Hi", "options": {"top_k": 1e999}}')
    assert r.status_code == 400 and "\n" not in r.json()["error"], r.text


def test_tags_gives_the_fields_the_table_names(child: Server) -> None:
    from localgen.models.embedded import EMBEDDED

    models = httpx.get(f"{child.url}/api/tags", timeout=30).json()["models"]
    mine = next(m for m in models if m["name"] == MODEL)
    assert {"name", "model", "modified_at", "size", "digest", "details"} <= set(mine)
    assert mine["size"] > 0 and datetime.fromisoformat(mine["modified_at"]).year >= 2024
    assert mine["details"]["parameter_size"] == "134.52M", "Ollama's HumanNumber: two places below a billion"
    assert re.fullmatch(r"[0-9a-f]{64}", mine["digest"]), "a digest of the file's path, size and mtime"
    gemma = next(m for m in models if m["name"] == "gemma3:270m")
    assert gemma["digest"] == EMBEDDED["gemma3:270m"].sha256, "the embedded model's published SHA-256"
    shown = _post(child, "/api/show", {})
    assert shown.json()["modified_at"] == mine["modified_at"], shown.text


@pytest.mark.parametrize("n, said", [(0, "0"), (999, "999"), (115_584, "116K"), (1_000_000, "1M"),
                                     (125_000_000, "125M"), (134_515_008, "134.52M"), (500_500_000, "500.50M"),
                                     (1_000_000_000, "1B"), (2_800_000_000, "2.8B"), (2_850_000_000, "2.9B")])
def test_parameter_size_is_written_as_ollama_writes_it(n: int, said: str) -> None:
    from localgen.serve.listings import human_number

    assert human_number(n) == said


@pytest.mark.parametrize("body", [{}, {"messages": None}, {"messages": []}])
def test_ollama_chat_without_messages_loads_the_model(child: Server, body: dict[str, Any]) -> None:
    r = _post(child, "/api/chat", body)
    assert r.status_code == 200 and r.json()["done_reason"] == "load", r.text
    assert r.json()["message"] == {"role": "assistant", "content": ""}


def test_ollamas_older_embeddings_route_takes_one_prompt(child: Server) -> None:
    one = _post(child, "/api/embeddings", {"prompt": "the cat"})
    assert one.status_code == 200 and len(one.json()["embedding"]) == 576, one.text  # SmolLM2-135M's width
    several = _post(child, "/api/embeddings", {"prompt": ["the cat", "the dog"]})
    assert several.status_code == 400 and "`prompt` must be a string" in several.json()["error"], several.text


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/embeddings", "/rerank", "/models/load"])
def test_a_body_not_sent_as_json_is_a_415_outside_ollamas_routes(path: str) -> None:
    from starlette.testclient import TestClient

    from localgen.serve.app import build
    from localgen.serve.guard import Policy
    from localgen.serve.state import ServeState

    client = TestClient(build(ServeState(workers={}), Policy(check_host=False)))
    body = b'{"model": "smollm2:135m"}'
    for kind in ("text/plain", "application/x-www-form-urlencoded"):
        assert client.post(path, content=body, headers={"Content-Type": kind}).status_code == 415, (path, kind)
    # Ollama's routes read a form type, text/plain (a page's fetch) or none as JSON, as Ollama does: past the body,
    # to the model (none here)
    for kind in ("application/x-www-form-urlencoded", "text/plain;charset=UTF-8"):
        r = client.post("/api/show", content=body, headers={"Content-Type": kind})
        assert r.status_code != 415, r.text


def test_ollamas_embed_says_its_load_and_takes_keep_alive(child: Server) -> None:
    assert _post(child, "/api/generate", {"prompt": "", "keep_alive": 0}).json()["done_reason"] == "unload"
    assert _unloaded(child)
    first = _post(child, "/api/embed", {"input": "the cat", "keep_alive": 0})
    assert first.status_code == 200 and first.json()["load_duration"] > 0, first.text  # it loaded the model
    assert _unloaded(child), "keep_alive 0 unloads it after the embedding"
    kept = _post(child, "/api/embed", {"input": "the cat", "keep_alive": "10m"})
    assert kept.status_code == 200 and kept.json()["load_duration"] > 0
    assert _seconds_left(child) > 360, "10 minutes, not the server's 5"
    again = _post(child, "/api/embeddings", {"prompt": "the cat"}).json()
    assert len(again["embedding"]) == 576
    warm = _post(child, "/api/embed", {"input": "the cat"}).json()
    assert warm["load_duration"] == 0, "loaded already"
    # nothing to embed: Ollama's way to load (or with keep_alive 0 unload) an embedding model (they were 400s)
    for path, body, answer in (("/api/embed", {"input": []}, {"model": "smollm2:135m", "embeddings": []}),
                               ("/api/embed", {}, {"model": "smollm2:135m", "embeddings": []}),
                               ("/api/embeddings", {"prompt": ""}, {"embedding": []})):
        gone = _post(child, path, {**body, "keep_alive": 0})
        assert gone.status_code == 200 and gone.json() == answer and _unloaded(child), gone.text
        loaded = _post(child, path, body)
        assert loaded.status_code == 200 and loaded.json() == answer, loaded.text
        assert _seconds_left(child) > 0, "loaded, with the server's keep-alive"
    assert _post(child, "/api/embed", {"input": "x", "keep_alive": "soon"}).status_code == 400
    bad = _post(child, "/api/embed", {"input": "x", "keep_alive": True})  # said as JSON writes it (it was `True`)
    assert bad.status_code == 400 and "bad duration true: use seconds" in bad.json()["error"], bad.text
    bad = _post(child, "/api/embed", {"input": [], "dimensions": "x"})  # checked with nothing to embed too
    assert bad.status_code == 400 and "`dimensions`" in bad.text, bad.text
    assert _post(child, "/api/generate", {"prompt": "", "keep_alive": "5m"}).status_code == 200  # as it was


@pytest.mark.parametrize(("query", "page", "more"), [
    ("limit=2", ["a", "b"], True),
    ("after_id=b&limit=2", ["c", "d"], True),
    ("before_id=e&limit=2", ["c", "d"], True),
    ("before_id=c", ["a", "b"], False),
    # both: the models between them (a red team's: after_id was let be, and the page began at the list's start)
    ("after_id=a&before_id=c", ["b"], False),
    ("after_id=a&before_id=e&limit=2", ["c", "d"], True),
    ("after_id=b&before_id=c", [], False),
    ("after_id=d&before_id=b", [], False),
])
def test_anthropics_model_page_by_its_cursors(query: str, page: list[str], more: bool) -> None:
    from starlette.requests import Request

    from localgen.serve.listings import _anthropic_page

    data = [{"id": x} for x in "abcde"]
    got = _anthropic_page(data, Request({"type": "http", "query_string": query.encode(), "headers": []}))
    assert [d["id"] for d in got["data"]] == page and got["has_more"] is more, got
    assert got["first_id"] == (page[0] if page else None) and got["last_id"] == (page[-1] if page else None)
