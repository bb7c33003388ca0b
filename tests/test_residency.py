"""Serving every installed model on demand within a memory budget and a count (#43): serve/residency.py's
rules in process, with stand-in workers; then a real server holding one model at a time, SmolLM2 and Gemma 3
asked for in turn through the real `ollama` client: both answer, /api/ps and `localgen ps` show the swap, and
a request during a swap waits rather than fails."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from localgen.engine.hostcache import MIN_TOKENS
from localgen.engine.tokens import reusable_prefix
from localgen.serve.residency import NoRoom, Residency, TooBig
from localgen.serve.servelog import ServeLog
from tests.conftest import CLI
from tests.test_serve import SERVE_GRID, Server

MB = 1 << 20


class Stand:
    """A worker as residency sees it: a name, pinned or not, busy or not (`running`: its jobs in slots, the rest
    queued), when last used; unloading on request frees its room, as the worker thread does; asked to yield,
    it holds back what comes (ModelWorker.evictable)."""

    def __init__(self, r: Residency, name: str, pinned: bool = False, busy: bool = False) -> None:
        self.r, self.name, self.pinned, self.busy = r, name, pinned, busy
        self.running = busy
        self.last_used = time.monotonic()
        self.unloaded = 0
        self.yielding: list[str] = []

    @property
    def evictable(self) -> bool:
        return not self.busy or (bool(self.yielding) and not self.running)

    def yield_to(self, name: str) -> None:
        self.yielding.append(name)

    def resume(self, name: str) -> None:
        self.yielding.remove(name)

    def request_unload(self, reason: str = "asked", evicted_for: str | None = None) -> threading.Event:
        done = threading.Event()
        self.unloaded += 1
        self.r.released(self, evicted=reason == "evicted")
        done.set()
        return done


def test_the_least_recently_used_idle_model_makes_room() -> None:
    r = Residency(budget=1000 * MB, max_models=2)
    a, b, c = (Stand(r, n) for n in "abc")
    r.admit(a, 300 * MB)
    r.admit(b, 300 * MB)
    a.last_used = time.monotonic()  # b is now the least recently used
    r.admit(c, 300 * MB)  # the count is full: b goes
    assert (a.unloaded, b.unloaded) == (0, 1) and r.status()["loaded"] == ["a", "c"]
    d = Stand(r, "d")
    r.admit(d, 800 * MB)  # the count makes c go (used before a was used again), then the bytes make a go
    assert r.status()["loaded"] == ["d"] and r.evictions == 3 and r.loads == 4


def test_pinned_and_busy_models_are_never_evicted() -> None:
    r = Residency(budget=1000 * MB, max_models=2, wait_s=0.3)
    pinned, busy = Stand(r, "pinned", pinned=True), Stand(r, "busy", busy=True)
    r.admit(pinned, 100 * MB)
    r.admit(busy, 100 * MB)
    t0 = time.monotonic()
    with pytest.raises(NoRoom, match="pinned or busy"):
        r.admit(Stand(r, "new"), 100 * MB)
    assert time.monotonic() - t0 >= 0.3 and pinned.unloaded == busy.unloaded == 0


def test_a_load_waits_for_a_busy_model_to_finish() -> None:
    r = Residency(budget=1000 * MB, max_models=1, wait_s=30)
    busy = Stand(r, "busy", busy=True)
    r.admit(busy, 100 * MB)
    threading.Timer(0.3, lambda: setattr(busy, "running", False)).start()  # its job ends (another waits)
    r.admit(Stand(r, "next"), 100 * MB)
    assert busy.unloaded == 1


def test_a_busy_model_yields_to_a_waiting_load_and_later_loads_queue_behind_it() -> None:
    """Fair swaps: while a load waits, the busy model is asked to take no new jobs (its queue then waits behind
    the swap); once its running jobs end it is evicted although jobs still wait for it. A load asked for
    later waits behind the first, even when it would fit first; each wait is logged."""
    lines: list[str] = []
    r = Residency(budget=1000 * MB, max_models=1, wait_s=30, log=ServeLog(write=lines.append))
    a = Stand(r, "a", busy=True)
    r.admit(a, 100 * MB)
    order: list[str] = []

    def load(w: Stand) -> None:
        r.admit(w, 100 * MB)
        order.append(w.name)
        r.released(w)  # it answers, then goes (the next may load)

    b, c = Stand(r, "b"), Stand(r, "c")
    first = threading.Thread(target=load, args=(b,))
    first.start()
    deadline = time.monotonic() + 10
    while not a.yielding and time.monotonic() < deadline:
        time.sleep(0.01)
    assert a.yielding == ["b"] and a.unloaded == 0  # asked to yield; still busy running
    second = threading.Thread(target=load, args=(c,))
    second.start()
    deadline = time.monotonic() + 60  # a safety net for busy cores, not a timing
    while r.status()["waiting"] != ["b", "c"]:  # c waits too, behind b
        assert time.monotonic() < deadline, r.status()["waiting"]
        time.sleep(0.01)
    a.running = False  # its running jobs end; its queue (busy) waits behind the swap
    first.join(10)
    second.join(10)
    assert order == ["b", "c"] and a.unloaded == 1 and a.yielding == [], "b first, then c; a resumed"
    assert r.status()["swaps_waited"] == 1 and r.evictions == 1 and r.loads == 3
    assert any("b waits for room: a takes no new requests" in line for line in lines), lines


def test_a_pinned_busy_model_is_never_asked_to_yield() -> None:
    r = Residency(budget=1000 * MB, max_models=1, wait_s=0.3)
    pinned = Stand(r, "pinned", pinned=True, busy=True)
    r.admit(pinned, 100 * MB)
    with pytest.raises(NoRoom):
        r.admit(Stand(r, "new"), 100 * MB)
    assert pinned.yielding == [] and r.status()["waiting"] == []


def test_at_start_a_load_behind_pinned_models_fails_at_once() -> None:
    """serve's start (not `patient`): every model loaded is pinned, so nothing would ever make room; the
    load says so at once instead of waiting --load-wait (serve -m A -m B --max-models 1 sat silent)."""
    r = Residency(budget=1000 * MB, max_models=1, wait_s=30)
    r.admit(Stand(r, "a", pinned=True), 100 * MB)
    t0 = time.monotonic()
    with pytest.raises(NoRoom, match=r"no room to load b beside a: -m pins") as e:
        r.admit(Stand(r, "b", pinned=True), 100 * MB, patient=False)
    assert time.monotonic() - t0 < 10 and "--max-models" in (e.value.hint or "")
    assert r.status()["waiting"] == [] and r.status()["loaded"] == ["a"]


def test_serve_with_more_pinned_models_than_room_says_so(cli: CLI) -> None:
    """serve.md: -m loads each model at start and pins it; two with --max-models 1 is one usage error before any
    load, two that fit --max-memory apart but not together one error line, exit 1, at once (it waited silently
    for room that never came)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = cli("serve", "--port", str(port), "-m", "smollm2:135m", "-m", "gemma3:270m", "--max-models", "1",
            timeout=100)  # more than --max-models: refused before the first loads (it loaded, then refused)
    assert (r.returncode, r.stderr) == (2, "localgen: error: -m names 2 models to keep loaded, and --max-models holds "
                                           "1 model at once (give --max-models 2 or more, or name fewer models with "
                                           "-m)\n")
    r = cli("serve", "--port", str(port), "-m", "smollm2:135m", "-m", "gemma3:270m", "--max-memory", "1400M",
            timeout=100)  # each fits the budget, not both: known only once the first is loaded
    assert r.returncode == 1 and "no room to load gemma3:270m beside smollm2:135m: -m pins each model it names, " \
        "and 3 models or 1.4 GiB is the most held at once" in r.stderr, r.stderr
    assert r.stderr.count("localgen: error:") == 1 and "Traceback" not in r.stderr


