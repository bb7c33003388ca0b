"""`localgen stop MODEL` (and `--all`) against a real `localgen serve` with a key: the model is unloaded (gone
from /api/ps), quietly; a model not loaded, one the server lacks, no server, and a missing or wrong key are each
one line and exit 1; a model answering a request unloads once it ends, and a line says so."""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import CLI
from tests.test_serve import KEY, Server
from tests.trickle import trickling

AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server(cli_env: dict[str, str]) -> Iterator[Server]:
    s = Server(cli_env, "--api-key", KEY, "-m", "smollm2:135m", "-np", "1", "--ctx", "1024")
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def keyed(cli: CLI) -> CLI:
    """`localgen` with the server's key in LOCALGEN_API_KEY, as a user who set it once would run it."""
    return CLI({**cli.env, "LOCALGEN_API_KEY": KEY})


def _loaded(server: Server) -> list[str]:
    r = httpx.get(f"{server.url}/api/ps", headers=AUTH, timeout=30)
    assert r.status_code == 200, r.text
    return [m["name"] for m in r.json()["models"]]


def _load(server: Server, model: str) -> None:
    """Ollama's load without generating: /api/generate with no prompt."""
    r = httpx.post(f"{server.url}/api/generate", headers=AUTH, timeout=300,
                   json={"model": model, "prompt": "", "keep_alive": "10m"})
    assert r.status_code == 200 and r.json()["done_reason"] == "load", r.text
    assert model in _loaded(server)


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def test_stop_unloads_a_loaded_model_quietly(server: Server, keyed: CLI) -> None:
    _load(server, "smollm2:135m")
    r = keyed("stop", "smollm2:135m", "--port", str(server.port))
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    assert "smollm2:135m" not in _loaded(server)
    # not loaded now: one line naming it and the server, exit 1
    r = keyed("stop", "smollm2:135m", "--port", str(server.port))
    assert r.returncode == 1 and r.stdout == ""
    assert f"smollm2:135m is not running at {server.url}" in _one_line(r.stderr)
    _load(server, "smollm2:135m")  # the next request naming it loads it again


def test_stop_a_model_the_server_does_not_have(server: Server, keyed: CLI) -> None:
    r = keyed("stop", "no-such-model:1b", "--port", str(server.port))
    assert r.returncode == 1 and r.stdout == ""
    assert f"the server at {server.url} has no model 'no-such-model:1b'" in _one_line(r.stderr)


def test_stop_with_no_server_names_the_address_tried(keyed: CLI) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free once closed: nothing listens there
    r = keyed("stop", "smollm2:135m", "--port", str(port))
    assert r.returncode == 1 and r.stdout == ""
    assert f"no localgen serve is running at http://127.0.0.1:{port}" in _one_line(r.stderr)
    r = keyed("stop", "--all", "--host", f"127.0.0.1:{port}")  # LOCALGEN_HOST's forms, as ps takes them
    assert r.returncode == 1 and f"http://127.0.0.1:{port}" in _one_line(r.stderr)


def test_stop_without_the_key_or_with_a_wrong_one_unloads_nothing(server: Server, cli: CLI) -> None:
    _load(server, "smollm2:135m")
    r = cli("stop", "smollm2:135m", "--port", str(server.port))
    assert r.returncode == 1 and "needs an API key: give --api-key KEY or set LOCALGEN_API_KEY" in _one_line(r.stderr)
    r = cli("stop", "smollm2:135m", "--port", str(server.port), "--api-key", "wrong")
    assert r.returncode == 1 and "refused the API key given" in _one_line(r.stderr)
    assert "{" not in r.stderr  # never the server's raw JSON
    assert "smollm2:135m" in _loaded(server)
    r = cli("stop", "smollm2:135m", "--port", str(server.port), "--api-key", KEY)  # the flag, as ps takes it
    assert (r.returncode, r.stderr) == (0, "") and "smollm2:135m" not in _loaded(server)


def test_stop_all_unloads_every_model_loaded(server: Server, keyed: CLI) -> None:
    _load(server, "smollm2:135m")
    _load(server, "gemma3:270m")
    r = keyed("stop", "--all", "--port", str(server.port))
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    assert _loaded(server) == []
    r = keyed("stop", "--all", "--port", str(server.port))  # nothing loaded: nothing to do, no error
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


def test_stop_a_model_answering_a_request_unloads_it_once_that_ends(server: Server, keyed: CLI) -> None:
    _load(server, "smollm2:135m")
    body = {"model": "smollm2:135m", "prompt": "Count from 1 to 1000, separated by commas.",
            "options": {"num_predict": 3000, "temperature": 0}}
    with httpx.stream("POST", f"{server.url}/api/generate", headers=AUTH, json=body, timeout=60) as gen:
        lines = gen.iter_lines()  # held: a generator dropped would close the response
        assert json.loads(next(lines))["done"] is False  # it is generating
        r = keyed("stop", "smollm2:135m", "--port", str(server.port))
        assert r.returncode == 0 and r.stdout == ""
        # true too where its requests ended between the 409 and keep_alive 0 (it unloaded at once then)
        assert _one_line(r.stderr) == "smollm2:135m was answering requests: it unloads as soon as they have ended"
        assert "smollm2:135m" in _loaded(server)  # not cut off: it finishes what it answers
    deadline = time.monotonic() + 60  # the request ends as its client leaves, at the worker's next step
    while "smollm2:135m" in _loaded(server):
        assert time.monotonic() < deadline, "the model did not unload once its request ended"
        time.sleep(0.1)


