"""Model management over HTTP (#43 items 4 and 5): what /api/show and /api/create write, in process; then one
real server, its Hub the loopback stand-in (tests/hub_server.py), driven by the real `ollama` client: pull
(streamed progress, then the model is listed and answers), show, create (its system prompt and num_predict in
effect), copy, ps, delete (then a 404), llama-server's router routes, and errors as one-line JSON."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from localgen.serve import describe, manage, pulls
from localgen.serve.apierror import HTTPError
from localgen.serve.state import ServeState
from tests import hub_server
from tests.test_serve import Server

REPO = "acme/SmolLM2-GGUF"
FILE = "smollm2-135m-instruct-Q4_1.gguf"
PULLED = f"{REPO}:Q4_1"
COMMIT = hashlib.sha1(b"acme-manage").hexdigest()
SLOW, SLOW_FILE = "acme/Slow-GGUF", "slow-Q4_1.gguf"
TWICE, TWICE_FILE = "acme/Twice-GGUF", "twice-Q4_1.gguf"
OPTS = {"num_predict": 4, "temperature": 0}


# ---- in process ----------------------------------------------------------------------------------------------

def test_create_writes_a_modelfile_from_the_requests_fields() -> None:
    text = describe.modelfile_text({"from": "smollm2:135m", "system": "Be brief.\nVery.",
                                  "parameters": {"num_predict": 3, "stop": ["a", "b"], "temperature": 0},
                                  "messages": [{"role": "user", "content": "hi"}]})
    assert text == ('FROM smollm2:135m\nPARAMETER num_predict 3\nPARAMETER stop a\nPARAMETER stop b\n'
                    'PARAMETER temperature 0\nSYSTEM """Be brief.\nVery."""\nMESSAGE user hi\n')
    assert describe.modelfile_text({"modelfile": "FROM x\n", "from": "y"}) == "FROM x\n"  # older clients' text
    assert describe.modelfile_text({"from": "x", "quantize": "q4_K_M"}) == "FROM x\n"  # quantize: manage.py's
    for bad, says in (({"from": "x", "files": {"a": "sha256:0"}}, "`files` is not supported"),
                      ({}, "`from` must name"), ({"from": "x", "parameters": [1]}, "`parameters` must be an object"),
                      ({"from": "x", "messages": [{"content": "hi"}]}, "`content` string"),  # (no role)
                      ({"from": "x", "messages": [{"role": "user", "content": 5}]}, "`content` string"),
                      # a name with a line end wrote a SYSTEM line of its own into the preset
                      ({"from": "x", "parameters": {"temperature 0\nSYSTEM injected": 1}}, "no setting named"),
                      ({"from": "x", "parameters": {"top k": 1}}, "no setting named")):
        with pytest.raises(HTTPError, match=says) as e:
            describe.modelfile_text(bad)
        assert e.value.status == 400


def test_show_reads_the_header_without_loading(smollm2_path: Path) -> None:
    import dataclasses

    from localgen.models.resolve import resolve

    ref = resolve("smollm2:135m", offline=True, pull_missing=False)
    doc = describe.show_doc("smollm2:135m", ref)
    assert doc["modelfile"].startswith("FROM smollm2:135m\n")
    assert doc["model_info"]["general.architecture"] == "llama"
    assert doc["model_info"]["llama.context_length"] == ref.summary.context_length
    assert doc["model_info"]["general.parameter_count"] == ref.summary.n_params
    assert doc["template"] == ref.summary.chat_template and doc["details"]["format"] == "gguf"
    assert doc["capabilities"][0] == "completion"
    with_params = dataclasses.replace(ref, sampling_defaults={"temperature": 0.2, "stop": ("x", "y")}, context=1024)
    lines = describe.parameters_text(with_params).splitlines()
    assert [line.split() for line in lines] == [["num_ctx", "1024"], ["temperature", "0.2"], ["stop", "x"],
                                                ["stop", "y"]]
    # a stop of several lines is one line, quoted (it was cut at its first line: `stop """`)
    lines = describe.parameters_text(dataclasses.replace(ref, sampling_defaults={"stop": ("\n\nUser:", "z")})
                                     ).splitlines()
    assert [line.split(None, 1) for line in lines] == [["stop", '"\\n\\nUser:"'], ["stop", "z"]], lines
    # Ollama's values, which its client reads back as its options' types (a red team's: `seed none`, `numa
    # distribute`, no integer and no bool); the Modelfile keeps localgen's spelling
    lines = describe.parameters_text(dataclasses.replace(ref, sampling_defaults={"seed": None},
                                                         load={"numa": "distribute"})).splitlines()
    assert sorted(line.split() for line in lines) == [["numa", "true"], ["seed", "-1"]], lines
    tools = dataclasses.replace(ref, summary=dataclasses.replace(
        ref.summary, chat_template="{% if tools %}{{ tools }}{% endif %}{% if enable_thinking %}{% endif %}"))
    assert describe.capabilities(tools) == ["completion", "tools", "thinking"]
    bert = dataclasses.replace(ref, summary=dataclasses.replace(ref.summary, architecture="bert"))
    assert describe.capabilities(bert) == ["embedding"]


