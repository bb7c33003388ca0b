"""`localgen serve` as a service for a household or a team (#63), on real servers and models: the default
model of two -m, claude-* names, a load that cannot fit answered as an error, `localgen ps` while a model
answers, every --log-format json line an object with its request's id (also in the X-Request-Id header and
error bodies), loads and evictions logged, a fair swap under traffic to the loaded model, and the prompt
cache kept across a restart (SIGTERM, then the conversation continued from disk; a torn store skipped)."""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from localgen.engine.tokens import reusable_prefix
from localgen.serve.residence import KEEP_EVERY_S
from tests.conftest import CLI, InProcessCLI
from tests.test_serve import SERVE_GRID, Server


def _log(server: Server) -> str:
    return server.proc.stderr.read().decode() if server.proc.stderr else ""


# ---- two -m, a budget, JSON logs ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pirate_home(tmp_path_factory: pytest.TempPathFactory, cli_env: dict[str, str]) -> Path:
    """A home with a preset of SmolLM2 (so two -m models cost two small loads)."""
    home = tmp_path_factory.mktemp("service-home")
    (home / "Modelfile").write_text('FROM smollm2:135m\nSYSTEM """You are a pirate."""\n')
    r = CLI({**cli_env, "LOCALGEN_HOME": str(home)})("create", "pirate", "-f", str(home / "Modelfile"))
    assert r.returncode == 0, r.stderr
    return home


@pytest.fixture(scope="module")
def two(cli_env: dict[str, str], pirate_home: Path) -> Iterator[Server]:
    """`serve -m pirate -m smollm2:135m`, JSON logs, a budget that holds both but not Gemma."""
    s = Server({**cli_env, "LOCALGEN_HOME": str(pirate_home)}, "-m", "pirate", "-m", "smollm2:135m", "-np", "1",
               "--ctx", "512", "--max-memory", "500M", "--log-format", "json")
    yield s
    assert s.stop() == 0


def test_the_first_m_is_the_default_model_and_answers_claude_names(two: Server) -> None:
    """The README's two -m: a request that names no model, and a claude-* name that is not a model here, get the
    first -m (docs/serve.md, Which models)."""
    hi = [{"role": "user", "content": "Hi"}]
    r = httpx.post(f"{two.url}/v1/chat/completions", timeout=120, json={"messages": hi, "max_tokens": 2})
    assert r.status_code == 200 and r.json()["model"] == "pirate", r.text
    pirate_prompt = r.json()["usage"]["prompt_tokens"]  # with the preset's SYSTEM
    r = httpx.post(f"{two.url}/api/generate", timeout=120,
                   json={"prompt": "Hi", "stream": False, "options": {"num_predict": 2}})
    assert r.status_code == 200 and r.json()["model"] == "pirate", r.text
    r = httpx.post(f"{two.url}/v1/chat/completions", timeout=120,
                   json={"model": "smollm2:135m", "messages": hi, "max_tokens": 2})
    assert r.json()["model"] == "smollm2:135m"  # a name still picks its model
    assert r.json()["usage"]["prompt_tokens"] != pirate_prompt  # (SmolLM2's own default system prompt)
    import anthropic

    client = anthropic.Anthropic(base_url=two.url, api_key="none")
    msg = client.messages.create(model="claude-haiku-4-5", max_tokens=2, messages=hi)  # type: ignore[arg-type]
    assert msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0) == pirate_prompt, msg.usage
    said = httpx.get(f"{two.url}/health", timeout=30).json()
    assert said["status"] == "ok"


def test_a_model_that_cannot_fit_is_an_error_not_a_load(two: Server) -> None:
    """Ollama's way to load a model (no messages, no prompt) answers the load's outcome: Gemma needs more than
    --max-memory, so the answer is that error (never 200 done_reason "load"); SmolLM2 fits and loads."""
    for path, body in (("/api/chat", {"model": "gemma3:270m", "messages": []}),
                       ("/api/generate", {"model": "gemma3:270m"})):
        r = httpx.post(f"{two.url}{path}", json=body, timeout=120)
        assert r.status_code == 500 and "needs about" in r.json()["error"] and "500 MiB" in r.json()["error"], r.text
    r = httpx.post(f"{two.url}/api/chat", json={"model": "smollm2:135m", "messages": []}, timeout=120)
    assert r.status_code == 200 and r.json()["done_reason"] == "load"
    assert "gemma3:270m" not in [m["name"] for m in httpx.get(f"{two.url}/api/ps", timeout=30).json()["models"]]


