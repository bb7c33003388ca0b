"""The engine on the real SmolLM2, loaded once: prefix reuse, stop hold-back, UTF-8, stats, templates."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localgen.engine.template import ChatTemplate
from localgen.errors import ContextOverflowError, LocalgenError, TemplateError
from localgen.native.prompt import Prompt
from localgen.types import LoadParams, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=16)


def _run(engine: Any, tokens: list[int], sampling: SamplingParams) -> Any:
    gen = engine.generate(Prompt.text(tokens), sampling)
    chunks = [c.text for c in gen]
    assert "".join(chunks) == gen.text
    return gen


def test_second_turn_reuses_the_cached_prefix(smollm2_engine: Any) -> None:
    """The second turn keeps the first turn's prompt but the rows a fresh evaluation computes otherwise
    (engine/tokens.py, reusable_prefix), never its answer, generated one token at a time."""
    from localgen.engine.tokens import reusable_prefix

    eng = smollm2_engine
    turn1 = [{"role": "user", "content": "Name a fruit. " + "Think of the orchard, the market and the kitchen. " * 12}]
    g1 = _run(eng, eng.chat_tokens(turn1), GREEDY)
    turn2 = [*turn1, {"role": "assistant", "content": g1.text}, {"role": "user", "content": "Another one?"}]
    tokens2 = eng.chat_tokens(turn2)
    g2 = _run(eng, tokens2, GREEDY)
    p1 = g1.stats.prompt_tokens
    assert g2.stats.cached_tokens == reusable_prefix(p1, p1, len(tokens2), eng.kv.n_ubatch, eng.kv.n_batch) > 64


def test_stats_are_filled(smollm2_engine: Any) -> None:
    g = _run(smollm2_engine, smollm2_engine.raw_tokens("The quick brown fox"), GREEDY)
    s = g.stats
    assert s.finish_reason == "length" and s.completion_tokens == 16
    assert s.ttft_s is not None and s.ttft_s > 0
    assert s.decode_tps is not None and s.decode_tps > 0
    assert s.total_s >= s.ttft_s
    perf = smollm2_engine.perf()  # llama.cpp's own counters: the rate is its tokens over its seconds
    assert perf.n_eval >= s.completion_tokens - 1
    assert s.decode_tps == pytest.approx(perf.n_eval / (perf.t_eval_ms / 1000))


def test_greedy_is_deterministic(smollm2_engine: Any) -> None:
    tokens = smollm2_engine.raw_tokens("Once upon a time")
    smollm2_engine.kv.clear()
    first = _run(smollm2_engine, tokens, GREEDY).text
    smollm2_engine.kv.clear()  # evaluated afresh, the prompt goes through the same kernels again
    assert _run(smollm2_engine, tokens, GREEDY).text == first


def test_stop_text_is_never_emitted_even_across_chunks(smollm2_engine: Any) -> None:
    tokens = smollm2_engine.raw_tokens("1, 2, 3, 4, 5, 6, 7,")
    full = _run(smollm2_engine, tokens, SamplingParams(temperature=0.0, max_tokens=20)).text
    assert " 10," in full  # the greedy continuation counts on
    g = _run(smollm2_engine, tokens, SamplingParams(temperature=0.0, max_tokens=20, stop=(" 10,",)))
    assert g.finish_reason == "stop"
    assert g.text == full[: full.index(" 10,")]


def test_multibyte_characters_never_split(smollm2_engine: Any) -> None:
    # A grammar forces bytes that the byte-level tokenizer splits across several tokens.
    g = _run(smollm2_engine, smollm2_engine.raw_tokens("Emoji:"),
             SamplingParams(temperature=0.0, max_tokens=20, grammar='root ::= "😀é€日本"'))
    assert g.text == "😀é€日本"
    assert "\ufffd" not in g.text
    assert len(g.tokens) > 4


def test_cancel_keeps_text_so_far(smollm2_engine: Any) -> None:
    gen = smollm2_engine.generate(Prompt.text(smollm2_engine.raw_tokens("Once upon a time")),
                                  SamplingParams(temperature=0.0, max_tokens=100))
    for i, _chunk in enumerate(gen):
        if i == 3:
            gen.cancel()
    assert gen.finish_reason == "cancelled"
    assert 3 <= gen.stats.completion_tokens <= 5


def test_cancel_during_a_long_prompt_stops_at_the_end_of_a_piece(smollm2_engine: Any, monkeypatch: Any) -> None:
    """A cancel during a prompt of several n_batch pieces where no abort callback is set (the SIGINT handler is not
    one of ours: pytest's, a thread's): the evaluation stops after the piece under way, no token is generated, and
    the cache holds the pieces evaluated; cancelled before it begins, nothing."""
    eng = smollm2_engine
    tokens = eng.raw_tokens("A river passes the mill near the old bridge. " * 130)  # over 1,300 tokens
    assert len(tokens) > 2 * eng.kv.n_batch
    eng.kv.clear()
    gen = eng.generate(Prompt.text(tokens), GREEDY)
    evaluating = eng.kv.evaluating

    def cancelled_after_the_first_piece(prompt: Any, logits: bool = True, cancelled: Any = bool) -> Any:
        keep, pieces = evaluating(prompt, logits, cancelled)

        def first_then_cancel() -> Any:
            for n in pieces:
                gen.cancel()  # pressed while this piece was evaluated
                yield n

        return keep, first_then_cancel()

    monkeypatch.setattr(eng.kv, "evaluating", cancelled_after_the_first_piece)
    assert [c.text for c in gen] == [] and gen.finish_reason == "cancelled" and gen.stats.completion_tokens == 0
    assert eng.kv.held == tokens[:eng.kv.n_batch]
    monkeypatch.undo()
    eng.kv.clear()
    gen = eng.generate(Prompt.text(tokens), GREEDY)
    gen.cancel()  # before the answer began (chat's stop() reaches a generation just made)
    assert [c.text for c in gen] == [] and gen.finish_reason == "cancelled" and eng.kv.held == []


@contextlib.contextmanager
def _sigint(handler: Any) -> Iterator[None]:
    """`handler` for SIGINT meanwhile: one of ours, as run's and chat's are, so a prompt's pieces take Ctrl-C inside."""
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _press_inside_the_second_piece(eng: Any) -> threading.Thread:
    """A thread that sends this process SIGINT (Ctrl-C) once the first piece of a prompt is held and the second's
    llama_decode is under way (this test's main thread inside context.decode): an event, not a time."""
    from localgen.native import context

    main = threading.main_thread().ident

    def inside_decode() -> bool:
        frame = sys._current_frames().get(main)  # type: ignore[arg-type]
        while frame is not None:
            if frame.f_code is context.decode.__code__:
                return True
            frame = frame.f_back
        return False

    def press() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if len(eng.kv.held) == eng.kv.n_batch and inside_decode():
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.001)

    return threading.Thread(target=press, daemon=True)


