"""The Batch and Files APIs of `localgen serve` (docs/batch.md), driven by the real `openai` client against
SmolLM2 135M: a batch's lines answered as the same bodies POSTed to the route, refused inputs (a 400 naming the
field, or the batch `failed` with OpenAI's errors.data), cancelling, a serve killed mid-batch and started again,
and batches held back while a request waits for a slot."""

from __future__ import annotations

import json
import signal
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.test_serve import Server

KEY = "sk-batch-test"
MODEL = "smollm2:135m"
# one slot and three batch requests at once: a batch request that is not in the slot waits, so the runner
# starts no other meanwhile (docs/batch.md)
ARGS = ("--api-key", KEY, "-np", "1", "--batch-lines", "3", "--ctx", "512", "--no-on-demand")


def _chat(i: int, model: str = MODEL) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": f"Count to {i}."}], "max_tokens": 4,
            "temperature": 0}


def _line(custom_id: str, body: dict[str, Any], url: str = "/v1/chat/completions") -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def _jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


@pytest.fixture(scope="module")
def env(cli_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A home of the module's own: its batches are these tests' alone."""
    return {**cli_env, "LOCALGEN_HOME": str(tmp_path_factory.mktemp("batch-home"))}


@pytest.fixture
def own_env(cli_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """A home of the test's own, for the servers it starts and stops (one server holds a home's batches)."""
    return {**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")}


@pytest.fixture(scope="module")
def server(env: dict[str, str]) -> Iterator[Server]:
    s = Server(env, *ARGS)
    yield s
    assert s.stop() == 0


def _client(server: Server) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)


def _finished(client: Any, batch_id: str, timeout: float = 600) -> Any:
    deadline = time.monotonic() + timeout  # a safety net for busy cores, not a timing
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "cancelled", "expired"):
            return batch
        time.sleep(0.1)
    raise AssertionError(f"{batch_id} did not end")


def _records(client: Any, file_id: str | None) -> list[dict[str, Any]]:
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()] if file_id else []


def _answer(body: dict[str, Any]) -> dict[str, Any]:
    """What two answers to the same body share: everything but ids, times and the timings."""
    return {k: v for k, v in body.items() if k not in ("id", "created", "created_at", "timings")}


def test_a_batch_answers_each_line_as_its_route_does(server: Server) -> None:
    """docs/batch.md: each line goes through the route it names, as the same body POSTed there: the same answer
    (temperature 0), the same error for a field out of range or a model not served (an error line, and the batch
    goes on), and the Batch object's counts and tokens; retrieve and list parse as the openai client's types."""
    from openai.types import Batch, FileObject

    client = _client(server)
    odd = {**_chat(4), "messages": [{"role": "user", "content": "\ud800"}]}  # a lone surrogate: the route's 400
    bodies = {"one": _chat(1), "two": _chat(2), "hot": {**_chat(3), "top_p": 2}, "odd\ud800": odd}
    hour = {"anchor": "created_at", "seconds": 3600}  # accepted, and ignored: nothing expires here
    upload = client.files.create(file=("chat.jsonl", _jsonl([_line(k, b) for k, b in bodies.items()])),
                                 purpose="batch", expires_after=hour)  # type: ignore[arg-type]
    assert upload.purpose == "batch" and upload.bytes > 100 and upload.filename == "chat.jsonl"
    assert upload.expires_at is None
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h",
                                  metadata={"job": "nightly"}, output_expires_after=hour)  # type: ignore[arg-type]
    assert batch.status == "in_progress" and batch.request_counts.total == 4 and batch.metadata == {"job": "nightly"}
    batch = _finished(client, batch.id)
    assert batch.status == "completed" and batch.model == MODEL
    assert (batch.request_counts.completed, batch.request_counts.failed) == (2, 2)
    assert batch.completed_at >= batch.finalizing_at >= batch.in_progress_at >= batch.created_at
    output, errors = _records(client, batch.output_file_id), _records(client, batch.error_file_id)
    assert sorted(r["custom_id"] for r in output) == ["one", "two"]
    assert sorted(r["custom_id"] for r in errors) == ["hot", "odd\ud800"]
    headers = {"Authorization": f"Bearer {KEY}"}
    for record in output + errors:
        direct = httpx.post(f"{server.url}/v1/chat/completions", content=json.dumps(bodies[record["custom_id"]]),
                            headers={**headers, "Content-Type": "application/json"}, timeout=300)
        response = record["response"]
        assert response["status_code"] == direct.status_code and record["error"] is None
        assert response["request_id"].startswith("req_") and record["id"].startswith("batch_req_")
        if direct.status_code == 200:
            assert _answer(response["body"]) == _answer(direct.json())
        else:
            assert direct.status_code == 400
            assert response["body"]["error"] == direct.json()["error"]
            assert response["body"]["error"]["code"] == 400  # the status, as every route's (docs/api.md)
    usage = batch.usage
    assert usage.input_tokens == sum(r["response"]["body"]["usage"]["prompt_tokens"] for r in output)
    made = sum(r["response"]["body"]["usage"]["completion_tokens"] for r in output)
    assert made > 0 and usage.output_tokens == made and usage.total_tokens == usage.input_tokens + made
    # the shapes, validated by the openai client's own types (the client itself builds them unchecked)
    raw = httpx.get(f"{server.url}/v1/batches/{batch.id}", headers=headers).json()
    assert Batch.model_validate(raw).request_counts == batch.request_counts
    page = httpx.get(f"{server.url}/v1/batches", params={"limit": 1}, headers=headers).json()
    assert [Batch.model_validate(d).id for d in page["data"]] == [batch.id] and page["first_id"] == batch.id
    listed = [FileObject.model_validate(d) for d in httpx.get(f"{server.url}/v1/files", headers=headers).json()["data"]]
    assert {f.id for f in listed} >= {upload.id, batch.output_file_id, batch.error_file_id}
    assert {f.purpose for f in listed if f.id != upload.id} == {"batch_output"}
    assert batch.id in [b.id for b in client.batches.list()]
    assert [f.id for f in client.files.list(purpose="batch")] == [upload.id]
    # a model not served: each line's answer is the route's 404, in the error file, and the batch completes
    lost = client.files.create(file=("lost.jsonl", _jsonl([_line("lost", _chat(3, model="no-such-model"))])),
                               purpose="batch")
    batch = _finished(client, client.batches.create(input_file_id=lost.id, endpoint="/v1/chat/completions",
                                                    completion_window="24h").id)
    assert batch.status == "completed" and batch.output_file_id is None
    [record] = _records(client, batch.error_file_id)
    assert record["response"]["status_code"] == 404 and record["response"]["body"]["error"]["param"] == "model"


def test_metrics_count_the_batches_by_status_and_their_requests(server: Server) -> None:
    """docs/batch.md: /metrics has the batches by status and their requests answered, by result, and those still
    to run: the same counts the Batch objects give."""
    from prometheus_client.parser import text_string_to_metric_families

    client = _client(server)
    upload = client.files.create(file=("m.jsonl", _jsonl([_line("a", _chat(1)), _line("b", _chat(2, "nope"))])),
                                 purpose="batch")
    _finished(client, client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                            completion_window="24h").id)
    listed = list(client.batches.list(limit=100))
    text = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    for status in ("completed", "in_progress", "cancelled", "failed"):
        assert samples[("localgen_batches", (("status", status),))] == sum(b.status == status for b in listed)
    for result in ("completed", "failed"):
        assert samples[("localgen_batch_requests_total", (("result", result),))] == sum(
            getattr(b.request_counts, result) for b in listed) >= 1
    running = [b for b in listed if b.status in ("validating", "in_progress", "finalizing", "cancelling")]
    assert samples[("localgen_batch_requests_pending", ())] == sum(
        b.request_counts.total - b.request_counts.completed - b.request_counts.failed for b in running)


@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/embeddings", "/v1/responses"])
def test_the_other_endpoints_answer_as_their_routes(server: Server, endpoint: str) -> None:
    """Text completions, embeddings and the Responses API in a batch: the same answer as the route's."""
    client = _client(server)
    bodies: dict[str, dict[str, Any]] = {
        "/v1/completions": {"model": MODEL, "prompt": "Once upon", "max_tokens": 4, "temperature": 0},
        "/v1/embeddings": {"model": MODEL, "input": ["a cat", "a dog"]},
        "/v1/responses": {"model": MODEL, "input": "Say hi.", "max_output_tokens": 4, "temperature": 0}}
    body = bodies[endpoint]
    upload = client.files.create(file=("in.jsonl", _jsonl([_line("x", body, endpoint)])), purpose="batch")
    batch = _finished(client, client.batches.create(input_file_id=upload.id, endpoint=endpoint,
                                                    completion_window="24h").id)
    assert (batch.status, batch.request_counts.completed) == ("completed", 1), batch
    [record] = _records(client, batch.output_file_id)
    direct = httpx.post(f"{server.url}{endpoint}", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=300)
    assert direct.status_code == 200 and record["response"]["status_code"] == 200
    got, want = _answer(record["response"]["body"]), _answer(direct.json())
    if endpoint == "/v1/responses":  # its output items carry ids of their own
        assert got["output"][0]["content"][0]["text"] == want["output"][0]["content"][0]["text"]
        # batch.md: a line is stored as the route stores a response (store defaults to true), in the same store
        kept = httpx.get(f"{server.url}/v1/responses/{record['response']['body']['id']}",
                         headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
        assert kept.status_code == 200 and kept.json()["id"] == record["response"]["body"]["id"], kept.text
        got, want = ({k: v for k, v in d.items() if k != "output"} for d in (got, want))
    assert got == want


def test_bad_input_is_refused_before_anything_runs(server: Server, env: dict[str, str]) -> None:
    """docs/batch.md, Refused input: a 400 naming the field for the request itself; a file whose lines are not
    right makes the batch `failed` with every fault's code, line and param, and nothing runs (lines that name
    another model than the first's among them: OpenAI's rule, one model a batch)."""
    import openai

    client = _client(server)
    with pytest.raises(openai.BadRequestError) as e:
        client.files.create(file=("in.jsonl", b"{}\n"), purpose="fine-tune")
    assert dict(e.value.body)["param"] == "purpose"  # type: ignore[call-overload]
    bare = httpx.post(f"{server.url}/v1/files", files={"file": ("in.jsonl", b"{}\n")},
                      headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert bare.status_code == 400 and "the form has no `purpose`" in bare.json()["error"]["message"], bare.text
    good = client.files.create(file=("in.jsonl", _jsonl([_line("a", _chat(1))])), purpose="batch")
    cases: list[tuple[dict[str, Any], str]] = [(dict(input_file_id="file-0123456789abcdef01234567"), "input_file_id"),
                                                (dict(endpoint="/v1/moderations"), "endpoint"),
                                                (dict(completion_window="1h"), "completion_window"),
                                                (dict(metadata={"k": 1}), "metadata")]
    for given, param in cases:
        with pytest.raises(openai.BadRequestError) as e:
            client.batches.create(**{"input_file_id": good.id, "endpoint": "/v1/chat/completions",
                                     "completion_window": "24h", **given})
        assert dict(e.value.body)["param"] == param, given  # type: ignore[call-overload]
    for given, said in ((None, "input_file_id is required"), (123, "input_file_id must be a string (got 123)")):
        r = httpx.post(f"{server.url}/v1/batches", headers={"Authorization": f"Bearer {KEY}"}, timeout=60,
                       json={"input_file_id": given, "endpoint": "/v1/chat/completions", "completion_window": "24h"})
        assert r.status_code == 400 and r.json()["error"]["message"].startswith(said), r.text  # (123: "required")
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve("file-0123456789abcdef01234567")
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_nope")
    lines: list[Any] = [_line("a", _chat(1)), "not json", _line("b", _chat(1), url="/v1/completions"),
                        _line("a", _chat(1)),
                        {"custom_id": "c", "method": "POST", "url": "/v1/chat/completions"},
                        _line("d", {**_chat(1), "stream": True}), {**_line("e", _chat(1)), "method": "GET"},
                        _line("b", _chat(1)),  # taken by a line refused above: still taken
                        _line("f", _chat(1, model="gemma3:270m")), _line("g", {"prompt": "no model"})]
    data = b"".join((json.dumps(x) if isinstance(x, dict) else x).encode() + b"\n\n" for x in lines)  # blanks skipped
    upload = client.files.create(file=("bad.jsonl", data), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.status == "failed" and batch.failed_at and batch.output_file_id is None
    assert [(x.code, x.line, x.param) for x in batch.errors.data] == [
        ("invalid_json_line", 3, None), ("url_mismatch", 5, "url"), ("duplicate_custom_id", 7, "custom_id"),
        ("missing_required_parameter", 9, "body"), ("invalid_request", 11, "body.stream"),
        ("invalid_request", 13, "method"), ("duplicate_custom_id", 15, "custom_id"),
        ("mismatched_model", 17, "body.model"), ("mismatched_model", 19, "body.model")]
    assert batch.errors.data[-2].message == ("The provided model 'gemma3:270m' does not match the model for the rest "
                                             f"of the batch ('{MODEL}'): all requests in a batch must use the same "
                                             "model.")
    empty = client.files.create(file=("empty.jsonl", b"\n"), purpose="batch")
    failed = client.batches.create(input_file_id=empty.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert [x.code for x in failed.errors.data] == ["empty_file"]
    (Path(env["LOCALGEN_HOME"]) / "data" / "batches" / "files" / f"{empty.id}.jsonl").unlink()  # gone by hand
    gone = httpx.get(f"{server.url}/v1/files/{empty.id}/content", headers={"Authorization": f"Bearer {KEY}"})
    assert gone.status_code == 404 and "gone from the data dir" in gone.json()["error"]["message"], gone.text
    # without the key, nothing of it answers
    for method, path in (("GET", "/v1/files"), ("POST", "/v1/files"), ("GET", f"/v1/files/{good.id}/content"),
                         ("GET", "/v1/batches"), ("POST", f"/v1/batches/{batch.id}/cancel")):
        assert httpx.request(method, f"{server.url}{path}").status_code == 401, path
    r = httpx.post(f"{server.url}/v1/files", json={"purpose": "batch"}, headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 415 and r.json()["error"]["param"] == "file"


def _form(*parts: tuple[bytes, bytes]) -> bytes:
    """A multipart body (boundary x) of these (headers, content) parts."""
    return b"".join(b"--x\r\n" + head + b"\r\n\r\n" + data + b"\r\n" for head, data in parts) + b"--x--\r\n"


def _file_part(filename: bytes) -> tuple[bytes, bytes]:
    return b'Content-Disposition: form-data; name="file"; filename="' + filename + b'"', b"{}\n"


PURPOSE = (b'Content-Disposition: form-data; name="purpose"', b"batch")


@pytest.mark.parametrize(("parts", "says"), [
    ((_file_part(b"a" * 5000), PURPOSE), "the file name is too long: its part's Content-Disposition header is over "
                                         "4,224 bytes, and a file name may have at most 255 characters"),
    ((_file_part(b"a" * 300), PURPOSE), "the file name is too long: 300 characters, over the 255 a file name may "
                                        "have"),
    ((_file_part(b"../../etc/passwd"), PURPOSE), "the file name '../../etc/passwd' has a path in it (/ or \\): send "
                                                 "the file's name alone"),
    ((_file_part(b"dir\\in.jsonl"), PURPOSE), "has a path in it"),  # (C:\\in.jsonl is IE's: its name taken)
    ((_file_part(b"in\x00.jsonl"), PURPOSE), "the file name 'in\\x00.jsonl' has a control character in it"),
    ((_file_part(b"a.jsonl"), _file_part(b"b.jsonl"), PURPOSE), "the form has more than one file: send one, as the "
                                                                 "field `file`"),
    ((_file_part(b"a.jsonl"), (b'Content-Disposition: form-data; filename="b"', b"")),
     "a part has no name (its header must say Content-Disposition: form-data; name=\"file\")"),
    (((b'Content-Disposition: form-data; name="file"; filename="a"\r\nX-Big: ' + b"y" * 100_000, b"{}"), PURPOSE),
     "a part's header (X-Big) is over 4,224 bytes, the most one may have"),
    (((b'Content-Disposition: form-data; name="file"; filename="a"' + b"\r\nX-A: 1" * 9, b"{}"), PURPOSE),
     "a part has more than 8 headers, the most one may have"),
    (((b'Content-Disposition: form-data; name="file"\r\nBad Header: 1', b"{}"), PURPOSE),
     "the upload is not a valid multipart form: Found invalid character"),
])
def test_a_bad_part_of_an_upload_says_what_is_wrong(server: Server, parts: tuple[tuple[bytes, bytes], ...],
                                                    says: str) -> None:
    """docs/batch.md "Refused input": each bad part of an upload's form is a 400 naming `file` that says what is
    wrong with it (a 5,000-character file name, a path, a NUL, two files, a part with no name, a part's header
    over the bound), not "invalid multipart data"; nothing is kept."""
    before = len(_client(server).files.list().data)
    r = httpx.post(f"{server.url}/v1/files", content=_form(*parts), timeout=60,
                   headers={"Content-Type": "multipart/form-data; boundary=x", "Authorization": f"Bearer {KEY}"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert says in error["message"] and error["param"] == "file", error
    assert "Invalid multipart data" not in error["message"]
    assert len(_client(server).files.list().data) == before


def test_an_upload_named_with_a_windows_path_keeps_its_last_part(server: Server) -> None:
    """docs/batch.md "Refused input": the whole Windows path old browsers send as a file's name is taken as its
    last part (python-multipart's rule), not refused as a path."""
    r = httpx.post(f"{server.url}/v1/files", content=_form(_file_part(b"C:\\Users\\me\\in.jsonl"), PURPOSE),
                   headers={"Content-Type": "multipart/form-data; boundary=x", "Authorization": f"Bearer {KEY}"},
                   timeout=60)
    assert r.status_code == 200 and r.json()["filename"] == "in.jsonl", r.text


def test_an_upload_over_the_bound_is_refused_before_it_is_read(server: Server) -> None:
    """A declared length over 200 MB is a 413 at once: the server answers before a byte of the body came."""
    head = (f"POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
            "Content-Type: multipart/form-data; boundary=x\r\nContent-Length: 300000000\r\n\r\n")
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as s:
        s.sendall(head.encode())
        answer = b""
        while b"}" not in answer.partition(b"\r\n\r\n")[2]:  # the headers, then the JSON body
            chunk = s.recv(65536)
            assert chunk, answer
            answer += chunk
    answer = answer.decode()
    assert answer.startswith("HTTP/1.1 413"), answer[:200]
    assert '"param":"file"' in answer and "209,715,200 bytes" in answer


def test_an_upload_sent_in_chunks_stops_at_the_bound(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """With no length declared, the bytes are counted as they come, and the upload ends at the bound (in process,
    with a bound of 1 KiB): nothing is kept."""
    from localgen.serve import files
    from localgen.serve.app import build
    from localgen.serve.state import ServeState

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path))
    monkeypatch.setattr(files, "MAX_BYTES", 1024)
    monkeypatch.setattr(files, "FORM_SLACK", 512)
    app = build(ServeState(workers={}), webui=False)

    async def body() -> AsyncIterator[bytes]:
        yield b'--x\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        yield b'--x\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n\r\n'
        for _ in range(64):
            yield b"{}\n" * 16

    async def post() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost") as c:
            return await c.post("/v1/files", content=body(),
                                headers={"Content-Type": "multipart/form-data; boundary=x"})

    import asyncio

    r = asyncio.run(post())
    assert r.status_code == 413 and r.json()["error"]["param"] == "file"
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "lock"]


def test_a_file_over_the_line_bound_fails_with_too_many_tasks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """More requests than MAX_LINES (OpenAI's 50,000; 3 here) is one fault, too_many_tasks, on the first line past
    it, and reading stops there."""
    from localgen.serve import batchinput

    assert batchinput.MAX_LINES == 50_000
    monkeypatch.setattr(batchinput, "MAX_LINES", 3)
    path = tmp_path / "in.jsonl"
    path.write_bytes(_jsonl([_line(f"m{i}", _chat(i)) for i in range(3)]) + b"\n" + _jsonl([_line("m9", _chat(9))])
                     + b"not json\n")
    total, model, errors = batchinput.validate(path, "/v1/chat/completions")
    assert (total, model) == (3, MODEL)
    assert [(e["code"], e["line"]) for e in errors] == [("too_many_tasks", 5)]
    path.write_bytes(_jsonl([_line(f"m{i}", _chat(i)) for i in range(3)]))
    assert batchinput.validate(path, "/v1/chat/completions") == (3, MODEL, [])


def test_cancel_ends_after_the_lines_in_flight(server: Server) -> None:
    """Cancelling: `cancelling`, then `cancelled` once the requests in flight end; what was answered is in the
    output file, each once; the input cannot be deleted while the batch reads it, and can be after."""
    import openai

    client = _client(server)
    upload = client.files.create(file=("many.jsonl", _jsonl([_line(f"n{i}", _chat(i)) for i in range(24)])),
                                 purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.ConflictError):
        client.files.delete(upload.id)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    batch = _finished(client, batch.id)
    assert batch.status == "cancelled" and batch.cancelled_at and batch.completed_at is None
    done = [r["custom_id"] for r in _records(client, batch.output_file_id)]
    assert batch.request_counts.completed == len(done) < 24 and len(set(done)) == len(done)
    assert client.batches.cancel(batch.id).status == "cancelled"  # again: as it is
    assert client.files.delete(upload.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.content(upload.id)


def test_batch_requests_wait_behind_a_waiting_request(server: Server) -> None:
    """docs/batch.md: a batch request starts only while no request waits for a slot; with one slot and
    --batch-lines 3, /health never shows more than one request queued while a batch runs alone, and a client's
    request sent meanwhile is answered before the batch's end."""
    client = _client(server)
    upload = client.files.create(file=("q.jsonl", _jsonl([_line(f"q{i}", _chat(i)) for i in range(8)])),
                                 purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    queued: list[int] = []
    while client.batches.retrieve(batch.id).request_counts.completed < 2:
        queued.append(server.health()["queued"])
    answer = client.chat.completions.create(**_chat(99))
    after = client.batches.retrieve(batch.id)
    batch = _finished(client, batch.id)
    assert answer.choices[0].message.content and after.status == "in_progress"
    assert after.request_counts.completed < 8
    assert max(queued) <= 1 and batch.request_counts.completed == 8


def test_the_pages_python_example_runs(server: Server, cli_env: dict[str, str]) -> None:
    """docs/batch.md's example runs as written against a real serve (its address and key made the test
    server's) and prints the batch's end and each answer."""
    import re
    import subprocess
    import sys

    from tests.conftest import ROOT

    [code] = re.findall(r"^```python\n(.*?)^```$", (ROOT / "docs" / "batch.md").read_text(), re.S | re.M)
    code = code.replace("127.0.0.1:11435", server.url.removeprefix("http://")).replace('api_key="none"',
                                                                                      f'api_key="{KEY}"')
    r = subprocess.run([sys.executable, "-c", code], env=cli_env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert lines[0].startswith("completed BatchRequestCounts(completed=2, failed=0, total=2)")
    assert sorted(line.split()[0] for line in lines[1:]) == ["q0", "q1"]
    # a model not served (a typo, a catalogue model not pulled): the lines' errors, read from the error file (the
    # example read only the output file, which such a batch has none of: the openai client's ValueError)
    r = subprocess.run([sys.executable, "-c", code.replace('"smollm2:135m"', '"llama3.1:8b"')], env=cli_env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert lines[0].startswith("completed BatchRequestCounts(completed=0, failed=2, total=2)"), r.stdout
    assert sorted(line.split()[0] for line in lines[1:]) == ["q0", "q1"], r.stdout
    assert all("failed: model 'llama3.1:8b' is not served here" in line for line in lines[1:]), r.stdout


def test_a_killed_serve_finishes_the_batch_after_a_restart(own_env: dict[str, str]) -> None:
    """A serve killed (SIGKILL) mid-batch, its last record cut short as a crash may leave it, and started again
    on the same data: the batch goes on from the requests not answered, and its output has every custom_id once,
    those answered before the kill as they were."""
    env = own_env
    first = Server(env, *ARGS)
    try:
        client = _client(first)
        upload = client.files.create(file=("kill.jsonl", _jsonl([_line(f"k{i}", _chat(i)) for i in range(6)])),
                                     purpose="batch")
        batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                      completion_window="24h")
        while client.batches.retrieve(batch.id).request_counts.completed < 2:
            time.sleep(0.05)
    finally:
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(timeout=60)
    output = Path(env["LOCALGEN_HOME"]) / "data" / "batches" / "runs" / batch.id / "output.jsonl"
    before = [json.loads(line) for line in output.read_text().splitlines()]
    assert 2 <= len(before) < 6
    with open(output, "a") as f:
        f.write('{"id": "batch_req_torn", "custom_id": "k')  # a record the kill cut short
    again = Server(env, *ARGS)
    try:
        client = _client(again)
        batch = _finished(client, batch.id)
        assert batch.status == "completed" and batch.request_counts.completed == 6
        records = _records(client, batch.output_file_id)
        assert sorted(r["custom_id"] for r in records) == sorted(f"k{i}" for i in range(6))
        assert records[:len(before)] == before
    finally:
        assert again.stop() == 0


def test_a_serve_stopped_mid_batch_goes_on_at_its_next_start(own_env: dict[str, str]) -> None:
    """SIGTERM mid-batch: serve exits 0 at once (the requests in flight are not recorded), and the next start
    finishes the batch, each custom_id once."""
    env = own_env
    first = Server(env, *ARGS)
    client = _client(first)
    upload = client.files.create(file=("term.jsonl", _jsonl([_line(f"t{i}", _chat(i)) for i in range(6)])),
                                 purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    while client.batches.retrieve(batch.id).request_counts.completed < 1:
        time.sleep(0.05)
    assert first.stop() == 0
    assert "Traceback" not in first.proc.stderr.read().decode()
    again = Server(env, *ARGS)
    try:
        batch = _finished(_client(again), batch.id)
        records = _records(_client(again), batch.output_file_id)
        assert batch.status == "completed" and sorted(r["custom_id"] for r in records) == [f"t{i}" for i in range(6)]
        assert batch.request_counts.failed == 0
    finally:
        assert again.stop() == 0


def test_a_second_serve_on_the_same_data_leaves_the_batches_to_the_first_and_goes_on_with_them(
        own_env: dict[str, str]) -> None:
    """One server runs a data dir's batches: a second one on the same folder answers 503 saying so. Once the first
    has stopped mid-batch, the second's first request takes the batches, and the unfinished one goes on at once
    (it waited for a batch created or cancelled), each custom_id answered once."""
    import openai

    first, second = Server(own_env, *ARGS), Server(own_env, *ARGS)
    try:
        client = _client(first)
        client.batches.list()
        with pytest.raises(openai.InternalServerError) as e:
            _client(second).batches.list()
        assert e.value.status_code == 503 and "another localgen serve" in e.value.message
        upload = client.files.create(file=("two.jsonl", _jsonl([_line(f"s{i}", _chat(i)) for i in range(6)])),
                                     purpose="batch")
        batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                      completion_window="24h")
        while client.batches.retrieve(batch.id).request_counts.completed < 1:
            time.sleep(0.05)
        assert first.stop() == 0
        batch = _finished(_client(second), batch.id)
        records = _records(_client(second), batch.output_file_id)
        assert batch.status == "completed" and sorted(r["custom_id"] for r in records) == [f"s{i}" for i in range(6)]
    finally:
        assert first.stop() == 0 and second.stop() == 0


def test_a_hostile_query_or_a_bare_cancel_gets_a_plain_answer(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A `limit` of a digit int() refuses ("²") is a 400 naming limit, not a 500; `curl -X POST .../cancel` (no
    body, no Content-Type: the route reads none) reaches the route instead of a 415 about JSON."""
    from starlette.testclient import TestClient

    from localgen.serve.app import build
    from localgen.serve.guard import Policy
    from localgen.serve.state import ServeState

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path))
    client = TestClient(build(ServeState(workers={}), Policy(check_host=False), webui=False))
    for path in ("/v1/batches", "/v1/files"):
        r = client.get(path, params={"limit": "\u00b2"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "limit", r.text
    assert client.head("/v1/files").status_code == 200  # HEAD wherever GET is taken, as Starlette's routes do
    r = client.post("/v1/batches/batch_nope/cancel")
    assert r.status_code == 404 and r.json()["error"]["param"] == "batch_id", r.text
    r = client.post("/v1/batches", content=b"{}")  # a route that reads a body still wants JSON's type
    assert r.status_code == 415, r.text
    form = (b'--x\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--x\r\n'
            b'Content-Disposition: form-data; name="file"\r\n\r\n{}\n\r\n--x--\r\n')  # curl -F 'file=<in.jsonl'
    r = client.post("/v1/files", content=form, headers={"Content-Type": "multipart/form-data; boundary=x"})
    assert r.status_code == 400 and "curl -F file=@" in r.json()["error"]["message"], r.text


def test_a_line_longer_than_a_request_may_be_is_refused_unread(tmp_path: Path) -> None:
    """docs/batch.md: a line over the server's --max-body is `invalid_request` on its line (it could only be a 413),
    found without holding it whole; the lines after it are still read, numbered as they are."""
    from localgen.serve import batchinput

    path = tmp_path / "in.jsonl"
    long = json.dumps(_line("long", {**_chat(1), "messages": [{"role": "user", "content": "a " * 5000}]}))
    path.write_bytes(_jsonl([_line("a", _chat(1))]) + long.encode() + b"\r\n" + _jsonl([_line("b", _chat(2))]) + b"{")
    assert [(n, raw is None) for n, raw in batchinput.read_lines(path, 4096)] == [(1, False), (2, True), (3, False),
                                                                                (4, False)]
    total, _, errors = batchinput.validate(path, "/v1/chat/completions", 4096)
    assert total == 4
    assert [(e["code"], e["line"], e["param"]) for e in errors] == [("invalid_request", 2, "body"),
                                                                   ("invalid_json_line", 4, None)]
    assert "--max-body" in errors[0]["message"]
    assert batchinput.validate(path, "/v1/chat/completions", 1 << 20)[2] == [errors[1]]


def test_a_first_read_that_fails_lets_the_lock_go_and_the_next_request_reads_every_batch(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The first request that takes the batches fails while sweeping the files (an OSError): the server lets the
    data folder's lock go and keeps nothing, so the next request reads every batch; it held the lock and an empty
    list for good before (the batches made by an earlier start never listed, never run)."""
    import io

    from localgen.serve import batches

    first = batches.Desk(tmp_path)
    first.owner()
    upload = first.files.add(io.BytesIO(_jsonl([_line("f0", _chat(0))])), "in.jsonl", "batch")
    doc = first.create(upload["id"], "/v1/chat/completions", "24h", None)
    first.release()
    again = batches.Desk(tmp_path)
    sweep, calls = again.files.sweep, []

    def fails_once() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise PermissionError(13, "Permission denied")
        sweep()

    monkeypatch.setattr(again.files, "sweep", fails_once)
    with pytest.raises(PermissionError):
        again.owner()
    assert again.batches is None
    other = batches.Desk(tmp_path)  # the lock was let go: another server could take the batches now
    other.owner()
    other.release()
    again.owner()
    assert again.batches is not None and list(again.batches) == [doc["id"]]
    again.release()


def test_a_crash_while_finalizing_keeps_every_answer(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A serve that dies in `finalizing`, after its results became files but before the batch's object said so:
    the next start ends the batch with its output file and its counts, every answer in it."""
    import io

    from localgen.serve import batches

    first = batches.Desk(tmp_path)
    first.owner()
    upload = first.files.add(io.BytesIO(_jsonl([_line(f"f{i}", _chat(i)) for i in range(2)])), "in.jsonl", "batch")
    doc = first.create(upload["id"], "/v1/chat/completions", "24h", None)
    first.validate(doc)
    progress = first.progress[doc["id"]]
    for i in range(2):
        record = {"id": f"batch_req_{i}", "custom_id": f"f{i}", "error": None,
                  "response": {"status_code": 200, "request_id": "req_x", "body": {"usage": {"prompt_tokens": 3,
                                                                                             "completion_tokens": 4}}}}
        progress.write(record, True)
        progress.count(record, True)
    save = first.save

    def dies(d: dict[str, Any], **changes: Any) -> None:
        if changes.get("status", d["status"]) == "completed":
            raise RuntimeError("killed")
        save(d, **changes)

    monkeypatch.setattr(first, "save", dies)
    with pytest.raises(RuntimeError):
        first.finish(doc)
    first.release()
    again = batches.Desk(tmp_path)
    again.owner()
    assert again.batches is not None
    doc = again.batches[doc["id"]]
    assert doc["status"] == "finalizing"
    again.finish(doc)
    assert doc["status"] == "completed" and doc["request_counts"]["completed"] == 2 and doc["output_file_id"]
    assert doc["usage"]["output_tokens"] == 8
    kept = again.files.content(doc["output_file_id"]).read_text().splitlines()
    assert sorted(json.loads(line)["custom_id"] for line in kept) == ["f0", "f1"]
    assert json.loads((tmp_path / "runs" / doc["id"] / "batch.json").read_bytes())["output_file_id"] == doc[
        "output_file_id"]


def test_a_full_disk_is_a_507_and_a_pause_never_a_lost_answer(own_env: dict[str, str]) -> None:
    """The batches' folder on a small disk (tmpfs, in a mount namespace of the server's own), filled through the
    API: an upload or a batch that cannot be written is a 507 that says so; a running batch waits instead of its
    runner dying, and once space is freed it ends with every custom_id answered once; no traceback."""
    import shutil
    import subprocess
    import sys

    if shutil.which("unshare") is None or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode:
        pytest.skip("mounting needs unshare and the right to use it (root)")
    folder = Path(own_env["LOCALGEN_HOME"]) / "data" / "batches"
    folder.mkdir(parents=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = folder.parent / "serve.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            ["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=256k tmpfs "$B" && exec "$PY" -m localgen serve "$@"',
             "sh", "--port", str(port), *ARGS[2:]], env={**own_env, "B": str(folder), "PY": sys.executable},
            stderr=err, stdout=subprocess.DEVNULL)
    url, headers = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {KEY}"}
    try:
        deadline = time.monotonic() + 600  # a safety net for busy cores, not a timing
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)

        def upload(data: bytes) -> httpx.Response:
            return httpx.post(f"{url}/v1/files", files={"file": ("in.jsonl", data)}, data={"purpose": "batch"},
                              headers=headers, timeout=60)

        def create(file_id: str) -> httpx.Response:
            return httpx.post(f"{url}/v1/batches", headers=headers, timeout=60, json={
                "input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"})

        given = upload(_jsonl([_line(f"d{i}", _chat(i)) for i in range(3)])).json()["id"]
        fillers: list[tuple[str, int]] = []

        def fill(size: int) -> httpx.Response:
            while (r := upload(b"\n" * size)).status_code == 200:
                fillers.append((r.json()["id"], size))
            return r

        r = fill(32768)
        assert r.status_code == 507 and "cannot be written" in r.json()["error"]["message"], r.text
        if fill(4096) and fillers[-1][1] != 4096:  # room for none: a larger one made room
            httpx.delete(f"{url}/v1/files/{fillers.pop()[0]}", headers=headers)
            fill(4096)
        assert create(given).status_code == 507  # no room for the batch's object
        httpx.delete(f"{url}/v1/files/{fillers.pop()[0]}", headers=headers)  # room for it, not for its answers
        batch = create(given).json()["id"]
        while b"the Batch API waits" not in log.read_bytes():
            assert time.monotonic() < deadline - 300 and proc.poll() is None, log.read_text()[-2000:]
            time.sleep(0.1)
        for ident, _ in fillers:
            assert httpx.delete(f"{url}/v1/files/{ident}", headers=headers).status_code == 200
        assert create(given).status_code == 200  # space again: a new batch, which wakes the runner
        while (doc := httpx.get(f"{url}/v1/batches/{batch}", headers=headers).json())["status"] != "completed":
            assert time.monotonic() < deadline and doc["status"] in ("in_progress", "finalizing"), doc
            time.sleep(0.2)
        output = httpx.get(f"{url}/v1/files/{doc['output_file_id']}/content", headers=headers).text.splitlines()
        assert sorted(json.loads(line)["custom_id"] for line in output) == ["d0", "d1", "d2"]
        assert doc["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=300)
    assert "Traceback" not in log.read_text()


def test_a_line_for_a_model_not_loaded_waits_until_no_request_is_in_flight(tmp_path: Path) -> None:
    """docs/batch.md: a batch's line whose model is not loaded (its load may evict another) starts only once no
    model holds a request; a line for the loaded model runs beside a client's request as before. Driven through
    the runner with stand-in workers and app (a client streams to model a; a batch names a, the next b)."""
    import asyncio
    import io
    import time
    from types import SimpleNamespace

    from localgen.serve import batches
    from localgen.serve.batchrun import Runner

    desk = batches.Desk(tmp_path)
    desk.owner()
    docs = []
    for model in ("a", "b"):  # a batch names one model
        upload = desk.files.add(io.BytesIO(_jsonl([_line(f"on-{model}", _chat(1, model))])), "in.jsonl", "batch")
        docs.append(desk.create(upload["id"], "/v1/chat/completions", "24h", None))
        desk.validate(docs[-1])
    workers = {"a": SimpleNamespace(loaded=True, outstanding=1, running=1),  # a client's answer streams
               "b": SimpleNamespace(loaded=False, outstanding=0, running=0)}
    sent: dict[str, float] = {}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:  # each request reaches its worker
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        model = json.loads(body)["model"]
        sent[model] = time.monotonic()
        w = workers[model]
        w.outstanding += 1
        w.running += 1
        await asyncio.sleep(0.05)
        w.loaded = True
        w.outstanding -= 1
        w.running -= 1
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b"{}"})

    state = SimpleNamespace(workers=workers, on_demand=None, upstreams=None, meant=lambda name: name or "a",
                            local=lambda name: None)  # "a": the default; no model's keep-alive holds b back
    runner = Runner(desk, state, app, None, lambda: False, 2, print)  # type: ignore[arg-type]

    async def client_ends() -> float:
        await asyncio.sleep(0.5)
        workers["a"].outstanding = workers["a"].running = 0
        return time.monotonic()

    async def both() -> float:
        ended = asyncio.create_task(client_ends())
        for doc in docs:
            await runner.lines(doc, desk.progress[doc["id"]])
        return await ended

    ended = asyncio.run(both())
    assert sent["a"] < ended <= sent["b"], (sent, ended)
    desk.release()


def test_files_and_batches_of_the_same_second_list_in_the_order_made(tmp_path: Path) -> None:
    """docs/batch.md: both lists are newest first, also for files and batches made within one second (a script's
    burst of uploads), and still so after a restart; a batch's results list after its input."""
    import io

    from localgen.serve import batches, files

    desk = batches.Desk(tmp_path, clock=lambda: 1_800_000_000.0)  # one second for all
    desk.owner()
    uploaded = [desk.files.add(io.BytesIO(_jsonl([_line("a", _chat(1))])), f"{i}.jsonl", "batch")["id"]
                for i in range(8)]
    docs = [desk.create(ident, "/v1/chat/completions", "24h", None) for ident in uploaded]
    doc = docs[0]
    desk.validate(doc)
    desk.progress[doc["id"]].write({"id": "batch_req_0", "custom_id": "a", "response": {"status_code": 200}}, True)
    desk.progress[doc["id"]].count({"custom_id": "a"}, True)
    desk.finish(doc)
    assert [d["id"] for d in desk.files.listed()] == [*uploaded, doc["output_file_id"]]
    assert files.page(list(reversed(desk.files.listed())), uploaded[5], 2)["data"][1]["id"] == uploaded[3]
    desk.release()
    again = batches.Desk(tmp_path, clock=lambda: 1_800_000_000.0)
    again.owner()
    assert list(again.batches or {}) == [d["id"] for d in docs]
    again.release()


def test_a_batch_whose_input_is_gone_fails_and_the_next_runs(tmp_path: Path) -> None:
    """A running batch whose input file was removed (by hand, to free a full disk; or a DELETE that raced its
    creation) ends `failed` with `file_not_found`, keeping what it answered, and the batches after it still run:
    the runner does not stop for good (it did, at every start)."""
    import asyncio
    import io
    from types import SimpleNamespace

    from localgen.serve import batches
    from localgen.serve.batchrun import Runner

    desk = batches.Desk(tmp_path)
    desk.owner()
    assert desk.batches is not None
    docs = []
    for i in range(2):
        upload = desk.files.add(io.BytesIO(_jsonl([_line("a", _chat(1)), _line("b", _chat(2))])), "in.jsonl", "batch")
        doc = desk.batches[f"b{i}"] = desk.create(upload["id"], "/v1/chat/completions", "24h", None)
        desk.validate(doc)
        for custom_id in ("a", "b"):  # answered already: the runner need send nothing
            record = {"id": "batch_req_0", "custom_id": custom_id, "error": None, "response": {"status_code": 200}}
            desk.progress[doc["id"]].write(record, True)
            desk.progress[doc["id"]].count(record, True)
            if i == 0:
                break
        docs.append(doc)
    desk.files.content(docs[0]["input_file_id"]).unlink()
    logged: list[str] = []
    state = SimpleNamespace(workers={}, on_demand=None, upstreams=None, meant=lambda name: name,
                            local=lambda name: None)
    ended = lambda: all(d["status"] not in batches.RUNNING for d in docs)  # noqa: E731
    runner = Runner(desk, state, None, None, ended, 2, logged.append)  # type: ignore[arg-type]
    asyncio.run(asyncio.wait_for(runner.serve(), 60))
    assert not logged, logged
    assert docs[0]["status"] == "failed" and docs[0]["failed_at"] and docs[0]["output_file_id"]
    assert [e["code"] for e in docs[0]["errors"]["data"]] == ["file_not_found"]
    assert docs[0]["request_counts"] == {"total": 2, "completed": 1, "failed": 0}
    assert docs[1]["status"] == "completed" and docs[1]["request_counts"]["completed"] == 2
    desk.release()


def test_a_batch_does_not_swap_out_the_model_a_client_keeps_using(own_env: dict[str, str]) -> None:
    """docs/batch.md: under --max-models 1, a batch for gemma3 while a client keeps asking the loaded smollm2: the
    batch waits (said once in the log) while smollm2 is within its keep-alive of the client's last request, so the
    client never waits for a swap; once smollm2 unloads (here the client asks it to, with Ollama's keep_alive 0),
    gemma3 loads and the batch runs. It swapped models back and forth before, a client's every request waiting for
    an unload and a load."""
    s = Server(own_env, "--api-key", KEY, "-np", "1", "--ctx", "512", "--max-models", "1")  # keep-alive: 5 minutes
    headers = {"Authorization": f"Bearer {KEY}"}

    def ask(i: int) -> None:
        r = httpx.post(f"{s.url}/v1/chat/completions", headers=headers, timeout=120, json={**_chat(i), "model": MODEL})
        assert r.status_code == 200, r.text

    try:
        ask(0)  # the client's first request: its model is one a client uses from now on
        upload = httpx.post(f"{s.url}/v1/files", headers=headers, timeout=60, data={"purpose": "batch"},
                            files={"file": ("in.jsonl", _jsonl([_line(f"g{i}", {  # a base model: a plain prompt
                                "model": "gemma3:270m", "prompt": f"Count to {i}:", "max_tokens": 4}, "/v1/completions")
                                for i in range(2)]))}).json()
        batch = httpx.post(f"{s.url}/v1/batches", headers=headers, timeout=60, json={
            "input_file_id": upload["id"], "endpoint": "/v1/completions", "completion_window": "24h"}).json()
        for i in range(1, 8):  # the client's next requests, a moment apart: each finds its model loaded
            time.sleep(0.5)
            ask(i)
        residency = httpx.get(f"{s.url}/health", timeout=30).json()["residency"]
        assert residency["loaded"] == [MODEL] and residency["evictions"] == 0, residency
        assert httpx.get(f"{s.url}/v1/batches/{batch['id']}", headers=headers).json()["request_counts"][
            "completed"] == 0
        gone = httpx.post(f"{s.url}/api/generate", headers=headers, timeout=120, json={"model": MODEL, "keep_alive": 0})
        assert gone.status_code == 200 and gone.json()["done_reason"] == "unload", gone.text
        deadline = time.monotonic() + 600  # a safety net for busy cores, not a timing
        while (doc := httpx.get(f"{s.url}/v1/batches/{batch['id']}", headers=headers).json())["status"] != \
                "completed":
            assert time.monotonic() < deadline and doc["status"] in ("in_progress", "finalizing"), doc
            time.sleep(0.2)
        errors = httpx.get(f"{s.url}/v1/files/{doc['error_file_id']}/content", headers=headers).text \
            if doc.get("error_file_id") else ""
        assert doc["request_counts"] == {"total": 2, "completed": 2, "failed": 0}, errors
        residency = httpx.get(f"{s.url}/health", timeout=30).json()["residency"]
        assert residency["evictions"] == 0 and residency["unloads"] >= 1, residency  # smollm2 left as asked
        said = [line for line in s.log().splitlines() if "waits to load" in line]
        assert said == [f"localgen serve: {batch['id']} waits to load gemma3:270m: that would unload {MODEL}, "
                        "which a client used within its keep-alive"], said
    finally:
        assert s.stop() == 0


def test_a_restart_reads_a_large_results_file_a_line_at_a_time(tmp_path: Path) -> None:
    """docs/batch.md's restart: the answers on disk are counted again (a torn last line dropped) without holding
    the results file whole: an embeddings batch's output runs to gigabytes. Here 24 MB of answers are read back
    within a fraction of their size."""
    import tracemalloc

    from localgen.serve import batches

    vector = [0.123456789] * 3000
    record = {"id": "batch_req_0", "error": None, "response": {"status_code": 200, "request_id": "req_0",
              "body": {"object": "list", "data": [{"embedding": vector}], "usage": {"prompt_tokens": 5}}}}
    with open(tmp_path / "output.jsonl", "w") as f:
        for i in range(600):
            f.write(json.dumps({**record, "custom_id": f"e{i}"}) + "\n")
        f.write(json.dumps({**record, "custom_id": "torn"})[:5000])  # cut short by a crash
    size = (tmp_path / "output.jsonl").stat().st_size
    assert size > 20 << 20
    tracemalloc.start()
    try:
        progress = batches.Progress.read(tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert progress.completed == 600 and "torn" not in progress.done and progress.tokens[0] == 3000
    assert (tmp_path / "output.jsonl").read_bytes().endswith(b"}\n")
    assert peak < size // 4, (peak, size)


def test_a_short_write_on_a_full_disk_never_takes_another_answer_with_it(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Path) -> None:
    """Two of a batch's answers appended at once (--batch-lines 2) while the disk fills: the one whose write
    stopped short and then failed is taken back whole, and the other's record, written meanwhile, stays whole on
    its line (it was cut off with the failed one, or split around its rest)."""
    import contextlib
    import errno
    import os
    import threading

    from localgen.serve import batches

    progress = batches.Progress(tmp_path)
    real = os.write
    half, other_done = threading.Event(), threading.Event()

    def write(fd: int, data: Any) -> int:
        target = os.readlink(f"/proc/self/fd/{fd}")
        if threading.current_thread().name != "first" or not target.endswith("output.jsonl"):
            return real(fd, data)
        if not half.is_set():
            half.set()
            return real(fd, bytes(data[: len(data) // 2]))  # a short write
        other_done.wait(2)  # the other answer goes in meanwhile, unless it must wait for this one
        raise OSError(errno.ENOSPC, "No space left on device")

    def answer(custom_id: str) -> None:
        with contextlib.suppress(OSError):
            progress.write({"id": "batch_req_0", "custom_id": custom_id, "response": {"status_code": 200}}, True)

    monkeypatch.setattr(os, "write", write)
    one = threading.Thread(target=answer, args=("a",), name="first")
    one.start()
    half.wait(30)
    two = threading.Thread(target=lambda: (answer("b"), other_done.set()))
    two.start()
    one.join(30)
    two.join(30)
    monkeypatch.undo()
    assert [json.loads(line)["custom_id"] for line in (tmp_path / "output.jsonl").read_bytes().splitlines()] == ["b"]


def test_what_a_crash_left_half_written_is_swept_at_the_next_start(tmp_path: Path) -> None:
    """An upload killed while it was copied in (its temporary file, up to 200 MB, listed nowhere), a delete cut
    between its two unlinks, an object whose rename never came: the next server to hold the batches removes them;
    the files and batches that were whole stay, and the batch still running ends with its answers."""
    import io

    from localgen.serve import batches

    desk = batches.Desk(tmp_path)
    desk.owner()
    kept = desk.files.add(io.BytesIO(_jsonl([_line("a", _chat(1))])), "in.jsonl", "batch")
    doc = desk.create(kept["id"], "/v1/chat/completions", "24h", None)
    desk.validate(doc)
    record = {"id": "batch_req_0", "custom_id": "a", "error": None, "response": {"status_code": 200}}
    desk.progress[doc["id"]].write(record, True)
    desk.release()
    files_dir, run = tmp_path / "files", tmp_path / "runs" / doc["id"]
    left = [files_dir / ".file-0123456789abcdef01234567.4242.tmp", files_dir / ".file-x.json.0a1b2c.tmp",
            files_dir / "file-0123456789abcdef01234567.jsonl", run / ".batch.json.0a1b2c.tmp"]
    for path in left:
        path.write_bytes(b"{}\n" * 1000)
    again = batches.Desk(tmp_path)
    again.owner()
    assert [p for p in left if p.exists()] == []
    assert again.files.content(kept["id"]).read_bytes() == _jsonl([_line("a", _chat(1))])
    assert again.batches is not None and again.batches[doc["id"]]["status"] == "in_progress"
    again.finish(again.batches[doc["id"]])
    assert again.files.content(again.batches[doc["id"]]["output_file_id"]).read_bytes().count(b"\n") == 1
    again.release()


def test_the_runner_leaves_a_batch_to_the_request_that_validates_it(tmp_path: Path) -> None:
    """A batch is listed (`validating`) while POST /v1/batches checks its file; a runner that wakes meanwhile (a
    batch before it ended, another was created or cancelled) must not check and run it too: that ran its lines
    twice, and the second check set an ended batch back to `in_progress` with counts of nothing."""
    import asyncio
    import io
    import threading
    from types import SimpleNamespace

    from starlette.applications import Starlette

    from localgen.serve import batches
    from localgen.serve.batchrun import Runner

    desk = batches.Desk(tmp_path)
    desk.owner()
    upload = desk.files.add(io.BytesIO(_jsonl([_line(f"v{i}", _chat(i)) for i in range(3)])), "in.jsonl", "batch")
    routes = Starlette(routes=batches.routes(desk))
    sent: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/v1/chat/completions":
            sent.append(scope["path"])
        await routes(scope, receive, send)  # a chat request: a 404 here, an error line of the batch

    checking, release = threading.Event(), threading.Event()
    validate = desk.validate

    def slow(doc: dict[str, Any]) -> None:
        if not checking.is_set():  # the request's own check waits until the runner has woken
            checking.set()
            release.wait(30)
        validate(doc)

    desk.validate = slow  # type: ignore[method-assign]
    state = SimpleNamespace(workers={}, on_demand=None, upstreams=None, meant=lambda name: name,
                            local=lambda name: None)
    stop = False
    runner = Runner(desk, state, app, None, lambda: stop, 1, print)  # type: ignore[arg-type]

    async def scenario() -> dict[str, Any]:
        nonlocal stop
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost") as c:
            made = asyncio.create_task(c.post("/v1/batches", json={
                "input_file_id": upload["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}))
            while not checking.is_set():
                await asyncio.sleep(0.01)
            running = asyncio.create_task(runner.serve())
            desk.wake.set()
            for _ in range(50):  # the runner's turn: it finds the batch listed, `validating`
                await asyncio.sleep(0.02)
            release.set()
            doc = (await made).json()
            while (doc := (await c.get(f"/v1/batches/{doc['id']}")).json())["status"] in batches.RUNNING:
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.2)  # nothing sets it back
            doc = (await c.get(f"/v1/batches/{doc['id']}")).json()
            stop = True
            desk.wake.set()
            await asyncio.wait_for(running, 30)
            return doc

    doc = asyncio.run(asyncio.wait_for(scenario(), 120))
    assert doc["status"] == "completed" and doc["request_counts"] == {"total": 3, "completed": 0, "failed": 3}, doc
    assert len(sent) == 3
    errors = desk.files.content(doc["error_file_id"]).read_bytes().splitlines()
    assert sorted(json.loads(line)["custom_id"] for line in errors) == ["v0", "v1", "v2"]
    desk.release()


def test_a_slow_save_never_lands_after_a_later_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A batch's object is saved from threads (a cancel's request, the runner's end of the batch): one that was
    slow to reach the disk landed after a later one, and left `batch.json` saying `cancelling` for a batch that
    had ended, which the next start ended again with counts of nothing. Saves now land in the order made."""
    import io
    import threading

    from localgen.serve import batches, files

    desk = batches.Desk(tmp_path)
    desk.owner()
    upload = desk.files.add(io.BytesIO(_jsonl([_line("a", _chat(1))])), "in.jsonl", "batch")
    doc = desk.create(upload["id"], "/v1/chat/completions", "24h", None)
    desk.validate(doc)
    real, slow = files.write_atomic, threading.Event()

    def write_atomic(path: Path, data: bytes) -> None:
        if threading.current_thread().name == "cancel":
            slow.wait(2)  # a disk slow for this one
        real(path, data)

    monkeypatch.setattr(files, "write_atomic", write_atomic)
    doc.update(status="cancelling", cancelling_at=desk.now())
    cancel = threading.Thread(target=desk.save, args=(doc,), name="cancel")
    cancel.start()
    end = threading.Thread(target=desk.finish, args=(doc,))
    end.start()
    end.join(30)
    slow.set()
    cancel.join(30)
    assert doc["status"] == "cancelled"
    assert json.loads((tmp_path / "runs" / doc["id"] / "batch.json").read_bytes())["status"] == "cancelled"
    desk.release()


def test_a_batch_refused_for_a_full_disk_is_not_made(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """POST /v1/batches whose check could not be saved (a disk that filled meanwhile) answers 507, and the batch is
    not made: it was listed, `validating`, and ran later beside the one the client sent again."""
    import errno

    from starlette.testclient import TestClient

    from localgen.serve import batches
    from localgen.serve.app import build
    from localgen.serve.guard import Policy
    from localgen.serve.state import ServeState

    def full(self: batches.Desk, doc: dict[str, Any]) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path))
    monkeypatch.setattr(batches.Desk, "validate", full)
    client = TestClient(build(ServeState(workers={}), Policy(check_host=False), webui=False))
    upload = client.post("/v1/files", files={"file": ("in.jsonl", _jsonl([_line("a", _chat(1))]))},
                         data={"purpose": "batch"}).json()
    r = client.post("/v1/batches", json={"input_file_id": upload["id"], "endpoint": "/v1/chat/completions",
                                         "completion_window": "24h"})
    assert r.status_code == 507 and "cannot be written" in r.json()["error"]["message"], r.text
    assert client.get("/v1/batches").json()["data"] == []
    assert list((tmp_path / "data" / "batches" / "runs").iterdir()) == []


def test_an_upload_whose_temporary_folder_is_full_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An upload over 1 MB is spooled to the temporary folder (TMPDIR) as it arrives, before the data folder sees
    it: that folder full was a 507 blaming the data folder, which had room. It names TMPDIR now, and nothing is
    made; with room again, the same upload is taken."""
    import errno
    import io
    import os
    import tempfile

    from starlette.testclient import TestClient

    from localgen.serve.app import build
    from localgen.serve.guard import Policy
    from localgen.serve.state import ServeState

    class Full(io.BytesIO):  # a spool file in a temporary folder with no room left
        def write(self, data: Any) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path))
    client = TestClient(build(ServeState(workers={}), Policy(check_host=False), webui=False))
    big = _jsonl([_line(f"c{i}", _chat(i)) for i in range(12_000)])
    assert len(big) > 1 << 20  # past Starlette's spool in memory
    real = tempfile.TemporaryFile
    monkeypatch.setattr(tempfile, "TemporaryFile", lambda **kwargs: Full())
    r = client.post("/v1/files", files={"file": ("in.jsonl", big)}, data={"purpose": "batch"})
    message = r.json()["error"]["message"]
    assert r.status_code == 507 and "temporary folder (TMPDIR) cannot be written (No space left" in message, r.text
    assert "data folder" not in message and client.get("/v1/files").json()["data"] == []
    monkeypatch.setattr(tempfile, "TemporaryFile", real)
    r = client.post("/v1/files", files={"file": ("in.jsonl", big)}, data={"purpose": "batch"})
    assert r.status_code == 200 and r.json()["bytes"] == len(big), r.text


def test_a_clean_up_loop_that_deletes_while_it_pages_deletes_every_file(monkeypatch: pytest.MonkeyPatch,
                                                                        tmp_path: Path) -> None:
    """`for f in client.files.list(limit=2): client.files.delete(f.id)`: the openai client asks for the next page
    after the last file it was given, which is deleted by then; that page was empty, and the loop stopped after
    the first page. Both orders; an `after` that names nothing ever listed is still an empty page."""
    import openai
    from starlette.testclient import TestClient

    from localgen.serve.app import build
    from localgen.serve.guard import Policy
    from localgen.serve.state import ServeState

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path))
    http = TestClient(build(ServeState(workers={}), Policy(check_host=False), webui=False))
    client = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http, max_retries=0)
    for order in ("desc", "asc"):
        made = [client.files.create(file=(f"{i}.jsonl", b"{}\n"), purpose="batch").id for i in range(7)]
        gone = []
        for f in client.files.list(limit=2, order=order):  # type: ignore[arg-type]
            client.files.delete(f.id)
            gone.append(f.id)
        assert gone == (made[::-1] if order == "desc" else made)
        assert client.files.list().data == []
    client.files.create(file=("kept.jsonl", b"{}\n"), purpose="batch")
    assert http.get("/v1/files", params={"after": "file-" + "f" * 24}).json()["data"] == []  # no time: nothing


def test_a_cancel_refused_for_a_full_disk_changes_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """docs/batch.md: POST /v1/batches/{id}/cancel whose new state could not be saved answers 507 (nothing done:
    send it again), and the batch is as it was, in memory as on disk: it was `cancelling` in GET and in the
    runner's eyes, while its batch.json (what a restart reads) said `in_progress`."""
    import errno

    from starlette.testclient import TestClient

    from localgen.serve import batches
    from localgen.serve.app import build
    from localgen.serve.guard import Policy
    from localgen.serve.state import ServeState

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path))
    client = TestClient(build(ServeState(workers={}), Policy(check_host=False), webui=False))  # no runner: no lifespan
    upload = client.post("/v1/files", files={"file": ("in.jsonl", _jsonl([_line("a", _chat(1))]))},
                         data={"purpose": "batch"}).json()
    made = client.post("/v1/batches", json={"input_file_id": upload["id"], "endpoint": "/v1/chat/completions",
                                            "completion_window": "24h"}).json()
    assert made["status"] == "in_progress", made
    saved = tmp_path / "data" / "batches" / "runs" / made["id"] / "batch.json"
    write = batches.files.write_atomic

    def full(path: Path, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(batches.files, "write_atomic", full)
    r = client.post(f"/v1/batches/{made['id']}/cancel")
    assert r.status_code == 507 and "cannot be written" in r.json()["error"]["message"], r.text
    shown = client.get(f"/v1/batches/{made['id']}").json()
    assert (shown["status"], shown["cancelling_at"]) == ("in_progress", None), shown
    assert json.loads(saved.read_bytes())["status"] == "in_progress"
    monkeypatch.setattr(batches.files, "write_atomic", write)  # room again: the same request now cancels
    r = client.post(f"/v1/batches/{made['id']}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "cancelling" and r.json()["cancelling_at"], r.text
    assert json.loads(saved.read_bytes())["status"] == "cancelling"


def _read_only(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """`folder` as a read-only file system shows it to this process: opening a file there to write, making, removing
    or renaming one fails with EROFS (a test cannot mount one: CI is not root, and root ignores a chmod)."""
    import builtins
    import errno
    import os

    def guarded(real: Any, writes: Any) -> Any:
        def call(path: Any, *args: Any, **kwargs: Any) -> Any:
            if str(path).startswith(str(folder)) and writes(*args, **kwargs):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
            return real(path, *args, **kwargs)
        return call

    written = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    monkeypatch.setattr(os, "open", guarded(os.open, lambda flags, *a, **k: flags & written))
    monkeypatch.setattr(builtins, "open", guarded(builtins.open, lambda mode="r", *a, **k: set(mode) & set("wax+")))
    for name in ("mkdir", "unlink", "replace", "rename", "rmdir"):
        monkeypatch.setattr(os, name, guarded(getattr(os, name), lambda *a, **k: True))


def test_a_read_only_data_folder_still_answers_the_routes_that_read(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    """docs/batch.md: a data dir that cannot be written makes only the routes that write answer 507. GET /v1/files,
    a file, its content, GET /v1/batches and a batch answered 507 too (the lock they took first could not be made);
    they read what is on disk as it is (a running batch's answers counted, its torn last line left alone), and the
    first request once the folder can be written takes the batches."""
    import io

    from starlette.testclient import TestClient

    from localgen.serve import batches
    from localgen.serve.app import build
    from localgen.serve.guard import Policy
    from localgen.serve.state import ServeState

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path))
    data = tmp_path / "data" / "batches"
    desk = batches.Desk(data)
    desk.owner()
    upload = desk.files.add(io.BytesIO(_jsonl([_line("a", _chat(1)), _line("b", _chat(2))])), "in.jsonl", "batch")
    doc = desk.create(upload["id"], "/v1/chat/completions", "24h", None)
    desk.validate(doc)
    desk.progress[doc["id"]].write({"id": "batch_req_0", "custom_id": "a", "response": {"status_code": 200}}, True)
    desk.release()
    output = data / "runs" / doc["id"] / "output.jsonl"
    with open(output, "ab") as f:
        f.write(b'{"custom_id": "b", "resp')  # a crash cut this answer short
    _read_only(monkeypatch, tmp_path)
    client = TestClient(build(ServeState(workers={}), Policy(check_host=False), webui=False))  # no runner: no lifespan
    listed = client.get("/v1/files")
    assert listed.status_code == 200 and [f["id"] for f in listed.json()["data"]] == [upload["id"]], listed.text
    assert client.get(f"/v1/files/{upload['id']}").json()["filename"] == "in.jsonl"
    content = client.get(f"/v1/files/{upload['id']}/content")
    assert content.status_code == 200 and content.content.count(b"\n") == 2, content.text
    shown = client.get("/v1/batches")
    assert shown.status_code == 200 and [b["id"] for b in shown.json()["data"]] == [doc["id"]], shown.text
    one = client.get(f"/v1/batches/{doc['id']}").json()
    assert one["status"] == "in_progress" and one["request_counts"] == {"total": 2, "completed": 1, "failed": 0}
    refused = client.post("/v1/files", files={"file": ("in.jsonl", b"{}\n")}, data={"purpose": "batch"})
    assert refused.status_code == 507 and "cannot be written" in refused.json()["error"]["message"], refused.text
    monkeypatch.undo()  # the folder can be written again: the next request holds the batches, and repairs them
    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path))
    again = client.post("/v1/files", files={"file": ("in.jsonl", b"{}\n")}, data={"purpose": "batch"})
    assert again.status_code == 200, again.text
    assert output.read_bytes().endswith(b"}\n") and output.read_bytes().count(b"\n") == 1


def test_a_request_that_never_reached_its_route_is_kept_with_openais_code(tmp_path: Path) -> None:
    """docs/batch.md: a line whose request failed before the app answered (a fault of the server's own) is an error
    record with no response and OpenAI's string code `server_error`, said in the log; the next line still runs."""
    import asyncio

    from localgen.serve import batches, batchinput
    from localgen.serve.batchrun import Runner

    class Broken:  # the in-process client, failing before any answer
        async def post(self, url: str, **kwargs: Any) -> Any:
            raise RuntimeError("a bug")

    progress = batches.Progress(tmp_path)
    said: list[str] = []
    runner = Runner(batches.Desk(tmp_path), None, None, None, lambda: False, 1, said.append)  # type: ignore[arg-type]
    line = batchinput.Line(1, "a", "/v1/chat/completions", _chat(1))
    asyncio.run(runner.one(Broken(), progress, line, asyncio.Semaphore(0)))
    [record] = [json.loads(raw) for raw in (tmp_path / "errors.jsonl").read_text().splitlines()]
    assert record["response"] is None and record["custom_id"] == "a"
    assert record["error"] == {"code": "server_error", "message": "internal error (the server's log has the details)"}
    assert progress.failed == 1 and "a batch request failed" in said[0] and "RuntimeError: a bug" in said[0]


def test_a_line_with_nan_or_infinity_is_refused_naming_where(server: Server) -> None:
    """docs/batch.md, Refused input: NaN, Infinity and 1e999 are no JSON numbers; such a line ran, and its answer
    (echoing a tool's schema) was a 500 in the error file after the whole generation."""
    client = _client(server)
    lines = [_line("a", {**_chat(1), "tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "number", "maximum": "BIG"}}}}}]}),
             _line("b", {**_chat(1), "temperature": "NAN"}), _line("c", _chat(1))]
    data = _jsonl(lines).replace(b'"BIG"', b"1e999").replace(b'"NAN"', b"NaN")
    upload = client.files.create(file=("odd.jsonl", data), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.status == "failed" and batch.output_file_id is None and batch.error_file_id is None
    assert [(x.code, x.line, x.param) for x in batch.errors.data] == [
        ("invalid_json_line", 1, "body.tools.0.function.parameters.properties.x.maximum"),
        ("invalid_json_line", 2, "body.temperature")]
    assert "is 1e999, not a finite number" in batch.errors.data[0].message


def test_a_files_content_takes_a_range_as_rfc_9110_has_it(server: Server) -> None:
    """docs/batch.md: a Range of another unit, or one that cannot be read, was Starlette's plain-text 400 ("Only
    support bytes range"); one past the end its plain-text 416. RFC 9110 §14.2: an unknown unit is ignored, an
    invalid range may be (the whole file, 200); none of it in the file is a 416 in the API's shape, with
    Content-Range: bytes */SIZE."""
    data = _jsonl([_line("a", _chat(1))])
    upload = _client(server).files.create(file=("in.jsonl", data), purpose="batch")
    url, key = f"{server.url}/v1/files/{upload.id}/content", {"Authorization": f"Bearer {KEY}"}
    for whole in ("items=0-1", "bytes=abc", "bytes=100-50", "bytes", "bytes=0-1;x", "bytes=1-2-3"):
        r = httpx.get(url, headers={**key, "Range": whole})
        assert r.status_code == 200 and r.content == data and "content-range" not in r.headers, (whole, r.text)
    for past in ("bytes=999999-", f"bytes={len(data)}-", "bytes=-0"):
        r = httpx.get(url, headers={**key, "Range": past})
        assert r.status_code == 416 and r.headers["content-range"] == f"bytes */{len(data)}", (past, r.text)
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["code"] == 416, r.text
        assert err["message"] == f"The range asked for is past the end of {upload.id}, which has {len(data):,} bytes"
    for asked, got in (("bytes=0-1", data[:2]), ("bytes=-3", data[-3:]), ("bytes=2-", data[2:]),
                       ("bytes=0-1, 999999-", data[:2]), ("bytes=0-1,,1-3", data[:4])):
        r = httpx.get(url, headers={**key, "Range": asked})
        assert r.status_code == 206 and r.content == got, (asked, r.status_code, r.text)


def test_a_file_where_the_batches_folder_goes_is_a_507_that_names_it(own_env: dict[str, str]) -> None:
    """batch.md: a data dir that cannot be written makes the routes that write answer 507, and those that read
    still answer. A file where its `batches` folder goes (a sync tool's, a hand's) was a bare 500 on every route,
    two tracebacks each in the log."""
    data = Path(own_env["LOCALGEN_HOME"]) / "data"
    data.mkdir(parents=True)
    (data / "batches").write_text("x\n")
    s = Server(own_env, *ARGS)
    try:
        auth = {"Authorization": f"Bearer {KEY}"}
        listed = httpx.get(f"{s.url}/v1/files", headers=auth, timeout=60)
        assert listed.status_code == 200 and listed.json()["data"] == [], listed.text
        assert httpx.get(f"{s.url}/v1/batches", headers=auth, timeout=60).status_code == 200
        one = httpx.get(f"{s.url}/v1/files/file-0123456789abcdef01234567", headers=auth, timeout=60)
        assert one.status_code == 404, one.text
        r = httpx.post(f"{s.url}/v1/files", headers=auth, files={"file": ("in.jsonl", _jsonl([_line("a", _chat(1))]))},
                       data={"purpose": "batch"}, timeout=60)
        assert r.status_code == 507, r.text
        said = r.json()["error"]["message"]
        assert said.startswith("the server's data folder cannot be written (") and said.endswith(
            "batches is a file, not a folder): move that file away, then send it again"), r.text
        assert "Traceback" not in s.log() and "is damaged" not in s.log(), s.log()  # (no file is: none is there)
        assert (data / "batches").read_text() == "x\n"  # (the user's file, as it was)
    finally:
        assert s.stop() == 0


def test_a_damaged_object_is_said_in_the_log_and_the_others_still_listed(own_env: dict[str, str]) -> None:
    """One damaged FileObject (a disk's fault, a hand's edit) made GET /v1/files a 500 for every file; a damaged
    batch.json hid its batch without a word. Each is said once in the log, left as it is, and the rest served."""
    import openai

    s = Server(own_env, *ARGS)
    try:
        client = _client(s)
        kept = client.files.create(file=("kept.jsonl", _jsonl([_line("a", _chat(1))])), purpose="batch")
        hurt = client.files.create(file=("hurt.jsonl", _jsonl([_line("b", _chat(2))])), purpose="batch")
        batch = client.batches.create(input_file_id=kept.id, endpoint="/v1/chat/completions", completion_window="24h")
        _finished(client, batch.id)
    finally:
        assert s.stop() == 0
    root = Path(own_env["LOCALGEN_HOME"]) / "data" / "batches"
    (root / "files" / f"{hurt.id}.json").write_text("garbage\n")
    (root / "runs" / batch.id / "batch.json").write_text('{"id": "batch_x", "stat')
    (root / "runs" / "batch_listed").mkdir()
    (root / "runs" / "batch_listed" / "batch.json").write_text("[]\n")  # JSON, not an object: serve did not start
    s = Server(own_env, *ARGS)
    try:
        client = _client(s)
        assert kept.id in [f.id for f in client.files.list()]
        assert hurt.id not in [f.id for f in client.files.list()]
        assert client.files.retrieve(kept.id).filename == "kept.jsonl"
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(hurt.id)
        with pytest.raises(openai.NotFoundError):
            client.batches.retrieve(batch.id)
        log = s.log()
        assert log.count(f"{root / 'files' / hurt.id}.json is damaged") == 1, log
        assert f"{root / 'runs' / batch.id / 'batch.json'} is damaged" in log, log
        assert "Traceback" not in log, log
        assert (root / "files" / f"{hurt.id}.json").read_text() == "garbage\n"
        assert f"{root / 'runs' / 'batch_listed' / 'batch.json'} is damaged" in s.log(), s.log()
        assert client.files.delete(hurt.id).deleted  # a damaged file is deleted as any (it was a 404)
        assert not (root / "files" / f"{hurt.id}.json").exists() and not (root / "files" / f"{hurt.id}.jsonl").exists()
    finally:
        assert s.stop() == 0