def test_ps_while_a_model_answers_says_when_it_unloads(two: Server, cli: CLI) -> None:
    """Unloaded (keep_alive 0), then loaded again by a streamed request: while it answers, `localgen ps` says
    its keep-alive from now (5 minutes), never "forever"."""
    r = httpx.post(f"{two.url}/api/generate", json={"model": "pirate", "keep_alive": 0}, timeout=120)
    assert r.json()["done_reason"] == "unload"
    body = {"model": "pirate", "prompt": "Count to a hundred.", "options": {"num_predict": 300, "ignore_eos": True}}
    with httpx.stream("POST", f"{two.url}/api/generate", json=body, timeout=120) as streaming:
        lines = streaming.iter_lines()
        next(lines)  # it has loaded and is generating
        ps = cli("ps", "--port", str(two.port))
        doc = httpx.get(f"{two.url}/api/ps", timeout=30).json()
    assert ps.returncode == 0 and "pirate" in ps.stdout, ps.stderr
    row = next(line for line in ps.stdout.splitlines() if line.startswith("pirate"))
    assert "forever" not in row and "minutes from now" in row, ps.stdout
    (expires,) = [m["expires_at"] for m in doc["models"] if m["name"] == "pirate"]
    assert expires.startswith(time.strftime("%Y")), expires


def test_every_json_line_parses_and_carries_its_request(two: Server) -> None:
    """--log-format json: each line an object with time, event, request_id, route, model and status; a request's
    line has its X-Request-Id (the client's, sanitized and bounded, or a fresh one), which the response's
    header and its error body carry; the loads at start are events."""
    ok = httpx.post(f"{two.url}/v1/completions", headers={"X-Request-Id": "trace-42"}, timeout=120,
                    json={"model": "smollm2:135m", "prompt": "Hi", "max_tokens": 3})
    assert ok.headers["x-request-id"] == "trace-42"
    unsafe = httpx.get(f"{two.url}/api/tags", headers={"X-Request-Id": "a b\"c<" + "d" * 300}, timeout=30)
    assert unsafe.headers["x-request-id"] == "abc" + "d" * 125  # unsafe characters dropped, 128 kept
    missing = httpx.post(f"{two.url}/v1/chat/completions", json={"model": "nope", "messages": []}, timeout=30)
    assert missing.status_code == 404 and missing.json()["request_id"] == missing.headers["x-request-id"]
    assert missing.headers["x-request-id"].startswith("req_")
    anthropic_error = httpx.post(f"{two.url}/v1/messages", json={"model": "smollm2:135m"}, timeout=30)
    assert anthropic_error.status_code == 400 and anthropic_error.json()["request_id"].startswith("req_")
    about = {"unload": httpx.post(f"{two.url}/models/unload", json={"model": "nope"}, timeout=30),
             "delete": httpx.request("DELETE", f"{two.url}/api/delete", json={"model": "nope"}, timeout=30),
             "stored": httpx.get(f"{two.url}/v1/responses/resp_nope", timeout=30)}
    assert [r.status_code for r in about.values()] == [404, 404, 404], [r.text for r in about.values()]
    stream = httpx.post(f"{two.url}/api/chat", timeout=120, json={
        "model": "smollm2:135m", "messages": [{"role": "user", "content": "Hi"}], "options": {"num_predict": 3}})
    assert stream.status_code == 200
    _logged(two, [r.headers["x-request-id"] for r in (ok, unsafe, missing, *about.values(), stream)])
    lines = _log_lines(two)
    docs = [json.loads(line) for line in lines]  # every line parses
    for doc in docs:
        assert {"time", "event", "request_id", "route", "model", "status"} <= set(doc), doc
    requests = {d["request_id"]: d for d in docs if d["event"] == "request"}
    done = requests["trace-42"]
    assert (done["route"], done["status"], done["model"], done["method"]) == ("/v1/completions", 200,
                                                                             "smollm2:135m", "POST")
    assert done["completion_tokens"] == 3 and done["prompt_tokens"] >= 1 and done["cached_tokens"] is not None
    assert done["ttft_ms"] > 0 and done["total_ms"] >= done["ttft_ms"] and done["client"].startswith("127.0.0.1:")
    assert requests[missing.headers["x-request-id"]]["status"] == 404
    for r in (missing, about["unload"], about["delete"]):  # the model the request named, though none answered
        assert requests[r.headers["x-request-id"]]["model"] == "nope", requests[r.headers["x-request-id"]]
    stored = requests[about["stored"].headers["x-request-id"]]
    assert stored["route"] == "/v1/responses/{id}" and stored["path"] == "/v1/responses/resp_nope"  # as docs say
    assert 'route="/v1/responses/{id}",status="404"' in httpx.get(f"{two.url}/metrics", timeout=30).text
    assert requests["abc" + "d" * 125]["route"] == "/api/tags"
    chat = [d for d in docs if d["event"] == "request" and d["route"] == "/api/chat" and d["completion_tokens"]]
    assert chat and chat[-1]["completion_tokens"] == 3
    loads = {d["model"] for d in docs if d["event"] == "load"}
    assert {"pirate", "smollm2:135m"} <= loads and any(d["event"] == "start" for d in docs)


