"""serve --collection NAME: embeddings collections offered read-only as OpenAI's vector stores, through the real
`openai` client against the real server (docs/api.md, "Vector stores"): the listing and one store, a search that
ranks as `localgen similar` does, the search's bounds and errors, and serve's start-up checks."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import CLI
from tests.test_serve import Server
from tests.test_user_processes import free_port

KEY = "sk-vector-test"
TEXTS = {"cats": "Cats are small furry pets that purr and chase mice.",
         "rust": "Rust is a systems programming language with a borrow checker.",
         "paris": "Paris is the capital of France, on the river Seine."}
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def home_env(cli_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A home with collection `notes` (SmolLM2's mean-pooled vectors) and `lasts` (the same with last pooling)."""
    env = {**cli_env, "LOCALGEN_HOME": str(tmp_path_factory.mktemp("vs") / "home")}
    lines = "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in TEXTS.items())
    for name, extra in (("notes", ()), ("lasts", ("--pooling", "last"))):
        r = CLI(env)("embed", "--store", name, *extra, input=lines)
        assert r.returncode == 0, r.stderr
    r = CLI(env)("embed", "--store", "long", input="".join(json.dumps({"id": f"fact{i}", "text": LONG[i]}) + "\n"
                                                          for i in range(len(LONG))))
    assert r.returncode == 0, r.stderr
    r = CLI(env)("embed", "--store", "removed", "a text to remove")
    assert r.returncode == 0, r.stderr
    return env


# texts of about 120 tokens each: five of them do not fit a 512-token window beside the answer's room
LONG = [f"Fact {i} about the river Seine and Paris: " + " ".join(f"word{i}x{j}" for j in range(40)) for i in range(6)]


@pytest.fixture(scope="module")
def server(home_env: dict[str, str]) -> Iterator[Server]:
    s = Server(home_env, "--api-key", KEY, "-np", "2", "--ctx", "512", "--collection", "notes",
               "--collection", "lasts", "--collection", "long", "--collection", "removed")
    yield s
    assert s.stop() == 0


def test_collections_are_listed_and_searched_as_openais_vector_stores(server: Server, home_env: dict[str, str]) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY)
    listed = client.vector_stores.list()
    assert [s.id for s in listed.data] == ["notes", "lasts", "long", "removed"] and not listed.has_more
    one = client.vector_stores.retrieve("notes")
    assert (one.name, one.status, one.file_counts.completed, one.file_counts.total) == ("notes", "completed", 3, 3)
    assert one.metadata == {"model": "smollm2:135m", "pooling": "mean", "dimensions": "576"}
    assert one.usage_bytes > 576 * 4 * 3  # three float32 vectors and their texts

    page = client.vector_stores.search("notes", query=QUESTION, max_num_results=2)
    got = [(d.file_id, d.score, d.content[0].text) for d in page.data]
    similar = CLI(home_env)("similar", "notes", QUESTION, "-n", "2")
    assert similar.returncode == 0, similar.stderr
    expected = [(d["id"], d["score"], d["content"]) for d in map(json.loads, similar.stdout.splitlines())]
    assert got == expected and got[0][0] == "paris", got  # the same ranking and scores as `localgen similar`
    assert [d.filename for d in page.data] == [g[0] for g in got] and page.search_query == [QUESTION]
    assert [d.attributes for d in page.data] == [{"vector_store_id": "notes"}] * 2  # as file_search's results

    # several queries: each text scored by the query it is most like
    both = client.vector_stores.search("notes", query=[QUESTION, "a purring pet"], max_num_results=3)
    top2 = {d.file_id for d in both.data[:2]}
    assert top2 == {"paris", "cats"}, [(d.file_id, d.score) for d in both.data]
    # a threshold keeps only the scores at or above it
    cut = client.vector_stores.search("notes", query=QUESTION, ranking_options={"score_threshold": got[0][1]})
    assert [d.file_id for d in cut.data] == ["paris"]


