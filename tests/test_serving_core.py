"""The serving core (engine/scheduler.py) through its public API: jobs added, steps taken, outputs read.
A large embeddings task runs a slice a step beside a stream; aborts end any job at the next step; faults
come out as typed errors with the status they answer with. And in a real server: an embeddings request
whose client leaves is aborted, not computed to its end."""

from __future__ import annotations

import itertools
import json
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from localgen.engine.batch import ParallelContext
from localgen.engine.batchseq import Request
from localgen.engine.embed import ContextTooSmall, Embedder, EmbedTask
from localgen.engine.scheduler import SLICE_TOKENS, Finished, Piece, Result, Scheduler
from localgen.errors import Cancelled, PromptTooLong
from localgen.native.prompt import Prompt
from localgen.types import SamplingParams
from tests.test_serve import Server


def _greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def _chat(eng: Any, text: str) -> list[int]:
    return list(eng.chat_tokens([{"role": "user", "content": text}]))


@pytest.fixture
def core(smollm2_engine: object) -> Any:
    eng: Any = smollm2_engine
    pc = ParallelContext(eng, 2, 512, pooled=True)
    emb = Embedder(eng)
    yield eng, pc, emb
    emb.close()
    pc.close()


def test_a_large_embeddings_task_runs_a_slice_a_step_beside_a_stream(core: Any) -> None:
    eng, pc, emb = core
    # 42 texts: 32 go in bounded slices (8 a step) while the 5-token stream runs, the other 10 (more than a
    # slice may hold) in one step after it; every step is a llama_decode for the stream and one for the
    # slice, so the stream is kept short
    texts = [f"note {i}: the weather is fine today, and the river is calm" for i in range(42)]
    sched = Scheduler(pc)
    sched.add(Request(0, Prompt.text(_chat(eng, "Tell me a story.")), _greedy(5)))
    task = EmbedTask(1, emb, texts)
    sched.add(task)
    per_step: list[tuple[int, int]] = []  # (the stream's tokens, texts embedded) after each step
    result: Result | None = None
    text = ""
    while not sched.idle:
        outs = sched.step()
        text += "".join(o.text for o in outs if isinstance(o, Piece) and o.id == 0)
        result = next((o for o in outs if isinstance(o, Result)), result)
        stream = next((len(s.dec.tokens) for s in sched.active.values() if s.req.index == 0), None)
        per_step.append((stream if stream is not None else -1, len(task.done)))
    assert result is not None and result.error is None and len(result.value) == len(texts)
    while_streaming = [(k, n) for k, (tok, n) in enumerate(per_step) if tok >= 0]
    assert [per_step[k][0] for k, _ in while_streaming] == list(range(1, len(while_streaming) + 1)), \
        "the stream got a token at every step"
    per_text = len(emb.tokens(texts[0]))
    slices = [b - a for (_, a), (_, b) in itertools.pairwise(while_streaming)]
    assert slices and max(slices) * per_text <= SLICE_TOKENS + per_text, "a bounded slice a step while it streams"
    assert len(task.done) == len(texts) and sum(slices) < len(texts), "the rest once the stream had ended"
    after = next(n for tok, n in per_step if tok < 0) - while_streaming[-1][1]
    assert after * per_text > SLICE_TOKENS + per_text and after + while_streaming[-1][1] == len(texts), \
        "all the rest in the first step after the stream: no slices then"
    alone = emb.embed([emb.tokens(t) for t in texts[:3]])  # in other company: rounded differently
    for got, want in zip(result.value[:3], alone, strict=True):
        assert sum(a * b for a, b in zip(got.vector, want.vector, strict=True)) > 0.999, "each text's own vector"
    assert text, "the stream's text came out as Pieces"


def test_an_abort_ends_a_waiting_a_running_and_a_task_job_at_the_next_step(core: Any) -> None:
    eng, pc, emb = core
    sched = Scheduler(pc)
    sched.add(Request(1, Prompt.text(_chat(eng, "Count to a hundred.")), _greedy(50)))
    sched.add(Request(2, Prompt.text(_chat(eng, "Name a colour.")), _greedy(50)))
    sched.add(Request(3, Prompt.text(_chat(eng, "Name a river.")), _greedy(50)))  # two slots: this one waits
    sched.add(EmbedTask(4, emb, [f"text {i} about the sea" for i in range(2000)]))
    for _ in range(2):  # the running ones through a decoding step, the task through two of its slices
        sched.step()
    assert len(sched.active) == 2 and sched.room < 0
    for job_id in (1, 3, 4):
        sched.abort(job_id)
    outs = sched.step()
    ended = {o.id: o for o in outs if isinstance(o, (Finished, Result))}
    assert set(ended) == {1, 3, 4}
    assert ended[1].completion.finish_reason == "cancelled" and 1 <= ended[1].completion.completion_tokens < 50
    assert ended[3].completion.finish_reason == "cancelled" and ended[3].completion.completion_tokens == 0
    assert isinstance(ended[4].error, Cancelled) and ended[4].error.status == 499
    assert sched.ids() == {2}, "job 2 runs on; job 3 never took a slot"
    sched.abort_all()
    sched.step()
    assert sched.idle and sorted(sched.free) == [0, 1], "every slot free again"


