"""The chat page's Documents (docs/webui.md): a conversation set to answer from the vector stores `localgen serve
--collection` offers, in a real headless Chromium against a real server, the seeded tiny BERT of tests/tiny_bert.py
for the collections and the real SmolLM2 for the answers. What the page sends is read from its requests; what the
model read is checked against the same conversation sent by this test with the excerpts written out in run --rag's
template (docs/rag.md): at temperature 0 the same prompt gives the same tokens and the same answer. Also here: a
stopped answer's token count. Chromium runs with a bounded heap and every wait has a deadline."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from localgen.embeddings.retrieve import RAG_INSTRUCTION
from tests import browser as chromium
from tests.conftest import CLI
from tests.test_serve import Server
from tests.test_webui import KEY, Tab, answer_ids, ask, chat_requests, settings, wait_answer

WAIT_MS = 300_000  # a round of SmolLM2 on two busy cores takes seconds (a minute and more under a full suite's load)
NOTES = [("cats.md#1", "The cat named Whiskers sleeps on the red sofa."),
         ("paris.md#1", "Paris is the capital of France; the Eiffel tower is there."),
         ("llama.md#2", "Llamas live in the Andes mountains of South America."),
         ("tea.md#4", "Green tea is brewed with water below boiling.")]
MORE = [("boats.md#1", "The harbour of Oslo holds wooden boats."),
        ("bread.md#3", "Sourdough bread rises overnight."),
        NOTES[2],  # the same id and text as in notes: sent once
        ("cats.md#1", "A cat of the harbour sleeps on the boats.")]  # the same id as in notes, another text
QUESTION = "Where do llamas live?"
# texts of about 300 tokens each: five do not fit the 1,024 tokens a 2,048-token window leaves beside the answer's
# room at its most (half the window)
LONG = [(f"long{i}.md#1", " ".join(["the cat sat on the mat in paris france"] * 33) + f" {i}") for i in range(5)]
BERT = "tiny-bert.gguf"


@pytest.fixture(scope="module")
def rag_home(cli_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], Path]:
    """A home with the collections `notes`, `more` and `gone` (embedded by the tiny BERT), and the BERT's file."""
    from tests.tiny_bert import build

    tmp = tmp_path_factory.mktemp("webui-rag")
    bert = build(tmp / BERT)
    env = {**cli_env, "LOCALGEN_HOME": str(tmp / "home")}
    for name, entries in (("notes", NOTES), ("more", MORE), ("gone", [("x.md#1", "A text to remove.")]),
                          ("long", LONG)):
        lines = "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in entries)
        r = CLI(env)("embed", "-m", str(bert), "--store", name, input=lines)
        assert r.returncode == 0, r.stderr
    return env, bert


@pytest.fixture(scope="module")
def server(rag_home: tuple[dict[str, str], Path]) -> Iterator[Server]:
    env, bert = rag_home
    s = Server(env, "--api-key", KEY, "-m", "smollm2:135m", "-m", str(bert), "--collection", "notes",
               "--collection", "more", "--collection", "gone", "--collection", "long", "-np", "1",
               "--ctx", "2048")
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium.bounded() as b:
        yield b


@pytest.fixture
def tab(browser: Any, server: Server) -> Iterator[Tab]:
    t = Tab(browser, server)
    t.page.set_default_timeout(WAIT_MS)
    yield t
    t.close()


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


def documents(page: Any, *stores: str, **values: object) -> None:
    """The conversation's settings: Documents `stores` checked (the others not), temperature 0 and 24 tokens
    unless `values` say otherwise."""
    page.click("#open-settings")
    page.locator("#documents-settings").wait_for(state="visible")
    for box in page.locator("#document-list input[type=checkbox]").all():
        box.set_checked(box.get_attribute("value") in stores)
    for name, value in {"temperature": 0, "max_tokens": 24, **values}.items():
        page.fill(f"#{name}", str(value))
    page.click("#settings-form button[type=submit]")
    page.locator("#settings").wait_for(state="hidden")


