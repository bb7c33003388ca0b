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
from localgen.native.prompt import Prompt
from localgen.types import SamplingParams
from tests.conftest import CLI, assert_same_greedy_text
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
    pc.step_costs = [(1, 1.0), (64, 1.0)]
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

    def counted(wants: dict[int, tuple[list[int], int]]) -> dict[int, list[int]]:
        before = d.decodes
        out = propose(wants)
        calls.append((len(wants), max(k for _, k in wants.values()), d.decodes - before))
        return out

    d.propose = counted
    sched = Scheduler(pc, exact=False, reuse=True)
    for r in reqs:
        sched.add(r)
    done: dict[int, Any] = {}
    checked = 0
    try:
        while not sched.idle:
            done.update({o.id: o.completion for o in sched.step() if isinstance(o, Finished)})
            for slot in range(3):
                held = d.held[slot]
                assert lc.llama_memory_seq_pos_max(mem, slot) == len(held) - 1, "the record agrees"
                seq = sched.active.get(slot)
                if seq is None:
                    assert held == [], "a freed slot's draft sequence is cleared"
                elif seq.pending is not None:
                    assert held == (seq.req.tokens + seq.dec.tokens[:-1])[:len(held)]
                    checked += 1
        totals = (pc.drafted, pc.accepted)
    finally:
        sched.close()
        pc.close()
        eng.close()
    assert checked > 20
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
    # one draft-model decode per drafted position (the first with what each slot lacks), every slot in it
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
        assert 0.2 < pc.draft_cost < 5
        lc = lib()
        for ctx in (pc.ctx, pc.drafter.ctx):
            mem = lc.llama_get_memory(ctx)
            assert [lc.llama_memory_seq_pos_max(mem, q) for q in range(2)] == [-1, -1]
    finally:
        pc.close()


@pytest.mark.slow  # loads SmolLM2 twice and decodes in this process
def test_a_draft_models_decodes_are_priced_beside_the_rows(smollm2_engine: object, smollm2_path: Path) -> None:
    """Rows free, one slot: where a draft-model decode costs nothing the request drafts at every step; where one
    costs 100 steps of the model only the tries are made (one token after 16 steps, while they are kept)."""
    eng: Any = smollm2_engine
    prompt = Prompt.text(_chat(eng, _copy_prompt(4)))
    greedy = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    ends: list[Any] = []
    for price in (0.0, 100.0):
        pc = _drafting_pc(eng, smollm2_path, 1)
        pc.draft_cost = price
        try:
            pc.run(iter([Request(0, prompt, greedy)]), ends.append, exact=False)
        finally:
            pc.close()
    drafted = [c.drafted for c in ends]
    assert drafted[0] > 20 and 0 < drafted[1] <= 48 // 16 + 1


@pytest.mark.slow  # loads SmolLM2 in this process
def test_a_slot_catches_up_in_pieces_of_the_batch_size(smollm2_path: Path) -> None:
    """A prompt of 150 tokens with a batch size of 64: a slot's draft sequence takes it in three decodes (another
    slot, the same, proposes the same); then only what it lacks is evaluated, and `kept` drops what is past."""
    from localgen.engine.llama import Engine
    from localgen.engine.speculative import SlotDrafter
    from localgen.models.resolve import resolve
    from localgen.types import LoadParams

    d = SlotDrafter(Engine(resolve(str(smollm2_path)), LoadParams(n_ctx=1024, n_batch=64, n_ubatch=64)), 2, 1024)
    try:
        tokens = _chat(d.engine, _copy_prompt(8))[:150]
        assert len(tokens) == 150
        first = d.propose({0: (tokens, 1)})
        assert d.decodes == 3 and d.held[0] == tokens
        assert d.propose({1: (tokens, 1)}) == {1: first[0]} and d.decodes == 6
        more = d.propose({0: (tokens + first[0], 2)})
        assert d.decodes == 8 and len(more[0]) == 2 and d.held[0] == tokens + first[0] + more[0][:1]
        d.kept(0, 150)
        assert d.held[0] == tokens
        # a draft stops at a token past the model's vocabulary (a draft model with a few more tokens): here every
        # token the draft model picks is past a "vocabulary" that ends below it, so nothing is proposed
        d.limit = min(first[0] + more[0])
        assert d.propose({0: (tokens, 3)}) == {}
    finally:
        d.close()


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