def test_faults_come_out_as_typed_errors(core: Any) -> None:
    _eng, pc, emb = core
    sched = Scheduler(pc)
    sched.add(Request(1, Prompt.text(list(range(10, 10 + pc.n_ctx_seq))), _greedy(4)))
    sched.add(EmbedTask(2, emb, ["fine", "word " * 3000]))
    outs: list[Any] = []
    while not sched.idle:
        outs += sched.step()
    too_long = next(o for o in outs if isinstance(o, Finished)).completion
    assert isinstance(too_long.error, PromptTooLong) and too_long.error.status == 400
    failed = next(o for o in outs if isinstance(o, Result))
    assert isinstance(failed.error, ContextTooSmall) and failed.error.status == 400


def test_a_cancelled_task_stops_inside_its_slice_and_the_embedder_goes_on(core: Any) -> None:
    """llama.cpp's abort callback asks the task's `cancelled` while it computes: a window-long text is not
    encoded to its end for an absent client (the test cancels before the first operation)."""
    _eng, pc, emb = core
    sched = Scheduler(pc)
    sched.add(EmbedTask(1, emb, ["the river runs past the old mill. " * 40], cancelled=lambda: True))
    outs = sched.step()
    assert len(outs) == 1 and isinstance(outs[0], Result) and isinstance(outs[0].error, Cancelled)
    again = EmbedTask(2, emb, ["the river runs past the old mill."])
    assert again.step(None) and len(again.value) == 1, "the next task is encoded as usual"


@pytest.fixture(scope="module")
def server(cli_env: dict[str, str]) -> Any:
    s = Server(cli_env, "-np", "2", "--ctx", "1024")
    yield s
    assert s.stop() == 0


def test_an_embeddings_request_whose_client_leaves_is_aborted(server: Any) -> None:
    texts = [f"note {i}: the weather is fine today" for i in range(2000)]  # ~24,000 tokens: many seconds
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{server.url}/v1/embeddings", json={"model": "smollm2:135m", "input": texts}, timeout=1.0)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        health = server.health()
        if health["aborted_jobs"] == 1 and health["running"] == 0:
            break
        time.sleep(0.1)
    assert health["aborted_jobs"] == 1 and health["running"] == 0, health
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
        "model": "smollm2:135m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    assert r.status_code == 200 and server.health()["aborted_jobs"] == 1


# ---- prompts with images or audio are made off the model's thread (serve/prepare.py) ----

def test_media_prompts_are_made_in_the_media_thread_and_wake_the_worker() -> None:
    import threading

    from localgen.serve.prepare import MediaPrep

    class Backend:  # what MediaPrep asks of a LocalBackend
        def __init__(self) -> None:
            self.loaded_in: list[str] = []
            self.made_in: list[str] = []

        def check_generates(self) -> None:
            pass

        def projector(self) -> None:
            self.loaded_in.append(threading.current_thread().name)

        def prompt(self, request: Any) -> Prompt:
            self.made_in.append(threading.current_thread().name)
            if request == "bad":
                raise PromptTooLong("too long")
            return Prompt.text([1, 2, 3])

    class Job:
        def __init__(self, request: str) -> None:
            self.request = request

    woken = threading.Semaphore(0)
    prep = MediaPrep(woken.release)
    backend = Backend()
    prep.submit(1, Job("fine"), backend)
    prep.submit(2, Job("bad"), backend)
    assert prep.pending == 2
    ready: list[Any] = []
    while len(ready) < 2:
        assert woken.acquire(timeout=30), "the media thread never woke the worker"
        ready += prep.ready()
    prep.close()
    got = {job_id: (prompt, type(error).__name__ if error else None) for job_id, _job, prompt, error in ready}
    assert got == {1: (Prompt.text([1, 2, 3]), None), 2: (None, "PromptTooLong")}
    assert backend.loaded_in == [threading.current_thread().name] * 2, "the projector loads in the model's thread"
    assert backend.made_in and all(n.startswith("localgen-media") for n in backend.made_in), backend.made_in
    assert prep.pending == 0