def test_a_model_bigger_than_the_budget_says_what_it_needs() -> None:
    r = Residency(budget=500 * MB, max_models=3)
    with pytest.raises(TooBig, match=r"needs about 800 MiB .* budget for loaded models is 500 MiB"):
        r.admit(Stand(r, "big"), 800 * MB)


def test_on_demand_makes_one_worker_per_model() -> None:
    from localgen.errors import ModelNotFoundError
    from localgen.serve.apierror import HTTPError
    from localgen.serve.ondemand import OnDemand
    from localgen.serve.state import ServeState
    from localgen.types import LoadParams, ModelRef

    made: list[str] = []

    class W:
        def __init__(self, ref: ModelRef) -> None:
            self.ref, self.name = ref, ref.name
            made.append(ref.name)

    def lookup(name: str) -> Any:
        if name not in ("m:1", "m"):
            raise ModelNotFoundError(f"no model {name}")
        return ModelRef(name="m:1", path="/m.gguf", source="embedded", summary=None)  # type: ignore[arg-type]

    state = ServeState(workers={}, on_demand=OnDemand(W, lookup, lambda: ["m:1", "m"], LoadParams()))
    w = state.worker("m:1")
    assert state.worker("m") is w and state.worker("m:1") is w and made == ["m:1"]
    for path in ("/etc/passwd", "../m.gguf", "owner/repo:Q4_K_M"):  # never a name that is not on the list
        with pytest.raises(HTTPError):
            state.worker(path)
    assert state.names() == ["m:1"]  # "m" asked for that model: it is listed once
    with pytest.raises(HTTPError) as e:
        state.worker("nope")
    assert e.value.status == 404 and "m:1" in e.value.message