def test_an_offline_server_refuses_to_pull() -> None:
    with pytest.raises(HTTPError, match="offline") as e:
        asyncio.run(pulls.pull(ServeState(workers={}, offline=True), PULLED, True))
    assert e.value.status == 403


def test_a_pinned_or_busy_model_is_not_retired_and_a_file_of_your_own_is_not_deleted(smollm2_path: Path) -> None:
    from localgen.models.resolve import resolve

    class Stand:
        def __init__(self, name: str, pinned: bool, busy: bool) -> None:
            self.name, self.pinned, self.busy = name, pinned, busy
            self.ref = resolve(str(smollm2_path))  # a path: source "path"

    async def retire(state: ServeState, stand: Stand) -> None:
        async with manage._retired(state, [stand], "deleted"):  # type: ignore[list-item]
            raise AssertionError("retired")

    for stand, says in ((Stand("a", True, False), "named by serve -m"), (Stand("b", False, True), "answering")):
        state = ServeState(workers={stand.name: stand})  # type: ignore[dict-item]
        with pytest.raises(HTTPError, match=says) as e:
            asyncio.run(retire(state, stand))
        assert e.value.status == 409 and stand.name in state.workers and not state.retiring
    own = Stand("mine.gguf", False, False)
    with pytest.raises(HTTPError, match="did not download") as e:
        asyncio.run(manage._delete(ServeState(workers={"mine.gguf": own}), "mine.gguf"))  # type: ignore[dict-item]
    assert e.value.status == 400


def test_a_retire_clears_its_marks_and_a_second_one_of_the_same_model_is_refused() -> None:
    """The block failing (a preset that cannot be written) leaves no mark and no worker waiting to be stopped; a
    second delete, copy or create of a model being taken away is a 409 (it deleted the files under the first)."""
    import threading

    class Stand:  # a worker as _retired uses it
        def __init__(self, name: str) -> None:
            self.name, self.pinned, self.busy, self.stopped = name, False, False, False

        def close(self, why: str) -> None:
            pass

        def request_unload(self) -> threading.Event:
            done = threading.Event()
            done.set()
            return done

        def stop(self, timeout: float = 5.0) -> None:
            self.stopped = True

    async def both(state: ServeState, stand: Stand) -> None:
        async with manage._retired(state, [stand], "deleted", "rc"):  # type: ignore[list-item]
            assert state.retiring == [("rc", "deleted"), ("a", "deleted")] and stand.stopped
            with pytest.raises(HTTPError, match="'rc' is being deleted") as second:
                async with manage._retired(state, [], "replaced", "rc"):
                    raise AssertionError("the second ran")
            assert second.value.status == 409
            raise ValueError("the preset could not be written")

    stand = Stand("a")
    state = ServeState(workers={"a": stand})  # type: ignore[dict-item]
    with pytest.raises(ValueError):
        asyncio.run(both(state, stand))
    assert state.retiring == [] and state.stopping == [] and "a" not in state.workers


def test_a_pull_thread_that_wakes_after_the_server_stopped_leaves_no_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM during a pull: the event loop closes while the download thread still waits on the Hub's bytes.
    When it wakes, it stops (Stopped) and hands that to a loop that is gone: the item is dropped, and nothing
    reaches the server's log (threading's excepthook prints a thread's traceback there)."""
    import threading

    from localgen.models import resolve

    woke = threading.Event()
    failures: list[Any] = []
    monkeypatch.setattr(threading, "excepthook", failures.append)

    def pull(target: Any, progress: Any) -> None:
        woke.wait(30)  # a read of the Hub's next bytes, still under way when the server stops
        progress.advance(1)

    monkeypatch.setattr(resolve, "pull", pull)

    async def serve() -> None:
        _, stop, _ = pulls._pulling(None, True)
        stop.set()  # serve/app.py's Drain ends the pull (Pull.end), then the loop closes

    asyncio.run(serve())
    thread = next(t for t in threading.enumerate() if t.name == "localgen-pull")
    woke.set()
    thread.join(30)
    assert not thread.is_alive() and failures == [], [f.exc_value for f in failures]