@pytest.mark.slow  # starts `localgen serve` twice
def test_serve_draft_answers_two_requests_at_once_as_serve_without_a_draft(
        cli_env: dict[str, str], smollm2_path: Path, plain_answers: list[str]) -> None:
    """serve --draft PATH --parallel 2, two greedy requests at once: the texts of serve without a draft; the
    start-up line names the draft model; each answer's timings, /health and /metrics count drafts, nearly all
    kept. Then a sampled request with a seed: a well-formed answer, the counts
    move."""
    s = Server(cli_env, "--draft", str(smollm2_path), "-np", "2", "--ctx", "1024")
    try:
        docs = _together(s.url, PROMPTS)
        health = s.health()
        metrics = httpx.get(f"{s.url}/metrics", timeout=30).text
        hot = _ask(s.url, _copy_prompt(3), temperature=0.9, seed=7, max_tokens=40)
        later = s.health()
    finally:
        assert s.stop() == 0
    assert s.proc.stderr is not None
    startup = s.proc.stderr.read().decode()
    assert f"smollm2:135m: throughput batching: --draft {smollm2_path.name}" in startup
    assert_same_greedy_text([d["choices"][0]["message"]["content"] for d in docs], plain_answers,
                            "a draft model's drafts never change greedy text")
    drafted = sum(d["timings"]["draft_n"] for d in docs)
    accepted = sum(d["timings"]["draft_n_accepted"] for d in docs)
    assert drafted > 0 and accepted > 0
    assert (health["drafted"], health["accepted"]) == (drafted, accepted)
    assert health["draft_model_cost"] > 0 and health["draft_row_cost"] >= 0, "measured at the warm-up"
    assert f'localgen_draft_tokens_total{{model="smollm2:135m"}} {float(drafted)}' in metrics
    assert f'localgen_draft_accepted_tokens_total{{model="smollm2:135m"}} {float(accepted)}' in metrics
    assert hot["usage"]["completion_tokens"] == 40 and hot["choices"][0]["message"]["content"].strip()
    assert hot["timings"]["draft_n"] > 0 and later["drafted"] == drafted + hot["timings"]["draft_n"]
    assert later["accepted"] == accepted + hot["timings"]["draft_n_accepted"]


@pytest.mark.slow  # starts `localgen serve` (twice, with the fixture)
def test_a_request_cancelled_mid_stream_leaves_its_slot_to_the_next_exact(
        cli_env: dict[str, str], smollm2_path: Path, plain_answers: list[str]) -> None:
    """With one slot, a streamed request that drafted is dropped by its client after 24 pieces; the next request,
    on the same slot, answers what serve without a draft answers, its drafts kept (its draft sequence started
    anew)."""
    s = Server(cli_env, "-md", str(smollm2_path), "-np", "1", "--ctx", "1024")
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
        assert s.stop() == 0
    assert_same_greedy_text([doc["choices"][0]["message"]["content"]], [plain_answers[1]],
                            "the slot's next request answers as on a fresh server")
    assert health["drafted"] > doc["timings"]["draft_n"] > 0, "both requests drafted"
    assert doc["timings"]["draft_n_accepted"] > 0


@pytest.mark.slow  # loads SmolLM2 and Gemma 3 in a localgen process
def test_a_draft_model_with_another_vocabulary_is_refused_before_listening(cli: CLI, gemma_path: Path) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    r = cli("serve", "--model-draft", str(gemma_path), "-np", "2", "--port", str(port))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "the draft model's vocabulary (262,144 tokens) differs from the model's (49,152)" in r.stderr
    assert "http://" not in r.stdout + r.stderr


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
    """As llama.cpp's check: sizes within 128 tokens (Qwen2.5 7B's 152,064 and its 0.5B's 151,936), the tokens
    both have of the same text."""
    from dataclasses import dataclass

    from localgen.engine.speculative import check_vocab
    from localgen.errors import UsageError

    @dataclass
    class Vocab:  # the two things check_vocab reads of an engine
        n_vocab: int
        renamed: int = -1

        def piece(self, t: int) -> bytes:
            return b"other" if t == self.renamed else str(t).encode()

    check_vocab(Vocab(152_064), Vocab(151_936))  # type: ignore[arg-type]
    check_vocab(Vocab(151_936), Vocab(152_064))  # type: ignore[arg-type]
    for target, draft, said in ((Vocab(152_064), Vocab(151_935), "differs from the model's (152,064) by more than 128"),
                                (Vocab(1024), Vocab(1024, renamed=512), "differs from the model's (token 512)")):
        with pytest.raises(UsageError) as e:
            check_vocab(target, draft)  # type: ignore[arg-type]
        assert said in e.value.message, e.value.message


def test_draft_flags_that_cannot_go_together_are_usage_errors(cli: CLI) -> None:
    for args, said in ((["--draft", "smollm2:135m", "--lookup"], "--draft and --lookup cannot be combined"),
                       (["--draft", " "], "--draft is empty"),
                       (["--draft-max", "3"], "add --lookup or --draft")):
        r = cli("serve", *args)
        assert r.returncode == 2 and said in r.stderr and r.stderr.count("\n") == 1, (args, r.stderr)