SMALL_BATCH = 256


@pytest.fixture
def small_batch_engine(smollm2_path: Path) -> Iterator[Any]:
    """SmolLM2 loaded with n_batch 256 (smollm2_engine's is 512): three pieces of a prompt then take ~530
    tokens to evaluate, not ~1,100 (prompt evaluation is most of what the long-prompt test costs)."""
    from localgen.engine.llama import Engine
    from localgen.models.resolve import resolve
    from localgen.types import LoadParams

    engine = Engine(resolve(str(smollm2_path)), LoadParams(n_ctx=2048, n_batch=SMALL_BATCH))
    yield engine
    engine.close()


def test_an_exact_long_prompt_is_evaluated_a_piece_a_step_beside_a_stream(small_batch_engine: Any) -> None:
    """The exact policy (serve's on a CPU) evaluates a new prompt in the single-stream path's n_batch pieces,
    one a step while other sequences decode, so a long prompt holds a running stream up for one piece at a
    time; the answer is still the one the prompt gets alone."""
    eng: Any = small_batch_engine
    # about 590 tokens: past two pieces (2 x n_batch, 256 each), so three steps evaluate it; and past 512,
    # so its answer is decoded over 512+ KV cells, in calls of its own (on 2 threads, decoding it beside the
    # stream instead changes this answer)
    long_text = " ".join(f"Item {i} is a small blue stone found by the river." for i in range(40))
    long_prompt = _chat(eng, "Here is a list. " + long_text + " Which colour are the stones?")
    pc = ParallelContext(eng, 2, 2048)
    assert pc.n_chunk == eng.n_batch == SMALL_BATCH
    assert 2 * pc.n_chunk < len(long_prompt) <= 3 * pc.n_chunk and len(long_prompt) > 512, len(long_prompt)
    sampling = _greedy(8)
    eng.kv.clear()  # alone means from the first token, in n_batch pieces: not after a prefix an earlier test left
    gen = eng.generate(Prompt.text(long_prompt), sampling)
    alone = "".join(c.text for c in gen)
    sched = Scheduler(pc, exact=None, reuse=True, interleave=True)
    answers: dict[int, str] = {0: "", 1: ""}
    trace: list[tuple[int, int]] = []  # (the stream's tokens, the long prompt's evaluated tokens) per step
    try:
        # still running past the 3 pieces
        sched.add(Request(0, Prompt.text(_chat(eng, "Tell me a story.")), _greedy(12)))
        sched.step()
        sched.add(Request(1, Prompt.text(long_prompt), sampling))
        while not sched.idle:
            for o in sched.step():
                if isinstance(o, Piece):
                    answers[o.id] += o.text
            by_id = {s.req.index: s for s in sched.active.values()}
            if 1 in by_id and 0 in by_id:
                trace.append((len(by_id[0].dec.tokens), by_id[1].filled))
    finally:
        sched.close()
        pc.close()
    assert answers[1] == alone, "pieces beside a stream change nothing in an exact answer"
    filling = [(tok, filled) for tok, filled in trace if filled < len(long_prompt)]
    assert len(filling) >= 2, trace
    for (tok0, f0), (tok1, f1) in itertools.pairwise(filling):
        assert 0 < f1 - f0 <= pc.n_chunk, "one piece of the prompt a step"
        assert tok1 == tok0 + 1, "and the stream's next token in the same step"


PAUSE_S = 6.0  # past the default drain (4 s) and uvicorn's wait after it (1 s more)


def _listening(port: int) -> bool:
    with socket.socket() as c:
        return c.connect_ex(("127.0.0.1", port)) == 0