def test_a_search_says_what_it_cannot_do(server: Server) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY)
    with pytest.raises(openai.NotFoundError) as missing:
        client.vector_stores.search("nosuch", query="x")
    assert "offered here: notes, lasts, long, removed" in str(missing.value)
    for bad, param in (({"query": ""}, "query"), ({"query": []}, "query"),
                       ({"query": "x", "max_num_results": 0}, "max_num_results"),
                       ({"query": "x", "max_num_results": 51}, "max_num_results"),
                       ({"query": "x", "filters": {"type": "eq", "key": "a", "value": "b"}}, "filters"),
                       ({"query": "x", "rewrite_query": True}, "rewrite_query"),
                       ({"query": "x", "ranking_options": {"score_threshold": 2}}, "ranking_options.score_threshold"),
                       ({"query": "x", "ranking_options": []}, "ranking_options.score_threshold"),
                       ({"query": [f"q{i}" for i in range(17)]}, "query")):
        r = httpx.post(f"{server.url}/v1/vector_stores/notes/search", json=bad,
                       headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (bad, r.text)
    # the key guards the stores as every route: their texts are the collection owner's
    assert httpx.get(f"{server.url}/v1/vector_stores", timeout=10).status_code == 401
    # read-only: a store is made and changed with `localgen embed --store`
    auth = {"Authorization": f"Bearer {KEY}"}
    assert httpx.post(f"{server.url}/v1/vector_stores", json={"name": "x"}, headers=auth, timeout=10).status_code == 405
    assert httpx.delete(f"{server.url}/v1/vector_stores/notes", headers=auth, timeout=10).status_code == 405
    # a collection whose vectors another pooling made cannot be searched with this model's: a 400 that says so
    with pytest.raises(openai.BadRequestError) as other:
        client.vector_stores.search("lasts", query=QUESTION)
    assert "made with last pooling" in str(other.value) and "mean pooling" in str(other.value)


def test_serve_refuses_a_collection_it_cannot_offer(home_env: dict[str, str], tmp_path: Path) -> None:
    """Checked before the port is taken: an unknown collection (naming those there are), one on an address
    others reach with no key; and, with no collections at all, a hint at how to make one."""
    cli = CLI(home_env)
    r = cli("serve", "--collection", "nosuch", "--port", "1")
    said = re.search(r"no collection named 'nosuch' \(there are: lasts, long, notes\b", r.stderr)  # sorted
    assert r.returncode == 2 and said, r.stderr
    r = cli("serve", "--collection", "notes", "--host", "0.0.0.0", "--port", "1")
    assert r.returncode == 2 and "with no API key would let anyone" in r.stderr, r.stderr
    r = CLI({**home_env, "LOCALGEN_HOME": str(tmp_path / "empty")})("serve", "--collection", "notes", "--port", "1")
    assert r.returncode == 2 and "there are no collections yet" in r.stderr and "embed --store" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_serve_refuses_an_empty_collection(home_env: dict[str, str], tmp_path: Path) -> None:
    """A collection with no entries has nothing to search: refused at start, as run --rag refuses it."""
    env = {**home_env, "LOCALGEN_HOME": str(tmp_path / "home")}
    r = CLI(env)("embed", "--store", "hollow", "a text to remove")
    assert r.returncode == 0, r.stderr
    entry = json.loads(CLI(env)("collections", "show", "hollow", "--json").stdout)["items"][0]["id"]
    r = CLI(env)("collections", "rm", "hollow", "--id", entry)
    assert r.returncode == 0, r.stderr
    # a port of its own, not 1: were the check gone, the server would start and hold it until the timeout
    r = CLI(env)("serve", "--collection", "hollow", "--port", str(free_port()), timeout=120)
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert r.stderr == "localgen: error: --collection 'hollow' is empty: there is nothing to search (store texts in " \
                       "it with `localgen embed --file FILE --store hollow`)\n", r.stderr


def test_a_collection_of_a_model_file_is_searched_once_serve_offers_that_file(
        home_env: dict[str, str], tmp_path: Path) -> None:
    """A collection made with `-m FILE` (the tiny BERT, an encoder with CLS pooling): serve without that model is
    refused with the -m that serves it; with it, the search ranks as `localgen similar` does."""
    import openai

    from tests.tiny_bert import build

    bert = str(build(tmp_path / "tiny-bert.gguf"))
    cli = CLI(home_env)
    r = cli("embed", "-m", bert, "--store", "bert", input="the cat sat on the mat\nstocks fell in paris\n")
    assert r.returncode == 0, r.stderr
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = str(free.getsockname()[1])
    r = cli("serve", "--collection", "bert", "--no-on-demand", "--ctx", "512", "--port", port)
    assert r.returncode == 2 and "was made with tiny-bert" in r.stderr and f"-m {bert}" in r.stderr, r.stderr
    s = Server(home_env, "-m", bert, "--collection", "bert", "--api-key", KEY)
    try:
        client = openai.OpenAI(base_url=f"{s.url}/v1", api_key=KEY)
        got = [(d.file_id, d.score) for d in client.vector_stores.search("bert", query="a cat on a mat").data]
    finally:
        assert s.stop() == 0
    similar = cli("similar", "bert", "a cat on a mat")
    assert got == [(d["id"], d["score"]) for d in map(json.loads, similar.stdout.splitlines())], (got, similar)


def test_responses_file_search_answers_from_the_store(server: Server) -> None:
    """The Responses API's file_search tool: the request's question searched for in the stores it names, a
    file_search_call item before the answer (its results with include), the texts put into the question under
    their ids (what input_items then lists), its events when streamed, and what it refuses."""
    import openai

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY)
    tool = {"type": "file_search", "vector_store_ids": ["notes"], "max_num_results": 2}
    r = client.responses.create(model="smollm2:135m", input=QUESTION, max_output_tokens=16, temperature=0,
                                tools=[tool], include=["file_search_call.results"])
    assert [o.type for o in r.output] == ["file_search_call", "message"], r.output
    call = r.output[0]
    assert call.type == "file_search_call" and call.queries == [QUESTION] and call.status == "completed"
    found = client.vector_stores.search("notes", query=QUESTION, max_num_results=2)
    assert call.results is not None
    assert [(x.file_id, x.score, x.text) for x in call.results] == \
        [(d.file_id, d.score, d.content[0].text) for d in found.data]
    assert r.tools[0].type == "file_search" and r.tools[0].max_num_results == 2
    # the question the model answered has the texts ahead of it, each under its id
    asked = client.responses.input_items.list(r.id).data
    assert len(asked) == 1 and asked[0].type == "message"
    text = asked[0].content[0].text  # type: ignore[union-attr]
    assert text.endswith(f"Question: {QUESTION}") and f"[paris]\n{TEXTS['paris']}" in text, text
    from localgen.embeddings.retrieve import RAG_INSTRUCTION

    assert text.startswith(RAG_INSTRUCTION)  # what run --rag sends
    assert "[cats]" not in text  # only the two best

    # without include the item says what was searched for, not what was found
    plain = client.responses.create(model="smollm2:135m", input=QUESTION, max_output_tokens=4, tools=[tool])
    assert plain.output[0].type == "file_search_call" and plain.output[0].results is None

    # a continuation searches for its own input, never an earlier turn's
    follow = client.responses.create(model="smollm2:135m", input="Tell me about a purring pet.", max_output_tokens=4,
                                     tools=[tool], previous_response_id=r.id, include=["file_search_call.results"])
    assert follow.output[0].type == "file_search_call"
    assert follow.output[0].queries == ["Tell me about a purring pet."]
    assert follow.output[0].results and follow.output[0].results[0].file_id == "cats"

    events = list(client.responses.create(model="smollm2:135m", input=QUESTION, max_output_tokens=4, tools=[tool],
                                          stream=True))
    kinds = [e.type for e in events if not e.type.endswith(".delta")]
    final = events[-1].response  # type: ignore[union-attr]
    assert kinds[:7] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.file_search_call.in_progress", "response.file_search_call.searching",
                         "response.file_search_call.completed", "response.output_item.done"], kinds
    assert [o.type for o in final.output] == ["file_search_call", "message"]

    for tools, words in (([{"type": "file_search", "vector_store_ids": ["nosuch"]}], "No vector store found"),
                         ([tool, tool], "at most one file_search tool"),
                         ([{**tool, "filters": {"type": "eq", "key": "a", "value": 1}}], "filters are not supported"),
                         ([{"type": "file_search", "vector_store_ids": []}], "vector_store_ids"),
                         ([{**tool, "max_results": 2}], "a file_search tool has no field 'max_results'")):
        with pytest.raises(openai.BadRequestError) as bad:
            client.responses.create(model="smollm2:135m", input=QUESTION, tools=tools)  # type: ignore[arg-type]
        assert words in str(bad.value), bad.value
    with pytest.raises(openai.BadRequestError) as bad:  # as chat completions' file_search and run --rag refuse it
        client.responses.create(model="smollm2:135m", input=" ", tools=[tool])  # type: ignore[list-item]
    assert "the question is blank" in str(bad.value), bad.value


