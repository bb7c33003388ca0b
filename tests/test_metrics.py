"""GET /metrics in Prometheus' text format (#43 item 6): in process, the scrape-time gauges from stand-in workers
and residency, each generation's tokens, TTFT and ITL, and requests counted by route template and status behind
the API key; then a real server (SmolLM2) whose counters match the usage its answers reported."""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import SimpleNamespace

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from localgen.backend import Completion
from localgen.serve.metrics import BUCKETS, STEP_BUCKETS, Metrics
from localgen.serve.residency import Residency
from localgen.serve.state import ServeState
from tests.test_serve import Server

MB = 1 << 20
KEY = "metrics-key"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, by name and labels (the parser rejects what is not the text format)."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(got: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float | None:
    return got.get((name, tuple(sorted(labels.items()))))


class Stand:
    """A worker as the gauges see it: jobs outstanding and running, loaded or not, its estimate."""

    def __init__(self, name: str, outstanding: int, running: int, loaded: bool, need: int) -> None:
        self.name, self.outstanding, self.loaded, self.running = name, outstanding, loaded, running
        self.residence = SimpleNamespace(need=need)
        self.pinned, self.busy, self.last_used = False, outstanding > 0, 0.0


def done(prompt: int, made: int, ttft: float, total: float) -> Completion:
    return Completion(index=0, text="", finish_reason="stop", prompt_tokens=prompt, completion_tokens=made,
                      ttft_s=ttft, total_s=total, seed=0)


def test_gauges_are_read_from_the_workers_and_residency_at_each_scrape() -> None:
    r = Residency(budget=1000 * MB, max_models=2)
    a = Stand("a", outstanding=3, running=1, loaded=True, need=300 * MB)
    b = Stand("b", outstanding=0, running=0, loaded=False, need=200 * MB)
    r.admit(a, 300 * MB)
    state = ServeState(workers={"a": a, "b": b}, residency=r)  # type: ignore[dict-item]
    m = Metrics(state)
    got = samples(m.text().decode())
    assert value(got, "localgen_queue_depth", model="a") == 2  # 3 outstanding, 1 of them in a slot
    assert value(got, "localgen_running_requests", model="a") == 1
    assert value(got, "localgen_model_loaded", model="a") == 1 and value(got, "localgen_model_loaded", model="b") == 0
    assert value(got, "localgen_model_memory_bytes", model="a") == 300 * MB
    assert value(got, "localgen_model_memory_bytes", model="b") == 0  # not loaded: holds nothing
    assert value(got, "localgen_memory_budget_bytes") == 1000 * MB
    assert value(got, "localgen_loads_total") == 1 and value(got, "localgen_evictions_total") == 0
    # never stale: the next scrape sees what changed since
    a.outstanding, a.running = 0, 0
    r.released(a)
    r.admit(b, 200 * MB)
    b.loaded = True
    got = samples(m.text().decode())
    assert value(got, "localgen_queue_depth", model="a") == 0 and value(got, "localgen_model_loaded", model="b") == 1
    assert value(got, "localgen_loads_total") == 2


def test_each_generation_counts_its_tokens_ttft_and_mean_inter_token_time() -> None:
    m = Metrics(ServeState(workers={}))
    m.observe("a", done(prompt=10, made=5, ttft=0.2, total=1.0))  # ITL (1.0 - 0.2) / 4 = 0.2
    m.observe("a", done(prompt=7, made=1, ttft=0.03, total=0.03))  # one token: a TTFT, no inter-token time
    m.observe("a", done(prompt=4, made=0, ttft=0.0, total=0.01))  # no token: neither
    got = samples(m.text().decode())
    assert value(got, "localgen_prompt_tokens_total", model="a") == 21
    assert value(got, "localgen_generated_tokens_total", model="a") == 6
    assert value(got, "localgen_time_to_first_token_seconds_count", model="a") == 2
    assert value(got, "localgen_time_to_first_token_seconds_sum", model="a") == pytest.approx(0.23)
    assert value(got, "localgen_inter_token_seconds_count", model="a") == 1
    assert value(got, "localgen_inter_token_seconds_sum", model="a") == pytest.approx(0.2)
    assert value(got, "localgen_inter_token_seconds_bucket", model="a", le="0.25") == 1
    assert value(got, "localgen_inter_token_seconds_bucket", model="a", le="0.1") == 0
    assert BUCKETS[0] == 0.001 and BUCKETS[-1] == 60.0  # 1 ms to 60 s
    assert value(got, "localgen_time_to_first_token_seconds_bucket", model="a", le="0.001") == 0
    assert value(got, "localgen_time_to_first_token_seconds_bucket", model="a", le="60.0") == 2


