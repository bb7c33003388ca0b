"""A burst of requests is evaluated together (serve/arrivals.py): the rule on a clock the test moves, the count
of requests being read as serve's front door keeps it, and a real model's first step taking the whole burst."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localgen.serve import arrivals
from localgen.serve.arrivals import BURST_S, QUIET_S, Arrivals, Bursts
from tests.workers import running_worker

MODEL = "smollm2:135m"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _bursts() -> tuple[Bursts, Arrivals, Clock]:
    clock = Clock()
    counted = Arrivals(clock)
    return Bursts(counted, clock), counted, clock


def test_a_lone_request_never_waits() -> None:
    b, _, _ = _bursts()
    b.came(others=False)
    assert b.hold(fresh=True, jobs=1) is False
    assert b.hold(fresh=False, jobs=1) is False  # a scheduler that runs something is never held


def test_a_client_s_requests_one_after_another_never_wait() -> None:
    b, _, clock = _bursts()
    for _ in range(5):
        b.came(others=False)  # its last request had ended: the model had no other job
        assert b.hold(fresh=True, jobs=1) is False
        clock.now += QUIET_S * 2  # well within BURST_S of the last step
    assert not b.company


def test_requests_being_read_hold_a_burst_until_they_are_handed_on_or_its_time_is_up() -> None:
    b, counted, clock = _bursts()
    b.came(others=False)
    reading = counted.enter()
    assert b.hold(fresh=True, jobs=1) is True
    clock.now += BURST_S / 2
    assert b.hold(fresh=True, jobs=1) is True
    reading.done()
    reading.done()  # given up once, whoever calls it again
    assert counted.coming == 0
    assert b.hold(fresh=True, jobs=1) is False

    b.rested()  # the burst ended and the model was idle
    stuck = counted.enter()  # a request that is never handed on holds the next burst for BURST_S at most
    b.came(others=False)
    assert b.hold(fresh=True, jobs=1) is True
    clock.now += BURST_S
    assert b.hold(fresh=True, jobs=1) is False
    clock.now += 10.0
    b.rested()
    b.came(others=False)  # nor does it hold a later one: it came more than BURST_S ago
    assert (counted.coming, counted.held) == (0, 1)
    assert b.hold(fresh=True, jobs=1) is False
    stuck.done()
    assert counted.held == 0


def test_after_a_burst_the_next_one_waits_for_a_quiet_moment_and_a_lone_request_ends_that() -> None:
    b, _, clock = _bursts()
    b.came(others=False)
    assert b.hold(fresh=True, jobs=1) is False  # the first burst: nothing told it more would come
    clock.now += BURST_S / 4
    b.came(others=True)  # one came just after its first step, while it ran: bursts come to this model
    assert b.company

    clock.now += 10.0
    b.rested()
    b.came(others=False)
    assert b.hold(fresh=True, jobs=1) is True  # waits for more, until no job has come for QUIET_S
    clock.now += QUIET_S / 2
    b.came(others=True)
    assert b.hold(fresh=True, jobs=2) is True
    clock.now += QUIET_S
    assert b.hold(fresh=True, jobs=2) is False
    assert b.company  # two in its first step

    clock.now += 10.0
    b.rested()
    b.came(others=False)
    assert b.hold(fresh=True, jobs=1) is True
    clock.now += QUIET_S
    assert b.hold(fresh=True, jobs=1) is False  # a lone request waited QUIET_S once
    assert not b.company
    clock.now += 10.0
    b.rested()
    b.came(others=False)
    assert b.hold(fresh=True, jobs=1) is False  # and the next does not


def test_a_steady_stream_of_requests_holds_a_burst_for_burst_s_at_most() -> None:
    b, _, clock = _bursts()
    b.company = True
    start = clock.now
    for _ in range(1000):
        b.came(others=True)
        if not b.hold(fresh=True, jobs=2):
            break
        clock.now += QUIET_S / 2
    assert clock.now - start == pytest.approx(BURST_S, abs=QUIET_S)


def test_requests_queued_behind_full_slots_start_without_waiting_until_the_model_rests() -> None:
    """Every slot ended in the same step and requests still wait: the scheduler runs nothing, but a burst is
    under way, so they start at once; once it has been idle, the next burst waits again."""
    b, counted, clock = _bursts()
    b.came(others=False)
    assert b.hold(fresh=True, jobs=6) is False  # the burst's first step: 4 of 6 take the slots
    reading = counted.enter()
    b.came(others=True)
    clock.now += QUIET_S / 2
    assert b.hold(fresh=True, jobs=3) is False  # all 4 ended in one step: the rest start now
    b.rested()
    assert b.hold(fresh=True, jobs=1) is True
    reading.done()


def test_the_front_door_counts_a_post_until_its_answer_begins() -> None:
    """FrontDoor (serve/app.py) around a route that reads its body, then answers in two parts: a POST counts
    while its body is read, no longer once its answer has begun; a GET never counts."""
    import asyncio

    from localgen.serve.app import Front, FrontDoor

    seen: dict[str, int] = {}

    async def request(method: str) -> None:
        started, finish = asyncio.Event(), asyncio.Event()
        body = [{"type": "http.request", "body": b"{", "more_body": True},
                {"type": "http.request", "body": b"}", "more_body": False}]

        async def route(scope: dict[str, Any], receive: Any, send: Any) -> None:
            while (await receive()).get("more_body"):
                seen[f"{method} reading"] = arrivals.ARRIVALS.held
            await send({"type": "http.response.start", "status": 200, "headers": []})
            started.set()
            await finish.wait()
            await send({"type": "http.response.body", "body": b"done"})

        async def receive() -> dict[str, Any]:
            return body.pop(0) if body else {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            pass

        door = FrontDoor(route, Front())
        scope = {"type": "http", "method": method, "path": "/x", "headers": [], "client": ("127.0.0.1", 1)}
        task = asyncio.create_task(door(scope, receive, send))
        await started.wait()
        seen[f"{method} answering"] = arrivals.ARRIVALS.held
        finish.set()
        await task
        seen[f"{method} ended"] = arrivals.ARRIVALS.held

    before = arrivals.ARRIVALS.held
    asyncio.run(request("POST"))
    asyncio.run(request("GET"))
    assert seen == {"POST reading": before + 1, "POST answering": before, "POST ended": before,
                    "GET reading": before, "GET answering": before, "GET ended": before}


@pytest.fixture(scope="module")
def worker(smollm2_path: Path) -> Iterator[Any]:
    with running_worker(smollm2_path, parallel=4) as w:
        yield w


def test_a_burst_read_while_its_first_job_waits_is_evaluated_in_one_step(worker: Any,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Three chats sent at once while a fourth request is still being read: none is evaluated until that one is
    handed on, then all three prompts go into the model's first step, and each answer's one token comes from
    it."""
    from starlette.testclient import TestClient

    from localgen.serve.app import build
    from localgen.serve.guard import Policy
    from localgen.serve.state import ServeState

    monkeypatch.setattr(arrivals, "BURST_S", 5.0)  # the test's own pace never ends the wait
    assert arrivals.ARRIVALS.held == 0
    pc = worker.residence.pc
    with TestClient(build(ServeState(workers={MODEL: worker}), Policy(check_host=False), webui=False)) as client:
        reading = arrivals.ARRIVALS.enter()
        steps = pc.rounds  # scheduler steps (pc.steps counts only decode calls that generate)
        answers: list[Any] = []

        def chat(i: int) -> None:
            answers.append(client.post("/v1/chat/completions", json={
                "model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": f"Say {i}."}]}))

        threads = [threading.Thread(target=chat, args=(i,)) for i in range(3)]
        try:
            for t in threads:
                t.start()
            for _ in range(800):
                sched = worker.residence.sched
                if sched is not None and sched.policy.waiting == 3:
                    break
                threading.Event().wait(0.005)
            assert worker.residence.sched.policy.waiting == 3 and pc.rounds == steps  # held, nothing evaluated
        finally:
            reading.done()
            for t in threads:
                t.join(60)
    assert [a.status_code for a in answers] == [200] * 3, [a.text for a in answers]
    assert all(a.json()["usage"]["completion_tokens"] == 1 for a in answers)
    assert pc.rounds == steps + 1


def test_a_chat_is_no_longer_counted_once_handed_to_its_model(worker: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Counted until submitted (before its answer begins), and a client's chats one after another do not make the
    model wait for a burst."""
    from starlette.testclient import TestClient

    from localgen.serve.app import build
    from localgen.serve.guard import Policy
    from localgen.serve.state import ServeState

    monkeypatch.setattr(arrivals, "BURST_S", 5.0)  # a second chat well inside a burst's time after the first
    before = arrivals.ARRIVALS.held
    at_submit: list[int] = []
    company: list[bool] = []  # whether the model takes a burst to be coming, once each chat is submitted
    came = worker.bursts.came

    def counted(others: bool) -> None:
        at_submit.append(arrivals.ARRIVALS.held)
        came(others)
        company.append(worker.bursts.company)

    monkeypatch.setattr(worker.bursts, "came", counted)
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "Count to ten."}]}
    app = build(ServeState(workers={MODEL: worker}), Policy(check_host=False), webui=False)
    with TestClient(app) as client:
        for _ in range(2):
            r = client.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
    assert at_submit == [before, before]
    assert company[1] is False  # the second came after the first had ended
