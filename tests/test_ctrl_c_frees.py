"""Ctrl-C pressed while llama.cpp frees a context, a model or a batch: one "interrupted" line and exit 130, never
a SIGSEGV (docs/run.md, "Exit codes and errors"). Such a press is handled once the free returns, and its
KeyboardInterrupt was raised before the reference to what was freed was cleared: a later close() freed it again.
Seldom on a terminal (a press of `run --file` just as the engine's context is freed, when the batch starts);
here each press is made to land there every time: the process sends itself SIGINT as llama.cpp's free returns,
at the call named."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, SAFETY_NET_S, default_sigint

# the console script's two lines, after a SIGINT is arranged to follow the NTH call of llama.cpp's function NAME
SCRIPT = ("import os, signal, sys\nfrom localgen.native.lib import lib\n"
          "name, nth = sys.argv[1], int(sys.argv[2])\nlc = lib()\nreal = getattr(lc, name)\ncalls = [0]\n"
          "def freed_then_pressed(*args):\n    real(*args)\n    calls[0] += 1\n    if calls[0] == nth:\n"
          "        os.kill(os.getpid(), signal.SIGINT)  # pressed while llama.cpp freed: handled as it returns\n"
          "setattr(lc, name, freed_then_pressed)\n"
          "from localgen.cli.main import main\nsys.argv = ['localgen', *sys.argv[3:]]\nsys.exit(main())\n")

# where each lands in `run --file`: the engine's context freed as the batch starts (the one seen in the wild); the
# model, and the engine's batch, freed at the end (after the batch's own)
FREES = [("llama_free", 1), ("llama_model_free", 1), ("llama_batch_free", 2)]


@pytest.mark.parametrize(("name", "nth"), FREES)
def test_ctrl_c_while_llama_cpp_frees_is_one_line_and_exit_130(cli_env: dict[str, str], tmp_path: Path,
                                                               name: str, nth: int) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"Name a river, number {i}.\n" for i in range(3)))
    p = subprocess.run([sys.executable, "-c", SCRIPT, name, str(nth), "run", "--file", str(prompts), "-n", "2",
                        "--temperature", "0"], env={**cli_env, "PYTHONFAULTHANDLER": "1"}, cwd=str(ROOT),
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=SAFETY_NET_S,
                       preexec_fn=default_sigint)
    assert p.returncode != -signal.SIGSEGV, p.stderr
    assert "Traceback" not in p.stderr and "Fatal Python error" not in p.stderr, p.stderr
    assert p.returncode == 130, (p.returncode, p.stderr)
    assert p.stderr.splitlines()[-1] == "interrupted", p.stderr


def test_an_abort_check_stays_referenced_while_its_context_holds_it(smollm2_engine: Any,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A press handled as llama.cpp takes a context's abort check (a chat's long prompt piece) raised before the
    caller kept the ctypes thunk: it was freed while the context still called it at its next decode. Now the press
    waits, for the check to stop the decode it is set for."""
    import gc
    import weakref

    from localgen.native import context, logs
    from localgen.native.lib import lib

    lc = lib()
    real = lc.llama_set_abort_callback
    taken: list[Any] = []

    def set_then_pressed(ctx: Any, thunk: Any, data: Any) -> None:
        real(ctx, thunk, data)
        taken.append(weakref.ref(thunk))
        _ours(signal.SIGINT, sys._getframe())  # the press, handled here as Python handles one at its next check
        # (the handler given this frame), the set_abort call not yet over. Called, not sent: a CI run once saw a
        # raised SIGINT handled two lines after set_abort had returned, and the test failed on the timing, not the
        # code

    monkeypatch.setattr(lc, "llama_set_abort_callback", set_then_pressed)
    previous = signal.signal(signal.SIGINT, _ours)
    try:
        context.set_abort(smollm2_engine.ctx, lambda: False)  # the thunk it returns is not kept
        gc.collect()
        assert taken[0]() is not None, "the thunk the context holds was freed"
        with pytest.raises(KeyboardInterrupt):  # the press, raised after the decode the check stops
            logs.raise_deferred()
        monkeypatch.setattr(lc, "llama_set_abort_callback", real)
        context.set_abort(smollm2_engine.ctx, None)
    finally:
        signal.signal(signal.SIGINT, previous)
    gc.collect()
    assert taken[0]() is None, "a cleared abort check is kept for ever"