def test_file_search_with_no_user_message_is_a_400(server: Server) -> None:
    """A conversation with no user message has no question to search for: a 400, not an answer without the
    search; a chain whose question came before (a request of an assistant turn, a tool's output) goes on."""
    import openai

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY)
    tool = {"type": "file_search", "vector_store_ids": ["notes"], "max_num_results": 1}
    said = "file_search searches the stores for the last user message's text: this request has no user message"
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(model="smollm2:135m", input=[{"role": "developer", "content": "Answer briefly."}],
                                tools=[tool], max_output_tokens=4)  # type: ignore[list-item]
    assert said in str(bad.value) and bad.value.body["param"] == "input", bad.value  # type: ignore[index]
    r = httpx.post(f"{server.url}/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"}, timeout=60,
                   json={"model": "smollm2:135m", "messages": [{"role": "system", "content": "Be brief."}],
                         "max_tokens": 4, "file_search": {"vector_store_ids": ["notes"]}})
    assert r.status_code == 400 and r.json()["error"]["message"] == said, r.text
    assert r.json()["error"]["param"] == "messages", r.text
    first = client.responses.create(model="smollm2:135m", input=QUESTION, tools=[tool], max_output_tokens=4)  # type: ignore[list-item]
    then = client.responses.create(model="smollm2:135m", input=[{"role": "assistant", "content": "Paris."}],
                                   previous_response_id=first.id, tools=[tool], max_output_tokens=4)  # type: ignore[list-item]
    assert then.status == "completed" and then.output[-1].type == "message", then.output