def test_each_step_counts_the_tokens_it_evaluated_and_its_time() -> None:
    m = Metrics(ServeState(workers={}))
    m.stepped("a", 2048, 0.08)  # a burst's prompts, a whole batch
    m.stepped("a", 32, 0.012)  # 32 streams decoding
    m.stepped("b", 1, 0.004)
    got = samples(m.text().decode())
    assert value(got, "localgen_step_tokens_count", model="a") == 2
    assert value(got, "localgen_step_tokens_sum", model="a") == 2080
    assert value(got, "localgen_step_tokens_bucket", model="a", le="32.0") == 1
    assert value(got, "localgen_step_tokens_bucket", model="a", le="1024.0") == 1
    assert value(got, "localgen_step_tokens_bucket", model="a", le="2048.0") == 2
    assert value(got, "localgen_step_seconds_sum", model="a") == pytest.approx(0.092)
    assert value(got, "localgen_step_seconds_bucket", model="a", le="0.01") == 0
    assert value(got, "localgen_step_seconds_bucket", model="a", le="0.025") == 1
    assert value(got, "localgen_step_tokens_count", model="b") == 1
    assert STEP_BUCKETS[0] == 1 and STEP_BUCKETS[-1] == 4096


def test_requests_are_counted_by_route_template_and_status_behind_the_key() -> None:
    from starlette.testclient import TestClient

    from localgen.serve.app import build
    from localgen.serve.guard import Policy

    client = TestClient(build(ServeState(workers={}), Policy(api_key=KEY, check_host=False)))
    auth = {"Authorization": f"Bearer {KEY}"}
    assert client.get("/metrics").status_code == 401
    assert client.get("/v1/models", headers=auth).status_code == 200
    assert client.get("/v1/chat/completions", headers=auth).status_code == 405
    assert client.get("/no/such/path/1", headers=auth).status_code == 404
    assert client.get("/no/such/path/2", headers=auth).status_code == 404
    scrape = client.get("/metrics", headers=auth)
    assert scrape.status_code == 200 and scrape.headers["content-type"].startswith("text/plain; version=0.0.4")
    got = samples(scrape.text)
    assert value(got, "localgen_requests_total", route="/metrics", status="401") == 1
    assert value(got, "localgen_requests_total", route="/v1/models", status="200") == 1
    assert value(got, "localgen_requests_total", route="/v1/chat/completions", status="405") == 1
    assert value(got, "localgen_requests_total", route="other", status="404") == 2  # never the raw path
    assert value(got, "localgen_request_seconds_count", route="other") == 2
    assert not any("/no/such" in str(labels) for _, labels in got)



def test_a_path_without_v1_is_counted_and_logged_as_its_v1_route() -> None:
    """llama-server's spellings without /v1 (GET /models, /chat/completions) count as their /v1 route, one series
    per route: a dashboard on /v1/models missed the clients that leave /v1 out. The JSON access line's `route`
    is that route too, its `path` the one asked for."""
    import json

    from starlette.testclient import TestClient

    from localgen.serve.app import build
    from localgen.serve.guard import Policy
    from localgen.serve.servelog import ServeLog

    app = build(ServeState(workers={}), Policy(api_key=KEY, check_host=False))
    lines: list[str] = []
    app.state.front.log = ServeLog(json_lines=True, write=lines.append)
    client = TestClient(app)
    auth = {"Authorization": f"Bearer {KEY}"}
    assert client.get("/v1/models", headers=auth).status_code == 200
    assert client.get("/models", headers=auth).status_code == 200
    assert client.get("/chat/completions", headers=auth).status_code == 405
    got = samples(client.get("/metrics", headers=auth).text)
    assert value(got, "localgen_requests_total", route="/v1/models", status="200") == 2
    assert value(got, "localgen_request_seconds_count", route="/v1/models") == 2
    assert value(got, "localgen_requests_total", route="/v1/chat/completions", status="405") == 1
    assert not any(dict(labels).get("route") in ("/models", "/chat/completions") for _, labels in got), got
    logged = [json.loads(line) for line in lines]
    asked = {(e["path"], e["route"]) for e in logged if e["event"] == "request"}
    assert {("/models", "/v1/models"), ("/v1/models", "/v1/models"),
            ("/chat/completions", "/v1/chat/completions")} <= asked, asked