def test_an_engine_the_collector_frees_leaves_a_pending_press_to_the_code_it_ran_inside(smollm2_path: Path) -> None:
    """A press noted inside llama.cpp's call (its abort check waits for the decode it stops) was raised by an
    unreferenced engine's __del__ if the collector ran meanwhile (a CI run's gc.collect() between the two): Python
    drops an exception from a finaliser, and keep_ctrl_c handed the press on at a moment no code chose. The engine
    is freed all the same, and the press stays for the code that noted it."""
    from localgen.engine.llama import Engine
    from localgen.models.resolve import resolve
    from localgen.native import logs
    from localgen.types import LoadParams

    engine = Engine(resolve(str(smollm2_path)), LoadParams(n_ctx=256))
    with logs.unbroken(raising=False):
        assert logs.defer_interrupt(None), "a press inside an unbroken block is noted"
    try:
        engine.__del__()  # as the collector calls it: an exception it raised would be lost
        assert engine.model_ptr is None and engine._ctx is None, "the engine was not freed"
    finally:
        with pytest.raises(KeyboardInterrupt):  # the press, still there for its own code
            logs.raise_deferred()
        engine.close()


def test_a_press_while_the_collector_frees_an_engine_is_raised_there(smollm2_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """One that comes while __del__ frees is raised at its end, as before (Python drops it from a finaliser, and
    keep_ctrl_c hands it on): left pending, it was lost where no later llama.cpp call raised it."""
    from localgen.engine.llama import Engine
    from localgen.models.resolve import resolve
    from localgen.native import logs
    from localgen.native.lib import lib
    from localgen.types import LoadParams

    engine = Engine(resolve(str(smollm2_path)), LoadParams(n_ctx=256))
    freed = _freed_then_pressed(lib(), "llama_model_free", monkeypatch)
    previous = signal.signal(signal.SIGINT, _ours)
    try:
        with pytest.raises(KeyboardInterrupt):
            engine.__del__()  # as the collector calls it
    finally:
        signal.signal(signal.SIGINT, previous)
    assert freed and engine.model_ptr is None and not logs.pending()


def _freed_then_pressed(lc: Any, name: str, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """llama.cpp's free NAME, made to be followed by a press (handled at Python's next check); what it freed."""
    real = getattr(lc, name)
    freed: list[Any] = []

    def free(ptr: Any) -> None:
        real(ptr)
        freed.append(ptr)
        signal.raise_signal(signal.SIGINT)  # to this thread

    monkeypatch.setattr(lc, name, free)
    return freed


def _ours(signum: int, frame: Any) -> None:
    """A SIGINT handler as the CLI's: a press inside an `unbroken` block (native/logs.py) waits for its end."""
    from localgen.native import logs

    if not logs.defer_interrupt(frame):
        raise KeyboardInterrupt


def _pressed_as_it_returns(lc: Any, name: str, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """llama.cpp's NAME, made to be followed by a press (handled at Python's next check); what it returned."""

    real = getattr(lc, name)
    made: list[Any] = []

    def made_then_pressed(*args: Any) -> Any:
        made.append(real(*args))
        signal.raise_signal(signal.SIGINT)  # to this thread, as above
        return made[-1]

    monkeypatch.setattr(lc, name, made_then_pressed)
    return made


def _freed(lc: Any, name: str, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    real = getattr(lc, name)
    freed: list[Any] = []

    def free(ptr: Any) -> None:
        freed.append(ptr)
        real(ptr)

    monkeypatch.setattr(lc, name, free)
    return freed


@pytest.mark.parametrize("what", ["context", "model"])
def test_a_press_as_llama_cpp_hands_a_new_object_frees_it_before_it_is_raised(
        smollm2_engine: Any, smollm2_path: Path, monkeypatch: pytest.MonkeyPatch, what: str) -> None:
    """The press stops the command (a chat goes on after it): what llama.cpp had just made (a context's KV cache,
    a model's weights) must not be left to the process, unheld."""
    from localgen.native import context
    from localgen.native import model as native_model
    from localgen.native.lib import lib

    lc = lib()
    if what == "context":
        made = _pressed_as_it_returns(lc, "llama_init_from_model", monkeypatch)
        freed = _freed(lc, "llama_free", monkeypatch)
        make: Any = lambda: context.new(smollm2_engine.model_ptr, n_ctx=256)  # noqa: E731
    else:
        made = _pressed_as_it_returns(lc, "llama_model_load_from_file", monkeypatch)
        freed = _freed(lc, "llama_model_free", monkeypatch)
        make = lambda: native_model.load(str(smollm2_path), native_model.ModelOptions(vocab_only=True))  # noqa: E731

    previous = signal.signal(signal.SIGINT, _ours)
    try:
        with pytest.raises(KeyboardInterrupt):
            make()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert made and made[0], "llama.cpp made nothing"
    assert freed == made, f"the {what} llama.cpp made as the press came was left unfreed"