def test_a_store_removed_while_serving_is_gone_and_its_paths_say_what_is_served(server: Server,
                                                                                home_env: dict[str, str]) -> None:
    """A collection removed (localgen collections rm) while serve offers it: left out of the listing, a 404 for
    itself and its search that names no collection the server does not offer; a store's other paths: a GET of
    its search is a 405, its files a 404 that says where a collection is changed."""
    auth = {"Authorization": f"Bearer {KEY}"}
    r = CLI(home_env)("collections", "rm", "removed", "--yes")
    assert r.returncode == 0, r.stderr
    listed = httpx.get(f"{server.url}/v1/vector_stores", headers=auth, timeout=30).json()
    assert "removed" not in [d["id"] for d in listed["data"]] and len(listed["data"]) == 3
    one = httpx.get(f"{server.url}/v1/vector_stores/removed", headers=auth, timeout=30)
    found = httpx.post(f"{server.url}/v1/vector_stores/removed/search", json={"query": "x"}, headers=auth, timeout=30)
    for gone in (one, found):
        assert gone.status_code == 404 and "is gone" in gone.text and "notes" not in gone.text, gone.text
    assert httpx.get(f"{server.url}/v1/vector_stores/notes/search", headers=auth, timeout=30).status_code == 405
    files = httpx.get(f"{server.url}/v1/vector_stores/notes/files", headers=auth, timeout=30)
    assert files.status_code == 404 and "localgen embed --store" in files.text, files.text