def searches(page: Any) -> list[str]:
    """The vector store requests the page sends from now on (their URLs)."""
    sent: list[str] = []
    page.on("request", lambda r: sent.append(r.url) if "/v1/vector_stores/" in r.url else None)
    return sent


def found(server: Server, store: str, query: str, n: int = 5) -> list[dict[str, Any]]:
    """What the vector store search route finds for `query`: [{id, score, text}], best first."""
    r = httpx.post(f"{server.url}/v1/vector_stores/{store}/search", headers=_auth(), timeout=120,
                   json={"query": query, "max_num_results": n})
    assert r.status_code == 200, r.text
    return [{"id": d["file_id"], "score": d["score"], "text": d["content"][0]["text"]} for d in r.json()["data"]]


def merged(server: Server, stores: list[str], query: str, n: int) -> list[dict[str, Any]]:
    """What a file_search of `stores` sends, from the search route: each store's texts, best first (a tie in the
    stores' order), the same id and text once (from the first store), `n` of them; each with its `store`."""
    every = [{**h, "store": s} for s in stores for h in found(server, s, query, 50)]
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for h in sorted(every, key=lambda h: -h["score"]):
        out.setdefault((h["id"], h["text"]), h)
    return list(out.values())[:n]


def shown_sources(article: Any) -> list[str]:
    return list(article.locator(".sources .source .source-id").all_inner_texts())


def stored_answers(page: Any) -> list[dict[str, Any]]:
    """The answers of the conversation on screen as this browser keeps them (IndexedDB), oldest first."""
    return list(page.evaluate("""async () => {
        const store = await import('./webui/store.js');
        const conv = await store.get(decodeURIComponent(location.hash.slice(1)));
        return Object.values(conv.messages).filter((m) => m.role === 'assistant')
            .sort((a, b) => a.created - b.created);
    }"""))


def loaded(server: Server) -> set[str]:
    doc = httpx.get(f"{server.url}/models", headers=_auth(), timeout=30).json()
    return {m["id"] for m in doc["data"] if m["status"]["value"] == "loaded"}