def _sigterm_mid_stream(cli_env: dict[str, str], drain: str, max_tokens: int, pause: bool) -> tuple[list[str], bool]:
    """A server with --drain-timeout DRAIN streams MAX_TOKENS tokens and gets SIGTERM after the first. With
    `pause`, once its shutdown has begun (its listener closed, the drain's timer and uvicorn's wait started) it
    is paused (SIGSTOP) for PAUSE_S: on its clock the stream then runs past the default drain, whatever the
    machine's speed. The stream's data lines, and whether it was still running when the server paused."""
    s = Server(cli_env, "-np", "1", "--drain-timeout", drain)
    lines: list[str] = []
    first, ended = threading.Event(), threading.Event()

    def stream() -> None:
        body = {"model": "smollm2:135m", "prompt": "Once", "max_tokens": max_tokens, "ignore_eos": True,
                "stream": True}
        with httpx.stream("POST", f"{s.url}/v1/completions", json=body, timeout=600) as r:
            for line in r.iter_lines():
                if line.startswith("data:"):
                    lines.append(line)
                    first.set()
        ended.set()

    t = threading.Thread(target=stream)
    running_at_pause = False
    try:
        t.start()
        assert first.wait(120), "the stream produced its first token"
        s.proc.send_signal(signal.SIGTERM)
        if pause:
            deadline = time.monotonic() + 120  # a safety net
            while _listening(s.port) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert not _listening(s.port), "the server began its shutdown"
            time.sleep(0.5)  # uvicorn's wait for the requests in flight starts 0.1 s after its listener closes
            s.proc.send_signal(signal.SIGSTOP)
            time.sleep(PAUSE_S)
            running_at_pause = not ended.is_set()  # what the server sent before the pause has arrived by now
            s.proc.send_signal(signal.SIGCONT)
        t.join(600)
        assert s.proc.wait(timeout=600) == 0
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
    return lines, running_at_pause


@pytest.mark.parametrize("drain", ["0", "600"])
def test_drain_timeout_is_how_long_requests_in_flight_go_on_after_sigterm(cli_env: dict[str, str],
                                                                           drain: str) -> None:
    """serve --drain-timeout: after SIGTERM the requests in flight go on for that long. With 600 s, a stream
    that outlives the default drain (4 s) ends as it would have (its last chunk, then [DONE]); with 0 it ends at
    once with a 503 error event. The server exits 0 either way.

    With 600 s the server is paused for 6 s once its shutdown has begun (_sigterm_mid_stream), so 300 tokens
    outlive the default drain here without the 1,200 tokens (13 s of CPU) it took otherwise. A machine fast
    enough to end the stream before the pause (a GPU) gets a stream twice as long, until one is paused mid-way;
    every stream must end as it would have."""
    if drain == "0":
        lines, _ = _sigterm_mid_stream(cli_env, drain, 1200, pause=False)
        assert lines[-1] == "data: [DONE]", lines[-3:]
        chunks = [json.loads(line[5:]) for line in lines[:-1]]
        assert chunks[-1]["error"]["code"] == 503 and "shutting down" in chunks[-1]["error"]["message"]
        assert len(chunks) < 600, "cut at the signal, not run to its end"
        return
    for max_tokens in (300, 600, 1200, 2400):  # the default context (4,096) holds the longest
        lines, running_at_pause = _sigterm_mid_stream(cli_env, drain, max_tokens, pause=True)
        assert lines[-1] == "data: [DONE]", lines[-3:]
        chunks = [json.loads(line[5:]) for line in lines[:-1]]
        assert not any("error" in c for c in chunks), chunks[-2:]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        texts = sum(1 for c in chunks if c["choices"][0]["text"])
        assert texts >= max_tokens * 5 // 6, "every token came, not a cut stream"
        if running_at_pause:
            return
    raise AssertionError("every stream had ended before the server paused")


def test_a_second_ctrl_c_ends_the_requests_in_flight_at_once_without_a_traceback(cli_env: dict[str, str]) -> None:
    """serve.md, Stopping: Ctrl-C lets the requests in flight finish for --drain-timeout (here 600 s, far past
    the test); a second Ctrl-C ends them at once with a 503 error event, and the server exits 0 with no
    traceback (uvicorn skipped the app's lifespan shutdown then, and Starlette printed the cancelled task's)."""
    s = Server(cli_env, "-np", "1", "--drain-timeout", "600")
    lines: list[str] = []
    first = threading.Event()

    def stream() -> None:
        body = {"model": "smollm2:135m", "prompt": "Once", "max_tokens": 3000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{s.url}/v1/completions", json=body, timeout=600) as r:
            for line in r.iter_lines():
                if line.startswith("data:"):
                    lines.append(line)
                    first.set()

    t = threading.Thread(target=stream)
    try:
        t.start()
        assert first.wait(120), "the stream produced its first token"
        s.proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 120  # a safety net
        while _listening(s.port) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _listening(s.port), "the server began its shutdown"
        s.proc.send_signal(signal.SIGINT)
        t.join(600)
        assert s.proc.wait(timeout=600) == 0
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
    assert s.proc.stderr is not None
    said = s.proc.stderr.read().decode()
    assert "Traceback" not in said and "ERROR" not in said, said
    assert lines[-1] == "data: [DONE]", lines[-3:]
    cut = json.loads(lines[-2][5:])
    assert cut["error"]["code"] == 503 and "shutting down" in cut["error"]["message"]
    assert len(lines) < 2000, "cut at the second Ctrl-C, not run to its end"
