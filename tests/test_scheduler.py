"""The throughput scheduler (engine/batch.py, a pooled ParallelContext): many prompts in one call, prompts
cut into chunks and mixed into the decoding steps, shared prefixes, the exact lane beside it, and which
mode runs by default."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from localgen.engine.batch import ParallelContext
from localgen.engine.batchmode import batching_mode, exact_price
from localgen.engine.batchseq import Request
from localgen.engine.scheduler import Finished, Scheduler
from localgen.engine.tokens import common_prefix, reusable_prefix
from localgen.native.lib import lib
from localgen.native.prompt import Prompt
from localgen.types import SamplingParams

PROMPTS = ["Tell me about rivers.", "What is the capital of France?", "Write a haiku about snow.",
           "List three colors."]


def _chat(eng: Any, text: str) -> list[int]:
    return list(eng.chat_tokens([{"role": "user", "content": text}]))


def _kept(eng: Any, held: list[int], prompt: list[int], evaluated: int | None = None) -> int:
    """How many tokens of `prompt` a slot holding `held` (its first `evaluated` its prompt, all when None) keeps:
    what gives a fresh evaluation's rows bit for bit (engine/tokens.py; these prompts fit one ubatch)."""
    n = common_prefix(held, prompt)
    return reusable_prefix(n, len(held) if evaluated is None else evaluated, len(prompt), eng.kv.n_ubatch,
                           eng.kv.n_batch)


def _greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def test_the_prompts_of_many_new_requests_are_evaluated_in_one_call(smollm2_engine: object) -> None:
    eng: Any = smollm2_engine
    pc = ParallelContext(eng, 4, 512, pooled=True)
    pc.step_tokens = 512  # the four prompts (~35 tokens each) fit one step
    done: dict[int, Any] = {}
    try:
        pc.run(iter([Request(i, Prompt.text(_chat(eng, p)), _greedy(8)) for i, p in enumerate(PROMPTS)]),
               lambda c: done.__setitem__(c.index, c))
    finally:
        pc.close()
    # one call evaluates all four prompts and gives each its first token; seven more decode four rows each (steps
    # counts the decode calls that generate, rounds every scheduler step)
    assert pc.rounds == 8 and pc.steps == 7 and pc.rows == 4 * 7, (pc.rounds, pc.steps, pc.rows)
    assert sorted(done) == [0, 1, 2, 3] and all(c.completion_tokens == 8 for c in done.values())


def _finished(outputs: list[Any], done: dict[int, Any]) -> None:
    done.update({o.id: o.completion for o in outputs if isinstance(o, Finished)})


def _tokens(sched: Scheduler, done: dict[int, Any]) -> dict[int, int]:
    """How many tokens each request has, running or ended."""
    got = {seq.req.index: len(seq.dec.tokens) for seq in sched.active.values()}
    got.update({i: c.completion_tokens for i, c in done.items()})
    return got