def test_documents_are_off_by_default_and_a_question_is_answered_from_the_excerpts(tab: Tab, server: Server,
                                                                                 tmp_path: Path) -> None:
    """Settings lists the server's stores, none checked: a question then sends no search. With `notes` checked,
    the chat request carries file_search, the embedding model unloaded meanwhile loads for it, and the model reads
    run --rag's message (the same tokens and answer as this test's own request with the template written out);
    the answer shows its sources (id, score, the excerpt folded), kept with the conversation's choice through a
    reload, both exports and an import; Regenerate searches again."""
    page = tab.open()
    page.click("#open-settings")
    page.locator("#documents-settings").wait_for(state="visible")
    boxes = page.locator("#document-list input[type=checkbox]")
    assert [b.get_attribute("value") for b in boxes.all()] == ["notes", "more", "gone", "long"]
    assert not any(b.is_checked() for b in boxes.all())
    assert "4 texts · embedded by tiny-bert.gguf" in page.inner_text("#document-list")
    # the list grows with the stores (the dialog scrolls), not a box of its own cut at a few of them
    assert page.eval_on_selector("#document-list", "(e) => getComputedStyle(e).maxHeight") == "none"
    page.click("#settings-cancel")

    sent, urls = chat_requests(page), searches(page)
    settings(page, temperature=0, max_tokens=4)
    plain = ask(page, QUESTION)
    assert len(sent) == 1 and "file_search" not in sent[0] and urls == []
    assert plain.locator(".sources").count() == 0

    r = httpx.post(f"{server.url}/models/unload", headers=_auth(), json={"model": BERT}, timeout=60)
    assert r.status_code == 200 and BERT not in loaded(server), r.text
    documents(page, "notes", max_tokens=4)
    article = ask(page, QUESTION)
    assert sent[1]["file_search"] == {"vector_store_ids": ["notes"]} and urls == []
    assert BERT in loaded(server)  # the search loaded the collection's model on demand
    hits = found(server, "notes", QUESTION)
    assert shown_sources(article) == [h["id"] for h in hits]
    assert article.locator(".sources .source-n").all_inner_texts() == [f"[{k + 1}]" for k in range(len(hits))]
    assert article.locator(".sources .source-score").first.inner_text() == f"{hits[0]['score']:.3f}"
    first = article.locator(".sources .source").first
    assert first.get_attribute("open") is None  # folded
    first.locator("summary").click()
    assert first.locator(".source-text").inner_text() == hits[0]["text"]

    # what the model read: the question in run --rag's template, excerpts and all
    answer = stored_answers(page)[-1]
    excerpts = "\n\n".join(f"[{h['id']}]\n{h['text']}" for h in hits)
    assert sent[1]["messages"][-1] == {"role": "user", "content": QUESTION}  # the page sends the question alone
    messages = [*sent[1]["messages"][:-1],
                {"role": "user", "content": f"{RAG_INSTRUCTION}\n\n{excerpts}\n\nQuestion: {QUESTION}"}]
    direct = httpx.post(f"{server.url}/v1/chat/completions", headers=_auth(), timeout=300, json={
        "model": "smollm2:135m", "messages": messages, "temperature": 0, "max_tokens": 4}).json()
    assert direct["usage"]["prompt_tokens"] == answer["stats"]["prompt"], (direct["usage"], answer["stats"])
    assert direct["choices"][0]["message"]["content"] == answer["content"]
    assert [s["id"] for s in answer["sources"]] == [h["id"] for h in hits]

    page.reload()
    article = page.locator("article.assistant").last
    article.locator(".sources").wait_for()
    assert shown_sources(article) == [h["id"] for h in hits]
    page.click("#open-settings")
    checked = [b.get_attribute("value") for b in page.locator("#document-list input[type=checkbox]").all()
               if b.is_checked()]
    assert checked == ["notes"]  # the choice is kept with the conversation
    with page.expect_download() as got:
        page.click("#export-json")
    exported = json.loads(Path(got.value.path()).read_text())["conversations"][0]
    assert exported["documents"] == {"stores": ["notes"]}
    kept = [m for m in exported["messages"].values() if m["role"] == "assistant" and m.get("sources")]
    assert [(s["id"], s["score"], s["text"]) for s in kept[0]["sources"]] == \
        [(h["id"], h["score"], h["text"]) for h in hits]
    with page.expect_download() as got:
        page.click("#export-md")
    md = Path(got.value.path()).read_text()
    first_md = f"1. `{hits[0]['id']}` in notes (score {hits[0]['score']:.3f})\n\n   > {hits[0]['text']}"
    assert "**Sources:**" in md and first_md in md, md
    page.click("#settings-cancel")
    file = tmp_path / "rag.json"
    file.write_text(json.dumps(exported))
    page.set_input_files("#import-file", str(file))
    page.wait_for_function("() => document.querySelectorAll('#conversations .conv').length === 2")
    page.locator("article.assistant .sources").last.wait_for()
    assert shown_sources(page.locator("article.assistant").last) == [h["id"] for h in hits]
    page.click("#open-settings")
    assert page.is_checked("#document-list input[value=notes]")  # the import keeps the choice too
    page.click("#settings-cancel")

    # Regenerate asks again, searching again; two stores are searched together
    documents(page, "notes", "more", max_tokens=4)
    ids = answer_ids(page)
    page.locator("article.assistant").last.get_by_role("button", name="Regenerate").click()
    again = wait_answer(page, ids)
    assert sent[-1]["file_search"] == {"vector_store_ids": ["notes", "more"]}
    both = merged(server, ["notes", "more"], QUESTION, 5)
    assert shown_sources(again) == [h["id"] for h in both]
    assert again.locator(".sources .source-store").all_inner_texts() == [h["store"] for h in both]