# ---- a real server -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def one_at_a_time(cli_env: dict[str, str]) -> Iterator[Server]:
    s = Server(cli_env, "--max-models", "1", "-np", "1", "--ctx", "512")
    yield s
    assert s.stop() == 0


def _loaded(server: Server) -> list[str]:
    return [m["name"] for m in httpx.get(f"{server.url}/api/ps", timeout=30).json()["models"]]


def test_two_models_in_turn_under_a_budget_for_one(one_at_a_time: Server, cli: CLI) -> None:
    import ollama

    client = ollama.Client(host=one_at_a_time.url)
    names = [m.model for m in client.list().models]
    assert names[0] == "smollm2:135m" and "gemma3:270m" in names, names
    assert _loaded(one_at_a_time) == ["smollm2:135m"]  # the default, loaded at start
    for name in ("gemma3:270m", "smollm2:135m", "gemma3:270m"):
        r = client.generate(model=name, prompt="Say hi.", options={"num_predict": 4, "temperature": 0})
        assert r.response and r.done
        assert _loaded(one_at_a_time) == [name]
    ps = cli("ps", "--port", str(one_at_a_time.port))
    assert ps.returncode == 0 and "gemma3:270m" in ps.stdout and "100% CPU" in ps.stdout, ps.stderr
    health = httpx.get(f"{one_at_a_time.url}/health", timeout=30).json()["residency"]
    assert health["max_models"] == 1 and health["evictions"] >= 3 and health["loaded"] == ["gemma3:270m"]


def test_a_request_during_a_swap_waits(one_at_a_time: Server) -> None:
    """SmolLM2 generates 200 tokens while Gemma is asked for: Gemma's request waits for SmolLM2 to finish (it is
    busy, so it is not evicted), then both have answered."""
    url = f"{one_at_a_time.url}/api/generate"
    results: dict[str, Any] = {}

    def ask(name: str, n: int) -> None:
        results[name] = httpx.post(url, timeout=600, json={"model": name, "prompt": "Count to 100.", "stream": False,
                                                            "options": {"num_predict": n, "temperature": 0,
                                                                        "ignore_eos": True}})

    first = threading.Thread(target=ask, args=("smollm2:135m", 200))
    first.start()
    deadline = time.monotonic() + 300
    while "smollm2:135m" not in _loaded(one_at_a_time) and time.monotonic() < deadline:
        time.sleep(0.1)
    ask("gemma3:270m", 4)
    first.join()
    assert {n: r.status_code for n, r in results.items()} == {"smollm2:135m": 200, "gemma3:270m": 200}
    assert results["smollm2:135m"].json()["eval_count"] == 200


def test_ps_with_no_server(cli: CLI) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = cli("ps", "--port", str(port))
    assert r.returncode == 1 and "no localgen serve is running" in r.stderr and "Traceback" not in r.stderr


def test_ps_says_when_a_model_unloads_in_words() -> None:
    """`localgen ps`'s UNTIL, as Ollama's: a model 20 s from unloading said "0 minutes from now"."""
    from localgen.cli.serve.ps import until_text

    assert until_text(20.4) == "20 seconds from now" and until_text(1) == "1 second from now"
    assert until_text(-3) == "0 seconds from now" and until_text(299.6) == "5 minutes from now"
    assert until_text(60 * 90) == "90 minutes from now" and until_text(3 * 3600) == "3 hours from now"
    assert until_text(400 * 86400) == "forever"