# ---- a real server, its Hub on loopback -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hub(smollm2_path: Path) -> Iterator[hub_server.FakeHub]:
    fake, server = hub_server.start()
    fake.repos[REPO] = hub_server.HubRepo(COMMIT, {FILE: hub_server.HubFile(smollm2_path),
                                                   "README.md": hub_server.HubFile(b"# readme\n")})
    fake.repos[SLOW] = hub_server.HubRepo(COMMIT, {SLOW_FILE: hub_server.HubFile(smollm2_path)})
    yield fake
    server.shutdown()
    server.cdn.shutdown()  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def server(cli_env: dict[str, str], hub: hub_server.FakeHub,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    env = {k: v for k, v in cli_env.items() if k != "HF_HUB_OFFLINE"}
    env.update(HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(tmp_path_factory.mktemp("manage-hf")))
    s = Server(env, "-np", "1", "--ctx", "512")
    yield s
    assert s.stop() == 0
    log = s.proc.stderr.read().decode() if s.proc.stderr else ""
    assert "Traceback" not in log, log


@pytest.fixture(scope="module")
def client(server: Server) -> Any:
    import ollama

    return ollama.Client(host=server.url)


def _names(client: Any) -> list[str]:
    return [m.model for m in client.list().models]


def _error(server: Server, method: str, path: str, body: dict[str, Any], status: int) -> str:
    """Ollama's error shape: one line under `error`, and the request's id (its X-Request-Id header) beside it."""
    r = httpx.request(method, f"{server.url}{path}", json=body, timeout=120)
    assert r.status_code == status, r.text
    doc = r.json()
    assert list(doc) == ["error", "request_id"] and "\n" not in doc["error"], doc
    assert doc["request_id"] == r.headers["x-request-id"]
    return str(doc["error"])


def test_pull_streams_progress_and_the_model_answers_at_once(server: Server, client: Any,
                                                            hub: hub_server.FakeHub) -> None:
    assert PULLED not in _names(client)
    lines = list(client.pull(PULLED, stream=True))
    statuses = [x.status for x in lines]
    assert statuses[0] == "pulling manifest" and statuses[-2:] == ["verifying sha256 digest", "success"], statuses
    progress = [x for x in lines if x.status == f"pulling {FILE}"]
    size = hub.repos[REPO].files[FILE].size
    assert progress and progress[-1].total == progress[-1].completed == size and progress[-1].digest == FILE
    assert PULLED in _names(client)
    r = client.generate(model=PULLED, prompt="Say hi.", options=OPTS)
    assert r.done and r.eval_count and r.eval_count <= 4
    assert client.pull(PULLED).status == "success"  # a second pull: verified in the cache, nothing sent
    assert hub.sent[FILE] == size


def test_a_client_that_leaves_stops_the_pull_and_the_next_resumes(server: Server, client: Any,
                                                                     hub: hub_server.FakeHub) -> None:
    import json
    import time

    size = hub.repos[SLOW].files[SLOW_FILE].size
    hub.delay_per_mb = 0.05
    try:
        with httpx.stream("POST", f"{server.url}/api/pull", json={"model": f"{SLOW}:Q4_1"}, timeout=60) as r:
            for line in r.iter_lines():
                if json.loads(line).get("completed", 0) > 8 << 20:
                    break  # the client leaves mid-download
        sent, settled = -1, 0
        while settled < 10:  # until the Hub has sent nothing more for a second
            time.sleep(0.1)
            settled = settled + 1 if hub.sent.get(SLOW_FILE, 0) == sent else 0
            sent = hub.sent.get(SLOW_FILE, 0)
    finally:
        hub.delay_per_mb = 0.0
    assert 8 << 20 < sent < size
    assert f"{SLOW}:Q4_1" not in _names(client)
    again = [x.status for x in client.pull(f"{SLOW}:Q4_1", stream=True)]
    assert again[-1] == "success" and any(x.startswith(f"{SLOW_FILE}: resuming at ") for x in again), again
    assert size <= hub.sent[SLOW_FILE] < sent + size  # it went on from what it had, not from the start
    assert f"{SLOW}:Q4_1" in _names(client)


def test_two_pulls_of_one_model_and_a_quantize_of_a_quantized_one_name_no_server_path(
        server: Server, hub: hub_server.FakeHub) -> None:
    """The red team's leaks: a second pull of a model under way said "waiting for it to finish (lock
    /.../.locks/...lock)", and /api/create's `quantize` from a quantized model named its file in the data dir or
    site-packages. Over HTTP the client is told the model, never where the server keeps it."""
    import json
    import threading

    hub.repos[TWICE] = hub_server.HubRepo(COMMIT, {TWICE_FILE: hub.repos[SLOW].files[SLOW_FILE]})
    first: list[dict[str, Any]] = []
    started = threading.Event()

    def pull_first() -> None:
        with httpx.stream("POST", f"{server.url}/api/pull", json={"model": f"{TWICE}:Q4_1"}, timeout=120) as r:
            for line in r.iter_lines():
                first.append(json.loads(line))
                if first[-1].get("completed", 0) > 1 << 20:
                    started.set()

    hub.delay_per_mb = 0.05
    thread = threading.Thread(target=pull_first)
    try:
        thread.start()
        assert started.wait(60)
        with httpx.stream("POST", f"{server.url}/api/pull", json={"model": f"{TWICE}:Q4_1"}, timeout=120) as r:
            second = [json.loads(line) for line in r.iter_lines()]
    finally:
        hub.delay_per_mb = 0.0
        thread.join(120)
    waiting = [x["status"] for x in second if "another process is downloading" in x.get("status", "")]
    assert waiting and not any("/" in x or "lock" in x for x in waiting), second
    assert first[-1] == second[-1] == {"status": "success"}, (first[-3:], second[-3:])
    for model in ("smollm2:135m", "gemma3:270m"):
        said = _error(server, "POST", "/api/create", {"model": "mgr-q", "from": model, "quantize": "q4_K_M"}, 400)
        assert said.startswith(f"{model} is already quantized") and "/" not in said, said


def test_a_model_in_use_is_not_deleted(server: Server, client: Any) -> None:
    import time

    slow = f"{SLOW}:Q4_1"
    body = {"model": slow, "prompt": "Count to a hundred.", "options": {"num_predict": 400, "ignore_eos": True,
                                                                 "temperature": 0}}
    with httpx.stream("POST", f"{server.url}/api/generate", json=body, timeout=60) as r:
        lines = r.iter_lines()  # held: a generator dropped would close the response
        next(lines)  # it is generating
        assert "is answering requests" in _error(server, "DELETE", "/api/delete", {"model": slow}, 409)
        assert "is answering requests" in _error(server, "POST", "/models/unload", {"model": slow}, 409)
    deadline = time.monotonic() + 30  # the request ends as its client leaves, at the worker's next step
    while httpx.request("DELETE", f"{server.url}/api/delete", json={"model": slow}, timeout=60).status_code == 409:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert slow not in _names(client)


def test_lm_studio_ttl_sets_how_long_the_model_stays(server: Server, client: Any) -> None:
    import time

    import openai

    oa = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none")
    msgs: Any = [{"role": "user", "content": "Say hi."}]
    oa.chat.completions.create(model=PULLED, messages=msgs, max_tokens=2, extra_body={"ttl": 3600})

    def left() -> float:  # seconds until it unloads, by /api/ps (the worker sets it once the job has ended)
        (ps,) = [m for m in client.ps().models if m.model == PULLED]
        return float(ps.expires_at.timestamp() - time.time())

    deadline = time.monotonic() + 30
    while left() < 3500 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert 3500 < left() <= 3600
    oa.chat.completions.create(model=PULLED, messages=msgs, max_tokens=2, extra_body={"ttl": 0})
    deadline = time.monotonic() + 30
    while PULLED in [m.model for m in client.ps().models] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert PULLED not in [m.model for m in client.ps().models]  # unloaded once idle
    r = httpx.post(f"{server.url}/v1/chat/completions", json={"model": PULLED, "messages": msgs, "ttl": "1h"},
                   timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "ttl"


def test_pull_errors(server: Server, client: Any, hub: hub_server.FakeHub) -> None:
    import ollama

    assert client.pull("smollm2:135m").status == "success"  # it ships inside a Python package: here already
    hub.repos["acme/Gated-GGUF"] = hub_server.HubRepo(COMMIT, {"gated-Q4_1.gguf": hub.repos[REPO].files[FILE]},
                                                      gated_files=True)
    assert "refused the download" in _error(server, "POST", "/api/pull",
                                            {"model": "acme/Gated-GGUF:Q4_1", "stream": False}, 502)
    with pytest.raises(ollama.ResponseError, match="refused the download"):  # its line after progress began
        list(client.pull("acme/Gated-GGUF:Q4_1", stream=True))
    assert "has no quantization Q2_K" in _error(server, "POST", "/api/pull", {"model": f"{REPO}:Q2_K"}, 404)
    assert "acme/none" in _error(server, "POST", "/api/pull", {"model": "acme/none"}, 404)
    _error(server, "POST", "/api/pull", {"model": "/etc/passwd"}, 400)
    _error(server, "POST", "/api/pull", {}, 400)


@pytest.mark.parametrize("name", ["a/../../b", "file:///etc/passwd", "x" * 5000, "hf.co/a/b/../../../etc/passwd.gguf",
                                  "acme//SmolLM2-GGUF", "README.md"])
def test_a_pull_of_a_name_that_is_no_model_is_a_4xx(server: Server, name: str) -> None:
    """The red team's names: a 400 in Ollama's shape (never a 500 with a traceback in the log, checked as the
    server stops, nor a dropped connection). No file on the server is looked for: README.md, a file in the
    server's folder, is a model name not in the catalogue (404), not "a local file"."""
    for stream in (False, True):
        if name == "README.md":
            assert "unknown model" in _error(server, "POST", "/api/pull", {"model": name, "stream": stream}, 404)
            continue
        said = _error(server, "POST", "/api/pull", {"model": name, "stream": stream}, 400)
        assert name[:40] in said or "at most 4,096 characters" in said, said


def test_a_pulled_file_that_is_not_a_gguf_is_a_422_and_leaves_the_cache(server: Server, client: Any,
                                                                        hub: hub_server.FakeHub) -> None:
    """The Hub's bytes, verified, that are not a model: the error names the repo's file, never the server's
    paths, and the file is gone again (nothing over HTTP could remove it)."""
    text = hub_server.HubFile(b"not a model\n" * 99)
    hub.repos["acme/Text-GGUF"] = hub_server.HubRepo(COMMIT, {"text-Q4_1.gguf": text})
    said = _error(server, "POST", "/api/pull", {"model": "acme/Text-GGUF:Q4_1", "stream": False}, 422)
    assert "acme/Text-GGUF/text-Q4_1.gguf is not a GGUF file" in said, said
    for private in ("/tmp", "/root", "/home", str(Path.home())):
        assert private not in said, said
    with pytest.raises(Exception, match="is not a GGUF file"):  # streamed: its error line
        list(client.pull("acme/Text-GGUF:Q4_1", stream=True))
    cache = Path(server.env["HF_HUB_CACHE"]) / "models--acme--Text-GGUF"
    left = [p for p in cache.rglob("*") if p.is_file() or p.is_symlink()] if cache.exists() else []
    assert not [p for p in left if p.name == "text-Q4_1.gguf" or p.parent.name == "blobs"], left
    assert "acme/Text-GGUF:Q4_1" not in _names(client)


def test_show_create_copy_and_delete_a_preset(server: Server, client: Any) -> None:
    import ollama

    shown = client.show(PULLED)
    assert shown.modelfile.startswith(f"FROM {PULLED}") and shown.template and shown.capabilities == ["completion"]
    assert shown.modelinfo["general.architecture"] == "llama" and shown.details.format == "gguf"
    done = client.create(model="mgr-bot", from_="smollm2:135m", system="You are a pirate. Answer as one.",
                         parameters={"num_predict": 3, "temperature": 0})
    assert done.status == "success"
    assert "mgr-bot" in _names(client)
    assert client.generate(model="mgr-bot", prompt="Say hi.").eval_count == 3
    again = {"model": "mgr-bot", "from": "smollm2:135m", "system": "You are a pirate. Answer as one.",
             "parameters": {"num_predict": 2, "temperature": 0}, "stream": False}
    assert "send \"force\": true" in _error(server, "POST", "/api/create", again, 409)  # as the CLI's --force
    assert client.generate(model="mgr-bot", prompt="Say hi.").eval_count == 3  # kept, and still answering
    assert httpx.post(f"{server.url}/api/create", json={**again, "force": True}, timeout=120).status_code == 200
    assert client.generate(model="mgr-bot", prompt="Say hi.").eval_count == 2  # replaced, as asked
    client.create(model="mgr-bot2", from_="smollm2:135m")
    _error(server, "POST", "/api/copy", {"source": "smollm2:135m", "destination": "mgr-bot2"}, 409)
    assert client.delete("mgr-bot2").status == "success"
    httpx.post(f"{server.url}/api/create", timeout=120, json={**again, "force": True,
                                                               "parameters": {"num_predict": 3, "temperature": 0}})
    bot = client.generate(model="mgr-bot", prompt="Say hi.")
    assert bot.eval_count == 3  # the preset's num_predict
    given = client.generate(model="smollm2:135m", prompt="Say hi.", system="You are a pirate. Answer as one.",
                            options={"temperature": 0, "num_predict": 3})
    assert (bot.prompt_eval_count, bot.response) == (given.prompt_eval_count, given.response)  # its SYSTEM
    assert "SYSTEM" in client.show("mgr-bot").modelfile and "num_predict" in client.show("mgr-bot").parameters
    bare, tagged = client.show("mgr-bot"), client.show("mgr-bot:latest")  # docs/models.md: NAME:latest is NAME
    assert (tagged.modelfile, tagged.parameters) == (bare.modelfile, bare.parameters)
    assert client.copy("mgr-bot", "mgr-bot2").status == "success"
    assert client.generate(model="mgr-bot2", prompt="Say hi.").eval_count == 3
    assert client.delete("mgr-bot2").status == "success"
    assert "mgr-bot2" not in _names(client) and "mgr-bot" in _names(client)
    with pytest.raises(ollama.ResponseError) as e:
        client.generate(model="mgr-bot2", prompt="Say hi.")
    assert e.value.status_code == 404
    assert client.delete("mgr-bot").status == "success"
    assert "bad preset name" in _error(server, "POST", "/api/copy", {"source": PULLED, "destination": "a b"}, 400)
    # the names it has, as a generation's 404 says them (not `localgen list`, a command on another machine)
    said = _error(server, "POST", "/api/copy", {"source": "nope", "destination": "x"}, 404)
    assert said.startswith("model 'nope' is not served here (served: ") and "smollm2:135m" in said, said
    assert _error(server, "POST", "/api/show", {"model": "nope"}, 404) == said
    assert _error(server, "DELETE", "/api/delete", {"model": "nope"}, 404) == said
    assert "catalogue model" in _error(server, "POST", "/api/copy",
                                       {"source": PULLED, "destination": "gemma3:270m"}, 400)
    assert "FROM nope" in _error(server, "POST", "/api/create", {"model": "x", "from": "nope"}, 400)
    assert "Go template" in _error(server, "POST", "/api/create",
                                   {"model": "x", "from": PULLED, "template": "{{ .Prompt }}"}, 400)
    _error(server, "POST", "/api/show", {"model": "/etc/passwd"}, 404)


def test_create_takes_what_ollamas_client_sends(server: Server, client: Any) -> None:
    """What the `ollama` client sends, and Ollama's create takes, was a 400: an empty `system` (none set: the
    base's stays, as Ollama's create keeps it), a message with empty content, `numa` true or false, the options a
    request lets be (num_keep, tfs_z, penalize_newline, low_vram, f16_kv, vocab_only), num_predict -2, and an
    integer sent as a float. One with a fraction is still a 400, as Ollama's Modelfile refuses it."""
    import ollama

    try:
        client.create(model="mgr-sys", from_="smollm2:135m", system="You are a pirate. Answer as one.")
        done = client.create(model="mgr-olla", from_="mgr-sys", system="",
                             messages=[{"role": "user", "content": ""}, {"role": "assistant", "content": "Ahoy."}],
                             parameters=ollama.Options(numa=False, num_keep=24, tfs_z=1.0, penalize_newline=True,
                                                       low_vram=False, f16_kv=True, vocab_only=False, num_predict=-2))
        assert done.status == "success"
        shown = client.show("mgr-olla").modelfile
        assert "SYSTEM You are a pirate. Answer as one.\n" in shown and 'MESSAGE user ""\n' in shown, shown
        assert "PARAMETER num_predict -1\n" in shown and "numa" not in shown and "tfs_z" not in shown, shown
        assert client.generate(model="mgr-olla", prompt="Say hi.", options={"num_predict": 2}).eval_count == 2
        made = httpx.post(f"{server.url}/api/create", timeout=120, json={
            "model": "mgr-numa", "from": "smollm2:135m", "stream": False,
            "parameters": {"numa": True, "top_k": 40.0, "num_ctx": 2048.0, "num_thread": 1.0}})
        assert made.status_code == 200, made.text
        shown = client.show("mgr-numa").modelfile
        for line in ("numa distribute", "top_k 40", "num_ctx 2048", "num_thread 1"):
            assert f"PARAMETER {line}\n" in shown, shown
        # a message without content (or null) is one with "", as Go decodes it (it was a 400 here; /api/chat took it)
        made = httpx.post(f"{server.url}/api/create", timeout=120, json={
            "model": "mgr-empty", "from": "smollm2:135m", "stream": False,
            "messages": [{"role": "user", "content": None}, {"role": "assistant"}]})
        assert made.status_code == 200, made.text
        shown = client.show("mgr-empty").modelfile
        assert 'MESSAGE user ""\nMESSAGE assistant ""\n' in shown, shown
        said = _error(server, "POST", "/api/create", {"model": "mgr-bad", "from": "smollm2:135m",
                                                       "parameters": {"top_k": 40.5}}, 400)
        assert said == "the request line 2: top_k takes an integer, not '40.5'", said
    finally:
        for name in ("mgr-olla", "mgr-numa", "mgr-empty", "mgr-sys"):
            httpx.request("DELETE", f"{server.url}/api/delete", json={"model": name}, timeout=60)


def test_a_refused_copy_or_create_leaves_a_loaded_model_loaded(server: Server, client: Any) -> None:
    """The red team's copy and create onto a loaded model's name: refused (a catalogue name, a bad name, a
    preset that exists), and the model is still loaded and answering: every check comes before its worker is
    stopped."""
    assert client.generate(model="smollm2:135m", prompt="Say hi.", options=OPTS).done
    client.create(model="mgr-live", from_="smollm2:135m")
    assert client.generate(model="mgr-live", prompt="Say hi.", options=OPTS).done
    loaded = {"smollm2:135m", "mgr-live"}
    for path, body, status in (("/api/copy", {"source": "gemma3:270m", "destination": "smollm2:135m"}, 400),
                               ("/api/create", {"model": "smollm2:135m", "from": "gemma3:270m"}, 400),
                               ("/api/copy", {"source": "gemma3:270m", "destination": "mgr-live"}, 409),
                               ("/api/create", {"model": "mgr-live", "from": "gemma3:270m"}, 409),
                               ("/api/create", {"model": "mgr-live", "from": "nope", "force": True}, 400),
                               ("/api/create", {"model": "mgr-live\n", "from": "smollm2:135m"}, 400)):
        _error(server, "POST", path, body, status)
        assert loaded <= {m.model for m in client.ps().models}, (path, body)
    assert client.generate(model="mgr-live", prompt="Say hi.", options=OPTS).done
    assert client.delete("mgr-live").status == "success"


def test_racing_creates_or_copies_of_one_name_make_one_preset_and_409s(server: Server, client: Any) -> None:
    """The red team's race: eight /api/create of one new name at once, without `force`, then eight /api/copy to
    one destination: exactly one of each answers 200, every other a 409, and the preset is the winner's."""
    from concurrent.futures import ThreadPoolExecutor

    def post(path: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(f"{server.url}{path}", json=body, timeout=120)

    creates = [{"model": "mgr-race", "from": "smollm2:135m", "parameters": {"num_predict": n}, "stream": False}
               for n in range(1, 9)]
    copies = [{"source": "smollm2:135m", "destination": "mgr-race2"}] * 8
    answered = {}
    for path, bodies in (("/api/create", creates), ("/api/copy", copies)):
        with ThreadPoolExecutor(len(bodies)) as pool:
            answers = answered[path] = list(pool.map(post, [path] * len(bodies), bodies))
        assert sorted(r.status_code for r in answers) == [200] + [409] * 7, [r.text for r in answers]
        assert all("exists" in r.json()["error"] for r in answers if r.status_code == 409)
    winner = next(b for b, r in zip(creates, answered["/api/create"], strict=True) if r.status_code == 200)
    assert f"num_predict {winner['parameters']['num_predict']}" in " ".join(client.show("mgr-race").parameters.split())
    assert client.delete("mgr-race").status == "success" and client.delete("mgr-race2").status == "success"


def test_a_preset_name_with_a_newline_is_refused_by_the_cli_and_over_http(server: Server, cli_env: dict[str, str],
                                                                           tmp_path: Path) -> None:
    """`$` in a pattern also matches before a final newline: "bot\n" was taken, written as a file, then a 404.
    The one rule (models/presets.py's check_name) refuses it over HTTP and on the command line alike."""
    from tests.conftest import CLI

    for bad in ("bot\n", "bot\r", "bot/x", "../bot", "bot bot", ".bot"):
        said = _error(server, "POST", "/api/create", {"model": bad, "from": "smollm2:135m"}, 400)
        assert "bad preset name" in said
        _error(server, "POST", "/api/copy", {"source": "smollm2:135m", "destination": bad}, 400)
    (tmp_path / "Modelfile").write_text("FROM smollm2:135m\n")
    r = CLI({**cli_env, "LOCALGEN_HOME": str(tmp_path)})("create", "bot\n", "-f", str(tmp_path / "Modelfile"))
    assert r.returncode == 2 and "bad preset name" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "data" / "presets").exists() or not list((tmp_path / "data" / "presets").iterdir())


def test_load_and_eviction_counts_add_up_after_churn(server: Server, client: Any) -> None:
    """/health after presets made, replaced, copied, used and deleted: every load has ended once, as an eviction
    or an unload, or is loaded now."""
    client.create(model="mgr-churn", from_="smollm2:135m")
    for _ in range(2):
        assert client.generate(model="mgr-churn", prompt="Say hi.", options=OPTS).done
        httpx.post(f"{server.url}/api/create", json={"model": "mgr-churn", "from": "smollm2:135m", "force": True},
                   timeout=120).raise_for_status()
        assert client.copy("mgr-churn", "mgr-churn2").status == "success"
        assert client.generate(model="mgr-churn2", prompt="Say hi.", options=OPTS).done
        assert client.delete("mgr-churn2").status == "success"
    assert client.delete("mgr-churn").status == "success"
    r = httpx.get(f"{server.url}/health", timeout=30).json()["residency"]
    assert r["loads"] == len(r["loaded"]) + r["evictions"] + r["unloads"] and r["evictions"] <= r["loads"], r
    assert r["unloads"] >= 4, r


def test_router_load_unload_then_delete(server: Server, client: Any, hub: hub_server.FakeHub) -> None:
    import ollama

    def status() -> dict[str, str]:
        doc = httpx.get(f"{server.url}/models", timeout=30).json()
        return {m["id"]: m["status"]["value"] for m in doc["data"]}

    assert httpx.post(f"{server.url}/models/load", json={"model": PULLED}, timeout=300).json() == {"success": True}
    assert httpx.post(f"{server.url}/models/unload", json={"model": PULLED}, timeout=60).json() == {"success": True}
    assert status()[PULLED] == "unloaded"
    assert "model is not running" in _error(server, "POST", "/models/unload", {"model": PULLED}, 400)  # llama-server's
    assert httpx.post(f"{server.url}/models/load", json={"model": PULLED}, timeout=300).json() == {"success": True}
    assert status()[PULLED] == "loaded" and PULLED in [m.model for m in client.ps().models]
    _error(server, "DELETE", "/api/delete", {"model": "smollm2:135m"}, 400)  # it ships in a Python package
    client.create(model="mgr-over", from_=PULLED)
    assert client.generate(model="mgr-over", prompt="Say hi.", options=OPTS).done
    assert client.delete(PULLED).status == "success"  # unloaded first, and the preset's worker on it too
    loaded = [m.model for m in client.ps().models]
    assert PULLED not in _names(client) and PULLED not in loaded and "mgr-over" not in loaded
    with pytest.raises(ollama.ResponseError) as e:
        client.generate(model=PULLED, prompt="Say hi.")
    assert e.value.status_code == 404
    _error(server, "DELETE", "/api/delete", {"model": PULLED}, 404)
    _error(server, "POST", "/models/load", {"model": PULLED}, 404)


def test_sigterm_during_a_streamed_pull_ends_it_with_an_error_line(cli_env: dict[str, str], hub: hub_server.FakeHub,
                                                                   tmp_path: Path) -> None:
    """The server is stopped while a pull streams its progress: the stream's last line is an error saying so
    (not a cut body), the server exits 0 with no traceback in its log, and the next pull resumes the file."""
    import json
    import signal
    import threading

    env = {k: v for k, v in cli_env.items() if k != "HF_HUB_OFFLINE"}
    env.update(HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(tmp_path / "hf"), LOCALGEN_HOME=str(tmp_path / "home"))
    s = Server(env, "-np", "1", "--ctx", "512", "--drain-timeout", "1")
    hub.delay_per_mb = 0.2
    lines: list[dict[str, Any]] = []
    stopped = False
    try:
        with httpx.stream("POST", f"{s.url}/api/pull", json={"model": f"{SLOW}:Q4_1"}, timeout=120) as r:
            for line in r.iter_lines():
                lines.append(json.loads(line))
                if lines[-1].get("completed", 0) > 2 << 20 and not stopped:  # the download is under way
                    stopped = True
                    threading.Thread(target=s.proc.send_signal, args=(signal.SIGTERM,)).start()
    finally:
        hub.delay_per_mb = 0.0
        code = s.stop()
    log = s.proc.stderr.read().decode() if s.proc.stderr else ""
    assert code == 0 and "Traceback" not in log, log
    assert "error" in lines[-1] and "shutting down" in lines[-1]["error"], lines[-3:]
    assert stopped and not any(x.get("status") == "success" for x in lines)


@pytest.mark.parametrize("taking", ["delete", "create"])
def test_a_request_while_its_model_is_deleted_or_replaced_is_answered_and_the_next_load_works(
        cli_env: dict[str, str], tmp_path: Path, taking: str) -> None:
    """The red team's race under --max-models 1: a preset loaded, then deleted (or replaced with `force`) while
    requests naming it keep coming. Every request is answered (a 409 while the model is being taken away, a 404
    once it is gone, or served), none hangs; what /health counts as loaded is what /api/ps shows; another model
    loads after it; the server stops with 0 and no traceback. Before, a request that came while the worker was
    unloaded and stopped loaded the model again and was never answered, the model stayed counted, and with
    --max-models 1 no model could load again."""
    import threading

    s = Server({**cli_env, "LOCALGEN_HOME": str(tmp_path)}, "--max-models", "1", "-np", "1", "--ctx", "512")
    create = {"model": "mgr-rc", "from": "smollm2:135m", "stream": False, "force": True}
    take = (("DELETE", "/api/delete", {"model": "mgr-rc"}) if taking == "delete" else
            ("POST", "/api/create", {**create, "system": "You are new."}))
    statuses: list[int] = []
    try:
        for _ in range(20):  # until one request comes while the take is under way: the requests start once /api/ps
            # no longer shows the model (started beside the take, they came first, and the take was a busy 409)
            assert httpx.post(f"{s.url}/api/create", json=create, timeout=120).status_code == 200
            assert httpx.post(f"{s.url}/api/generate", json={"model": "mgr-rc"}, timeout=120).status_code == 200
            taken: list[httpx.Response] = []
            thread = threading.Thread(target=lambda answers=taken: answers.append(
                httpx.request(take[0], f"{s.url}{take[1]}", json=take[2], timeout=120)))
            thread.start()
            with httpx.Client(timeout=30) as poll:  # until the take is under way: the model is no longer shown
                while thread.is_alive() and any(m["name"].startswith("mgr-rc")
                                                for m in poll.get(f"{s.url}/api/ps").json()["models"]):
                    time.sleep(0.005)
            during: list[int] = []
            while thread.is_alive():  # loads of the model (no prompt) while it is being taken away
                during.append(httpx.post(f"{s.url}/api/generate", json={"model": "mgr-rc"}, timeout=60).status_code)
            thread.join()
            story = httpx.post(f"{s.url}/api/generate", timeout=60, json={
                "model": "mgr-rc", "prompt": "Tell a story", "stream": False, "options": {"num_predict": 4}})
            statuses += [*during, story.status_code]
            allowed = {200, 404, 409} if taking == "delete" else {200, 409}  # a replaced preset is never missing
            assert set(statuses) <= allowed and taken[0].status_code in (200, 409), (taken[0].text, statuses)
            if taken[0].status_code == 200 and 409 in during:
                break
        assert taken[0].status_code == 200 and 409 in during, (taken[0].text, statuses)
        assert story.status_code == (404 if taking == "delete" else 200), story.text
        residency = httpx.get(f"{s.url}/health", timeout=30).json()["residency"]
        shown = [m["name"] for m in httpx.get(f"{s.url}/api/ps", timeout=30).json()["models"]]
        assert residency["loaded"] == sorted(shown), (residency, shown)
        smol = httpx.post(f"{s.url}/api/generate", timeout=120, json={
            "model": "smollm2:135m", "prompt": "Say hi.", "stream": False, "options": OPTS})
        assert smol.status_code == 200 and smol.json()["eval_count"] == 4, smol.text
    finally:
        code = s.stop()
    log = s.proc.stderr.read().decode() if s.proc.stderr else ""
    assert code == 0 and "Traceback" not in log, log


def test_create_refuses_a_preset_larger_than_a_preset_is_read_to(server: Server, client: Any) -> None:
    """configuration.md: a preset file is read to 16 MiB, a larger one left out as too large; /api/create (whose
    body may carry 4-byte characters a preset's JSON writes as 12 bytes each) refuses a Modelfile over the 1 MiB
    `create -f` reads, 400, rather than make a preset whose `show --modelfile` create refuses (a 3 MiB system
    prompt was taken) or one no command could read."""
    for system in ("\U0001F600" * 1_400_000, "x" * (3 << 20)):
        body = {"model": "mgr-huge", "from": "smollm2:135m", "system": system}
        r = httpx.post(f"{server.url}/api/create", content=json.dumps(body, ensure_ascii=False).encode(),
                       headers={"Content-Type": "application/json"}, timeout=120)
        assert r.status_code == 400, r.text
        assert r.json()["error"] == "the request's Modelfile is larger than 1 MiB, the most localgen reads of it"
        assert "mgr-huge" not in _names(client)