def test_citations_link_to_their_excerpts(tab: Tab) -> None:
    """`[id]` of an excerpt the answer was sent, and `[n]` (its number in the sources), are links that open that
    excerpt; an id not sent and brackets in code stay text. The answer is edited here so that it cites for sure
    (an edited answer keeps its sources)."""
    page = tab.open()
    documents(page, "notes", max_tokens=4)
    article = ask(page, QUESTION)
    ids = shown_sources(article)
    article.get_by_role("button", name="Edit").click()
    page.fill("article.assistant textarea", f"In the Andes [{ids[1]}], see [1]; not [nosuch.md#1] nor `[{ids[0]}]`.")
    page.get_by_role("button", name="Save").click()
    article = page.locator("article.assistant").last
    cites = article.locator(".body button.cite")
    cites.first.wait_for()
    assert cites.all_inner_texts() == [f"[{ids[1]}]", "[1]"]
    assert article.locator(".body code").inner_text() == f"[{ids[0]}]"
    cites.first.click()
    second = article.locator(".sources .source").nth(1)
    assert second.get_attribute("open") is not None and article.locator(".sources .source[open]").count() == 1
    cites.nth(1).click()
    assert article.locator(".sources .source").first.get_attribute("open") is not None


def test_an_id_in_two_collections_shows_each_and_a_citation_opens_the_first(tab: Tab, tmp_path: Path) -> None:
    """Sources of one id from two collections (as an answer keeps them): each shows its collection, `[id]`
    opens the first, and Export Markdown names the collection of each. A folded source has its marker (▸, ▾
    open), a long id is cut on the source's one line, and Export Markdown's quoted excerpt keeps a `#` line a
    line of text (not a heading)."""
    page = tab.open()
    sources = [{"id": "cats.md#1", "store": "notes", "score": 0.9, "text": "The cat sleeps."},
               {"id": "cats.md#1", "store": "more", "score": 0.8, "text": "A cat of the harbour."},
               {"id": f"{'a-very-long-folder-name/' * 12}cats.md#2", "store": "more", "score": 0.7,
                "text": "# Cats\nThey purr."}]
    conv = {"name": "Twice", "system": "", "settings": {}, "documents": {"stores": ["notes", "more"]},
            "current": "a", "messages": {
                "root": {"id": "root", "parent": None, "children": ["q"], "role": "root"},
                "q": {"id": "q", "parent": "root", "children": ["a"], "role": "user", "content": "The cat?"},
                "a": {"id": "a", "parent": "q", "children": [], "role": "assistant", "content": "See [cats.md#1].",
                      "sources": sources}}}
    file = tmp_path / "twice.json"
    file.write_text(json.dumps(conv))
    page.set_input_files("#import-file", str(file))
    article = page.locator("article.assistant").last
    article.locator(".sources").wait_for()
    assert article.locator(".sources .source-store").all_inner_texts() == ["notes", "more", "more"]
    marker = "(s) => getComputedStyle(s, '::before').content"
    first = article.locator(".sources .source summary").first
    assert first.evaluate(marker) == '"▸"'
    article.locator(".body button.cite").click()
    assert article.locator(".sources .source").first.get_attribute("open") is not None
    assert article.locator(".sources .source[open]").count() == 1 and first.evaluate(marker) == '"▾"'
    long = article.locator(".sources .source summary").nth(2)
    tops = {round(b["y"]) for b in (long.locator(k).bounding_box() for k in (".source-n", ".source-id",
                                                                              ".source-score")) if b}
    summary = long.bounding_box()
    assert max(tops) - min(tops) <= 4 and summary and summary["height"] < 40, (tops, summary)  # one line
    page.click("#open-settings")
    with page.expect_download() as got:
        page.click("#export-md")
    md = Path(got.value.path()).read_text()
    assert "1. `cats.md#1` in notes (score 0.900)" in md and "2. `cats.md#1` in more (score 0.800)" in md, md
    assert "   > \\# Cats\n   > They purr." in md, md
    page.click("#settings-cancel")