def test_a_burst_of_long_prompts_never_stalls_a_running_stream(smollm2_engine: object) -> None:
    """While four ~140-token prompts (more than one ubatch together) are evaluated chunk by chunk, the stream
    that was already running gets a token at every step; the new ones start as their prompts complete."""
    eng: Any = smollm2_engine
    long = [_chat(eng, f"Document {i}: " + "the river runs past the old mill and on to the sea. " * 9)
            for i in range(4)]
    assert sum(map(len, long)) > 512
    pc = ParallelContext(eng, 5, 1024, pooled=True)
    # a GPU's steps (one ubatch each), made small here: on a CPU a step takes a whole n_batch instead
    assert (pc.step_tokens, pc.n_batch, pc.one_pool) == (2048, 2048, False)
    pc.step_tokens = 128
    sched = Scheduler(pc)
    sched.add(Request(0, Prompt.text(_chat(eng, PROMPTS[0])), _greedy(24)))
    done: dict[int, Any] = {}
    history: list[dict[int, int]] = []  # each request's tokens after each step
    try:
        while not sched.idle:
            _finished(sched.step(), done)
            history.append(_tokens(sched, done))
            if len(history[-1]) == 1 and history[-1][0] == 3:  # request 0 streams: the burst arrives
                for i, t in enumerate(long):
                    sched.add(Request(i + 1, Prompt.text(t), _greedy(4)))
    finally:
        pc.close()
    assert set(done) == {0, 1, 2, 3, 4}
    of_0 = [h[0] for h in history]
    first = of_0.index(1)
    assert of_0[first:first + 24] == list(range(1, 25)), "a token at every step"
    firsts = {i: next(k for k, h in enumerate(history) if h.get(i, 0) >= 1) for i in range(1, 5)}
    room = pc.step_tokens - 1  # the running stream's row takes one place in each step
    assert max(firsts.values()) - of_0.index(3) <= -(-sum(map(len, long)) // room) + 1, "chunks filled each step"
    assert len(set(firsts.values())) > 1, "the burst's prompts were cut into chunks across steps"


def _gpu_steps(pc: ParallelContext, size: int) -> None:
    """A GPU's steps, made small: one ubatch of `size` rows per step, and prompts cut on that grid."""
    pc.step_tokens = pc.grid = size


def test_a_burst_with_nothing_decoding_takes_a_whole_batch_per_step(smollm2_engine: object) -> None:
    """Steps of one ubatch (a GPU's) are there so running streams never wait on a burst. With none running, a
    step takes a piece of every prompt waiting, up to n_batch, as llama-batched-bench sends a burst: on an H200 a
    step per ubatch left -npl 32's prefill at 0.94× that tool's. Once a stream decodes, steps are one ubatch."""
    eng: Any = smollm2_engine
    long = [_chat(eng, f"Report {i}: " + "the train crosses the valley and stops at the small station. " * 8)
            for i in range(4)]
    pc = ParallelContext(eng, 4, 1024, pooled=True)
    _gpu_steps(pc, 128)
    assert all(128 < len(t) <= 256 for t in long) and pc.n_batch >= 4 * 128
    sched = Scheduler(pc)
    rows: list[int] = []
    done: dict[int, Any] = {}
    try:
        for i, t in enumerate(long):
            sched.add(Request(i, Prompt.text(t), _greedy(3)))
        while not sched.idle:
            _finished(sched.step(), done)
            rows.append(pc.batch.n_tokens)
    finally:
        pc.close()
    # a piece of every prompt in each call while none decodes (not one ubatch), then a row for each stream per step
    assert rows == [4 * 128, sum(map(len, long)) - 4 * 128, 4, 4]
    assert sorted(done) == [0, 1, 2, 3] and all(c.completion_tokens == 3 for c in done.values())


def test_an_exact_request_in_the_solo_lane_keeps_the_burst_to_one_ubatch_per_step(smollm2_engine: object) -> None:
    """The solo lane (an exact request, run alone) takes one token after each step: while it decodes, a burst's
    steps stay one ubatch, as they do beside decoding streams."""
    eng: Any = smollm2_engine
    long = [_chat(eng, f"Note {i}: " + "the bell rings twice at noon and the market opens in the square. " * 8)
            for i in range(2)]
    pc = ParallelContext(eng, 2, 1024, pooled=True)
    _gpu_steps(pc, 128)
    sched = Scheduler(pc)
    rows: list[int] = []
    done: dict[int, Any] = {}
    try:
        sched.add(Request(9, Prompt.text(_chat(eng, PROMPTS[0])), _greedy(24), exact=True))
        _finished(sched.step(), done)  # the solo lane starts: its prompt, then a token a step
        for i, t in enumerate(long):
            sched.add(Request(i, Prompt.text(t), _greedy(2)))
        while 9 not in done and not sched.idle:
            _finished(sched.step(), done)
            rows.append(pc.batch.n_tokens)
    finally:
        pc.close()
    assert rows and max(rows) <= 128, rows


def test_a_step_lays_its_rows_out_in_slot_order_whatever_slots_the_prompts_got(smollm2_engine: object) -> None:
    """Prompts that continue what other slots hold get those slots, out of arrival order; the step that
    evaluates them still lays out its rows slot by slot, each slot's rows together. With a KV stream per slot,
    llama.cpp cuts a batch into ubatches of consecutive sequence ids, so rows out of order cost many small
    ubatches (a pass over the weights each: a 12 % slower step for 31 prompts on Gemma 3 270M, 2 cores)."""
    eng: Any = smollm2_engine
    first = [_chat(eng, f"Story {k}: " + "a fox and a crow share a long road through the hills. " * 8)
             for k in range(4)]
    extra = list(eng.raw_tokens(" And then?"))[-3:]
    pc = ParallelContext(eng, 4, 512, pooled=True)
    assert not pc.one_pool  # the CPU layout: a stream per slot
    calls: list[list[int]] = []  # the sequence id of every row of each step's llama_decode (one a step)
    slots: dict[int, int] = {}
    done: dict[int, Any] = {}

    def drive(reqs: list[Request]) -> None:
        sched = Scheduler(pc, reuse=True)
        for r in reqs:
            sched.add(r)
        while not sched.idle:
            _finished(sched.step(), done)
            calls.append([pc.batch.seq(i) for i in range(pc.batch.n_tokens)])
            slots.update({seq.req.index: slot for slot, seq in sched.active.items()})

    try:
        drive([Request(k, Prompt.text(t), _greedy(2)) for k, t in enumerate(first)])
        assert [slots[k] for k in range(4)] == [0, 1, 2, 3]
        calls.clear()
        # arrivals continue the slots' prompts in reverse: request 4 continues slot 3's, ..., 7 slot 0's
        drive([Request(4 + k, Prompt.text(first[3 - k] + extra), _greedy(2)) for k in range(4)])
    finally:
        pc.close()
    assert [slots[4 + k] for k in range(4)] == [3, 2, 1, 0], "each prompt took the slot holding its prefix"
    kept = [_kept(eng, first[3 - k], first[3 - k] + extra) for k in range(4)]
    assert all(done[4 + k].cached_tokens == kept[k] > 0 for k in range(4))
    assert len(calls[0]) == sum(len(first[3 - k]) + len(extra) - kept[k] for k in range(4)), \
        "the four prompts' tokens still to evaluate in one call"
    for ids in calls:
        assert ids == sorted(ids), f"rows out of slot order: {ids}"


@pytest.mark.parametrize("pool", [False, True], ids=["streams", "one-pool"])
def test_a_shared_prefix_is_taken_from_another_slot_and_survives_it(smollm2_engine: object, pool: bool) -> None:
    """A request whose system prompt a running slot already holds shares those cells instead of evaluating
    them; when that slot moves on to another prompt, the cells stay for the one that shares them. In both KV
    layouts: a stream per slot (a CPU's default: the cells come in a copy of the stream) and one pool (a GPU's
    default, --kv-unified here: the same cells, tagged with both sequences)."""
    eng: Any = smollm2_engine
    system = "You are a careful assistant. Answer in one short sentence. " * 12

    def conv(q: str) -> list[int]:
        return list(eng.chat_tokens([{"role": "system", "content": system}, {"role": "user", "content": q}]))

    first, second, other = conv("Name a river."), conv("Name a mountain."), _chat(eng, "Count to three.")
    prefix = 0
    while first[prefix] == second[prefix]:
        prefix += 1
    assert prefix > 100
    params = eng.params
    eng.params = dataclasses.replace(params, kv_unified=True) if pool else params
    try:
        pc = ParallelContext(eng, 2, 1024, pooled=True)
    finally:
        eng.params = params
    assert pc.one_pool == pool
    sched = Scheduler(pc, reuse=True)
    sched.add(Request(0, Prompt.text(first), _greedy(3)))
    done: dict[int, Any] = {}
    positions: list[int] = []  # where request 1's cells begin, after each step
    mem = lib().llama_get_memory(pc.ctx)
    try:
        while not sched.idle:
            _finished(sched.step(), done)
            now = _tokens(sched, done)
            if now.get(0) == 2 and 1 not in now:  # the first request runs: the second arrives
                sched.add(Request(1, Prompt.text(second), _greedy(12)))
            if now.get(1) == 2 and 2 not in now:  # slot 0 is free again: it takes another prompt
                sched.add(Request(2, Prompt.text(other), _greedy(2)))
            positions += [int(lib().llama_memory_seq_pos_min(mem, slot)) for slot, seq in sched.active.items()
                          if seq.req.index == 1]
    finally:
        pc.close()
    shared = reusable_prefix(prefix, len(first), len(second), pc.n_ubatch, pc.grid)
    assert pc.slots.shared == shared == done[1].cached_tokens > 64
    assert done[1].completion_tokens == 12 and done[2].completion_tokens == 2
    assert positions and set(positions) == {0}, "the shared cells stayed with the second request throughout"


def _then(first: Request, done: dict[int, Any], next_turn: Callable[[str], Request]) -> Iterator[Request]:
    """`first`, then the request `next_turn` makes of its answer. In `_one_slot` the next request is taken
    once the slot is free again, so `first` has ended and its completion is in `done` by then: the run that
    answers A's first turn also makes its next one (no run of its own for the answer)."""
    yield first
    yield next_turn(done[first.index].text)


A_SYSTEM = "You are a careful assistant who answers about geography in one short sentence. " * 8


def _conversation_a(eng: Any, next_id: int) -> tuple[list[int], list[int], Callable[[str], Request]]:
    """Conversation A's first turn, its second (filled in once the first is answered), and what makes the
    second turn's request, `next_id`, of the first turn's answer (for `_then`)."""
    a1 = _conversation(eng, A_SYSTEM, "Name a river in Europe.")
    a2: list[int] = []

    def next_turn(answer: str) -> Request:
        a2.extend(_conversation(eng, A_SYSTEM, "Name a river in Europe.", answer, "And one in Asia?"))
        return Request(next_id, Prompt.text(a2), _greedy(8))

    return a1, a2, next_turn


def _conversation(eng: Any, system: str, *turns: str) -> list[int]:
    roles = ["user", "assistant"]
    msgs = [{"role": "system", "content": system}] + [
        {"role": roles[i % 2], "content": t} for i, t in enumerate(turns)]
    return list(eng.chat_tokens(msgs))


def _one_slot(eng: Any, reqs: Iterable[Request], cache_ram: int, pooled: bool = True,
              done: dict[int, Any] | None = None) -> tuple[dict[int, Any], Any]:
    """Run `reqs` one after another in a single slot (as a server with -np 1 would), with host memory for
    saved slots; the completions (into `done`, if given), and the host cache's counters."""
    pc = ParallelContext(eng, 1, 1024, pooled=pooled, cache_ram=cache_ram)
    done = {} if done is None else done
    try:
        pc.run(iter(reqs), lambda c: done.__setitem__(c.index, c), reuse=True)
        return done, pc.slots.host.status() if pc.slots.host else None
    finally:
        pc.close()


@pytest.mark.parametrize("pooled", [True, False], ids=["throughput", "exact"])
def test_a_conversation_that_lost_its_slot_comes_back_from_host_memory(smollm2_engine: object,
                                                                       pooled: bool) -> None:
    """Conversation A, then B in the same (only) slot, then A's next turn: A's KV state was saved to host
    memory before B took the slot and is copied back, so A's next turn evaluates only what is new, and
    answers exactly as it does when A never lost the slot (the same cells, bit for bit)."""
    eng: Any = smollm2_engine
    # 95 tokens: B's state (64 or more past what it shares with A's next turn) is saved before that turn
    b_sys = "You are a poet. Every answer is a rhyming couplet about the weather and the sea. " * 4
    a1, a2, next_turn = _conversation_a(eng, 2)
    b1 = _conversation(eng, b_sys, "Write about rain.")
    kept: dict[int, Any] = {}
    _one_slot(eng, _then(Request(0, Prompt.text(a1), _greedy(8)), kept, next_turn), 0, pooled, kept)
    lost, _ = _one_slot(eng, [Request(0, Prompt.text(a1), _greedy(8)), Request(1, Prompt.text(b1), _greedy(8)),
                              Request(2, Prompt.text(a2), _greedy(8))], 0, pooled)
    back, counters = _one_slot(eng, [Request(0, Prompt.text(a1), _greedy(8)), Request(1, Prompt.text(b1), _greedy(8)),
                                     Request(2, Prompt.text(a2), _greedy(8))], -1, pooled)
    assert kept[2].cached_tokens == _kept(eng, a1, a2) > 64 and len(a1) > 100
    assert lost[2].cached_tokens < 10, "without host memory B's prompt took the slot's cells (but its first words)"
    assert back[2].cached_tokens == kept[2].cached_tokens
    assert back[2].text == kept[2].text and back[2].completion_tokens == 8
    assert counters["saves"] == 2 and counters["loads"] == 1  # A before B, B before A's second turn
    assert counters["loaded_tokens"] == kept[2].cached_tokens
    assert counters["entries"] == 1 and counters["bytes"] > 0  # B's state; A's is in the slot again


def test_a_saved_state_comes_back_into_another_slot(smollm2_engine: object) -> None:
    """Saved from slot 1 (B takes it while X runs in slot 0), loaded into slot 0 (free first, when X ends):
    each slot has its own stream of cells, and the state lands in the new slot's. On the exact scheduler,
    where A's next turn is evaluated alone and decoded on batch-invariant kernels beside B, it answers as
    when A kept its slot."""
    eng: Any = smollm2_engine
    a1, a2, next_turn = _conversation_a(eng, 1)
    kept: dict[int, Any] = {}
    _one_slot(eng, _then(Request(0, Prompt.text(a1), _greedy(4)), kept, next_turn), 0, False, kept)
    x = _chat(eng, "Count from one to twenty.")
    b1 = _conversation(eng, "You are a poet who writes about the weather and the sea. " * 8, "Write about rain.")
    pc = ParallelContext(eng, 2, 1024, cache_ram=-1)
    sched = Scheduler(pc, reuse=True)
    done: dict[int, Any] = {}
    slots: dict[int, int] = {}
    for r in [Request(9, Prompt.text(x), _greedy(20)), Request(0, Prompt.text(a1), _greedy(4)),
              Request(2, Prompt.text(b1), _greedy(40)), Request(1, Prompt.text(a2), _greedy(8))]:
        sched.add(r)
    try:
        while not sched.idle:
            _finished(sched.step(), done)
            slots.update({seq.req.index: slot for slot, seq in sched.active.items()})
        counters = pc.slots.host.status() if pc.slots.host else {}
    finally:
        pc.close()
    assert slots == {9: 0, 0: 1, 2: 1, 1: 0}, "A saved from slot 1, its next turn in slot 0"
    assert counters["loads"] == 1 and done[1].cached_tokens == kept[1].cached_tokens == _kept(eng, a1, a2) > 64
    assert done[1].text == kept[1].text


def test_a_model_with_sliding_window_layers_comes_back_from_host_memory_too(gemma_path: Path) -> None:
    """Gemma 3 keeps two caches (full and sliding-window layers); its saved state holds both, and a text's
    next part answers as when the text kept its slot, on both schedulers."""
    from localgen.engine.llama import Engine
    from localgen.models.resolve import resolve
    from localgen.types import LoadParams

    eng = Engine(resolve(str(gemma_path)), LoadParams(n_ctx=2048))
    try:
        # 82 and 90 tokens: each text's state is saved (64 or more); both caches hold every cell of them (the
        # sliding window is 512), as they did of texts twice as long
        text = "The history of rivers and the mountains they cross. " * 8
        a1 = eng.tokenize(text, True)
        b1 = eng.tokenize("A recipe for bread, flour and water and salt. " * 8, True)
        for pooled in (False, True):
            a2: list[int] = []

            def next_part(answer: str, a2: list[int] = a2) -> Request:
                a2.extend(eng.tokenize(text + answer + " And then", True))
                return Request(2, Prompt.text(a2), _greedy(16))

            kept: dict[int, Any] = {}
            _one_slot(eng, _then(Request(0, Prompt.text(a1), _greedy(8)), kept, next_part), 0, pooled, kept)
            back, counters = _one_slot(eng, [Request(0, Prompt.text(a1), _greedy(8)),
                                             Request(1, Prompt.text(b1), _greedy(8)),
                                             Request(2, Prompt.text(a2), _greedy(16))], -1, pooled)
            assert counters["loads"] == 1 and back[2].cached_tokens == kept[2].cached_tokens == _kept(eng, a1, a2) > 0
            assert back[2].text == kept[2].text
    finally:
        eng.close()


def test_host_memory_keeps_the_most_recent_states_under_its_limit(smollm2_engine: object) -> None:
    """With room for one saved state, a second saved state pushes out the first; a state larger than the
    whole limit is not saved at all; prefixes under 64 tokens are evaluated again, not saved."""
    eng: Any = smollm2_engine
    convs = [_conversation(eng, f"System prompt number {i}. " + "Answer briefly and politely. " * 12, "Hi.")
             for i in range(3)]  # 83 tokens: a state of 64 or more is saved
    reqs = [Request(i, Prompt.text(t), _greedy(4)) for i, t in enumerate(convs)]
    _, unlimited = _one_slot(eng, reqs, -1)
    assert unlimited["entries"] == 2 and unlimited["saves"] == 2
    one = unlimited["bytes"] // 2 + 4096  # room for one state, not two
    _, limited = _one_slot(eng, reqs, one)
    assert limited["entries"] == 1 and limited["saves"] == 2 and limited["bytes"] <= one
    _, tiny = _one_slot(eng, reqs[:2], 4096)  # the one state the second request's arrival would save
    assert tiny["entries"] == 0 and tiny["saves"] == 0
    short = [Request(i, Prompt.text(_chat(eng, p)), _greedy(4)) for i, p in enumerate(PROMPTS[:2])]
    _, counters = _one_slot(eng, short, -1)
    assert counters["saves"] == 0


def test_a_state_chosen_to_load_is_not_pushed_out_by_the_state_saved_before_it(smollm2_engine: object) -> None:
    """Room for two saved states: A, B and C in turn fill it (A and B saved), then A again. Before A's state is
    loaded, C's is saved, and the room it needs comes from B, never from the A about to be loaded (it once was,
    and the step failed: `list.remove(x): x not in list`)."""
    eng: Any = smollm2_engine
    convs = [_conversation(eng, f"System prompt number {i}. " + "Answer briefly and politely. " * 12, "Hi.")
             for i in range(3)]  # 83 tokens each, states of one size
    reqs = [Request(i, Prompt.text(t), _greedy(4)) for i, t in enumerate(convs)]
    _, unlimited = _one_slot(eng, reqs, -1)
    two = unlimited["bytes"] + 4096  # A's and B's states, not a third
    again = Request(3, Prompt.text(convs[0]), _greedy(4))
    kept, _ = _one_slot(eng, [reqs[0], again], 0)  # A never left its slot
    done, counters = _one_slot(eng, [*reqs, again], two)
    assert counters["saves"] == 3 and counters["loads"] == 1 and counters["bytes"] <= two
    assert done[3].cached_tokens == kept[3].cached_tokens > 0 and done[3].text == done[0].text


def test_two_conversations_in_turn_each_come_back_when_one_state_fits_at_a_time(smollm2_engine: object) -> None:
    """Room for one saved state and a half: A and B in turn, each coming back with its prompt whole. Loading A takes
    its entry out of the cache as it goes, so B's state, saved just before, has the room: B then comes back from
    it. (B's save was refused for the room A's entry held until its load, and the cache was left empty: B missed
    on every turn.)"""
    eng: Any = smollm2_engine
    a, b = (_conversation(eng, f"System prompt number {i}. " + "Answer briefly and politely. " * 12, "Hi.")
            for i in range(2))
    _, one = _one_slot(eng, [Request(0, Prompt.text(a), _greedy(4)), Request(1, Prompt.text(b), _greedy(4))], -1)
    room = one["bytes"] * 3 // 2
    done, counters = _one_slot(eng, [Request(i, Prompt.text((a, b)[i % 2]), _greedy(4)) for i in range(4)], room)
    assert done[2].cached_tokens > 0 and done[3].cached_tokens > 0, (done[2].cached_tokens, done[3].cached_tokens)
    assert done[3].text == done[1].text and counters["bytes"] <= room


def test_a_prompt_cache_that_fails_is_turned_off_and_the_request_misses_it(smollm2_engine: object,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A fault of the host cache (here llama.cpp refusing to read a state back with an error) fails no request:
    the one at hand evaluates its prompt afresh and answers as it would have, and the cache is off from then on
    (serve's worker logs the error once)."""
    from localgen.native import context

    eng: Any = smollm2_engine
    a, b = (_conversation(eng, f"System prompt number {i}. " + "Answer briefly and politely. " * 12, "Hi.")
            for i in range(2))

    def broken(*args: Any) -> int:
        raise RuntimeError("no state for you")

    monkeypatch.setattr(context, "seq_state_set", broken)
    pc = ParallelContext(eng, 1, 1024, cache_ram=-1)
    done: dict[int, Any] = {}
    try:
        pc.run(iter([Request(0, Prompt.text(a), _greedy(4)), Request(1, Prompt.text(b), _greedy(4)),
                     Request(2, Prompt.text(a), _greedy(4))]), lambda c: done.__setitem__(c.index, c), reuse=True)
    finally:
        pc.close()
    assert done[2].cached_tokens < 10 and done[2].text == done[0].text and done[2].completion_tokens == 4
    assert pc.slots.host is None and isinstance(pc.slots.host_error, RuntimeError)


def test_a_closed_context_frees_its_saved_states_at_once(smollm2_engine: object) -> None:
    """Closing a context (serve's unload) frees the slot states its host cache holds then, not at Python's next
    full collection: the context sits in reference cycles, and serve's RSS grew by MBs at each model swap."""
    import gc
    import weakref

    eng: Any = smollm2_engine
    convs = [_conversation(eng, f"System prompt number {i}. " + "Answer briefly and politely. " * 12, "Hi.")
             for i in range(2)]
    pc = ParallelContext(eng, 1, 1024, pooled=True, cache_ram=-1)
    sched = Scheduler(pc, reuse=True)
    for i, t in enumerate(convs):
        sched.add(Request(i, Prompt.text(t), _greedy(4)))
    gc.disable()
    try:
        while not sched.idle:
            sched.step()
        assert pc.slots.host is not None and len(pc.slots.host.entries) == 1  # the first, saved for the second
        saved = weakref.ref(pc.slots.host.entries[0])
        sched.close()
        pc.close()
        del sched, pc
        assert saved() is None
    finally:
        gc.enable()


def test_an_exact_request_beside_the_batch_gets_the_answer_it_gets_alone(smollm2_engine: object) -> None:
    eng: Any = smollm2_engine
    sampling = SamplingParams(temperature=0.0, max_tokens=16)
    prompt = Prompt.text(_chat(eng, PROMPTS[1]))
    gen = eng.generate(prompt, sampling)
    alone = "".join(c.text for c in gen)
    pc = ParallelContext(eng, 3, 512, pooled=True)
    done: dict[int, Any] = {}
    reqs = [Request(0, Prompt.text(_chat(eng, PROMPTS[0])), _greedy(20)), Request(1, prompt, sampling, exact=True),
            Request(2, Prompt.text(_chat(eng, PROMPTS[2])), _greedy(20))]
    try:
        pc.run(iter(reqs), lambda c: done.__setitem__(c.index, c))
    finally:
        pc.close()
    assert done[1].text == alone and done[1].finish_reason == gen.finish_reason
    assert done[0].completion_tokens == done[2].completion_tokens == 20


def _engine(**kw: Any) -> Any:
    return SimpleNamespace(**{"offloaded": False, "exact_rows": 0, "flash_attn": False, **kw})


@pytest.mark.parametrize(("kw", "throughput"), [
    ({}, False), ({"offloaded": True}, True), ({"exact_rows": 7}, True), ({"flash_attn": True}, True)])
def test_exactness_is_the_default_only_where_it_is_free(kw: dict[str, Any], throughput: bool) -> None:
    eng = _engine(**kw)
    mode = batching_mode(eng, None)
    assert mode.throughput == throughput and (exact_price(eng) is None) != throughput
    assert mode.exact is (False if throughput else None)
    assert "--exact forces it" in mode.why if throughput else "free" in mode.why
    assert batching_mode(eng, True).exact is True and not batching_mode(eng, True).throughput
    assert batching_mode(eng, False).throughput


def test_smollm2_here_batches_for_throughput_by_default(smollm2_engine: object) -> None:
    from localgen.native.devices import has_gpu

    mode = batching_mode(smollm2_engine, None)  # type: ignore[arg-type]
    assert mode.throughput and ("GPU" if has_gpu() else "flash attention") in mode.why