def test_defaults_three_models_and_most_of_the_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """--max-models 3 (per GPU when offloading), --max-memory 90 % of RAM (plus GPU memory when offloading);
    a size in the flag's units, and a bad one is a usage error."""
    from localgen import hardware
    from localgen.cli.serve import checks as serve
    from localgen.cli.serve.options import ResidencyOptions
    from localgen.errors import UsageError

    offload = True  # -ngl not given (not 0)
    monkeypatch.setattr(hardware, "gpus", lambda: [])
    monkeypatch.setattr(hardware, "total_ram_bytes", lambda: 10 * 1024 * MB)
    r = serve._residency(ResidencyOptions(), offload)
    assert (r.max_models, r.budget) == (3, int(10 * 1024 * MB * 0.9))
    two = [hardware.GPU("a", 8 * 1024 * MB, 0), hardware.GPU("b", 8 * 1024 * MB, 0)]
    monkeypatch.setattr(hardware, "gpus", lambda: two)
    r = serve._residency(ResidencyOptions(), offload)
    assert (r.max_models, r.budget) == (6, int(26 * 1024 * MB * 0.9))
    r = serve._residency(ResidencyOptions(max_memory="12G", max_models=2), offload)
    assert (r.max_models, r.budget) == (2, 12 * 1024 * MB)
    with pytest.raises(UsageError, match="--max-memory takes a size"):
        serve._residency(ResidencyOptions(max_memory="lots"), offload)


def test_a_load_with_no_room_is_a_503_for_its_request() -> None:
    import asyncio

    from localgen.serve.jobs import Failed, Job
    from localgen.serve.worker import ModelWorker
    from localgen.types import GenerationRequest, LoadParams, ModelRef

    class Full:
        def admit(self, worker: Any, need: int) -> None:
            raise NoRoom("no room to load m: the models loaded (a) are pinned or busy")

        def released(self, worker: Any) -> None:
            raise AssertionError("nothing was held")

    ref = ModelRef(name="m", path=str(__file__), source="path", summary=None)  # type: ignore[arg-type]
    w = ModelWorker(ref, LoadParams(), 1, -1, 4, residency=Full(), pinned=False)
    # the footprint of a real file is not the point
    w.residence.__dict__["ensure"] = lambda warm, wanted=None, **_: Full().admit(w, 1)
    loop = asyncio.new_event_loop()
    try:
        job = Job(GenerationRequest(prompt="x"), loop)
        sent: list[Any] = []
        job.send = sent.append  # type: ignore[method-assign]
        failure = w._load_for(job)
        assert isinstance(failure, Failed) and failure.status == 503 and "pinned or busy" in failure.message
    finally:
        loop.close()


def _prefix_reuse(server: Server, while_away: Any = lambda: None) -> tuple[int, int]:
    """SmolLM2 answers a long question, Gemma 3 takes its place, SmolLM2 answers it again: how many prompt
    tokens that second answer found already evaluated (llama-server's timings.cache_n), and how many it has.
    The question: 163 tokens, well past the 64 a prefix needs to be kept (engine/hostcache.py's MIN_TOKENS)."""
    ask = {"messages": [{"role": "user", "content": " ".join(f"Fact {i}: river {i} flows north." for i in range(12))
                         + "\nWhich way does river 7 flow?"}], "max_tokens": 2, "temperature": 0}
    url = f"{server.url}/v1/chat/completions"
    assert httpx.post(url, json={**ask, "model": "smollm2:135m"}, timeout=600).status_code == 200
    # Gemma (a base model: a completion) loads in its place: SmolLM2 was evicted for it
    assert httpx.post(f"{server.url}/v1/completions", timeout=600,
                      json={"model": "gemma3:270m", "prompt": "Rivers", "max_tokens": 1}).status_code == 200
    assert _loaded(server) == ["gemma3:270m"]
    while_away()
    again = httpx.post(url, json={**ask, "model": "smollm2:135m"}, timeout=600).json()
    return int(again["timings"]["cache_n"]), int(again["usage"]["prompt_tokens"])