def _log_lines(server: Server) -> list[str]:
    """The server's stderr so far (its file is read from the start each time)."""
    assert server.proc.stderr is not None
    server.proc.stderr.seek(0)
    return [line for line in server.proc.stderr.read().decode().splitlines() if line.strip()]


def _logged(server: Server, ids: list[str]) -> None:
    """Waits until --log-format json has written each request's line: it is written after the response's last
    byte, so it can reach the log a moment after the client has the answer (as test_serve.py's Server.access)."""
    deadline = time.monotonic() + 60  # a safety net for busy cores, not a timing
    while True:
        seen: set[str] = set()
        for line in _log_lines(server):
            with contextlib.suppress(ValueError):  # a line still being written (the test parses them all after)
                doc = json.loads(line)
                if isinstance(doc, dict) and doc.get("event") == "request":
                    seen.add(str(doc.get("request_id")))
        if set(ids) <= seen:
            return
        assert time.monotonic() < deadline, f"no request line in 60 s for {sorted(set(ids) - seen)}"
        time.sleep(0.05)


# ---- fair swaps ----------------------------------------------------------------------------------------------

def test_a_request_for_another_model_is_not_starved(cli_env: dict[str, str], tmp_path: Path) -> None:
    """--max-models 1, four clients keeping SmolLM2 busy without a pause, one request for Gemma 3: it is
    answered once SmolLM2's running requests end (the requests that came meanwhile wait behind the swap), not
    after --load-wait with a 503. Every SmolLM2 client is answered too; the eviction and the loads are logged
    as text lines (the wait's own line, when SmolLM2 was busy as Gemma asked: test_residency.py)."""
    s = Server({**cli_env, "LOCALGEN_HOME": str(tmp_path)}, "--max-models", "1", "-np", "2", "--ctx", "512",
               "--load-wait", "90")
    stop = threading.Event()
    statuses: list[int] = []

    def client() -> None:
        while not stop.is_set():
            r = httpx.post(f"{s.url}/api/generate", timeout=600, json={
                "model": "smollm2:135m", "prompt": "Count to ten.", "stream": False,
                "options": {"num_predict": 4, "ignore_eos": True}})
            statuses.append(r.status_code)

    clients = [threading.Thread(target=client) for _ in range(4)]  # 2 in slots, 2 queued: never idle
    try:
        for c in clients:
            c.start()
        deadline = time.monotonic() + 120
        while len(statuses) < 4 and time.monotonic() < deadline:  # the four keep it busy
            time.sleep(0.1)
        t0 = time.monotonic()
        r = httpx.post(f"{s.url}/api/generate", timeout=600, json={
            "model": "gemma3:270m", "prompt": "Say hi.", "stream": False, "options": {"num_predict": 3}})
        waited = time.monotonic() - t0
        before = len(statuses)
        deadline = time.monotonic() + 300
        while len(statuses) < before + 3 and time.monotonic() < deadline:  # SmolLM2's clients go on
            time.sleep(0.1)
    finally:
        stop.set()
        for c in clients:
            c.join(600)
        code = s.stop()
    log = _log(s)
    assert r.status_code == 200 and r.json()["eval_count"] == 3, r.text
    assert waited < 90, waited
    assert set(statuses) == {200} and len(statuses) > before, statuses
    assert code == 0 and "Traceback" not in log
    assert "unloaded smollm2:135m to make room for gemma3:270m" in log and "loaded gemma3:270m in" in log, log