# ---- a real server ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(cli_env: dict[str, str]) -> Iterator[Server]:
    s = Server(cli_env, "--api-key", KEY, "-np", "1", "--ctx", "512")
    yield s
    assert s.stop() == 0


def _scrape(server: Server, want: dict[str, float]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The server's metrics once the counts `want` names have reached their values (a request is counted as
    its response ends, a moment after its client has the answer)."""
    auth = {"Authorization": f"Bearer {KEY}"}
    deadline = time.monotonic() + 60  # a safety net for busy cores, not a timing
    while True:
        got = samples(httpx.get(f"{server.url}/metrics", headers=auth, timeout=30).text)
        short = {k: _find(got, k) for k, v in want.items() if _find(got, k) != v}
        if not short:
            return got
        assert time.monotonic() < deadline, f"after 60 s, these counts are {short}, not as in {want}"
        time.sleep(0.1)


def _find(got: dict[tuple[str, tuple[tuple[str, str], ...]], float], key: str) -> float | None:
    name, _, label = key.partition("|")
    return got.get((name, tuple(sorted(tuple(kv.split("=", 1)) for kv in label.split(",") if kv))))  # type: ignore[misc]


def test_a_real_servers_metrics_match_the_usage_it_reported(server: Server) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}
    assert httpx.get(f"{server.url}/metrics", timeout=30).status_code == 401  # the key guards /metrics too
    prompt = made = 0
    for text in ("Name a color.", "Name a fruit."):
        r = httpx.post(f"{server.url}/v1/chat/completions", headers=auth, timeout=300, json={
            "messages": [{"role": "user", "content": text}], "max_tokens": 8, "temperature": 0})
        assert r.status_code == 200, r.text
        prompt += r.json()["usage"]["prompt_tokens"]
        made += r.json()["usage"]["completion_tokens"]
    g = httpx.post(f"{server.url}/api/generate", headers=auth, timeout=300, json={
        "model": "smollm2:135m", "prompt": "Count: one, two,", "stream": False,
        "options": {"num_predict": 8, "temperature": 0}})
    assert g.status_code == 200, g.text
    prompt += g.json()["prompt_eval_count"]
    made += g.json()["eval_count"]
    missing = httpx.post(f"{server.url}/v1/chat/completions", headers=auth, timeout=30, json={
        "model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]})
    assert missing.status_code == 404
    model = "smollm2:135m"
    got = _scrape(server, {"localgen_requests_total|route=/v1/chat/completions,status=200": 2,
                           "localgen_requests_total|route=/v1/chat/completions,status=404": 1,
                           "localgen_requests_total|route=/api/generate,status=200": 1})
    assert value(got, "localgen_requests_total", route="/v1/chat/completions", status="200") == 2
    assert value(got, "localgen_requests_total", route="/v1/chat/completions", status="404") == 1
    assert value(got, "localgen_requests_total", route="/api/generate", status="200") == 1
    assert value(got, "localgen_requests_total", route="/metrics", status="401") == 1
    assert value(got, "localgen_prompt_tokens_total", model=model) == prompt
    assert value(got, "localgen_generated_tokens_total", model=model) == made
    assert value(got, "localgen_time_to_first_token_seconds_count", model=model) == 3
    assert value(got, "localgen_inter_token_seconds_count", model=model) == 3
    assert value(got, "localgen_model_loaded", model=model) == 1
    ps = httpx.get(f"{server.url}/api/ps", headers=auth, timeout=30).json()["models"]
    assert (value(got, "localgen_model_memory_bytes", model=model) or 0) == ps[0]["size"] > 0  # the estimate
    assert (value(got, "localgen_memory_budget_bytes") or 0) > 0
    assert value(got, "localgen_loads_total") == 1 and value(got, "localgen_evictions_total") == 0
    assert value(got, "localgen_queue_depth", model=model) == 0
    assert value(got, "localgen_running_requests", model=model) == 0


def test_a_real_servers_steps_count_the_tokens_it_evaluated(server: Server) -> None:
    """Each step's tokens: the prompt's, less those its cache held, and each generated token fed back (all but
    the last)."""
    auth = {"Authorization": f"Bearer {KEY}"}
    before = _scrape(server, {})
    r = httpx.post(f"{server.url}/v1/chat/completions", headers=auth, timeout=300, json={
        "messages": [{"role": "user", "content": "Say the days of the week."}], "max_tokens": 6, "temperature": 0,
        "ignore_eos": True})
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert usage["completion_tokens"] == 6
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    sent = value(before, "localgen_requests_total", route="/v1/chat/completions", status="200") or 0
    got = _scrape(server, {"localgen_requests_total|route=/v1/chat/completions,status=200": sent + 1})
    model = "smollm2:135m"
    steps = (value(got, "localgen_step_tokens_count", model=model) or 0) - \
        (value(before, "localgen_step_tokens_count", model=model) or 0)
    tokens = (value(got, "localgen_step_tokens_sum", model=model) or 0) - \
        (value(before, "localgen_step_tokens_sum", model=model) or 0)
    assert tokens == usage["prompt_tokens"] - cached + 5
    assert steps >= 6  # the prompt's step (or steps), then one a token fed back
    assert (value(got, "localgen_step_seconds_count", model=model) or 0) - \
        (value(before, "localgen_step_seconds_count", model=model) or 0) == steps


def test_the_api_pages_metrics_are_those_a_real_server_exposes(server: Server) -> None:
    """docs/api.md's row for GET /metrics names every series a server shows, and shows none it does not name
    (counters by their `_total` samples; localgen_upstream_requests_total is only served with --endpoint)."""
    import re
    from pathlib import Path

    row = next(line for line in (Path(__file__).parents[1] / "docs" / "api.md").read_text().splitlines()
               if line.startswith("| `GET /metrics`"))
    named = set(re.findall(r"`(localgen_\w+)`", row))
    text = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=30).text
    shown = {f.name + ("_total" if f.type == "counter" else "") for f in text_string_to_metric_families(text)
             if not f.name.endswith("_created")}  # prometheus_client's time of each series' start
    assert shown - named == set()
    assert named - shown <= {"localgen_upstream_requests_total"}


def test_a_request_waiting_for_the_one_slot_is_queued_not_running(server: Server) -> None:
    """docs/api.md: /health's `running` is the requests in a slot and `queued` those waiting for one, as
    /metrics' localgen_running_requests and localgen_queue_depth are: with one slot and two long requests, one
    runs and one waits (both counted as running before, once the scheduler held them)."""
    import threading

    auth = {"Authorization": f"Bearer {KEY}"}
    body = {"model": "smollm2:135m", "prompt": "Count: one, two,", "stream": False,
            "options": {"num_predict": 64, "temperature": 0, "ignore_eos": True}}
    asks = [threading.Thread(target=httpx.post, args=(f"{server.url}/api/generate",),
                             kwargs={"headers": auth, "timeout": 600, "json": body}) for _ in range(2)]
    for t in asks:
        t.start()
    try:
        deadline = time.monotonic() + 300  # a safety net for busy cores, not a timing
        while not ((h := httpx.get(f"{server.url}/health", timeout=30).json()["models"]["smollm2:135m"])["running"]
                   and h["running"] + h["queued"] == 2):  # both taken in, the first begun
            assert time.monotonic() < deadline, h
            time.sleep(0.05)
        got = samples(httpx.get(f"{server.url}/metrics", headers=auth, timeout=30).text)
        assert (h["running"], h["queued"]) == (1, 1), h
        assert value(got, "localgen_running_requests", model="smollm2:135m") == 1
        assert value(got, "localgen_queue_depth", model="smollm2:135m") == 1
    finally:
        for t in asks:
            t.join()