def test_a_search_that_fails_shows_the_servers_reason(tab: Tab, rag_home: tuple[dict[str, str], Path],
                                                      tmp_path: Path) -> None:
    """A store removed while the server runs, and one the server does not offer (a conversation imported from
    elsewhere): the answer ends with the server's reason, which says to uncheck it, and the page is ready for the
    next message; the page reads the server's stores again after that error and when Settings opens, which then
    shows a store removed since the page loaded as no longer offered."""
    env, _ = rag_home
    page = tab.open()
    documents(page, "gone")
    r = CLI(env)("collections", "rm", "gone", "--yes")
    assert r.returncode == 0, r.stderr
    listed: list[str] = []
    page.on("request", lambda q: listed.append(q.url) if q.url.endswith("/v1/vector_stores") else None)
    page.click("#open-settings")  # the stores read again: the one removed is shown so, still checked
    gone = page.locator("#document-list li", has_text="not offered by the server now")
    gone.wait_for(timeout=20_000)
    assert gone.locator("input").get_attribute("value") == "gone" and gone.locator("input").is_checked()
    assert "uncheck it" in gone.inner_text() and len(listed) == 1, listed
    page.click("#settings-cancel")
    article = ask(page, QUESTION)
    note = article.locator(".note.error").inner_text()
    assert "vector store 'gone' is gone" in note and "uncheck it under Documents in the chat page's Settings" in note \
        and "(HTTP 404)" in note, note
    assert article.locator(".stats").count() == 0  # refused before a word came: no `0 tokens`
    for _ in range(100):  # read again after the error, as the answer ends: its event may come after
        if len(listed) == 2:
            break
        page.wait_for_timeout(100)
    assert len(listed) == 2, listed
    conv = {"name": "Elsewhere", "system": "", "settings": {}, "documents": {"stores": ["nosuch"]}, "current": "root",
            "messages": {"root": {"id": "root", "parent": None, "children": [], "role": "root"}}}
    file = tmp_path / "elsewhere.json"
    file.write_text(json.dumps(conv))
    page.set_input_files("#import-file", str(file))
    page.click("#open-settings")
    assert "nosuch" in page.inner_text("#document-list") and "not offered by the server now" in \
        page.inner_text("#document-list")
    page.click("#settings-cancel")
    article = ask(page, QUESTION)
    note = article.locator(".note.error").inner_text()
    assert "No vector store found with id 'nosuch' (offered here: notes, more" in note and "(HTTP 400)" in note, note


def test_a_stopped_answer_says_the_tokens_that_came(tab: Tab) -> None:
    """Stop ends the answer; its stats say how many tokens came, as the note says it was stopped: the pieces
    streamed, since the server's count (usage, in the stream's last chunk) never comes, said as an estimate
    (`about N tokens`), where a whole answer's count is the server's."""
    page = tab.open()
    settings(page, temperature=0, max_tokens=400)
    page.fill("#input", "Write a long story about a dragon and a knight.")
    page.press("#input", "Enter")
    page.wait_for_function("""() => {
        const last = document.querySelector('article.assistant .body');
        return last && last.textContent.length > 40 && !document.getElementById('stop').hidden;
    }""")
    page.click("#stop")
    article = wait_answer(page, [])
    assert article.locator(".note").inner_text() == "Stopped."
    stats = article.locator(".stats").inner_text()
    kept = stored_answers(page)[0]["stats"]
    tokens = kept["tokens"]
    assert tokens > 0 and stats.startswith(f"about {tokens} token"), (stats, tokens)
    assert kept["counted"] == "pieces" and "the server's count never came" in str(
        article.locator(".stats").get_attribute("title")), kept
    page.reload()  # kept so: the estimate is said again
    assert page.locator("article.assistant .stats").last.inner_text().startswith(f"about {tokens} token")
    page.wait_for_function("() => document.querySelectorAll('#model option').length > 0")  # else nothing is sent
    settings(page, max_tokens=3)
    whole = ask(page, "Say hi.").locator(".stats").inner_text()
    done = stored_answers(page)[-1]["stats"]
    assert "counted" not in done and whole.startswith(f"{done['tokens']} token"), (whole, done)


def checked_stores(page: Any) -> list[str]:
    """The stores checked under Documents in Settings (once the server's stores are listed), the dialog closed."""
    page.click("#open-settings")
    page.locator("#documents-settings").wait_for(state="visible")
    page.wait_for_function("() => document.getElementById('document-list').textContent.includes('embedded by')")
    boxes = page.locator("#document-list input[type=checkbox]").all()
    out = [str(b.get_attribute("value")) for b in boxes if b.is_checked()]
    page.click("#settings-cancel")
    return out


