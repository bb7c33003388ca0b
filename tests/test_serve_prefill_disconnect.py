"""A request whose client leaves while its prompt is evaluated (docs/serve.md, Faults): where the step's llama_decode
holds that prompt alone, llama.cpp asks the request's `cancelled` between its operations and stops there, on the
CPU; the piece under way leaves the slot, and the job ends as aborted. The old code evaluated the piece to its end
(all of a 3,000-token prompt with --batch-size 4096) and kept it in the slot.

Where the press lands is counted in the server's CPU seconds (/proc/PID/stat), not in time: a busy machine
stretches the wall clock, not the work."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import httpx
import pytest

from localgen.engine.batch import ParallelContext
from localgen.engine.batchseq import Request
from localgen.engine.scheduler import Finished, Scheduler
from localgen.native.prompt import Prompt
from localgen.types import SamplingParams
from tests.conftest import SAFETY_NET_S
from tests.test_read_in_ctrl_c import cpu_s
from tests.test_serve import Server


def long_text(lines: int) -> str:
    """Some 14 tokens a line."""
    return "".join(f"Line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(lines)) + "Summarize."


def _greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


@pytest.mark.parametrize("pooled", [False, True], ids=["exact", "throughput"])
def test_a_prompt_whose_client_leaves_inside_its_piece_stops_there_and_leaves_the_slot_as_it_was(
        smollm2_engine: Any, pooled: bool) -> None:
    """The scheduler's record: the client leaves once llama.cpp has asked 50 times (inside the piece's decode); the
    job ends cancelled in that step with nothing generated, the slot holds none of the prompt, and the same prompt
    sent again is evaluated whole (nothing cached) and answered as a fresh slot answers it."""
    eng = smollm2_engine
    tokens = list(eng.chat_tokens([{"role": "user", "content": long_text(30)}]))  # one piece either way
    asked = 0

    def left() -> bool:
        nonlocal asked
        asked += 1
        return asked > 50

    pc = ParallelContext(eng, 1, 2048, pooled=pooled)
    try:
        sched = Scheduler(pc, reuse=True, interleave=True)
        sched.add(Request(1, Prompt.text(tokens), _greedy(4), cancelled=left))
        outs = sched.step()
        ended = [o for o in outs if isinstance(o, Finished)]
        assert len(ended) == 1 and ended[0].completion.finish_reason == "cancelled", outs
        assert ended[0].completion.completion_tokens == 0 and asked > 50
        assert sched.idle and pc.slots.held.get(0) == [], pc.slots.held
        sched.add(Request(2, Prompt.text(tokens), _greedy(4)))
        again: Finished | None = None
        while again is None:
            again = next((o for o in sched.step() if isinstance(o, Finished)), None)
        assert again.completion.cached_tokens == 0 and again.completion.completion_tokens == 4
    finally:
        pc.close()
    fresh = ParallelContext(eng, 1, 2048, pooled=pooled)
    try:
        sched = Scheduler(fresh, reuse=True, interleave=True)
        sched.add(Request(3, Prompt.text(tokens), _greedy(4)))
        alone: Finished | None = None
        while alone is None:
            alone = next((o for o in sched.step() if isinstance(o, Finished)), None)
    finally:
        fresh.close()
    assert again.completion.text == alone.completion.text


def test_the_pieces_read_before_the_one_stopped_stay_in_the_slot(smollm2_engine: Any) -> None:
    """The exact scheduler reads a prompt a piece (--batch-size tokens) a step: the client leaves after the first
    piece; the second stops at once, and the slot keeps the first, which the same prompt sent again reuses."""
    eng = smollm2_engine
    tokens = list(eng.chat_tokens([{"role": "user", "content": long_text(60)}]))
    gone = False
    pc = ParallelContext(eng, 1, 2048)
    try:
        sched = Scheduler(pc, reuse=True, interleave=True)
        sched.add(Request(1, Prompt.text(tokens), _greedy(4), cancelled=lambda: gone))
        assert sched.step() == []
        first = list(pc.slots.held[0])
        assert 0 < len(first) < len(tokens), (len(first), len(tokens))
        gone = True
        outs = sched.step()
        assert [o.completion.finish_reason for o in outs if isinstance(o, Finished)] == ["cancelled"], outs
        assert pc.slots.held[0] == first
        sched.add(Request(2, Prompt.text(tokens), _greedy(4)))
        again: Finished | None = None
        while again is None:
            again = next((o for o in sched.step() if isinstance(o, Finished)), None)
        assert 0 < again.completion.cached_tokens <= len(first), (again.completion.cached_tokens, len(first))
    finally:
        pc.close()


def test_a_client_that_leaves_during_a_long_prefill_stops_it_and_the_slot_keeps_none_of_it(
        cli_env: dict[str, str]) -> None:
    """A ~3,500-token prompt, one piece with --batch-size 4096: the client closes its connection once the request has
    its slot and the server has worked 1 CPU s more (the piece takes tens); the job is counted as aborted and nothing
    runs, and the same prompt sent again is read in whole (timings.cache_n 0: the old code finished the piece and
    kept it in the slot)."""
    server = Server(cli_env, "-np", "1", "--ctx", "4096", "--batch-size", "4096")
    try:
        text = long_text(210)
        body = {"model": "smollm2:135m", "messages": [{"role": "user", "content": text}], "max_tokens": 2,
                "temperature": 0}
        raw = json.dumps({**body, "stream": True}).encode()
        with socket.create_connection(("127.0.0.1", server.port)) as client:
            client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
                           b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(raw) + raw)
            deadline = time.monotonic() + SAFETY_NET_S
            while server.health()["running"] == 0:  # in its slot: the scheduler has it (not only the handler)
                assert time.monotonic() < deadline, "the request never reached its slot"
                time.sleep(0.01)
            since = cpu_s(server.proc.pid)
            while cpu_s(server.proc.pid) < since + 1.0:
                assert time.monotonic() < deadline, "the prefill never began"
                time.sleep(0.01)
        deadline = time.monotonic() + SAFETY_NET_S
        while not ((health := server.health())["aborted_jobs"] == 1 and health["running"] == 0):
            assert time.monotonic() < deadline, health
            time.sleep(0.05)
        r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=SAFETY_NET_S)
        assert r.status_code == 200, r.text
        timings = r.json()["timings"]
        assert timings["prompt_n"] > 2500 and timings["cache_n"] == 0, timings
        assert server.health()["aborted_jobs"] == 1
    finally:
        assert server.stop() == 0