def test_file_search_sends_what_fits_and_runs_no_tool_with_tool_choice_none(server: Server) -> None:
    """Excerpts past a slot's window beside the answer's room are left out, the lowest-scoring first (the item's
    results are those sent), said in the server's log; tool_choice none searches nothing; required with
    file_search alone is answered."""
    import openai

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY)
    tool = {"type": "file_search", "vector_store_ids": ["long"]}
    r = client.responses.create(model="smollm2:135m", input="Tell me about the Seine.", max_output_tokens=32,
                                tools=[tool], include=["file_search_call.results"])
    call = r.output[0]
    assert call.type == "file_search_call" and call.results is not None
    sent = [x.file_id for x in call.results]
    found = client.vector_stores.search("long", query="Tell me about the Seine.", max_num_results=5)
    assert 0 < len(sent) < 5 and sent == [d.file_id for d in found.data][:len(sent)], (sent, found.data)
    assert r.usage is not None and r.usage.input_tokens <= 512 - 32
    text = client.responses.input_items.list(r.id).data[0].content[0].text  # type: ignore[union-attr]
    assert all(f"[{i}]" in text for i in sent) and not any(f"[{d.file_id}]" in text for d in found.data[len(sent):])
    log = server.proc.stderr.read().decode() if server.proc.stderr else ""
    assert f"excerpt{'s' if 5 - len(sent) != 1 else ''} left out to fit a slot's window of 512 tokens" in log, log

    none = client.responses.create(model="smollm2:135m", input=QUESTION, max_output_tokens=4, tool_choice="none",
                                   tools=[{"type": "file_search", "vector_store_ids": ["notes"]}])
    assert [o.type for o in none.output] == ["message"]
    required = client.responses.create(model="smollm2:135m", input=QUESTION, max_output_tokens=4,
                                       tool_choice="required",
                                       tools=[{"type": "file_search", "vector_store_ids": ["notes"]}])
    assert required.output[0].type == "file_search_call"