def test_a_new_conversations_documents_are_kept_through_a_reload(tab: Tab) -> None:
    """webui.md: Documents (and the other settings) chosen before the first question of a new conversation are
    kept through a reload, and its first question is sent with them; New chat starts one with none."""
    page = tab.open()
    documents(page, "notes", "more", max_tokens=2)
    page.reload()
    page.wait_for_function("() => document.querySelectorAll('#model option').length > 0")
    assert checked_stores(page) == ["notes", "more"]
    page.click("#open-settings")
    assert page.input_value("#max_tokens") == "2" and page.input_value("#temperature") == "0"
    page.click("#settings-cancel")
    sent = chat_requests(page)
    ask(page, QUESTION)
    assert sent[0]["file_search"] == {"vector_store_ids": ["notes", "more"]} and sent[0]["max_tokens"] == 2, sent
    page.reload()  # the conversation now: kept with it, as before
    page.locator("article.assistant").last.wait_for()
    assert checked_stores(page) == ["notes", "more"]
    page.click("#new-chat")
    assert checked_stores(page) == []
    page.reload()
    page.wait_for_function("() => document.querySelectorAll('#model option').length > 0")
    assert checked_stores(page) == []


def test_how_many_excerpts_a_question_is_sent_is_a_setting_kept_with_the_conversation(tab: Tab,
                                                                                        server: Server) -> None:
    """webui.md: Excerpts per question is sent as file_search's max_num_results (left out when empty: the
    server's 5), the answer shows that many sources, the setting is kept with the conversation (a reload, Export
    JSON), and a number out of 1 to 50 is refused in the dialog."""
    page = tab.open()
    sent = chat_requests(page)
    documents(page, "notes", max_tokens=2, max_num_results=2)
    article = ask(page, QUESTION)
    assert sent[0]["file_search"] == {"vector_store_ids": ["notes"], "max_num_results": 2}, sent
    assert shown_sources(article) == [h["id"] for h in found(server, "notes", QUESTION, 2)]
    page.reload()
    page.locator("article.assistant").last.wait_for()
    page.click("#open-settings")
    assert page.input_value("#max_num_results") == "2"
    for bad in ("0", "51", "2.5"):  # the browser's check of the field keeps the dialog open, nothing saved
        page.fill("#max_num_results", bad)
        page.click("#settings-form button[type=submit]")
        assert page.locator("#settings").is_visible(), bad
        assert not page.eval_on_selector("#max_num_results", "(e) => e.validity.valid"), bad
    page.click("#settings-cancel")
    page.click("#open-settings")
    assert page.input_value("#max_num_results") == "2"
    with page.expect_download() as download:
        page.click("#export-json")
    kept = json.loads(Path(download.value.path()).read_text())["conversations"][0]["documents"]
    assert kept == {"stores": ["notes"], "results": 2}, kept
    page.fill("#max_num_results", "")
    page.click("#settings-form button[type=submit]")
    page.locator("#settings").wait_for(state="hidden")
    ask(page, QUESTION)
    assert sent[1]["file_search"] == {"vector_store_ids": ["notes"]}, sent[1]


