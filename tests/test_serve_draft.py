"""serve --draft: a draft model proposes each request's drafts inside the throughput batch (engine/speculative.py's
SlotDrafter: a sequence per slot on the draft model's own context, kept in step with the slot's tokens), the model
checks them in its step as --lookup's (engine/scheduler.py, verify). SmolLM2 135M drafts for itself here (the same
vocabulary, so its drafts are nearly always kept); Gemma 3 270M has another vocabulary."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from localgen.engine.batch import ParallelContext
from localgen.engine.batchseq import Request
from localgen.engine.scheduler import Finished, Scheduler
from localgen.engine.stepcosts import StepCosts
from localgen.native.prompt import Prompt
from localgen.types import SamplingParams
from tests.conftest import CLI, InProcessCLI, assert_same_greedy_text
from tests.test_batch_lookup import _chat, _copy_prompt
from tests.test_serve import Server

PROMPTS = ["Count from 1 to 20, one number a line.", "Name the planets of the solar system, one a line."]


# ---- the scheduler, in process ---------------------------------------------------------------------------

def _drafting_pc(eng: Any, smollm2_path: Path, n: int) -> ParallelContext:
    """A throughput context of n slots whose drafts come from a second SmolLM2, rows and draft decodes priced
    as free (so every sequence drafts its 4 tokens each step)."""
    from localgen.engine.llama import Engine
    from localgen.engine.speculative import SlotDrafter
    from localgen.models.resolve import resolve
    from localgen.types import LoadParams

    pc = ParallelContext(eng, n, 1024, pooled=True, draft_max=4)
    pc.costs.steps = [(1, 1.0), (64, 1.0)]
    pc.drafter = SlotDrafter(Engine(resolve(str(smollm2_path)), LoadParams(n_ctx=1024)), n, pc.n_ctx_seq)
    return pc


@pytest.mark.slow  # loads SmolLM2 twice and decodes in this process
def test_a_draft_model_drafts_for_every_slot_at_once_and_its_cells_follow_each_slot(smollm2_path: Path) -> None:
    """Three requests (greedy, a hot sampled poem, greedy with a stop) drafting 4 tokens a step from the draft
    model: the greedy text is that of the same scheduler without drafts; after every step each slot's draft
    sequence holds a prefix of its tokens (the drafts not kept forgotten) and the record agrees with llama.cpp's
    cells; a slot whose request ended holds nothing; one draft-model decode serves every drafting slot's position."""
    from localgen.engine.llama import Engine
    from localgen.models.resolve import resolve
    from localgen.native.lib import lib
    from localgen.types import LoadParams

    # the slots' cells in one pool: drafts ride in the step's one pass, free here (with a stream per slot they are
    # priced as a pass of their own: tests/test_batch_lookup.py)
    eng = Engine(resolve(str(smollm2_path)), LoadParams(n_ctx=2048, kv_unified=True))
    copy = Prompt.text(_chat(eng, _copy_prompt(4)))
    greedy = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    reqs = [Request(0, copy, greedy),
            Request(1, Prompt.text(_chat(eng, "Write a short poem about the sea.")),
                    SamplingParams(temperature=1.5, max_tokens=40, ignore_eos=True), seed=5),
            Request(2, copy, SamplingParams(temperature=0.0, max_tokens=60, stop=["Item 2"]))]
    plain_pc = ParallelContext(eng, 3, 1024, pooled=True)
    plain: dict[int, Any] = {}
    try:
        plain_pc.run(iter(reqs), lambda c: plain.__setitem__(c.index, c), exact=False, reuse=True)
    finally:
        plain_pc.close()
    pc = _drafting_pc(eng, smollm2_path, 3)
    assert pc.one_pool
    lc = lib()
    d = pc.drafter
    mem = lc.llama_get_memory(d.ctx)
    calls: list[tuple[int, int, int]] = []  # each proposal: slots drafting, the deepest draft, the decodes it took
    propose = d.propose

    def counted(wants: dict[int, tuple[list[int], int]], catch_up: Any = None) -> dict[int, list[int]]:
        before, caught = d.decodes, d.caught_up
        out = propose(wants, catch_up)
        catching = -(-(d.caught_up - caught) // d.n_batch)  # the catch-up's decodes (a prompt's first)
        calls.append((len(wants), max(k for _, k in wants.values()), d.decodes - before - catching))
        return out

    d.propose = counted
    sched = Scheduler(pc, exact=False, reuse=True)
    for r in reqs:
        sched.add(r)
    done: dict[int, Any] = {}
    last: dict[int, Any] = {}  # each slot's last sequence (its tokens as they ended)
    checked = kept = 0
    try:
        while not sched.idle:
            done.update({o.id: o.completion for o in sched.step() if isinstance(o, Finished)})
            for slot in range(3):
                held = d.held[slot]
                assert lc.llama_memory_seq_pos_max(mem, slot) == len(held) - 1, "the record agrees"
                seq = sched.active.get(slot)
                if seq is None:
                    if held:  # a freed slot's draft sequence stays, for its next request to keep what it shares
                        assert held == (last[slot].req.tokens + last[slot].dec.tokens)[:len(held)]
                        kept += 1
                elif seq.pending is not None:
                    assert held == (seq.req.tokens + seq.dec.tokens[:-1])[:len(held)]
                    last[slot] = seq
                    checked += 1
        totals = (pc.drafted, pc.accepted)
    finally:
        sched.close()
        pc.close()
        eng.close()
    assert checked > 20 and kept > 0
    assert_same_greedy_text([done[0].text, done[2].text], [plain[0].text, plain[2].text],
                            "drafts of a draft model checked in the batch never change greedy text")
    assert done[2].finish_reason == "stop" and "Item 2" not in done[2].text and "Item 1" in done[2].text
    assert done[0].completion_tokens == done[1].completion_tokens == 40
    # mostly kept: the draft model evaluates a prompt in other batches than the model, and with flash attention
    # (on by default here) a near tie ("Item 0"/"Item 1") can go the other way
    assert done[0].accepted >= 0.75 * done[0].drafted > 0, "a model drafting for itself greedily is kept"
    assert done[1].drafted > done[1].accepted, "a hot sampled answer rejects some greedy drafts"
    # each answer counts the drafts of the step it ended in (its timings, /health and /metrics agree)
    assert (sum(c.drafted for c in done.values()), sum(c.accepted for c in done.values())) == totals
    # one draft-model decode per drafted position (after those that catch a slot up), every slot in it
    assert all(decodes <= deepest for _, deepest, decodes in calls)
    assert sum(n > 1 for n, _, _ in calls) > 5, "several slots drafting at once"


@pytest.mark.slow  # loads SmolLM2 twice in this process
def test_calibrate_measures_the_draft_models_decode_and_leaves_no_cells(
        smollm2_engine: object, smollm2_path: Path) -> None:
    """At load the draft model's one-row decode is measured against the model's (the same model here: about
    one step), and neither context keeps a cell."""
    from localgen.native.lib import lib

    pc = _drafting_pc(smollm2_engine, smollm2_path, 2)
    try:
        pc.calibrate(reps=2)
        assert 0.2 < pc.costs.draft_step < 5
        # by rows, as the model's steps: 64 rows of the draft model cost many one-row decodes (about 30 here)
        assert [n for n, _ in pc.costs.draft_steps][:2] == [1, 2] and pc.costs.draft_steps[-1][0] == 64
        assert pc.costs.draft_rows(1) == pc.costs.draft_step and pc.costs.draft_rows(64) > 4 * pc.costs.draft_step
        lc = lib()
        for ctx in (pc.ctx, pc.drafter.ctx):
            mem = lc.llama_get_memory(ctx)
            assert [lc.llama_memory_seq_pos_max(mem, q) for q in range(2)] == [-1, -1]
    finally:
        pc.close()


@pytest.mark.slow  # loads SmolLM2 twice and decodes in this process
def test_a_draft_models_decodes_are_priced_beside_the_rows(smollm2_engine: object, smollm2_path: Path) -> None:
    """Rows free, one slot: where a draft-model decode costs nothing the request drafts at every step; where a row
    of one costs 100 steps of the model nothing is drafted, not even the tries (kept, a try would not pay), and the
    sequence's tokens are compared with its draft sequence's only when a try is due (every 16 steps), not at every
    step."""
    eng: Any = smollm2_engine
    prompt = Prompt.text(_chat(eng, _copy_prompt(4)))
    greedy = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    ends: list[Any] = []
    compared: list[int] = []
    for price in (0.0, 100.0):
        pc = _drafting_pc(eng, smollm2_path, 1)
        pc.costs.draft_step = price
        lag = pc.drafter.lag
        compared.append(0)

        def counted(slot: int, tokens: list[int], lag: Any = lag) -> int:
            compared[-1] += 1
            return int(lag(slot, tokens))

        pc.drafter.lag = counted
        try:
            pc.run(iter([Request(0, prompt, greedy)]), ends.append, exact=False)
        finally:
            pc.close()
    drafted = [c.drafted for c in ends]
    assert drafted[0] > 20 and drafted[1] == 0
    assert compared[1] <= 48 // 16 + 1, compared


@pytest.mark.slow  # loads SmolLM2 twice and decodes in this process
def test_a_draft_models_decode_is_priced_by_its_rows(smollm2_path: Path) -> None:
    """Two greedy requests at once, the model's rows free (one pool of cells), the draft model's decode free for one
    row and dear for two: the sequence taken first drafts at every step and the other never joins its decodes (a
    decode priced by decodes, not rows, would have both draft)."""
    from localgen.engine.llama import Engine
    from localgen.models.resolve import resolve
    from localgen.types import LoadParams

    eng = Engine(resolve(str(smollm2_path)), LoadParams(n_ctx=2048, kv_unified=True))
    prompt = Prompt.text(_chat(eng, _copy_prompt(4)))
    # the first outlasts the second (which alone would draft freely)
    reqs = [Request(i, prompt, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
            for i, n in enumerate((200, 24))]
    pc = _drafting_pc(eng, smollm2_path, 2)
    pc.costs.draft_steps = [(1, 0.0), (2, 5.0), (256, 5.0)]  # a catch-up of the prompt costs 5 steps too
    ends: dict[int, Any] = {}
    try:
        assert pc.one_pool
        pc.run(iter(reqs), lambda c: ends.__setitem__(c.index, c), exact=False)
    finally:
        pc.close()
        eng.close()
    assert ends[0].drafted > 20 and ends[1].drafted == 0, (ends[0].drafted, ends[1].drafted)


@pytest.mark.slow  # loads SmolLM2 in this process
def test_a_slot_catches_up_in_pieces_of_the_batch_size(smollm2_path: Path) -> None:
    """A prompt of 150 tokens with a batch size of 64: a slot's draft sequence catches up on its first 149 in three
    decodes, then decodes the last for its draft (another slot, the same, proposes the same); bounded to 100 tokens
    a step, a third slot catches up over two steps and drafts only then; after that only what a sequence lacks is
    evaluated, and `kept` drops what is past."""
    from localgen.engine.llama import Engine
    from localgen.engine.speculative import SlotDrafter
    from localgen.models.resolve import resolve
    from localgen.types import LoadParams

    d = SlotDrafter(Engine(resolve(str(smollm2_path)), LoadParams(n_ctx=1024, n_batch=64, n_ubatch=64)), 3, 1024)
    try:
        tokens = _chat(d.engine, _copy_prompt(8))[:150]
        assert len(tokens) == 150 and d.lag(0, tokens) == 149
        first = d.propose({0: (tokens, 1)})
        assert d.decodes == 4 and d.held[0] == tokens and d.caught_up == 149
        assert d.propose({1: (tokens, 1)}) == {1: first[0]} and d.decodes == 8
        assert d.propose({2: (tokens, 1)}, {2: 100}) == {} and d.held[2] == tokens[:100] and d.lag(2, tokens) == 49
        assert d.propose({2: (tokens, 1)}, {2: 100}) == {2: first[0]} and d.caught_up == 149 * 3
        decodes = d.decodes
        more = d.propose({0: (tokens + first[0], 2)})
        # both drafts kept, and a token sampled after them: the last draft is the one token its sequence lacks
        assert d.lag(0, [*tokens, *first[0], *more[0], 0]) == 1
        assert d.decodes == decodes + 2 and len(more[0]) == 2 and d.held[0] == tokens + first[0] + more[0][:1]
        d.kept(0, 150)
        assert d.held[0] == tokens
        # a draft stops at a token past the model's vocabulary (a draft model with a few more tokens): here every
        # token the draft model picks is past a "vocabulary" that ends below it, so nothing is proposed
        d.limit = min(first[0] + more[0])
        assert d.propose({0: (tokens, 3)}) == {}
    finally:
        d.close()


@pytest.mark.slow  # loads SmolLM2 twice and decodes in this process
def test_a_conversations_next_turn_drafts_from_the_prefix_its_slot_kept(smollm2_engine: object,
                                                                      smollm2_path: Path) -> None:
    """One slot, drafts priced as free: a request's draft sequence outlives it, so the next turn of the same
    conversation (its prompt: the first turn's, the answer and a new question) catches up only on what is new."""
    eng: Any = smollm2_engine
    first = [{"role": "user", "content": _copy_prompt(4)}]
    greedy = SamplingParams(temperature=0.0, max_tokens=32)
    pc = _drafting_pc(eng, smollm2_path, 1)
    d = pc.drafter
    try:
        ends: list[Any] = []
        pc.run(iter([Request(0, Prompt.text(list(eng.chat_tokens(first))), greedy)]), ends.append, exact=False,
               reuse=True)
        turn1 = list(eng.chat_tokens(first))
        assert d.held[0][:len(turn1)] == turn1 and ends[0].drafted > 0, "kept when the request ended"
        second = [*first, {"role": "assistant", "content": ends[0].text}, {"role": "user", "content": "And again."}]
        turn2 = list(eng.chat_tokens(second))
        caught = d.caught_up
        pc.run(iter([Request(1, Prompt.text(turn2), greedy)]), ends.append, exact=False, reuse=True)
    finally:
        pc.close()
    assert ends[1].drafted > 0
    # the first turn's prompt is not evaluated again (a sequence emptied at the end of its request would be)
    assert 0 < d.caught_up - caught <= len(turn2) - len(turn1) + ends[1].completion_tokens


# ---- as users run it ----------------------------------------------------------------------------------------

def _ask(url: str, prompt: str, **extra: Any) -> dict[str, Any]:
    body = {"model": "smollm2:135m", "messages": [{"role": "user", "content": prompt}], "max_tokens": 48,
            "temperature": 0, "ignore_eos": True, **extra}  # 48 tokens: a request tries a draft every 16 steps
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _together(url: str, prompts: list[str], **extra: Any) -> list[dict[str, Any]]:
    """The prompts sent at once, each on a thread of its own (so they decode in one batch)."""
    docs: list[dict[str, Any]] = [{} for _ in prompts]

    def one(i: int) -> None:
        docs[i] = _ask(url, prompts[i], **extra)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return docs


@pytest.fixture(scope="module")
def plain_answers(cli_env: dict[str, str]) -> list[str]:
    """What `serve` without a draft answers to PROMPTS, greedy."""
    s = Server(cli_env, "-np", "2", "--ctx", "1024")
    try:
        return [d["choices"][0]["message"]["content"] for d in _together(s.url, PROMPTS)]
    finally:
        assert s.stop() == 0


@pytest.fixture(scope="module")
def random_draft(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny llama with random weights and SmolLM2's vocabulary (tests/tiny_llama.py): its drafts are not kept."""
    from tests.tiny_llama import build

    return build(smollm2_path, tmp_path_factory.mktemp("draft") / "random-draft.gguf")


@pytest.mark.slow  # starts `localgen serve` twice
def test_a_draft_as_costly_as_the_model_drafts_nothing(cli_env: dict[str, str], smollm2_path: Path,
                                                       plain_answers: list[str]) -> None:
    """serve --draft PATH --parallel 2, SmolLM2 drafting for itself on this CPU: a draft-model decode costs a step
    of the model, so no draft can pay, not even a try: nothing is drafted, and two greedy requests at once get the
    texts of serve without a draft. The start-up line names the draft model, /health gives its measured cost and
    says it drafts, /metrics too."""
    s = Server(cli_env, "--draft", str(smollm2_path), "-np", "2", "--ctx", "1024")
    try:
        docs = _together(s.url, PROMPTS)
        health = s.health()
        metrics = httpx.get(f"{s.url}/metrics", timeout=30).text
    finally:
        assert s.stop() == 0
    assert s.proc.stderr is not None
    startup = s.proc.stderr.read().decode()
    assert f"smollm2:135m: throughput batching: --draft {smollm2_path.name}" in startup
    assert_same_greedy_text([d["choices"][0]["message"]["content"] for d in docs], plain_answers,
                            "a draft model's drafts never change greedy text")
    assert [sorted(set(d["timings"]) & {"draft_n", "draft_n_accepted"}) for d in docs] == [[], []]  # none drafted
    assert (health["drafted"], health["accepted"]) == (0, 0)
    assert health["draft_model_cost"] > 0.2 and health["draft_row_cost"] >= 0, "measured at the warm-up"
    assert health["drafting"] is True and health["drafting_off"] is None
    assert 'localgen_drafting{model="smollm2:135m"} 1.0' in metrics
    # (the counter's help named only --lookup: a draft model drafts into it too)
    assert "# HELP localgen_draft_tokens_total tokens drafted (serve --lookup, --draft)" in metrics, metrics


class DraftServer:
    """serve's app and a ModelWorker on SmolLM2 with --draft `draft` (2 slots), served by uvicorn in a thread of this
    process (as tests/test_serve_hostile.py's InProcess), so a test can reach the worker's insides; its log lines go
    to `lines`. Once warm, rows and the draft model's decodes are priced as free (as on a GPU with a small draft),
    so every request drafts."""

    def __init__(self, smollm2_path: Path, draft: Path, parallel: int = 2, kv_unified: bool = False) -> None:
        import socket
        import time

        import uvicorn

        from localgen.models.resolve import resolve
        from localgen.serve.app import build
        from localgen.serve.guard import Policy
        from localgen.serve.servelog import ServeLog
        from localgen.serve.state import ServeState
        from localgen.serve.worker import ModelWorker
        from localgen.types import LoadParams

        self.lines: list[str] = []
        self.worker = ModelWorker(resolve(str(smollm2_path)), LoadParams(n_ctx=1024, kv_unified=kv_unified),
                                  parallel=parallel, keep_alive=-1, max_queue=4, lookup=4, draft=resolve(str(draft)),
                                  log=ServeLog(write=self.lines.append))
        self.worker.preload()
        self.worker.start()
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        config = uvicorn.Config(build(ServeState(workers={"smollm2:135m": self.worker}), Policy()), host="127.0.0.1",
                                port=port, log_level="critical", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        self.pc = self.worker.residence.pc
        deadline = time.monotonic() + 300
        while not (self.server.started and self.pc.warmed_in) and time.monotonic() < deadline:
            time.sleep(0.05)  # the worker's thread warms the model up and measures the costs (warmed_in is set last)
        assert self.pc.warmed_in and self.pc.costs.draft_steps, "the worker never finished its warm-up and calibration"
        self.pc.costs = StepCosts([(1, 1.0), (64, 1.0)])

    def health(self) -> dict[str, Any]:
        return dict(httpx.get(f"{self.url}/health", timeout=30).json()["models"]["smollm2:135m"])

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.worker.stop()


@pytest.mark.slow  # serves SmolLM2 with a draft in this process
def test_a_failing_draft_model_turns_drafting_off_and_the_requests_go_on(
        smollm2_path: Path, plain_answers: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Two greedy requests, one after the other, draft (SmolLM2 drafting for itself, priced as free): the texts of
    serve without a draft, nearly every draft kept. Then the draft model's decodes fail (llama_decode's error, as
    when its cells run out): the next two requests at once still answer those texts, without drafts; the log says
    so once; /health and /metrics say drafting is off; later requests go on."""
    from localgen.errors import LocalgenError

    s = DraftServer(smollm2_path, smollm2_path)
    try:
        # one after the other: two decoding at once, each in a stream of its own, pay a pass of their own for their
        # drafts (policies._step_cost) even with the draft model free, so whether they drafted hung on timing
        docs = [_ask(s.url, prompt) for prompt in PROMPTS]
        before = s.health()

        def failing(feed: Any, logits: bool = True) -> dict[int, int]:
            raise LocalgenError("llama_decode failed (1) in the draft model")

        monkeypatch.setattr(s.pc.drafter, "_decode", failing)
        after = _together(s.url, PROMPTS)
        health = s.health()
        metrics = httpx.get(f"{s.url}/metrics", timeout=30).text
        again = _ask(s.url, PROMPTS[0])
    finally:
        s.close()
    texts = [d["choices"][0]["message"]["content"] for d in docs]
    assert_same_greedy_text(texts, plain_answers, "a draft model's drafts never change greedy text")
    assert before["drafted"] > 20 and before["accepted"] >= 0.75 * before["drafted"]
    assert_same_greedy_text([d["choices"][0]["message"]["content"] for d in after], plain_answers,
                            "the requests go on without drafts")
    # alone against two at once: the same bits on a CPU, the same beginning on a GPU (kernels follow the batch)
    assert_same_greedy_text([again["choices"][0]["message"]["content"]], [after[0]["choices"][0]["message"]["content"]],
                            "a request after the draft model failed")
    warnings = [line for line in s.lines if "draft model failed" in line]
    assert warnings == [f"warning: {s.worker.name}: the draft model failed (llama_decode failed (1) in the draft "
                        "model); drafting is off, the requests go on without drafts"], s.lines
    assert health["drafting"] is False and health["drafting_off"] == "llama_decode failed (1) in the draft model"
    assert health["drafted"] == before["drafted"] and health["failed_jobs"] == 0
    assert 'localgen_drafting{model="smollm2:135m"} 0.0' in metrics
    assert "draft_n" not in again["timings"]


@pytest.mark.slow  # serves SmolLM2 with a random draft model in this process
def test_a_useless_draft_model_turns_itself_off(smollm2_path: Path, random_draft: Path,
                                                plain_answers: list[str]) -> None:
    """A draft model with SmolLM2's vocabulary and random weights, its decodes and the rows priced as cheap as a
    GPU's with a small draft (so a draft it made would pay if kept): after its first drafts are not kept, each
    request drafts only its tries, one token after 16 steps, then 32, 64: two requests of 160 tokens, one after
    the other, draft a few tokens each, and answer what serve without a draft answers."""
    s = DraftServer(smollm2_path, random_draft)
    s.pc.costs.steps = [(1, 1.0), (2, 1.05), (64, 4.0)]  # a GPU's: a row beside the step's first costs a twentieth
    try:
        docs = [_ask(s.url, prompt, max_tokens=160) for prompt in PROMPTS]
        health = s.health()
    finally:
        s.close()
    assert_same_greedy_text([d["choices"][0]["message"]["content"][:len(p)] for d, p in zip(docs, plain_answers,
                                                                                            strict=True)],
                            plain_answers, "a useless draft never changes greedy text")
    drafted = [d["timings"].get("draft_n", 0) for d in docs]
    # its first steps draft while the prior says drafts are kept, then only tries: at 16, 48, 112 steps
    assert all(0 < n <= 2 * 4 + 3 for n in drafted), drafted
    assert health["accepted"] <= 1 and health["drafting"] is True


@pytest.mark.slow  # serves SmolLM2 with a draft in this process (and starts `localgen serve` for the fixture)
def test_a_request_cancelled_mid_stream_leaves_its_slot_to_the_next_exact(
        smollm2_path: Path, random_draft: Path, plain_answers: list[str]) -> None:
    """With one slot and a tiny draft model (random weights, priced as free: every request drafts), a streamed
    request that drafted is dropped by its client after 24 pieces; the next request, on the same slot, drafts too
    and answers what serve without a draft answers."""
    s = DraftServer(smollm2_path, random_draft, parallel=1)
    try:
        body = {"model": "smollm2:135m", "messages": [{"role": "user", "content": _copy_prompt(6)}],
                "max_tokens": 200, "temperature": 0, "stream": True, "ignore_eos": True}
        pieces = 0
        with httpx.stream("POST", f"{s.url}/v1/chat/completions", json=body, timeout=600) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    pieces += bool(json.loads(line[6:])["choices"][0]["delta"].get("content"))
                if pieces >= 24:
                    break
        doc = _ask(s.url, PROMPTS[1])
        health = s.health()
    finally:
        s.close()
    assert_same_greedy_text([doc["choices"][0]["message"]["content"]], [plain_answers[1]],
                            "the slot's next request answers as on a fresh server")
    assert health["drafted"] > doc["timings"]["draft_n"] > 0, "both requests drafted"


def test_a_draft_model_with_another_vocabulary_is_refused_before_either_loads(
        cli_in_process: InProcessCLI, gemma_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The two files' vocabularies are read (no weights) and compared before any model loads: exit 2, one line,
    neither model loaded."""
    import socket

    import localgen.models.load

    loads: list[str] = []
    real = localgen.models.load.open_engine

    def counted(ref: Any, *args: Any, **kwargs: Any) -> Any:
        loads.append(ref.name)
        return real(ref, *args, **kwargs)

    monkeypatch.setattr(localgen.models.load, "open_engine", counted)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    r = cli_in_process("serve", "--model-draft", str(gemma_path), "-np", "2", "--port", str(port))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "the draft model's vocabulary (262,144 tokens) differs from the model's (49,152)" in r.stderr
    assert "http://" not in r.stdout + r.stderr
    assert loads == [], "neither model loaded"


@pytest.mark.slow  # starts `localgen serve` with SmolLM2 and Gemma 3
def test_the_draft_is_the_first_models_and_none_with_exact(cli_env: dict[str, str], smollm2_path: Path,
                                                           gemma_path: Path) -> None:
    """-m smollm2 -m gemma --draft smollm2: the first drafts, the second does not (its vocabulary would not
    even fit); with --exact nothing drafts, so the draft model is not loaded (another vocabulary goes unchecked)."""
    s = Server(cli_env, "-m", "smollm2:135m", "-m", str(gemma_path), "--draft", str(smollm2_path), "-np", "1",
               "--ctx", "512")
    try:
        models = httpx.get(f"{s.url}/health", timeout=5).json()["models"]
        first_size = next(m["size"] for m in httpx.get(f"{s.url}/api/ps", timeout=5).json()["models"]
                          if m["name"] == "smollm2:135m")
    finally:
        assert s.stop() == 0
    assert s.proc.stderr is not None
    startup = s.proc.stderr.read().decode()
    assert f"smollm2:135m: throughput batching: --draft {smollm2_path.name}" in startup
    gemma = next(name for name in models if name != "smollm2:135m")
    assert models[gemma]["drafted"] is None and models["smollm2:135m"]["drafted"] == 0
    assert models[gemma]["draft_model_cost"] is None
    assert f"{gemma}: throughput batching: --draft" not in startup
    s = Server(cli_env, "--draft", str(gemma_path), "--exact", "-np", "1", "--ctx", "512")
    try:
        exact_size = next(m["size"] for m in httpx.get(f"{s.url}/api/ps", timeout=5).json()["models"])
    finally:
        assert s.stop() == 0
    # SmolLM2 drafting for itself counts twice its bytes; with --exact the draft is not loaded, nor counted
    assert 2 * exact_size == first_size, (exact_size, first_size)
    assert s.proc.stderr is not None
    assert f"--exact: every answer identical to running alone (so nothing is drafted: --draft {gemma_path.name} is " \
           "off)" in s.proc.stderr.read().decode()


def test_the_no_exact_start_line_names_the_drafts() -> None:
    from localgen.engine.batchmode import batching_mode

    assert batching_mode(None, False, True).why == "--no-exact: every request batched, its drafts (--lookup) checked " \
                                                   "in the batch"  # serve/model.py names --draft MODEL in its place
    assert batching_mode(None, False, False).why == "--no-exact: every request batched"


def test_a_draft_vocabulary_may_differ_by_a_familys_padding_but_no_more() -> None:
    """As llama.cpp's check: sizes within 128 tokens (Qwen2.5 7B's 152,064 and its 0.5B's 151,936), the same BOS and
    EOS tokens, the tokens both have of the same text."""
    from dataclasses import dataclass

    from localgen.engine.speculative import check_vocab
    from localgen.errors import UsageError

    @dataclass
    class Vocab:  # what check_vocab reads of a vocabulary
        n_vocab: int
        renamed: int = -1
        eos: int = 2

        def piece(self, t: int) -> bytes:
            return b"other" if t == self.renamed else str(t).encode()

        def specials(self) -> tuple[int, int]:
            return 1, self.eos

    check_vocab(Vocab(152_064), Vocab(151_936))  # type: ignore[arg-type]
    check_vocab(Vocab(151_936), Vocab(152_064))  # type: ignore[arg-type]
    for target, draft, said in ((Vocab(152_064), Vocab(151_935), "differs from the model's (152,064) by more than 128"),
                                (Vocab(1024), Vocab(1024, renamed=512), "differs from the model's (token 512)"),
                                (Vocab(1024), Vocab(1024, eos=3), "special tokens (BOS 1, EOS 3) differ from the "
                                                                  "model's (BOS 1, EOS 2)")):
        with pytest.raises(UsageError) as e:
            check_vocab(target, draft)  # type: ignore[arg-type]
        assert said in e.value.message, e.value.message


def test_draft_flags_that_cannot_go_together_are_usage_errors(cli: CLI) -> None:
    for args, said in ((["--draft", "smollm2:135m", "--lookup"], "--draft and --lookup cannot be combined"),
                       (["--draft", " "], "--draft is empty"),
                       (["--draft-max", "3"], "add --lookup or --draft")):
        r = cli("serve", *args)
        assert r.returncode == 2 and said in r.stderr and r.stderr.count("\n") == 1, (args, r.stderr)