@pytest.mark.parametrize(("args", "says"), [
    ((), "name the model to stop (localgen ps lists those loaded), or give --all"),
    (("smollm2:135m", "--all"), "give a model or --all, not both"),
    ((" smollm2:135m",), "' smollm2:135m' is not a model's name"),
    (("",), "'' is not a model's name"),
    (("caf\udce8",), "'caf\ufffd' is not a model's name"),  # a byte not UTF-8, as U+FFFD (not '\udce8')
])
def test_stop_usage_errors_are_one_line_and_exit_2(keyed: CLI, args: tuple[str, ...], says: str) -> None:
    r = keyed("stop", *args, "--port", "9")
    assert r.returncode == 2 and r.stdout == ""
    assert says in _one_line(r.stderr)


def test_help_lists_stop_after_ps(cli: CLI) -> None:
    r = cli("--help")
    assert r.returncode == 0
    rows = re.findall(r"^│ (\S+) {2,}", r.stdout, re.MULTILINE)  # each row's first word; not its continuations
    assert rows[rows.index("ps") + 1] == "stop", rows
    assert "Unload a model from a running server now" in r.stdout


def test_stop_all_goes_on_past_a_model_that_fails_and_one_that_went(cli_in_process: Any,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """--all stopped at the first model whose unload did not answer as expected (one removed since /api/ps listed
    it: a 404), leaving the rest loaded: one that went is skipped, one that fails is said at the end, the others
    are unloaded all the same."""
    from localgen.cli.serve import stop

    unloaded: list[str] = []

    class Answer:
        def __init__(self, status: int, body: dict[str, Any]) -> None:
            self.status_code, self.body, self.text = status, body, json.dumps(body)

        def json(self) -> dict[str, Any]:
            return self.body

    class Fake:
        url = "http://127.0.0.1:1"

        def ask(self, path: str, body: dict[str, Any] | None = None, timeout: float = 10) -> Answer:
            if path == "/api/ps":
                return Answer(200, {"models": [{"name": n} for n in ("gone", "broken", "a", "b")]})
            name = (body or {}).get("model")
            if name == "gone":
                return Answer(404, {"error": {"message": "model 'gone' is not served here (served: a, b)"}})
            if name == "broken":
                return Answer(500, {"error": {"message": "it broke"}})
            unloaded.append(str(name))
            return Answer(200, {"success": True})

    monkeypatch.setattr(stop, "server_of", lambda *args: Fake())
    r = cli_in_process("stop", "--all")
    assert unloaded == ["a", "b"], unloaded
    assert r.returncode == 1 and r.stdout == "", r
    assert r.stderr == "localgen: error: the server at http://127.0.0.1:1 did not unload broken: it answered 500: it " \
                       "broke\n", r.stderr


def test_stop_gives_up_on_a_server_that_never_finishes_its_answer(cli_in_process: Any,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that keeps sending a header line now and then, never a whole answer: stop gives up at its deadline
    for the model (UNLOAD_TIMEOUT_S, here 1 s) with one line naming the model and the server. httpx bounds each
    read only: it waited as long as the server kept trickling (for ever, for one that never stops)."""
    from localgen.cli.serve import stop

    monkeypatch.setattr(stop, "UNLOAD_TIMEOUT_S", 1)
    with trickling(headers=True) as port:
        r = cli_in_process("stop", "smollm2:135m", "--port", str(port))
    assert r.returncode == 1 and r.stdout == "", r
    assert f"the server at http://127.0.0.1:{port} did not unload smollm2:135m within 1 s" in _one_line(r.stderr)


def test_a_posted_question_is_given_up_on_at_its_timeout_in_all() -> None:
    """Server.ask bounds the whole answer to a POST, as it did a GET's (proxies.request): httpx bounds each read
    only, so a server trickling header lines held any client command's POST for ever (stop kept a thread of its own
    for it). Given up on, it is NoAnswer, one line naming the route."""
    import threading

    from localgen.cli.serve.ps import NoAnswer
    from localgen.cli.serve.ps import Server as Asked

    outcome: list[BaseException | object] = []
    with trickling(headers=True) as port:
        server = Asked(url=f"http://127.0.0.1:{port}", host="127.0.0.1", host_from="--host", key=None,
                       key_from="--api-key")

        def ask() -> None:
            try:
                outcome.append(server.ask("/models/unload", {"model": "m"}, timeout=1))
            except BaseException as e:
                outcome.append(e)

        worker = threading.Thread(target=ask, daemon=True)
        worker.start()
        worker.join(30)  # a safety net far past the timeout: the old code never came back
    assert outcome and isinstance(outcome[0], NoAnswer), outcome
    assert outcome[0].message == f"the server at http://127.0.0.1:{port} did not answer /models/unload within 1 s"