def test_the_requests_waiting_for_a_models_load_all_run_in_that_load(cli_env: dict[str, str], tmp_path: Path) -> None:
    """--max-models 1: SmolLM2 busy with one long request, three requests for Gemma 3 wait for its load, then one
    more for SmolLM2 (held: SmolLM2 yields). The long one's client leaves: Gemma 3 loads and is asked at once to
    yield back to SmolLM2, and the three that waited for its load are all answered in that one load (only requests
    that come after the ask wait); SmolLM2 then loads again for its held request: three loads in all, not one of
    Gemma 3's per request."""
    s = Server({**cli_env, "LOCALGEN_HOME": str(tmp_path)}, "--max-models", "1", "-np", "1", "--ctx", "2048")
    codes: list[int] = []

    def ask(model: str) -> None:
        r = httpx.post(f"{s.url}/api/generate", timeout=600, json={
            "model": model, "prompt": "Count to ten.", "stream": False, "options": {"num_predict": 4}})
        codes.append(r.status_code)

    def model(name: str) -> dict[str, Any]:
        return dict(httpx.get(f"{s.url}/health", timeout=30).json()["models"].get(name) or {})

    def until(name: str, key: str, value: int) -> None:
        deadline = time.monotonic() + 300  # a safety net for busy cores, not a timing
        while (seen := model(name)).get(key) != value:
            assert time.monotonic() < deadline, seen
            time.sleep(0.05)

    threads = [threading.Thread(target=ask, args=("gemma3:270m",)) for _ in range(3)]
    threads.append(threading.Thread(target=ask, args=("smollm2:135m",)))
    try:
        with httpx.stream("POST", f"{s.url}/api/generate", timeout=600, json={
                "model": "smollm2:135m", "prompt": "Count to ten.", "stream": True,
                "options": {"num_predict": 1500, "ignore_eos": True}}) as long:
            lines = long.iter_lines()  # (kept: the iterator, once dropped, closes the response)
            next(lines)  # it runs: SmolLM2's slot is taken until its client leaves
            for t in threads[:3]:
                t.start()
            until("gemma3:270m", "queued", 3)
            # the swap under way in the listings: SmolLM2 unloads once its running request ends, not in 5 minutes
            ps = httpx.get(f"{s.url}/api/ps", timeout=30).json()["models"]
            assert [(m["name"], m.get("yielding_to")) for m in ps] == [("smollm2:135m", ["gemma3:270m"])], ps
            shown = InProcessCLI(dict(cli_env))("ps", "--port", str(s.port))
            assert shown.returncode == 0 and "unloading for gemma3:270m" in shown.stdout, shown
            threads[3].start()
            until("smollm2:135m", "held", 1)
        for t in threads:
            t.join(600)
        after = httpx.get(f"{s.url}/health", timeout=30).json()["residency"]
    finally:
        code = s.stop()
    assert codes == [200] * 4 and code == 0, codes
    assert (after["loads"], after["evictions"]) == (3, 2), after


# ---- the prompt cache across a restart -----------------------------------------------------------------------

RULES = [f"Rule {i}: the {c} door opens on day {i % 7 + 1}." for i, c in
         enumerate(["red", "blue", "green", "gold", "grey", "pink", "teal", "plum"] * 5)]
# a prompt of more than one of serve's ubatches (SERVE_GRID: 512 rows), so what a restart reads back spans one's
# edge: about 575 tokens with the chat template
FACTS = " ".join(RULES)
# a prefix just over what is stored (the prompt cache keeps 64 tokens or more): about 150 tokens
SHORT_FACTS = " ".join(RULES[:10])


def _turn(server: Server, history: list[dict[str, str]], question: str,
          facts: str = FACTS) -> tuple[tuple[str, object], int, int]:
    """One more turn of the conversation: the answer with its tokens' log-probabilities (which show a logit
    that differs in its last bit), its prompt tokens, and how many a slot already held."""
    msgs = [{"role": "system", "content": facts}, *history, {"role": "user", "content": question}]
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=600, json={
        "model": "smollm2:135m", "messages": msgs, "max_tokens": 4, "temperature": 0, "logprobs": True,
        "top_logprobs": 3})
    assert r.status_code == 200, r.text
    doc = r.json()
    choice = doc["choices"][0]
    return ((choice["message"]["content"], choice["logprobs"]), doc["usage"]["prompt_tokens"],
            doc["timings"]["cache_n"])