@pytest.mark.parametrize("warm", [True, False])
def test_a_reload_finds_the_prefixes_it_held(cli_env: dict[str, str], warm: bool, tmp_path: Path) -> None:
    """With the prompt cache on disk (the default) the prefixes of an evicted model wait on disk and come back
    with it: the same long question after the reload evaluates only the rows a fresh evaluation computes
    otherwise; with --cache-disk 0, all of it again."""
    s = Server({**cli_env, "LOCALGEN_HOME": str(tmp_path)}, "--max-models", "1", "-np", "1", "--ctx", "1024",
               *(() if warm else ("--cache-disk", "0")))
    seen_on_disk: list[Path] = []
    store = tmp_path / "cache" / "serve-prefixes"
    try:
        reused, prompt = _prefix_reuse(s, lambda: seen_on_disk.extend(store.glob("*/*.prefix")))
        health = httpx.get(f"{s.url}/health", timeout=30).json()
    finally:
        assert s.stop() == 0
    model = health["models"]["smollm2:135m"]
    if warm:
        # all but the rows a fresh evaluation computes otherwise (engine/tokens.py), the last token with them
        assert reused == reusable_prefix(prompt, prompt, prompt, *SERVE_GRID) > MIN_TOKENS, (reused, prompt)
        assert model["warm_restored"] >= 1 and model["prompt_cache"]["disk_loads"] >= 1
        assert seen_on_disk, "written at the eviction"
        assert health["prefix_store"]["read"] >= 1 and health["prefix_store"]["bytes"] > 0
    else:
        assert reused == 0 and model["warm_restored"] == 0 and not store.exists() and "prefix_store" not in health