def test_chat_completions_file_search_places_what_fits_and_says_what_it_sent(server: Server) -> None:
    """The field the page sends, as any client sends it: the whole answer carries file_search_call (the texts
    sent, best first, max_num_results of them), a score threshold drops texts, the excerpts past the window
    beside the answer's room are left out (the lowest first, said in the log), and what it cannot do is a 400."""
    url = f"{server.url}/v1/chat/completions"

    def chat(file_search: Any, **more: Any) -> httpx.Response:
        return httpx.post(url, headers=_auth(), timeout=300, json={
            "model": "smollm2:135m", "messages": [{"role": "user", "content": QUESTION}], "temperature": 0,
            "max_tokens": 2, "file_search": file_search, **more})

    r = chat({"vector_store_ids": ["notes"], "max_num_results": 2})
    item = r.json()["file_search_call"]
    assert item["type"] == "file_search_call" and item["queries"] == [QUESTION], item
    hits = found(server, "notes", QUESTION, 2)
    assert [(x["file_id"], x["filename"], x["score"], x["text"], x["attributes"]) for x in item["results"]] == \
        [(h["id"], h["id"].split("#")[0], h["score"], h["text"], {"vector_store_id": "notes"}) for h in hits]
    # an id in two stores: each result says its store; the same text under the same id is sent once
    item = chat({"vector_store_ids": ["notes", "more"], "max_num_results": 50}).json()["file_search_call"]
    got = [(x["file_id"], x["attributes"]["vector_store_id"], x["text"]) for x in item["results"]]
    assert got == [(h["id"], h["store"], h["text"]) for h in merged(server, ["notes", "more"], QUESTION, 50)]
    assert sorted(i for i, _, _ in got) == sorted(["boats.md#1", "bread.md#3", "cats.md#1", "cats.md#1",
                                                   "llama.md#2", "paris.md#1", "tea.md#4"]), got
    above = chat({"vector_store_ids": ["notes"], "ranking_options": {"score_threshold": hits[0]["score"]}})
    assert [x["file_id"] for x in above.json()["file_search_call"]["results"]] == [hits[0]["id"]]

    # a question past the embedding model's window (the tiny BERT's 512 tokens: 16,384 characters at most, in the
    # check before tokenizing) but not the chat's: searched for its first tokens, as run --rag cuts it
    long = f"{QUESTION}{' ' * 17_000}Answer briefly."
    r = chat({"vector_store_ids": ["notes"]}, messages=[{"role": "user", "content": long}])
    assert r.status_code == 200, r.text
    assert [x["file_id"] for x in r.json()["file_search_call"]["results"]] == [h["id"] for h in found(server, "notes",
                                                                                                       long)]

    # the answer's room is the 1,024 tokens asked for, but its end of turn (SmolLM2's <|im_end|>, token 2) is made
    # the first token: the placement is the room's, not what is generated in it
    r = chat({"vector_store_ids": ["long"]}, max_tokens=1024, messages=[{"role": "user", "content": "the cat"}],
             logit_bias={"2": 100})
    sent = [x["file_id"] for x in r.json()["file_search_call"]["results"]]
    best = [h["id"] for h in found(server, "long", "the cat")]
    assert 0 < len(sent) < 5 and sent == best[:len(sent)], (sent, best)
    assert r.json()["usage"]["prompt_tokens"] <= 2048 - 1024 and r.json()["usage"]["completion_tokens"] == 0
    log = server.proc.stderr.read().decode() if server.proc.stderr else ""
    assert f"file_search: {5 - len(sent)} excerpt" in log and "left out to fit a slot's window of 2,048" in log, log

    for spec, words in (("notes", "file_search must be an object"),
                        ({"vector_store_ids": []}, "`file_search` needs vector_store_ids"),
                        ({"vector_store_ids": ["nosuch"]}, "No vector store found with id 'nosuch'"),
                        ({"vector_store_ids": ["notes"], "max_num_results": 0}, "max_num_results")):
        bad = chat(spec)
        assert bad.status_code == 400 and words in bad.json()["error"]["message"], bad.text
        assert bad.json()["error"]["param"] == "file_search", bad.text
    bad = chat({"vector_store_ids": ["notes"]}, messages=[{"role": "user"}, "hello"])  # searched for nothing
    assert bad.status_code == 400 and bad.json()["error"]["param"].startswith("messages"), bad.text
    for blank, words in (({"role": "user"}, "a user message needs `content`"),  # as OpenAI refuses one
                         ({"role": "user", "content": " \n "}, "the question is blank"),  # as run --rag refuses one
                         ({"role": "user", "content": [{"type": "text", "text": "  "}]}, "the question is blank")):
        bad = chat({"vector_store_ids": ["notes"]}, messages=[blank])
        assert bad.status_code == 400 and words in bad.json()["error"]["message"], bad.text
        assert bad.json()["error"]["param"] in ("messages", "messages.[0].content"), bad.text  # where the blank is
    bad = chat({"vector_store_ids": ["notes"], "max_results": 2})  # a field not read is not silently ignored
    assert bad.status_code == 400 and "`file_search` has no field 'max_results'" in bad.text, bad.text
    bad = httpx.post(f"{server.url}/v1/completions", headers=_auth(), timeout=60, json={
        "model": "smollm2:135m", "prompt": QUESTION, "file_search": {"vector_store_ids": ["notes"]}})
    assert bad.status_code == 400 and "`file_search` needs a chat" in bad.text, bad.text