def _kept(held_prompt: int, prompt: int) -> int:
    """What serve keeps of a held prompt of `held_prompt` tokens for one of `prompt` that begins with it."""
    return reusable_prefix(held_prompt, held_prompt, prompt, *SERVE_GRID)


def test_the_prompt_cache_survives_a_restart(cli_env: dict[str, str], tmp_path: Path) -> None:
    """A long prompt sent twice gives the same greedy answer, to the last bit of its log-probabilities, as the
    first time (a fresh evaluation), its prefix reused. A long conversation, serve stopped with SIGTERM and
    started again, the conversation continued: the prefix comes back from disk (cache_n: the first turn's
    prompt but the rows a fresh evaluation computes otherwise), and the greedy answer is the one a server
    without the disk cache gives, bit for bit. A store torn meanwhile is skipped with one line: the answer is
    the same, evaluated afresh."""
    env = {**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")}
    args = ("-np", "1", "--ctx", "1024")
    began = time.monotonic()
    first = Server(env, *args)
    try:
        answered, prompt, _ = _turn(first, [], "Which day does the gold door open?")
        twice, _, cached_twice = _turn(first, [], "Which day does the gold door open?")
    finally:
        assert first.stop() == 0
    assert twice == answered, (twice, answered)
    assert cached_twice == _kept(prompt, prompt) > 0, cached_twice
    answer = answered[0]
    assert prompt > SERVE_GRID[0], prompt  # long: more than one ubatch
    log = _log(first)
    if time.monotonic() - began < KEEP_EVERY_S:  # else an idle keep may have written it all before the stop: nothing
        # new to write at the stop, and no line (serve.md); a busy machine's first server lived past it in CI
        assert re.search(r"smollm2:135m: kept [0-9.]+ [KMG]iB of prefixes for the next start", log), log  # serve.md
    store = tmp_path / "home" / "cache" / "serve-prefixes"
    assert list(store.glob("*/*.prefix"))
    history = [{"role": "user", "content": "Which day does the gold door open?"},
               {"role": "assistant", "content": answer}]
    question = "And the teal door?"

    again = Server(env, *args)
    try:
        warm, prompt2, cached = _turn(again, history, question)
        health = httpx.get(f"{again.url}/health", timeout=30).json()
        metrics = httpx.get(f"{again.url}/metrics", timeout=30).text
    finally:
        assert again.stop() == 0
    assert cached == _kept(prompt, prompt2) > prompt - 100, (prompt, prompt2, cached)
    assert health["models"]["smollm2:135m"]["disk_hits"] == 1 and health["prefix_store"]["read"] >= 1
    assert 'localgen_prefix_store_hits_total{model="smollm2:135m"} 1.0' in metrics
    assert f'localgen_prefix_store_hit_tokens_total{{model="smollm2:135m"}} {cached}.0' in metrics
    (stored,) = [float(line.split()[1]) for line in metrics.splitlines()
                 if line.startswith("localgen_prefix_store_bytes ")]
    assert stored == health["prefix_store"]["bytes"] > 0
    said = re.findall(r"; (\d+) stored (prefix|prefixes) read back", _log(again))
    assert said and all((word == "prefix") == (n == "1") for n, word in said), said  # "1 stored prefix"

    # a server whose --cache-disk holds none of these prefixes: it writes none, and leaves the others' alone
    kept = sorted(p.name for p in store.glob("*/*.prefix"))
    tiny = Server(env, *args, "--cache-disk", "1K")
    try:
        _turn(tiny, history, question)
    finally:
        assert tiny.stop() == 0
    log = _log(tiny)
    assert "prompt cache on disk: up to 1 KiB" in log and "dropped" not in log, log
    assert sorted(p.name for p in store.glob("*/*.prefix")) == kept

    cold = Server({**env, "LOCALGEN_HOME": str(tmp_path / "cold")}, *args, "--cache-disk", "0")
    try:
        fresh, _, cold_cached = _turn(cold, history, question)
    finally:
        assert cold.stop() == 0
    assert cold_cached == 0 and fresh == warm, (fresh, warm)

    for path in store.glob("*/*.prefix"):  # torn, as by a crash mid-write of a store without renames
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    torn = Server(env, *args)
    try:
        after, _, torn_cached = _turn(torn, history, question)
    finally:
        assert torn.stop() == 0
    log = _log(torn)
    assert torn_cached == 0 and after == fresh and "Traceback" not in log
    assert "skipped a stored prefix" in log and "the file is torn" in log, log


def test_a_server_with_another_window_or_slot_count_leaves_the_stored_prefixes(cli_env: dict[str, str],
                                                                                tmp_path: Path) -> None:
    """caches.md: the stored prefixes are read back only by the model and settings that made them, --ctx and
    --parallel among them; a server started with another window or slot count starts cold and leaves them (the
    page said that a file of another model was removed), and the next start with the first settings reads them
    back."""
    page = " ".join((Path(__file__).parents[1] / "docs" / "caches.md").read_text(encoding="utf-8").split())
    assert ("The settings include `--ctx` and `--parallel`: a server started with another window or slot count "
            "starts without the prefixes, and leaves them for the next start with the settings that made them") in page
    env = {**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")}
    first = Server(env, "-np", "1", "--ctx", "1024")
    try:
        _, prompt, _ = _turn(first, [], "Which day does the gold door open?", SHORT_FACTS)
    finally:
        assert first.stop() == 0
    store = tmp_path / "home" / "cache" / "serve-prefixes"
    written = sorted(store.glob("*/*.prefix"))
    assert written, _log(first)
    for other in (("-np", "2", "--ctx", "1024"), ("-np", "1", "--ctx", "512")):
        s = Server(env, *other)
        try:
            _, _, cached = _turn(s, [], "Which day does the gold door open?", SHORT_FACTS)
        finally:
            assert s.stop() == 0
        assert cached == 0 and "; 0 stored prefixes read back" in _log(s), (other, _log(s))
        assert set(written) <= set(store.glob("*/*.prefix")), other
    again = Server(env, "-np", "1", "--ctx", "1024")
    try:
        _, _, cached = _turn(again, [], "Which day does the gold door open?", SHORT_FACTS)
    finally:
        assert again.stop() == 0
    assert "; 1 stored prefix read back" in _log(again) and cached == _kept(prompt, prompt) > 0, _log(again)


def test_a_prefix_folder_that_cannot_be_made_is_one_warning_and_serve_answers(cli_env: dict[str, str],
                                                                              tmp_path: Path) -> None:
    """caches.md: the prompt cache on disk is a cache: when its folder cannot be made (a file in its place, no
    permission, a read-only disk), serve says so in one warning line and answers without it, as run and chat do
    (it exited 1 with "cannot write .../serve-prefixes")."""
    (tmp_path / "home" / "cache").mkdir(parents=True)
    (tmp_path / "home" / "cache" / "serve-prefixes").write_text("not a folder")
    s = Server({**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")}, "-np", "1", "--ctx", "1024")
    try:
        _turn(s, [], "Hello?", SHORT_FACTS)
    finally:
        assert s.stop() == 0
    log = _log(s)
    said = [line for line in log.splitlines() if "serve-prefixes" in line]
    assert len(said) == 1 and said[0].startswith("warning: no prompt cache on disk: "), log
    assert "cache/serve-prefixes is a file, not a folder (--cache-disk 0 says so without trying)" in said[0], log
    assert "no prompt cache on disk ·" in log and "Traceback" not in log, log


def test_a_model_file_removed_while_served_costs_only_its_prefixes(cli_env: dict[str, str], tmp_path: Path,
                                                                   smollm2_path: Path) -> None:
    """caches.md: a model whose file was removed while it was loaded keeps no prefixes on disk, said in one
    warning line (the clean stop wrote a traceback, "internal error while keeping the prompt cache on disk")."""
    import shutil

    model = tmp_path / "copy.gguf"
    shutil.copyfile(smollm2_path, model)
    s = Server({**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")}, "-m", str(model), "-np", "1", "--ctx", "1024")
    try:
        name = httpx.get(f"{s.url}/v1/models", timeout=30).json()["data"][0]["id"]
        r = httpx.post(f"{s.url}/v1/chat/completions", timeout=600, json={
            "model": name, "max_tokens": 2, "messages": [{"role": "system", "content": SHORT_FACTS},
                                                         {"role": "user", "content": "Hello?"}]})
        assert r.status_code == 200, r.text
        model.unlink()
    finally:
        assert s.stop() == 0
    log = _log(s)
    assert "Traceback" not in log and "internal error" not in log, log
    said = [line for line in log.splitlines() if "model file" in line]
    assert said == [f"warning: {name}: its model file is gone or changed since it loaded: its prefixes are not kept "
                    "on disk until it loads again"], log
    assert list((tmp_path / "home" / "cache" / "serve-prefixes").glob("*/*.prefix")) == []


def test_a_pinned_model_is_unloaded_when_a_client_asks_and_loads_again(cli_env: dict[str, str]) -> None:
    """docs/serve.md, Which models: -m pins a model against eviction (and deletion), not against an explicit unload
    (llama-server's router and Ollama honour one): POST /models/unload and Ollama's keep_alive 0 unload it, with
    --no-on-demand too; it stays offered, and the next request loads it again. --help says the same."""
    from localgen.cli import app

    s = Server(cli_env, "-m", "smollm2:135m", "--no-on-demand", "-np", "1", "--ctx", "512")
    try:
        def loaded() -> bool:
            return bool(httpx.get(f"{s.url}/health", timeout=30).json()["models"]["smollm2:135m"]["loaded"])

        def chat() -> httpx.Response:
            return httpx.post(f"{s.url}/v1/chat/completions", timeout=120, json={
                "model": "smollm2:135m", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]})

        assert loaded()
        r = httpx.post(f"{s.url}/models/unload", json={"model": "smollm2:135m"}, timeout=60)
        assert r.status_code == 200 and r.json() == {"success": True}, r.text
        assert not loaded() and httpx.get(f"{s.url}/api/ps", timeout=30).json()["models"] == []
        assert [m["id"] for m in httpx.get(f"{s.url}/v1/models", timeout=30).json()["data"]] == ["smollm2:135m"]
        assert chat().status_code == 200 and loaded()
        r = httpx.post(f"{s.url}/api/generate", json={"model": "smollm2:135m", "keep_alive": 0}, timeout=60)
        assert r.status_code == 200 and r.json()["done_reason"] == "unload" and not loaded(), r.text
        assert chat().status_code == 200 and loaded()
        assert httpx.get(f"{s.url}/health", timeout=30).json()["residency"]["unloads"] == 2
    finally:
        assert s.stop() == 0
    import typer

    [model] = [p for p in typer.main.get_command(app.build("serve")).commands["serve"].params  # type: ignore[attr-defined]
               if p.name == "models"]
    assert "never unloaded to make room for another, only after --keep-alive idle or when a client unloads it" \
        in " ".join((model.help or "").split())


def test_the_last_requests_keep_alive_wins_over_an_unload_asked_while_busy(cli_env: dict[str, str]) -> None:
    """docs/api.md: an unload that keep_alive 0 asked for while requests ran is taken back by a request that came
    after it with another keep_alive (Ollama's rule); without one, it happens once they end."""
    s = Server(cli_env, "-m", "smollm2:135m", "--no-on-demand", "-np", "2", "--ctx", "512")
    try:
        def loaded() -> bool:
            return bool(httpx.get(f"{s.url}/health", timeout=30).json()["models"]["smollm2:135m"]["loaded"])

        def generate(**more: object) -> httpx.Response:
            return httpx.post(f"{s.url}/api/generate", timeout=120, json={"model": "smollm2:135m", **more})

        def while_one_runs(then_keep: str | None) -> None:
            with httpx.Client(timeout=120) as c, c.stream("POST", f"{s.url}/api/generate", json={
                    "model": "smollm2:135m", "prompt": "Count from one to fifty in words.",
                    "options": {"num_predict": 48, "temperature": 0}}) as long:
                lines = long.iter_lines()
                next(lines)  # it runs
                r = generate(keep_alive=0)
                assert r.status_code == 200 and r.json()["done_reason"] == "unload"
                assert loaded()  # asked while a request runs: not yet
                if then_keep is not None:
                    r = generate(prompt="Hi", stream=False, keep_alive=then_keep, options={"num_predict": 1})
                    assert r.status_code == 200
                assert json.loads(list(lines)[-1])["done"] is True

        while_one_runs("5m")
        for _ in range(20):  # the worker takes its unloads the moment its last request ends: none comes
            assert loaded()
            time.sleep(0.05)
        assert httpx.get(f"{s.url}/health", timeout=30).json()["residency"]["unloads"] == 0
        while_one_runs(None)
        deadline = time.monotonic() + 60
        while loaded() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not loaded()
    finally:
        assert s.stop() == 0