def test_an_idle_model_writes_its_prefixes_without_a_stop(smollm2_path: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/serve.md: while idle the prompt cache is written to disk now and then, "so that a crash loses
    little". A real worker on SmolLM2 answers a long prompt and is then left idle, never stopped (as a server
    killed with SIGKILL would be): the store comes to hold that prompt as a prefix. (KEEP_EVERY_S made short.)"""
    import asyncio

    from localgen.engine.prefixstore import PrefixStore
    from localgen.models.resolve import resolve
    from localgen.native.lib import build_id
    from localgen.serve import residence
    from localgen.serve.jobs import Done, Job
    from localgen.serve.worker import ModelWorker
    from localgen.types import GenerationRequest, LoadParams, SamplingParams

    monkeypatch.setattr(residence, "KEEP_EVERY_S", 0.2)
    store = PrefixStore(tmp_path / "prefixes", 1 << 30, build_id())
    w = ModelWorker(resolve(str(smollm2_path)), LoadParams(n_ctx=512), 1, -1, 4, cache_ram=64 * MB, store=store)
    w.start()
    prompt = " ".join(f"Fact {i}: river {i} flows north." for i in range(12))
    loop = asyncio.new_event_loop()
    try:
        job = Job(GenerationRequest(prompt=prompt, sampling=SamplingParams(max_tokens=2, temperature=0)), loop,
                  stream=False)
        w.submit(job)
        event = loop.run_until_complete(asyncio.wait_for(job.events.get(), 300))
        assert isinstance(event, Done), event
        tokens = event.completion.prompt_tokens
        assert tokens > MIN_TOKENS
        deadline = time.monotonic() + 60
        files: list[Path] = []
        while not files and time.monotonic() < deadline:
            time.sleep(0.1)
            files = list((tmp_path / "prefixes").glob("*/*.prefix"))
        assert files, "the idle worker wrote what its slot holds"
        assert w.thread.is_alive() and w.loaded, "written while serving, not at a stop or an unload"
    finally:
        loop.close()
        w.stop()


def test_a_load_abandoned_by_every_client_counts_each_job_as_aborted() -> None:
    """/health's aborted_jobs counts each job whose client left: a load given up because every client waiting
    for it left fails the job that asked for it and those held back with it, each a 499, each counted once."""
    import asyncio

    from localgen.serve.jobs import Failed, Job, State
    from localgen.serve.residency import Abandoned
    from localgen.serve.worker import ModelWorker
    from localgen.types import GenerationRequest, LoadParams, ModelRef

    ref = ModelRef(name="m", path=str(__file__), source="path", summary=None)  # type: ignore[arg-type]
    w = ModelWorker(ref, LoadParams(), 4, -1, 4, residency=None, pinned=False)
    loop = asyncio.new_event_loop()
    try:
        jobs = [Job(GenerationRequest(prompt="x"), loop) for _ in range(3)]
        sent: list[list[Any]] = []
        for job in jobs:
            w.submit(job)
            sent.append([])
            job.send = lambda e, send=job.send, seen=sent[-1]: (seen.append(e), send(e))  # type: ignore[method-assign]
        jobs[1].state = jobs[2].state = State.HELD  # held back while the model yielded its room

        def leave(warm: bool, wanted: Any = None, **_: Any) -> None:  # every client leaves while it waits
            for job in jobs:
                job.cancelled.set()
            raise Abandoned("nobody waits for m any more")

        w.residence.__dict__["ensure"] = leave
        w._intake(wait=False)
        assert [[type(e).__name__ for e in s] for s in sent] == [["Failed"]] * 3
        assert all(isinstance(s[0], Failed) and s[0].status == 499 for s in sent)
        assert w.aborted == 3
    finally:
        loop.close()


def test_a_closed_worker_stopped_mid_job_answers_it_and_frees_its_room(smollm2_path: Path) -> None:
    """A worker closed (its model being deleted or replaced: serve/manage.py) takes no more jobs, and once
    stopped answers every job it still had (a 409), and frees the model: the residency counts it no more, so
    under --max-models 1 another model can load. Its thread used to end with the job unanswered (its client
    hung) and the model counted as loaded for good."""
    import asyncio

    from localgen.models.resolve import resolve
    from localgen.serve.jobs import Failed, Job, Retired, Text
    from localgen.serve.worker import ModelWorker
    from localgen.types import GenerationRequest, LoadParams, SamplingParams

    r = Residency(budget=1 << 40, max_models=1)
    w = ModelWorker(resolve(str(smollm2_path)), LoadParams(n_ctx=512), 1, -1, 4, residency=r, pinned=False)
    w.start()
    loop = asyncio.new_event_loop()
    try:
        story = SamplingParams(max_tokens=400, ignore_eos=True)
        job = Job(GenerationRequest(prompt="Tell a long story.", sampling=story), loop)
        w.submit(job)
        event = loop.run_until_complete(asyncio.wait_for(job.events.get(), 300))
        assert isinstance(event, Text) and r.status()["loaded"] == [w.name], event  # loaded, and generating
        w.close(f"{w.name} is being deleted")
        with pytest.raises(Retired, match="being deleted"):
            w.submit(Job(GenerationRequest(prompt="Hi"), loop))
        w.stop(timeout=0)
        while isinstance(event, Text):
            event = loop.run_until_complete(asyncio.wait_for(job.events.get(), 60))
        assert isinstance(event, Failed) and event.status == 409 and "being deleted" in event.message, event
        assert not w.loaded and r.status()["loaded"] == [] and r.status()["held_bytes"] == 0
    finally:
        loop.close()
        w.stop()


# ---- an embeddings context: counted as the rest of a model's memory ------------------------------------------

def test_an_embeddings_context_made_later_makes_room_as_a_load_does() -> None:
    """serve.md: a model that makes its embeddings context on demand asks for that room as a load does: the least
    recently used idle model is unloaded for it; more than the whole budget is TooBig, naming what it needs, and
    the model keeps what it held."""
    r = Residency(budget=1000 * MB, max_models=3)
    a, b = Stand(r, "a"), Stand(r, "b")
    r.admit(a, 300 * MB)
    r.admit(b, 300 * MB)
    r.grow(a, 100 * MB)  # 400 MiB beside b's 300
    assert b.unloaded == 0 and r.status()["held_bytes"] == 700 * MB
    r.grow(a, 400 * MB)  # 800 MiB: not beside b
    assert b.unloaded == 1 and r.status()["loaded"] == ["a"] and r.status()["held_bytes"] == 800 * MB
    with pytest.raises(TooBig, match=r"a needs about 1\.1 GiB .* budget for loaded models is 1,000 MiB"):
        r.grow(a, 300 * MB)
    assert r.status()["held_bytes"] == 800 * MB and r.status()["loaded"] == ["a"]
    assert (r.loads, r.evictions) == (2, 1)  # growing is no load


def _ps_size(server: Server, name: str) -> int:
    models = {m["name"]: m["size"] for m in httpx.get(f"{server.url}/api/ps", timeout=30).json()["models"]}
    return int(models[name])


def _embed_buffers(cli: CLI, model: str, ctx: int) -> int:
    """llama.cpp's KV, output and compute buffers of the embeddings context `localgen embed` makes (its last)."""
    import re

    r = cli("embed", "-m", model, "--ctx", str(ctx), "--verbose", "the cat sat")
    assert r.returncode == 0, r.stderr[-2000:]
    log = r.stderr[r.stderr.rindex("n_ctx "):]
    return int(sum(float(x) for x in re.findall(r"(?:KV|output|compute) buffer size =\s+([\d.]+) MiB", log)) * MB)