def _memory_end(eng: Any) -> int:
    """The last position the context's memory holds (llama.cpp's own account, not the record's)."""
    from localgen.native import context
    from localgen.native.lib import lib

    return int(lib().llama_memory_seq_pos_max(context.memory(eng.ctx), 0))


def test_ctrl_c_inside_a_prompt_piece_stops_its_decode_and_forgets_it(smollm2_engine: Any) -> None:
    """docs/chat.md, Ctrl-C: a first press while a long message is read in (chat's handler cancels the generation)
    stops the piece under way inside its llama_decode, not at its end: its rows leave the KV cache, the record
    holds the pieces before it, as the memory does, and the same prompt then reuses them and answers as a fresh
    evaluation does (the old code held the second piece too)."""
    eng = smollm2_engine
    tokens = eng.raw_tokens("A river passes the mill near the old bridge. " * 130)  # over 1,300 tokens: 3 pieces
    n = eng.kv.n_batch
    assert len(tokens) > 2 * n
    eng.kv.clear()
    gen = eng.generate(Prompt.text(tokens), GREEDY)
    presser = _press_inside_the_second_piece(eng)
    with _sigint(lambda signum, frame: gen.cancel()):
        presser.start()
        assert [c.text for c in gen] == []
    presser.join()
    assert gen.finish_reason == "cancelled" and gen.stats.completion_tokens == 0
    assert eng.kv.held == tokens[:n] and eng.kv.evaluated == n
    assert _memory_end(eng) == n - 1
    again = _run(eng, tokens, GREEDY)
    assert again.stats.cached_tokens == n
    eng.kv.clear()
    fresh = _run(eng, tokens, GREEDY)
    assert again.tokens == fresh.tokens and again.text == fresh.text


def test_a_ctrl_c_raised_inside_a_prompt_piece_leaves_the_memory_as_the_record(smollm2_engine: Any) -> None:
    """docs/run.md: run's handler defers a press that lands inside llama.cpp (native/logs.py) and raises it once
    the decode, stopped where it was, returns: KeyboardInterrupt, and the memory holds what the record says (the old
    code raised it as the piece's decode returned, the piece in the memory and not in the record)."""
    from localgen.native import logs

    def like_run(signum: int, frame: Any) -> None:
        if logs.defer_interrupt(frame):
            return
        raise KeyboardInterrupt

    eng = smollm2_engine
    tokens = eng.raw_tokens("A river passes the mill near the old bridge. " * 130)
    n = eng.kv.n_batch
    eng.kv.clear()
    gen = eng.generate(Prompt.text(tokens), GREEDY)
    presser = _press_inside_the_second_piece(eng)
    with _sigint(like_run), pytest.raises(KeyboardInterrupt):
        presser.start()
        for _ in gen:
            pass
    presser.join()
    gen.close()
    assert gen.finish_reason == "cancelled"
    assert eng.kv.held == tokens[:n] and _memory_end(eng) == n - 1
    eng.kv.evaluate(Prompt.text(tokens))  # the next evaluation goes on from the record: llama.cpp takes its positions
    assert eng.kv.held == tokens and _memory_end(eng) == len(tokens) - 1


