"""A damaged Responses store (docs/configuration.md's `responses.db`): a request that would store gets a 500
saying the store is damaged, naming the file but not where the server keeps it (docs/serve.md's rule), the
server's log one line saying what to do, no traceback; `store: false` still answers; GET of a stored response
is the same 500; and once the file is moved aside the next request starts a new store, without a restart."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.test_serve import Server


def test_a_damaged_responses_store_is_one_clear_error_and_store_false_still_works(cli_env: dict[str, str],
                                                                                  tmp_path: Path) -> None:
    home = tmp_path / "home"
    store = home / "data" / "responses" / "responses.db"
    store.parent.mkdir(parents=True)
    store.write_bytes(b"this is not a database at all " * 200)
    s = Server({**cli_env, "LOCALGEN_HOME": str(home)}, "--ctx", "512")
    try:
        ask = {"model": "smollm2:135m", "input": "Hi", "max_output_tokens": 2, "temperature": 0}
        for body in (ask, {**ask, "stream": True}):
            r = httpx.post(f"{s.url}/v1/responses", json=body, timeout=120)
            assert r.status_code == 500, r.text
            message = r.json()["error"]["message"]
            assert "the Responses store responses.db is damaged" in message and "store" in message, message
            assert str(home) not in r.text and "internal error" not in r.text
        got = httpx.get(f"{s.url}/v1/responses/resp_x", timeout=60)
        assert got.status_code == 500 and "is damaged" in got.json()["error"]["message"]
        r = httpx.post(f"{s.url}/v1/responses", json={**ask, "store": False}, timeout=120)
        assert r.status_code == 200 and r.json()["status"] in ("completed", "incomplete"), r.text
        store.rename(store.with_suffix(".damaged"))  # moved aside: the next request makes a new store
        r = httpx.post(f"{s.url}/v1/responses", json=ask, timeout=120)
        assert r.status_code == 200, r.text
        assert httpx.get(f"{s.url}/v1/responses/{r.json()['id']}", timeout=60).status_code == 200
    finally:
        assert s.stop() == 0
    assert s.proc.stderr is not None
    log = s.proc.stderr.read().decode()
    said = [line for line in log.splitlines() if "Responses store" in line]
    assert said and all(line.startswith(f"localgen serve: the Responses store {store} is damaged")
                        for line in said), log
    assert "Traceback" not in log, log
