"""Prompt lookup in the throughput scheduler (engine/policies.py `Throughput.drafts`, engine/scheduler.py
`Scheduler.verify`): drafts checked in the batch's own llama_decode, the cells of rejected drafts forgotten,
drafts only where they pay for their rows; and `run --file --lookup`, `serve --lookup` as users run them."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from localgen.engine.batch import ParallelContext
from localgen.engine.batchseq import Request
from localgen.engine.scheduler import Finished, Scheduler
from localgen.engine.speculative import LookupDrafter, NgramIndex, draft_length
from localgen.native.prompt import Prompt
from localgen.types import SamplingParams
from tests.conftest import CLI, assert_same_greedy_text
from tests.test_serve import Server


def _copy_prompt(items: int) -> str:
    text = "\n".join(f"Item {i}: the box holds {i * 3} apples and a note for warehouse {i % 5}." for i in range(items))
    return f"{text}\n\nCopy the list above exactly."


def _chat(eng: Any, text: str) -> list[int]:
    return list(eng.chat_tokens([{"role": "user", "content": text}]))


def _pc(eng: Any, n: int, draft_max: int, row_cost: float) -> ParallelContext:
    """A throughput context whose steps cost 1 + row_cost per row past the first (what `calibrate` measures, set:
    each test decides whether drafts pay)."""
    pc = ParallelContext(eng, n, 1024, pooled=True, draft_max=draft_max)
    pc.costs.steps = [(1, 1.0), (64, 1.0 + 63 * row_cost)]
    return pc


def _complete(pc: ParallelContext, reqs: list[Request]) -> dict[int, Any]:
    done: dict[int, Any] = {}
    try:
        pc.run(iter(reqs), lambda c: done.__setitem__(c.index, c), exact=False, reuse=True)
    finally:
        pc.close()
    return done


# ---- the pieces ------------------------------------------------------------------------------------------

def test_the_ngram_index_proposes_what_a_scan_of_the_context_does() -> None:
    """The index kept as tokens come gives run's scan's proposal (the latest earlier occurrence of the longest
    tail, 3 tokens down to 1), at every length of random contexts over a small vocabulary (many repeats)."""
    rng = random.Random(7)
    scan = LookupDrafter(max_ngram=3)
    for _ in range(20):
        tokens = [rng.randrange(6) for _ in range(rng.randrange(1, 40))]
        index = NgramIndex(tokens[:1])
        for n in range(1, len(tokens) + 1):
            if n > 1:
                index.append(tokens[n - 1])
            for k in (1, 4):
                assert index.propose(k) == scan.propose(tokens[:n], k), (tokens[:n], k)


def test_a_draft_is_as_long_as_makes_the_step_fastest() -> None:
    free = lambda n: 1.0  # noqa: E731  (rows that cost nothing: a step is a step)
    full = lambda n: float(n)  # noqa: E731  (each row a step's cost)
    assert draft_length(0.5, 1.0, 1, free, 6) == 6
    assert draft_length(0.99, 1.0, 1, full, 6) == 0, "no draft beats a row that costs a whole step"
    # a CPU's steps, as measured on SmolLM2: a second row doubles a step, the next ones cost less each
    cpu = dict([(1, 1.0), (2, 1.98), (3, 2.4), (4, 2.83), (5, 3.3), (6, 3.72), (7, 3.9)]).__getitem__
    assert draft_length(0.5, 1.0, 1, cpu, 6) == 0
    assert draft_length(0.8, 1.0, 1, cpu, 6) == 3  # 1 + .8 + .64 + .51 = 2.95 tokens for 2.83
    assert draft_length(0.9, 1.0, 1, cpu, 6) == 6
    assert draft_length(0.5, 2.0, 2, cpu, 4) == 1, "a third row is cheap where a second was not"


# ---- the scheduler, in process ---------------------------------------------------------------------------

@pytest.mark.slow  # decodes SmolLM2 in this process
def test_drafts_checked_in_the_batch_leave_greedy_text_unchanged(smollm2_engine: object) -> None:
    """One request, greedy, drafting up to 4 tokens a step (rows free): the text is that of the same scheduler
    without drafts, past drafts kept and drafts rejected (a rejected draft left in the cells, or a draft kept
    unchecked, changes it)."""
    eng: Any = smollm2_engine
    prompt = Prompt.text(_chat(eng, _copy_prompt(5)))
    greedy = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    plain = _complete(_pc(eng, 2, 0, 0.0), [Request(0, prompt, greedy)])[0]
    drafted = _complete(_pc(eng, 2, 4, 0.0), [Request(0, prompt, greedy)])[0]
    assert_same_greedy_text([drafted.text], [plain.text], "drafts checked in the batch never change greedy text")
    assert plain.drafted == 0 and drafted.completion_tokens == 48
    assert drafted.accepted > 0 and drafted.drafted > drafted.accepted, "some drafts kept, some rejected"


@pytest.mark.slow  # decodes SmolLM2 in this process
def test_the_cells_hold_exactly_the_kept_tokens_after_every_step(smollm2_engine: object) -> None:
    """Three requests (greedy and sampled, one with a stop string, one with log-probabilities) drafting in one
    batch: after every step each running sequence's cells end just before its pending token (rejected drafts
    forgotten), every request ends as it would (its token limit, its stop), and log-probabilities come for every
    token, drafted or not."""
    from localgen.native.lib import lib

    eng: Any = smollm2_engine
    pc = _pc(eng, 3, 4, 0.0)
    lc = lib()
    mem = lc.llama_get_memory(pc.ctx)
    sched = Scheduler(pc, exact=False, reuse=True)
    text = _copy_prompt(4)
    reqs = [Request(0, Prompt.text(_chat(eng, text)), SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)),
            Request(1, Prompt.text(_chat(eng, text)), SamplingParams(temperature=0.8, max_tokens=40, ignore_eos=True),
                    seed=5, logprobs=2),
            Request(2, Prompt.text(_chat(eng, text)), SamplingParams(temperature=0.0, max_tokens=60, stop=["Item 2"]))]
    for r in reqs:
        sched.add(r)
    done: dict[int, Any] = {}
    checked = 0
    try:
        while not sched.idle:
            done.update({o.id: o.completion for o in sched.step() if isinstance(o, Finished)})
            for seq in sched.active.values():
                if seq.pending is not None:
                    assert lc.llama_memory_seq_pos_max(mem, seq.slot) == seq.next_pos - 1
                    assert pc.slots.held[seq.slot] == seq.req.tokens + seq.dec.tokens[:-1], "the record agrees"
                    checked += 1
    finally:
        sched.close()
        pc.close()
    assert checked > 20
    assert done[0].completion_tokens == done[1].completion_tokens == 40
    assert len(done[1].logprobs) == 40 and all(t.logprob <= 0 for t in done[1].logprobs)
    assert done[2].finish_reason == "stop" and "Item 2" not in done[2].text and "Item 1" in done[2].text
    assert sum(c.drafted for c in done.values()) > 0 and sum(c.accepted for c in done.values()) > 0


@pytest.mark.slow  # decodes SmolLM2 in this process
def test_drafts_stop_where_rows_cost_what_they_return(smollm2_engine: object) -> None:
    """Where a drafted row costs a whole step (a CPU computing each row in full), no draft length pays,
    and a sequence only tries one token after 16 steps (so its share can recover); where rows cost
    nothing it drafts every step it finds a match."""
    eng: Any = smollm2_engine
    prompt = Prompt.text(_chat(eng, _copy_prompt(5)))
    greedy = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    dear = _complete(_pc(eng, 1, 4, 1.0), [Request(0, prompt, greedy)])[0]
    free = _complete(_pc(eng, 1, 4, 0.0), [Request(0, prompt, greedy)])[0]
    assert 0 < dear.drafted <= 48 // 16 + 1
    assert free.drafted > 4 * dear.drafted


@pytest.mark.slow  # loads and decodes SmolLM2 in this process
def test_with_a_stream_per_slot_drafts_beside_other_sequences_are_priced_as_a_pass_of_their_own(
        smollm2_engine: object, smollm2_path: Path) -> None:
    """Two copying requests decoding together, rows nearly free within a pass (0.05 of a step each): where the
    slots share one pool of cells, their drafts ride in the step's one pass and pay; where each slot has a
    stream (a CPU's default), llama.cpp cuts the step into a pass per number of rows, so drafts cost a pass of
    their own and only the tries are made."""
    from localgen.engine.llama import Engine
    from localgen.models.resolve import resolve
    from localgen.types import LoadParams

    eng: Any = smollm2_engine
    greedy = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)

    def both(e: Any) -> tuple[bool, int]:
        pc = _pc(e, 2, 4, 0.05)
        prompt = Prompt.text(_chat(e, _copy_prompt(5)))
        done = _complete(pc, [Request(i, prompt, greedy) for i in range(2)])
        return pc.one_pool, sum(c.drafted for c in done.values())

    streams, drafted_streams = both(eng)
    pooled_eng = Engine(resolve(str(smollm2_path)), LoadParams(n_ctx=2048, kv_unified=True))
    try:
        pooled, drafted_pooled = both(pooled_eng)
    finally:
        pooled_eng.close()
    assert (streams, pooled) == (False, True)
    assert drafted_streams <= 2 * (40 // 16 + 1), "tries only"
    assert drafted_pooled > 20


@pytest.mark.slow  # decodes SmolLM2 in this process
def test_tries_that_fail_come_ever_later(smollm2_engine: object) -> None:
    """A sampled poem (little to copy) where rows cost a whole step: its tries fail, and each comes twice as late
    as the one before (after 16 steps, then 32, 64, 128: at most three in 200 tokens, where one every 16 steps
    would be twelve)."""
    eng: Any = smollm2_engine
    prompt = Prompt.text(_chat(eng, "Write a short poem about the sea."))
    hot = SamplingParams(temperature=1.5, max_tokens=200, ignore_eos=True)
    c = _complete(_pc(eng, 1, 4, 1.0), [Request(0, prompt, hot, seed=1)])[0]
    assert c.completion_tokens == 200 and c.accepted == 0 and 1 <= c.drafted <= 3


@pytest.mark.slow  # decodes SmolLM2 in this process
def test_calibrate_measures_a_row_and_leaves_no_cells(smollm2_engine: object) -> None:
    from localgen.native.lib import lib

    eng: Any = smollm2_engine
    pc = ParallelContext(eng, 2, 512, pooled=True, draft_max=4)
    try:
        cost = pc.calibrate(reps=2)
        sizes = [n for n, _ in pc.costs.steps]
        assert sizes[:2] == [1, 2] and sizes[-1] == 2 * 5 and sizes == sorted(sizes)  # both slots, four drafts
        costs = [c for _, c in pc.costs.steps]
        assert costs[0] == 1.0 and costs == sorted(costs) and cost == pc.costs.row == costs[1] - 1
        assert pc.costs.step(2) == costs[1] and costs[0] <= pc.costs.step(5) <= costs[-1]
        lc = lib()
        mem = lc.llama_get_memory(pc.ctx)
        assert [lc.llama_memory_seq_pos_max(mem, q) for q in range(2)] == [-1, -1]
    finally:
        pc.close()
    assert ParallelContext(eng, 2, 512, pooled=False, draft_max=4).draft_max == 0, "the exact scheduler never drafts"


# ---- as users run it ----------------------------------------------------------------------------------------

@pytest.mark.slow  # runs SmolLM2 in a localgen process
def test_run_file_lookup_reports_its_drafts(cli: CLI, tmp_path: Path) -> None:
    lines = tmp_path / "in.jsonl"
    lines.write_text("".join(json.dumps({"prompt": _copy_prompt(4)}) + "\n" for _ in range(2)))
    r = cli("run", "--file", str(lines), "--lookup", "-n", "24", "--temperature", "0", "--json", "--stats",
            "--parallel", "2")
    assert r.returncode == 0, r.stderr
    docs = [json.loads(line) for line in r.stdout.splitlines()]
    assert [d["line"] for d in docs] == [1, 2] and all(d["completion_tokens"] == 24 for d in docs)
    assert all(d["exact"] == "no" for d in docs), "drafting batches every answer"
    stats = r.stderr.strip().splitlines()[-1]
    assert "throughput batching" in stats and "tokens drafted" in stats and "--lookup" in stats
    r = cli("run", "--file", str(lines), "--draft", "smollm2:135m", "-n", "4")
    assert r.returncode == 2 and "--draft cannot be used with --file/--each-line" in r.stderr


@pytest.mark.slow  # starts `localgen serve`
def test_serve_lookup_drafts_and_counts(cli: CLI, cli_env: dict[str, str]) -> None:
    """serve --lookup: the start-up line says why it batches everything, a request's llama-server `timings` say
    what was drafted and kept, and /metrics and /health count the same."""
    import httpx

    r = cli("serve", "--draft-max", "3")
    assert r.returncode == 2 and "add --lookup" in r.stderr and r.stderr.count("\n") == 1
    s = Server(cli_env, "--lookup", "--draft-max", "4", "-np", "2", "--ctx", "1024")
    try:
        body = {"model": "smollm2:135m", "messages": [{"role": "user", "content": _copy_prompt(4)}],
                "max_tokens": 32, "temperature": 0}
        doc = httpx.post(f"{s.url}/v1/chat/completions", json=body, timeout=300).json()
        metrics = httpx.get(f"{s.url}/metrics", timeout=30).text
        health = s.health()
    finally:
        assert s.stop() == 0
    assert s.proc.stderr is not None
    startup = s.proc.stderr.read().decode()
    assert "smollm2:135m: throughput batching: --lookup" in startup
    timings = doc["timings"]
    assert doc["usage"]["completion_tokens"] == 32
    # drafts where they pay; where a row costs too much here, still the every-16-steps probe
    assert timings["draft_n"] >= 1 and 0 <= timings["draft_n_accepted"] <= timings["draft_n"]
    for name, key in (("localgen_draft_tokens_total", "draft_n"), ("localgen_draft_accepted_tokens_total",
                                                                    "draft_n_accepted")):
        assert f'{name}{{model="smollm2:135m"}} {float(timings[key])}' in metrics
    assert (health["drafted"], health["accepted"]) == (timings["draft_n"], timings["draft_n_accepted"])
    assert health["draft_row_cost"] >= 0, "measured at the warm-up"