def test_context_overflow_raises_before_generating(smollm2_engine: Any) -> None:
    with pytest.raises(ContextOverflowError, match="context window is 2,048"):
        smollm2_engine.generate(Prompt.text(smollm2_engine.raw_tokens("word " * 3000)), GREEDY)


def test_template_renders_like_the_model_expects(smollm2_engine: Any) -> None:
    text = smollm2_engine.template.render([{"role": "user", "content": "hi"}])
    assert text.endswith("<|im_start|>assistant\n")
    assert "<|im_start|>user\nhi<|im_end|>" in text


def test_template_raise_exception_becomes_template_error() -> None:
    t = ChatTemplate("{{ raise_exception('System role not supported') }}", "<s>", "</s>")
    with pytest.raises(TemplateError, match="System role not supported"):
        t.render([{"role": "system", "content": "x"}])


def test_ctrl_c_inside_a_llama_cpp_log_callback_is_raised_after_it(smollm2_engine: Any, monkeypatch: Any) -> None:
    """On a GPU llama.cpp logs on every decode, so Ctrl-C's handler often runs inside our log callback, where
    an exception cannot cross the C frames (ctypes prints and drops it). It is deferred and raised after."""
    import signal

    from localgen.cli import signals
    from localgen.native import logs

    class Interrupting:
        def write(self, s: str) -> int:
            signal.raise_signal(signal.SIGINT)  # the handler runs inside this call, within the callback
            return len(s)

        def flush(self) -> None:
            pass

    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        signals.watch_sigint()
        monkeypatch.setattr("sys.stderr", Interrupting())
        logs.set_echo(True)
        try:
            logs._callback(2, b"CUDA Graph id 7 reused\n", None)  # through the real ctypes thunk
        finally:
            logs.set_echo(False)
        monkeypatch.undo()
        with pytest.raises(KeyboardInterrupt):
            logs.raise_deferred()
        logs.raise_deferred()  # raised once only
        # and in the engine: the next decode raises it, with the cache record still true (a prompt's piece, with
        # this handler of ours, is stopped by it where it is: nothing of it is kept, in the record or the memory)
        tokens = smollm2_engine.chat_tokens([{"role": "user", "content": "Hi"}])
        smollm2_engine.kv.clear()
        logs._deferred = True
        with pytest.raises(KeyboardInterrupt):
            smollm2_engine.kv.evaluate(Prompt.text(tokens))
        assert smollm2_engine.kv.held == [] and _memory_end(smollm2_engine) == -1
        logs._deferred = True
        with pytest.raises(KeyboardInterrupt):  # a token's decode takes no abort callback: it ends, then raises
            smollm2_engine.kv.decode(tokens[:1])
        assert smollm2_engine.kv.held == tokens[:1] and _memory_end(smollm2_engine) == 0
    finally:
        signal.signal(signal.SIGINT, previous)
        signals._sigint["seen"] = False


def test_a_ctrl_c_during_the_load_frees_the_model_at_once(smollm2_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C that came while llama.cpp loaded (deferred, raised as the load ends) frees the model before it
    propagates, and no context is made for it: not when the half-made engine is collected (at exit, perhaps after
    llama.cpp's own teardown)."""
    from localgen.engine import llama
    from localgen.models.resolve import resolve
    from localgen.native import context as native_context
    from localgen.native import model as native_model

    freed: list[str] = []
    free_model, free_context = native_model.free, native_context.free
    monkeypatch.setattr(native_model, "free", lambda m: (freed.append("model"), free_model(m))[1])
    monkeypatch.setattr(native_context, "free", lambda c: (freed.append("context"), free_context(c))[1])
    monkeypatch.setattr(llama.logs, "_deferred", True)  # as if Ctrl-C had landed inside a log callback
    with pytest.raises(KeyboardInterrupt) as caught:
        llama.Engine(resolve(str(smollm2_path)), LoadParams(n_ctx=256))
    # the exception's traceback still holds the half-made engine (as main()'s handler does until it returns)
    assert caught.tb is not None and freed == ["model"]


def test_an_engine_is_freed_when_its_last_user_lets_go(smollm2_path: Path) -> None:
    """Its KV record (Engine.kv) reaches the context through a weak reference: no reference cycle keeps the
    model and its context loaded until the garbage collector runs."""
    import gc
    import weakref

    from localgen.engine.llama import Engine
    from localgen.models.resolve import resolve

    engine = Engine(resolve(str(smollm2_path)), LoadParams(n_ctx=256))
    kv = engine.kv
    kv.evaluate(Prompt.text(engine.raw_tokens("Hello")))
    gone = weakref.ref(engine)
    gc.disable()
    try:
        del engine
        assert gone() is None
    finally:
        gc.enable()
    with pytest.raises(LocalgenError, match="the engine is closed"):
        kv.evaluate(Prompt.text([1, 2]))