def test_an_answer_that_cites_a_text_it_was_sent_carries_file_citations(server: Server) -> None:
    """The answer's `[id]` of a text file_search sent is a file_citation annotation at the bracket, whole and
    streamed (`response.output_text.annotation.added`); an id it was not sent is not one. The answer is held to
    a schema here so that the model writes the citations whatever it would have said."""
    import openai

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY)
    said = "Paris [paris], not [cats] nor [rust]; [paris]"
    fmt = {"type": "json_schema", "name": "cited", "schema": {"type": "string", "enum": [said]}}
    tool = {"type": "file_search", "vector_store_ids": ["notes"], "max_num_results": 2}  # paris and one other
    r = client.responses.create(model="smollm2:135m", input=QUESTION, temperature=0, tools=[tool],
                                include=["file_search_call.results"], text={"format": fmt})  # type: ignore[typeddict-item]
    sent = [x.file_id for x in r.output[0].results or []]  # type: ignore[union-attr]
    assert "paris" in sent and len(sent) == 2, sent
    # as chat completions' file_search says them (tests/test_webui_rag.py): the store of each, its document
    assert [(x.filename, x.attributes) for x in r.output[0].results or []] == \
        [(i, {"vector_store_id": "notes"}) for i in sent]  # type: ignore[union-attr]
    text = r.output[1].content[0]  # type: ignore[union-attr]
    assert text.text == json.dumps(said)
    other = ({"cats", "rust"} & set(sent)).pop()  # the second text sent: cited; the third was not sent
    want = sorted([(7, "paris"), ({"cats": 20, "rust": 31}[other], other), (39, "paris")])  # the brackets' places
    got = [(a.index, a.file_id) for a in text.annotations]  # type: ignore[union-attr]
    assert got == want and [a.type for a in text.annotations] == ["file_citation"] * 3, got

    events = list(client.responses.create(model="smollm2:135m", input=QUESTION, temperature=0, tools=[tool],
                                          text={"format": fmt}, stream=True))  # type: ignore[typeddict-item]
    added = [e for e in events if e.type == "response.output_text.annotation.added"]
    assert [(e.annotation_index, e.annotation.index, e.annotation.file_id) for e in added] == \
        [(n, at, i) for n, (at, i) in enumerate(want)]  # type: ignore[union-attr]
    final = events[-1].response  # type: ignore[union-attr]
    assert [(a.index, a.file_id) for a in final.output[1].content[0].annotations] == want  # type: ignore[union-attr]

    plain = client.responses.create(model="smollm2:135m", input=QUESTION, temperature=0, text={"format": fmt})  # type: ignore[typeddict-item]
    assert plain.output[0].content[0].annotations == []  # type: ignore[union-attr]  # no search: nothing sent to cite


def test_a_collection_made_with_another_file_of_its_model_s_name_is_refused(
        home_env: dict[str, str], tmp_path: Path) -> None:
    """docs/api.md: a search embeds on the model the collection was made with, as `localgen similar` does. A
    served file of the same name with other weights (its fingerprint not the collection's) would rank by
    unrelated vectors: refused at start (one line, exit 2), and a 400 for a collection made again with such a
    file while serving."""
    from tests.tiny_bert import build, with_other_weights

    (tmp_path / "a").mkdir()
    bert = build(tmp_path / "a" / "tiny-bert.gguf")
    other = with_other_weights(bert, tmp_path / "b" / "tiny-bert.gguf")
    env = {**home_env, "LOCALGEN_HOME": str(tmp_path / "home")}
    cli = CLI(env)
    for name, model in (("mine", bert), ("theirs", other)):
        r = cli("embed", "-m", str(model), "--store", name, input="the cat sat on the mat\nstocks fell in paris\n")
        assert r.returncode == 0, r.stderr
    r = cli("serve", "-m", str(bert), "--collection", "theirs", "--port", str(free_port()), timeout=120)
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    said = [line for line in r.stderr.splitlines() if line.startswith("localgen: error:")]
    assert said == ["localgen: error: --collection 'theirs' was made with another tiny-bert.gguf than the one served "
                    "as tiny-bert.gguf (a file of other content), so its vectors do not compare with this model's "
                    "(serve the file it was made with, or store it again with this one: localgen embed -m "
                    f"{bert} --store NEWNAME)"], r.stderr
    s = Server(env, "-m", str(bert), "--collection", "mine")
    try:
        ok = httpx.post(f"{s.url}/v1/vector_stores/mine/search", json={"query": "a cat"}, timeout=60)
        assert ok.status_code == 200, ok.text
        r = cli("collections", "rm", "mine", "--yes")
        assert r.returncode == 0, r.stderr
        r = cli("embed", "-m", str(other), "--store", "mine", input="the cat sat on the mat\n")
        assert r.returncode == 0, r.stderr
        bad = httpx.post(f"{s.url}/v1/vector_stores/mine/search", json={"query": "a cat"}, timeout=60)
    finally:
        assert s.stop() == 0
    assert bad.status_code == 400 and "vector store 'mine' was made with another tiny-bert.gguf" in bad.text, bad.text