def test_an_embeddings_request_counts_its_context_in_ps_and_the_budget(cli_env: dict[str, str], cli: CLI) -> None:
    """serve.md "How many stay loaded": SmolLM2's first embeddings request makes a context of its own (a 512-token
    micro-batch: ~120 MiB of logits and buffers beside 95 MiB of weights), which /api/ps, `localgen ps` and the
    budget count from then on, as llama.cpp reports its buffers; under a --max-memory that holds SmolLM2 and
    Gemma but not that context too, the idle Gemma is unloaded for it; under one that cannot hold it beside
    SmolLM2 alone, the request is refused naming what it needs, and SmolLM2 still answers (its context was not
    counted: the server held more than --max-memory)."""
    from localgen.models.footprint import COMPUTE_TOLERANCE

    args = ("-np", "1", "--ctx", "512", "--max-models", "2", "--keep-alive", "-1")
    embed = {"model": "smollm2:135m", "input": "the cat sat"}
    s = Server(cli_env, *args)
    try:
        before = _ps_size(s, "smollm2:135m")
        r = httpx.post(f"{s.url}/api/generate", json={"model": "gemma3:270m", "prompt": "", "stream": False},
                       timeout=300)
        assert r.status_code == 200, r.text
        gemma = _ps_size(s, "gemma3:270m")
        assert httpx.post(f"{s.url}/v1/embeddings", json=embed, timeout=300).status_code == 200
        after = _ps_size(s, "smollm2:135m")
        ps = cli("ps", "--port", str(s.port), "--json")
        assert ps.returncode == 0, ps.stderr
        assert str(after) in ps.stdout, ps.stdout
        assert httpx.get(f"{s.url}/health", timeout=30).json()["residency"]["held_bytes"] == after + gemma
    finally:
        assert s.stop() == 0
    assert s.proc.stderr is not None
    log = s.proc.stderr.read().decode()
    assert "localgen serve: smollm2:135m makes its embeddings context (about " in log and " in all)" in log, log
    grown, buffers = after - before, _embed_buffers(cli, "smollm2:135m", 512)
    assert abs(grown - buffers) <= COMPUTE_TOLERANCE * buffers, (grown, buffers)

    s = Server(cli_env, *args, "--max-memory", str(before + gemma + grown // 2))
    try:
        r = httpx.post(f"{s.url}/api/generate", json={"model": "gemma3:270m", "prompt": "", "stream": False},
                       timeout=300)
        assert r.status_code == 200 and sorted(_loaded(s)) == ["gemma3:270m", "smollm2:135m"], r.text
        assert httpx.post(f"{s.url}/v1/embeddings", json=embed, timeout=300).status_code == 200
        assert _loaded(s) == ["smollm2:135m"] and _ps_size(s, "smollm2:135m") == after  # Gemma made room
        assert httpx.get(f"{s.url}/health", timeout=30).json()["residency"]["evictions"] == 1
    finally:
        assert s.stop() == 0

    s = Server(cli_env, *args, "--max-memory", str(before + grown // 2))
    try:
        r = httpx.post(f"{s.url}/v1/embeddings", json=embed, timeout=300)
        assert r.status_code == 500, r.text
        said = r.json()["error"]["message"]
        assert said.startswith("no room for smollm2:135m's embeddings context: smollm2:135m needs about ") and \
            "the budget for loaded models is" in said, said
        assert _ps_size(s, "smollm2:135m") == before
        r = httpx.post(f"{s.url}/v1/completions", json={"model": "smollm2:135m", "prompt": "Hi", "max_tokens": 2},
                       timeout=300)
        assert r.status_code == 200, r.text
    finally:
        assert s.stop() == 0


def test_an_embedding_models_context_is_counted_from_its_load(cli_env: dict[str, str], cli: CLI,
                                                              tmp_path: Path) -> None:
    """serve.md: an embedding model (tests/tiny_bert.py's BERT) has its embeddings context counted from its load
    on: the figure /api/ps shows grows with the window its micro-batch spans (n_batch = n_ubatch = --ctx) at least
    as llama.cpp's buffers do, and a --max-memory that holds the rest of the model but not that context refuses it
    at start, as a model bigger than the budget is (it loaded, and the budget never saw the context)."""
    import socket

    from tests.tiny_bert import build

    bert = str(build(tmp_path / "tiny-bert.gguf"))
    sizes = {}
    for ctx in (256, 512):
        s = Server(cli_env, "-m", bert, "-np", "1", "--ctx", str(ctx))
        try:
            sizes[ctx] = _ps_size(s, "tiny-bert.gguf")
        finally:
            assert s.stop() == 0
    llama_cpp = _embed_buffers(cli, bert, 512) - _embed_buffers(cli, bert, 256)
    assert sizes[512] - sizes[256] >= (1 - 0.05) * llama_cpp, (sizes, llama_cpp)

    from localgen.models.resolve import resolve
    from localgen.serve.model import embeddings_footprint
    from localgen.types import LoadParams

    context = embeddings_footprint(resolve(bert), LoadParams(n_ctx=512))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    r = cli("serve", "--port", str(port), "-m", bert, "-np", "1", "--ctx", "512", "--max-memory",
            str(sizes[512] - context // 2), timeout=100)
    assert r.returncode == 1 and "tiny-bert.gguf needs about" in r.stderr and "budget for loaded models" in r.stderr, \
        r.stderr
    assert r.stderr.count("localgen: error:") == 1 and "Traceback" not in r.stderr


def test_on_apple_silicon_the_default_budget_is_no_more_than_metal_may_use(monkeypatch: pytest.MonkeyPatch) -> None:
    """serve.md: on Apple Silicon when offloading, --max-memory's default is no more than Metal may use (two
    thirds of 16 GiB, not 90 % of it: models loaded side by side must all fit in Metal's working set)."""
    from localgen import hardware
    from localgen.cli.serve import checks as serve
    from localgen.cli.serve.options import ResidencyOptions

    monkeypatch.setattr(hardware, "total_ram_bytes", lambda: 16 * 1024 * MB)
    monkeypatch.setattr(hardware, "gpus", lambda: [hardware.GPU("Apple Silicon (unified memory)",
                                                                16 * 1024 * MB * 2 // 3, None, True)])
    assert serve._residency(ResidencyOptions(), True).budget == 16 * 1024 * MB * 2 // 3
    assert serve._residency(ResidencyOptions(), False).budget == int(16 * 1024 * MB * 0.9)  # all on the CPU


def test_a_model_being_loaded_is_listed_loading(monkeypatch: pytest.MonkeyPatch, cli_in_process: Any) -> None:
    """docs/serve.md: once its room is made, a model being loaded is in /api/ps with `"loading": true` and in
    `localgen ps` as `loading` (a swap's new model was in neither while /health had it among those loaded: `ps`
    said no model was loaded for as long as a large model's memory filled). One not loaded, and not loading, is
    in neither."""
    from types import SimpleNamespace

    from starlette.testclient import TestClient

    from localgen.cli.serve import ps as ps_command
    from localgen.serve import listings
    from localgen.serve.app import build
    from localgen.serve.guard import Policy
    from localgen.serve.state import ServeState

    monkeypatch.setattr(listings, "_digest", lambda ref: "0" * 64)
    summary = SimpleNamespace(architecture="llama", n_params=135_000_000, quantization="Q4_1", file_size=100 * MB)

    def worker(name: str, loading: bool) -> Any:
        ref = SimpleNamespace(path="/nonexistent/m.gguf", summary=summary)
        residence = SimpleNamespace(need=300 * MB, vram_bytes=0, placement={}, loading=loading)
        return SimpleNamespace(name=name, ref=ref, loaded=False, n_ctx=4096, yielding_to=[], expires=lambda: None,
                               residence=residence)

    state = ServeState(workers={"new": worker("new", True), "idle": worker("idle", False)})  # type: ignore[dict-item]
    client = TestClient(build(state, Policy(check_host=False)))
    listed = client.get("/api/ps").json()["models"]
    assert [(m["name"], m.get("loading"), m["size"], m["context_length"]) for m in listed] == [
        ("new", True, 300 * MB, 4096)], listed
    monkeypatch.setattr(ps_command.Server, "ask", lambda self, path: client.get(path))
    r = cli_in_process("ps")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[1].split() == ["new", "300", "MiB", "-", "4,096", "loading"], r.stdout


def test_a_residence_is_loading_from_its_room_made_to_its_load_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    """Residence.loading (what /api/ps lists as loading): true while the model's load runs, false once it failed
    or ended."""
    from localgen.models.resolve import resolve
    from localgen.serve import model
    from localgen.serve.residence import Residence
    from localgen.types import LoadParams

    seen: list[bool] = []
    res = Residence(object(), resolve("smollm2:135m"), LoadParams(n_ctx=512), 1, 300, fault=lambda e, s: None)

    def failing_load(*args: Any, **kw: Any) -> Any:
        seen.append(res.loading)
        raise OSError("no such file")

    monkeypatch.setattr(model, "open_model", failing_load)
    assert not res.loading
    with pytest.raises(OSError):
        res.ensure(warm=False)
    assert seen == [True] and not res.loading and not res.loaded