def test_a_chat_request_refused_is_refused_before_its_file_search(server: Server) -> None:
    """docs/api.md: the search is made once the rest of the request is checked: a request refused for its messages
    or its tools is the same 400 with `file_search` as without, and the collection's embedding model (unloaded
    first) is not loaded for it."""
    r = httpx.post(f"{server.url}/models/unload", headers=_auth(), json={"model": BERT}, timeout=60)
    assert r.status_code == 200 and BERT not in loaded(server), r.text
    question = {"role": "user", "content": QUESTION}
    for bad in ({"messages": [{"role": "wizard", "content": "Hi."}, question]},
                {"messages": [{"role": "assistant", "content": 5}, question]},
                {"messages": [question], "tools": [{"type": "nope"}]},
                {"messages": [question], "chat_template_kwargs": "thinking"},
                {"messages": [question], "temperature": -1}):
        said = []
        for more in ({}, {"file_search": {"vector_store_ids": ["notes"]}}):
            r = httpx.post(f"{server.url}/v1/chat/completions", headers=_auth(), timeout=120,
                           json={"model": "smollm2:135m", "max_tokens": 2, **bad, **more})
            assert r.status_code == 400, (bad, r.text)
            said.append(r.json()["error"])
        assert said[0] == said[1], (bad, said)
    long = "cat " * 300_000  # past 32 characters a token of the window: refused before anything is tokenized
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": long}], "max_tokens": 2,
                                                 "file_search": {"vector_store_ids": ["notes"]}}),
                       ("/v1/responses", {"input": long, "max_output_tokens": 2,
                                          "tools": [{"type": "file_search", "vector_store_ids": ["notes"]}]})):
        r = httpx.post(f"{server.url}{path}", headers=_auth(), timeout=120, json={"model": "smollm2:135m", **body})
        assert r.status_code == 400 and "the prompt is 1,200,000 characters" in r.json()["error"]["message"], r.text
    assert BERT not in loaded(server)  # no search was made: the embedding model was not asked


def test_serve_refuses_a_collection_whose_model_it_does_not_offer_before_any_load(
        rag_home: tuple[dict[str, str], Path]) -> None:
    """The tiny BERT's collection with only SmolLM2 -m (a model file is never offered on demand): exit 2 with the
    -m that serves it, before SmolLM2 loads (no load line), and no crash on the way out."""
    env, bert = rag_home
    with socket.socket() as free:  # a port that is free: the check is not the port's
        free.bind(("127.0.0.1", 0))
        port = str(free.getsockname()[1])
    r = CLI(env)("serve", "-m", "smollm2:135m", "--collection", "notes", "-t", "1", "-np", "1", "--port", port)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert f"--collection 'notes' was made with {BERT}, which this server does not offer (serve it too: -m {bert})" \
        in r.stderr, r.stderr
    assert "loaded" not in r.stderr and "loading" not in r.stderr, r.stderr


def test_a_collection_of_a_model_on_this_machine_is_searched_on_demand(cli_env: dict[str, str],
                                                                       tmp_path: Path) -> None:
    """webui.md's Documents: a collection embedded with a model on this machine by its name (Gemma here) needs no
    -m: serve offers that model on demand, and the search loads it."""
    env = {**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")}
    lines = "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in NOTES)
    r = CLI(env)("embed", "-m", "gemma3:270m", "--store", "gem", input=lines)
    assert r.returncode == 0, r.stderr
    s = Server(env, "--api-key", KEY, "-m", "smollm2:135m", "--collection", "gem", "-np", "1", "--ctx", "512")
    try:
        assert "gemma3:270m" not in loaded(s)
        assert found(s, "gem", QUESTION, 2)
        assert "gemma3:270m" in loaded(s)
    finally:
        assert s.stop() == 0
