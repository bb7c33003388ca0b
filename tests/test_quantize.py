"""`localgen quantize`, `perplexity`, the ladder and `bench --quality`, on real weights: an F16 made from SmolLM2's
Q4_1 (tests/dequant.py), quantized and measured. What llama.cpp's own tools give on the same inputs is in
tests/data/llama_quant_reference.json (scripts/quant_reference.py regenerates it where they are built)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from localgen.models.download import sha256_file
from tests.conftest import CLI, NO_GPU, ROOT, InProcessCLI, reference_kernels, reference_rel

REF = json.loads((ROOT / "tests" / "data" / "llama_quant_reference.json").read_text())




@pytest.fixture(scope="session")
def smollm2_f16(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Path:
    """SmolLM2's weights as F16 (dequantized from the embedded Q4_1 with the gguf package), made once a session."""
    from tests.dequant import dequantize_to_f16

    path = dequantize_to_f16(smollm2_path, tmp_path_factory.mktemp("f16") / "SmolLM2-135M-Instruct-F16.gguf")
    assert sha256_file(path) == REF["f16_sha256"], "the F16 differs from the one the reference was measured on"
    return path


@pytest.fixture(scope="session")
def tiny_f16(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Path:
    """A small dense llama of random F16 weights with SmolLM2's tokenizer (tests/model_shapes.py's tiny-dense): an
    eighth of SmolLM2's weights, for what quantizes with no reference file to match, where a type's search is slow
    (IQ2_XXS took two minutes of SmolLM2 on a slow CPU)."""
    from tests.model_shapes import SHAPES, build

    return build(SHAPES["tiny-dense"], tmp_path_factory.mktemp("tiny") / "tiny-dense-F16.gguf", tokenizer=smollm2_path)


@pytest.fixture(scope="session")
def test_text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference's text: the shipped text's first characters."""
    from localgen.quant.text import default_text

    path = tmp_path_factory.mktemp("text") / "text.txt"
    path.write_text(default_text()[: REF["text_chars"]], encoding="utf-8")
    return path


@pytest.fixture()
def qcli(cli: CLI, tmp_path: Path) -> CLI:
    """The CLI in a home of its own: what a test quantizes never shows in another test's `list`. No GPU: the
    perplexity and KL figures are llama-perplexity's on a CPU (an H200's PPL was 1.4 % off, its KL 1.6 times)."""
    return CLI({**cli.env, "LOCALGEN_HOME": str(tmp_path / "home"), **NO_GPU})


def _home(q: CLI) -> Path:
    return Path(q.env["LOCALGEN_HOME"])


def _flat(page: str) -> str:
    """A docs page with its lines joined by spaces."""
    return " ".join((ROOT / "docs" / page).read_text(encoding="utf-8").split())


def _one_line(err: str) -> str:
    """The one error line (progress lines aside), with no traceback."""
    lines = [x for x in err.splitlines() if x.startswith("localgen") or "Error" in x]
    assert len(lines) == 1 and lines[0].startswith("localgen: error: "), err
    assert "Traceback" not in err
    return lines[0]


# ---- quantize --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("type_name", ["q8_0", "Q4_K_M"])
def test_quantize_writes_what_llama_quantize_writes_and_lists_it(qcli: CLI, smollm2_f16: Path, type_name: str) -> None:
    r = qcli("quantize", str(smollm2_f16), type_name, "-t", "2", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert set(doc) == {"name", "path", "type", "size", "bits_per_weight", "seconds"}
    canonical = type_name.upper()
    assert doc["name"] == f"smollm2-135m-instruct:{type_name.lower()}" and doc["type"] == canonical
    assert sha256_file(Path(doc["path"])) == REF["quantized"][canonical]["sha256"]  # llama-quantize's bytes, all
    # its figures are the file's: its size, and its tensor data's bits over its weights (Q8_0 blocks hold 8.5 bits)
    from gguf import GGUFReader

    reader = GGUFReader(doc["path"])
    size = Path(doc["path"]).stat().st_size
    weights = sum(int(t.n_elements) for t in reader.tensors)
    assert doc["size"] == size and weights == 134_515_008
    assert doc["bits_per_weight"] == round((size - reader.data_offset) * 8 / weights, 2), doc
    if canonical == "Q8_0":
        assert 8.5 <= doc["bits_per_weight"] < 8.6, doc
    listed = {m["name"]: m for m in json.loads(qcli("list", "--json").stdout)}
    assert listed[doc["name"]]["quantization"] == canonical and listed[doc["name"]]["source"] == "quantized"
    # as quantize.md and models.md say: the source is in --json; plain list's columns are models.md's six
    assert "`localgen list` shows it (`\"source\": \"quantized\"` in `list --json`)" in _flat("quantize.md")
    assert "(name, quantization, size, parameters, context, path; `--json` adds" in _flat("models.md")
    plain = qcli("list").stdout.splitlines()
    assert plain[0].split() == ["NAME", "QUANT", "SIZE", "PARAMS", "CONTEXT", "WHERE"]
    assert any(line.split()[:2] == [doc["name"], canonical] for line in plain)
    shown = qcli("show", doc["name"], "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["quantization"] == canonical
    ran = qcli("run", "-m", doc["name"], "-p", "Hello", "-n", "2", "--threads", "1")
    assert ran.returncode == 0, ran.stderr
    chatted = qcli("chat", "-m", doc["name"], "-n", "2", "--threads", "1", input="Hi\n")
    assert chatted.returncode == 0, chatted.stderr
    gone = qcli("rm", doc["name"], "--yes")
    assert gone.returncode == 0 and not Path(doc["path"]).exists()


def test_quantize_to_a_file_of_ones_own(qcli: CLI, smollm2_f16: Path, tmp_path: Path) -> None:
    out = tmp_path / "mine.gguf"
    r = qcli("quantize", str(smollm2_f16), "Q6_K", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert sha256_file(out) == REF["quantized"]["Q6_K"]["sha256"]
    assert "Q6_K mine.gguf: 50%" in r.stderr  # progress: plain lines when stderr is not a terminal
    assert r.stdout.startswith(f"{out}  Q6_K, ")
    again = qcli("quantize", str(smollm2_f16), "Q6_K", "-o", str(out))
    assert again.returncode == 2 and "exists" in _one_line(again.stderr) and "--force" in again.stderr
    forced = qcli("quantize", str(smollm2_f16), "Q8_0", "-o", str(out), "--force")
    assert forced.returncode == 0 and sha256_file(out) == REF["quantized"]["Q8_0"]["sha256"]
    folder = tmp_path / "models"
    folder.mkdir()
    into = qcli("quantize", str(smollm2_f16), "q8_0", "-o", str(folder), "--json")
    assert json.loads(into.stdout)["path"] == str(folder / "smollm2-135m-instruct-q8_0.gguf")
    assert json.loads(into.stdout)["name"] is None
    copied = qcli("quantize", str(smollm2_f16), "COPY", "-o", str(tmp_path / "copy.gguf"))
    assert copied.returncode == 0, copied.stderr
    from localgen.models.gguf_meta import read_gguf

    def types(path: Path) -> dict[str, int]:
        return {name: ttype for name, _, ttype, _ in read_gguf(str(path))[1]}

    assert types(tmp_path / "copy.gguf") == types(smollm2_f16)


def test_stderr_whose_reader_is_gone_or_full_does_not_end_a_quantization(qcli: CLI, smollm2_f16: Path,
                                                                         tmp_path: Path) -> None:
    """configuration.md: a command ends quietly with status 0 when its reader goes away. quantize's progress is on
    stderr: with that reader gone (`2>&1 | head -1`, a log collector that exits) or stderr full (`2>/dev/full`), it
    ended with status 1 at its next progress line, the quantization thrown away. A real interpreter: what Python
    does with a failed write to stderr is the point."""
    read, write = os.pipe()
    os.close(read)  # the reader has gone
    try:
        gone = subprocess.run(qcli.argv("quantize", str(smollm2_f16), "Q8_0", "-o", str(tmp_path / "a.gguf")),
                              env=qcli.env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=write, timeout=600)
    finally:
        os.close(write)
    assert gone.returncode == 0 and sha256_file(tmp_path / "a.gguf") == REF["quantized"]["Q8_0"]["sha256"]
    with open("/dev/full", "w") as full:
        r = subprocess.run(qcli.argv("quantize", str(smollm2_f16), "Q8_0", "-o", str(tmp_path / "b.gguf")),
                           env=qcli.env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=full,
                           timeout=600)
    assert r.returncode == 0 and r.stdout.startswith(f"{tmp_path / 'b.gguf'}  Q8_0, ".encode()), r.stdout
    assert sha256_file(tmp_path / "b.gguf") == REF["quantized"]["Q8_0"]["sha256"]


@pytest.mark.parametrize("option", ["pure", "leave-output-tensor", "tensor-types"])
def test_llama_quantizes_options_write_what_it_writes(qcli: CLI, smollm2_f16: Path, tmp_path: Path,
                                                     option: str) -> None:
    flags = {"pure": ["--pure"], "leave-output-tensor": ["--leave-output-tensor"],
             "tensor-types": ["--output-tensor-type", "Q8_0", "--token-embedding-type", "q4_0"]}[option]
    out = tmp_path / "q.gguf"
    r = qcli("quantize", str(smollm2_f16), "Q4_K_M", "-o", str(out), *flags)
    assert r.returncode == 0, r.stderr
    assert sha256_file(out) == REF["options_q4_k_m"][option]


def test_an_already_quantized_source_is_refused_and_nothing_is_left(qcli: CLI, tmp_path: Path) -> None:
    r = qcli("quantize", "smollm2:135m", "Q4_K_M", "-o", str(tmp_path / "out.gguf"))
    assert r.returncode == 1
    line = _one_line(r.stderr)
    assert "already quantized (Q4_1)" in line and "--allow-requantize" in line
    assert list(tmp_path.glob("*out.gguf*")) == []
    made = qcli("quantize", "smollm2:135m", "Q4_K_M", "--allow-requantize", "--json")
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["name"] == "smollm2-135m:q4_k_m"


@pytest.mark.parametrize(("args", "needle"), [
    (["Q9_X"], "unknown quantization type 'Q9_X'"),
    (["Q4_K_M", "--output-tensor-type", "q9"], "--output-tensor-type: 'q9' is no ggml type a tensor can be"),
    (["IQ2_XXS"], "IQ2_XXS needs an importance matrix"),
    (["Q4_K_M", "--name", "Bad Name"], "bad model name 'Bad Name'"),
])
def test_bad_input_is_one_line_exit_2(qcli: CLI, smollm2_f16: Path, args: list[str], needle: str) -> None:
    r = qcli("quantize", str(smollm2_f16), *args)
    assert r.returncode == 2
    assert needle in _one_line(r.stderr)
    folder = _home(qcli) / "data" / "quantized"
    assert not folder.exists() or list(folder.iterdir()) == []


@pytest.mark.parametrize(("flag", "type_name", "needle"), [
    ("--output-tensor-type", "deprecated", "'deprecated' is no ggml type"),  # llama.cpp: a division by 0
    ("--output-tensor-type", "q8_1", "'q8_1' is no ggml type a"),  # a ggml type with no quantizer: an assertion
    ("--token-embedding-type", "i32", "'i32' is no ggml type a tensor can be quantized to"),
    ("--token-embedding-type", "Q4_K", "token_embd.weight's rows hold 576 values, not a multiple of q4_k's blocks "
                                       "of 256"),
    ("--token-embedding-type", "iq4_xs", "not a multiple of iq4_xs's blocks of 256"),
])
def test_a_ggml_type_llama_cpp_cannot_write_there_is_refused_before_a_byte(qcli: CLI, smollm2_f16: Path,
                                                                           tmp_path: Path, flag: str,
                                                                           type_name: str, needle: str) -> None:
    """quantize.md: "Checked before a byte is written": a ggml type ggml_quantize_chunk has no quantizer for, or
    one whose blocks do not divide the tensor's rows (llama.cpp falls back for the types it picks, never for one
    given by name), is one line, exit 2, and nothing is written."""
    out = tmp_path / "out"
    out.mkdir()
    r = qcli("quantize", str(smollm2_f16), "Q4_K_M", flag, type_name, "-o", str(out / "x.gguf"))
    assert r.returncode == 2, r.stderr
    assert needle in _one_line(r.stderr)
    assert list(out.iterdir()) == []


def test_the_ggml_types_offered_are_the_ones_llama_cpp_quantizes_to(qcli: CLI, smollm2_f16: Path) -> None:
    """The unknown-type line lists every type a tensor can take, and only those; and each llama-quantize type,
    COPY too."""
    r = qcli("quantize", str(smollm2_f16), "Q4_K_M", "--output-tensor-type", "nope")
    line = _one_line(r.stderr)
    assert "'nope' is no ggml type a tensor can be quantized to" in line
    listed = line.split("those types: ", 1)[1].rstrip(")").split(", ")
    assert {"q8_0", "f16", "q4_k", "iq4_nl", "bf16"} <= set(listed)
    assert not {"q8_1", "q8_k", "i8", "i32", "f64", "deprecated"} & set(listed)
    r = qcli("quantize", str(smollm2_f16), "Q9")
    assert "COPY" in _one_line(r.stderr).split("llama-quantize's types: ")[1]


def test_an_abort_inside_llama_cpp_removes_the_partial_file(smollm2_f16: Path, tmp_path: Path) -> None:
    """What the checks cannot foresee: llama.cpp stopping the process mid-way (GGML_ASSERT) is one line, exit 1,
    and its temp file is removed ("nothing partial is ever left"). Here a type with no quantizer, past the
    checks."""
    code = ("import dataclasses, sys\n"
            "from pathlib import Path\n"
            "from localgen.quant import quantize as q\n"
            "job = q.plan(Path(sys.argv[1]), 'Q8_0', Path(sys.argv[2]), q.Options(threads=1))\n"
            "job = dataclasses.replace(job, params=dataclasses.replace(job.params, token_embedding_type=9))\n"
            "q.run(job)\n")
    r = subprocess.run([sys.executable, "-c", code, str(smollm2_f16), str(tmp_path / "x.gguf")],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 1, r.stderr
    assert "localgen: error: llama.cpp stopped: GGML_ASSERT" in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_output_ending_in_a_slash_is_a_folder(qcli: CLI, smollm2_f16: Path, tmp_path: Path) -> None:
    """quantize.md: "-o FILE ... (a folder, or a name ending in /: NAME-TYPE.gguf inside it, the folder made
    where it is not there)"."""
    r = qcli("quantize", str(smollm2_f16), "Q8_0", "-o", f"{tmp_path / 'new' / 'dir'}/", "--json")
    assert r.returncode == 0, r.stderr
    want = tmp_path / "new" / "dir" / "smollm2-135m-instruct-q8_0.gguf"
    assert json.loads(r.stdout)["path"] == str(want) and want.is_file()
    (tmp_path / "afile").write_text("x")
    r = qcli("quantize", str(smollm2_f16), "Q8_0", "-o", f"{tmp_path / 'afile'}/")
    assert r.returncode == 2 and "is not a folder" in _one_line(r.stderr)


def test_an_output_that_is_a_device_is_refused_with_force_or_without(cli_in_process: InProcessCLI,
                                                                      smollm2_f16: Path) -> None:
    """-o /dev/full (or /dev/null) said "exists (--force replaces it)", and --force then refused it: a device is
    never replaced, said the first time."""
    for extra in ((), ("--force",)):
        r = cli_in_process("quantize", str(smollm2_f16), "Q8_0", "-o", "/dev/null", *extra)
        assert (r.returncode, r.stdout) == (2, ""), r.stderr
        assert r.stderr.startswith("localgen: error: /dev/null is not a regular file (a device, a pipe or a socket): "
                                   "it is not replaced"), r.stderr


def test_an_output_that_is_the_source_by_another_name_is_refused(cli_in_process: InProcessCLI, smollm2_f16: Path,
                                                                   tmp_path: Path) -> None:
    """quantize.md: never the source itself, though --force: on a case-insensitive disk (APFS, NTFS) `-o MODEL.gguf`
    for model.gguf is the same file by another spelling, which comparing resolved paths let through. A hard link
    is the same file on any disk."""
    source, other = tmp_path / "model.gguf", tmp_path / "MODEL.gguf"
    os.link(smollm2_f16, source)
    os.link(smollm2_f16, other)
    r = cli_in_process("quantize", str(source), "Q8_0", "-o", str(other), "--force")
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert r.stderr.startswith("localgen: error: the output would overwrite the source"), r.stderr
    assert os.path.samefile(other, smollm2_f16) and sha256_file(source) == REF["f16_sha256"]
    assert "never the source itself" in _flat("quantize.md")


def test_a_folder_made_for_a_refused_quantization_is_removed(qcli: CLI, tmp_path: Path) -> None:
    """The folder -o DIR/ makes is for the result: a plan refused before a byte is written (here, requantizing
    without --allow-requantize) leaves no empty folders behind, and a folder that was there is kept."""
    top = tmp_path / "out"
    top.mkdir()
    r = qcli("quantize", "smollm2:135m", "Q8_0", "-o", f"{top / 'new' / 'dir'}/")
    assert r.returncode == 1 and "--allow-requantize" in _one_line(r.stderr)
    assert list(top.iterdir()) == []
    (top / "kept").mkdir()
    r = qcli("quantize", "smollm2:135m", "Q8_0", "-o", f"{top / 'kept' / 'sub'}/")
    assert r.returncode == 1
    assert [p.name for p in top.iterdir()] == ["kept"] and list((top / "kept").iterdir()) == []


def _made(q: CLI) -> list[str]:
    """The files in the quantized models' folder (but the records of what each was made from)."""
    folder = _home(q) / "data" / "quantized"
    return sorted(p.name for p in folder.iterdir() if not p.name.endswith(".origin.json")) if folder.is_dir() else []


@pytest.mark.parametrize("args", [
    ["quantize", "nope.gguf", "Q4_K_M"], ["quantize", "sub/nope.gguf", "Q8_0"],
    ["perplexity", "-m", "nope.gguf", "-f", "README.md"],  # (run's, bench's -m: a usage error, test_input_files.py)
])
def test_a_name_that_looks_like_a_file_and_is_not_there_is_no_such_file(qcli: CLI, args: list[str]) -> None:
    """Every command, through models/resolve.py: a .gguf name (with at most one '/') is a path, never a catalogue
    name ("unknown model")."""
    name = next(a for a in args if a.endswith(".gguf"))
    assert not (ROOT / name).exists()
    r = qcli(*args)
    assert r.returncode == 2  # a usage error naming the argument, as run's -m to nothing is
    flag = "SOURCE" if args[0] == "quantize" else "-m/--model"
    assert _one_line(r.stderr) == f"localgen: error: {flag} {name}: no such file"


def test_a_type_by_number_or_alias_is_named_by_the_type_it_stands_for(qcli: CLI, smollm2_f16: Path) -> None:
    """As `list` names the file: 15 (or Q4_K) makes NAME:q4_k_m, which run -m takes; Q4_K_M then finds it there."""
    r = qcli("quantize", str(smollm2_f16), "15", "--name", "num", "--json", "-t", "2")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["name"], doc["type"], Path(doc["path"]).name) == ("num:q4_k_m", "Q4_K_M", "num@q4_k_m.gguf")
    listed = {m["name"]: m for m in json.loads(qcli("list", "--json").stdout)}
    assert listed["num:q4_k_m"]["quantization"] == "Q4_K_M"
    assert any(line.split()[:2] == ["num:q4_k_m", "Q4_K_M"] for line in qcli("list").stdout.splitlines())
    inode = Path(doc["path"]).stat().st_ino
    for same in ("Q4_K_M", "q4_k"):
        again = qcli("quantize", str(smollm2_f16), same, "--name", "num")
        # named as `list` and run -m name it, not by its file (quantize.md: kept as NAME:TYPE)
        assert again.returncode == 2 and _one_line(again.stderr) == ("localgen: error: the quantized model "
                                                                     "num:q4_k_m exists (--force replaces it)")
    assert _made(qcli) == ["num@q4_k_m.gguf"] and Path(doc["path"]).stat().st_ino == inode


def test_a_full_disk_is_one_line_and_leaves_nothing(qcli: CLI, smollm2_f16: Path, tmp_path: Path) -> None:
    """Two ways: too little free space before the start (seen by the check), and writes failing part-way (a file
    size limit, as a disk that fills while writing)."""
    out = tmp_path / "full" / "q.gguf"
    out.parent.mkdir()
    limit = 20 << 20

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    r = subprocess.run(qcli.argv("quantize", str(smollm2_f16), "Q8_0", "-o", str(out)), env=qcli.env,
                       capture_output=True, text=True, preexec_fn=small_files, timeout=600)
    assert r.returncode == 1
    assert "could not write" in _one_line(r.stderr)
    assert list(out.parent.iterdir()) == []
    # -o DIR/ made the folders: a write that fails removes them again (quantize.md), as a refused plan does
    r = subprocess.run(qcli.argv("quantize", str(smollm2_f16), "Q8_0", "-o", f"{out.parent / 'new' / 'dir'}/"),
                       env=qcli.env, capture_output=True, text=True, preexec_fn=small_files, timeout=600)
    assert r.returncode == 1 and "could not write" in _one_line(r.stderr)
    assert list(out.parent.iterdir()) == []
    assert "the folder made where it is not there, and removed again when the quantization is refused or fails" \
        in _flat("quantize.md")


def test_too_little_free_space_is_refused_before_writing(smollm2_f16: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil
    from collections import namedtuple

    from localgen.errors import LocalgenError
    from localgen.quant import quantize as q

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(q.shutil, "disk_usage", lambda _p: usage(1 << 30, (1 << 30) - (50 << 20), 50 << 20))
    with pytest.raises(LocalgenError, match=r"not enough disk space .* the result needs 138 MiB, 50 MiB is free"):
        q.plan(smollm2_f16, "Q8_0", tmp_path / "q.gguf", q.Options())
    assert list(tmp_path.iterdir()) == []
    assert shutil.disk_usage is not None


def test_a_full_disk_is_said_to_have_0_bytes_free(smollm2_f16: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A disk with nothing left reads "0 bytes is free", not a table's "-" for a missing value."""
    from collections import namedtuple

    from localgen.errors import LocalgenError
    from localgen.quant import quantize as q

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(q.shutil, "disk_usage", lambda _p: usage(1 << 30, 1 << 30, 0))
    with pytest.raises(LocalgenError, match=r"the result needs 138 MiB, 0 bytes is free$"):
        q.plan(smollm2_f16, "Q8_0", tmp_path / "q.gguf", q.Options())


@pytest.mark.parametrize("written", ["unnamed", "named", "named, no hard links"])
def test_a_result_another_quantization_made_meanwhile_is_kept_without_force(
        qcli: CLI, smollm2_f16: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, written: str) -> None:
    """Two quantizations to one result, neither with --force: the one that finds the result there when its own is
    whole (made by the other after its plan) keeps that one, drops its own, and says so in one line (exit 2); it
    replaced it, and reported a file that was by then the other's. --force still replaces it. Whether the result is
    written as a file with no name, as a hidden named one, or where the disk has no hard links."""
    import errno

    from localgen import unnamed
    from localgen.quant import quantize as q

    theirs = b"another quantization's result\n"
    real_run = q.run

    def meanwhile(job: Any, *args: Any, **kwargs: Any) -> Any:
        job.out.write_bytes(theirs)  # the other quantization's result, named after this one's plan
        return real_run(job, *args, **kwargs)

    def no_links(*_args: Any, **_kwargs: Any) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")  # as FAT says it

    monkeypatch.setattr(q, "run", meanwhile)
    if written != "unnamed":
        monkeypatch.setattr(q, "open_unnamed", lambda _folder: None)
    if written == "named, no hard links":
        monkeypatch.setattr(unnamed.os, "link", no_links)
    folder = tmp_path / "out"
    folder.mkdir()
    out = folder / "q.gguf"
    lg = InProcessCLI(qcli.env)
    r = lg("quantize", str(smollm2_f16), "Q8_0", "-o", str(out))
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert _one_line(r.stderr) == (f"localgen: error: {out} exists (another quantization made it while this one ran; "
                                   "it is kept and this result dropped: --force replaces it)")
    assert out.read_bytes() == theirs and [p.name for p in folder.iterdir()] == ["q.gguf"]
    r = lg("quantize", str(smollm2_f16), "Q8_0", "--name", "mine")  # into localgen's models
    assert r.returncode == 2 and _one_line(r.stderr).startswith(
        "localgen: error: the quantized model mine:q8_0 exists (another quantization made it while this one ran")
    made = _made(qcli)
    assert len(made) == 1 and (_home(qcli) / "data" / "quantized" / made[0]).read_bytes() == theirs
    forced = lg("quantize", str(smollm2_f16), "Q8_0", "-o", str(out), "--force")
    assert forced.returncode == 0 and forced.stdout.startswith(f"{out}  Q8_0, "), forced.stderr
    assert sha256_file(out) == REF["quantized"]["Q8_0"]["sha256"] and [p.name for p in folder.iterdir()] == ["q.gguf"]
    assert "A result that exists is replaced only with `--force`, even one another quantization made while it " \
        "ran" in _flat("quantize.md")


def test_ctrl_c_during_a_quantize_leaves_no_file(qcli: CLI, smollm2_f16: Path, tmp_path: Path) -> None:
    """Stopped, nothing is written; where it was replacing a result (--force), the earlier one is kept as it was,
    and the line says so."""
    folder = tmp_path / "out"
    folder.mkdir()
    out = folder / "q.gguf"
    before = None
    for force, said in (([], "nothing was written (q.gguf is not there;"),
                        (["--force"], "nothing was written (the earlier q.gguf is kept as it was;")):
        if force:
            assert qcli("quantize", str(smollm2_f16), "Q8_0", "-o", str(out)).returncode == 0
            before = sha256_file(out)
        p = qcli.popen("quantize", str(smollm2_f16), "Q4_K_M", "-o", str(out), "-t", "1", *force,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        _wait_for_bytes(p)
        p.send_signal(signal.SIGINT)
        rc = p.wait(timeout=60)
        err = p.stderr.read().decode() if p.stderr else ""
        assert rc == 130, err
        assert f"interrupted: {said}" in err and "Traceback" not in err
        assert [x.name for x in folder.iterdir()] == (["q.gguf"] if force else [])
    assert sha256_file(out) == before
    assert "a result it was replacing (`--force`) is kept as it was" in _flat("quantize.md")
    # a SIGTERM (timeout, a kill) the same, into a folder it made: removed (it printed nothing and left the folder)
    made = tmp_path / "made" / "sub"
    p = qcli.popen("quantize", str(smollm2_f16), "Q4_K_M", "-o", f"{made}/", "-t", "1", stdout=subprocess.PIPE,
                   stderr=subprocess.PIPE)
    _wait_for_bytes(p)
    p.send_signal(signal.SIGTERM)
    rc = p.wait(timeout=60)
    err = p.stderr.read().decode() if p.stderr else ""
    assert rc == -signal.SIGTERM and "stopped by SIGTERM: nothing was written (" in err, (rc, err)  # by it
    assert not (tmp_path / "made").exists()
    assert "A SIGTERM or SIGHUP does the same" in _flat("quantize.md")


def _wait_for_bytes(p: Any) -> None:
    """Until a quantization's progress (plain lines on a pipe) says llama.cpp has written part of the result."""
    assert p.stderr is not None
    seen = b""
    while not re.search(rb": \d+%$", seen.rstrip()):
        line = p.stderr.readline()
        assert line, f"the quantization ended before it could be stopped: {seen!r}"
        seen += line


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGSEGV"])
def test_a_quantize_that_crashes_or_is_killed_leaves_no_file(qcli: CLI, smollm2_f16: Path, tmp_path: Path,
                                                             sig: str) -> None:
    """quantize.md: a quantization ended by anything but its own cleanup (SIGKILL, the OOM killer, a crash that
    is not llama.cpp's abort) leaves nothing: the result is written into a file with no name until it is whole."""
    folder = tmp_path / "out"
    folder.mkdir()
    p = qcli.popen("quantize", str(smollm2_f16), "Q4_K_M", "-o", str(folder / "q.gguf"), "-t", "1",
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _wait_for_bytes(p)
    p.send_signal(getattr(signal, sig))
    assert p.wait(timeout=60) == -getattr(signal, sig)
    assert list(folder.iterdir()) == []


def test_an_importance_matrix_is_carried_to_llama_cpp(qcli: CLI, tiny_f16: Path, tmp_path: Path) -> None:
    """An importance matrix changes what llama.cpp writes (its weights weigh each column's error), and lets a type
    that needs one be made."""
    import numpy as np

    from localgen.models.gguf_meta import read_gguf
    from localgen.quant.imatrix import read, write_legacy

    source = str(tiny_f16)
    _, tensors, _ = read_gguf(source)
    rng = np.random.default_rng(0)
    entries = {name: rng.uniform(0.1, 10, dims[0]).astype(np.float32) for name, dims, _, _ in tensors
               if len(dims) == 2 and name.startswith("blk.")}
    imx = tmp_path / "imatrix.dat"
    write_legacy(imx, entries, ncall=4, chunks=7, dataset="test.txt")
    back = read(imx)
    assert back.chunk_count == 7 and back.datasets == ("test.txt",)
    name = next(iter(entries))
    assert np.allclose(back.entries[name], entries[name])
    r = qcli("quantize", source, "Q4_K_M", "-o", str(tmp_path / "with.gguf"), "--imatrix", str(imx))
    assert r.returncode == 0, r.stderr
    assert qcli("quantize", source, "Q4_K_M", "-o", str(tmp_path / "without.gguf")).returncode == 0
    assert sha256_file(tmp_path / "with.gguf") != sha256_file(tmp_path / "without.gguf")
    meta, _, _ = read_gguf(str(tmp_path / "with.gguf"))
    assert meta["quantize.imatrix.file"] == str(imx) and meta["quantize.imatrix.chunks_count"] == 7
    iq = qcli("quantize", source, "IQ2_XXS", "-o", str(tmp_path / "iq.gguf"), "--imatrix", str(imx))
    assert iq.returncode == 0, iq.stderr
    assert "IQ2_XXS needs an importance matrix" in _one_line(qcli("quantize", source, "IQ2_XXS").stderr)
    bad = tmp_path / "bad.dat"
    bad.write_bytes(b"\x01\x00\x00\x00\xff\xff")
    r = qcli("quantize", source, "Q4_K_M", "-o", str(tmp_path / "x.gguf"), "--imatrix", str(bad))
    assert r.returncode == 2 and "is not an importance matrix" in _one_line(r.stderr)
    # the right names with rows of another size: llama.cpp stopped on it a quarter of the way through writing
    wrong = tmp_path / "wrong.dat"
    write_legacy(wrong, {n: np.ones(len(v) + 64, np.float32) for n, v in entries.items()}, ncall=4, chunks=7,
                 dataset="x")
    r = qcli("quantize", source, "Q4_K_M", "-o", str(tmp_path / "y.gguf"), "--imatrix", str(wrong))
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert re.fullmatch(rf"localgen: error: the importance matrix {re.escape(str(wrong))} has [0-9,]+ values for "
                        r"blk\.\S+, which takes [0-9,]+: it was computed for another model", _one_line(r.stderr))
    assert "%" not in r.stderr and not (tmp_path / "y.gguf").exists()
    assert "or whose rows for a tensor are of another size than the tensor's" in _flat("quantize.md")


# ---- perplexity ------------------------------------------------------------------------------------------------


def _ppl_args(text: Path) -> list[str]:
    return ["-f", str(text), "-c", str(REF["ctx"]), "--chunks", str(REF["chunks"]), "-t", str(REF["threads"])]


def test_perplexity_agrees_with_llama_perplexity(qcli: CLI, test_text: Path) -> None:
    r = qcli("perplexity", "-m", "smollm2:135m", *_ppl_args(test_text), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["ppl"] == pytest.approx(REF["q4_1_ppl"], rel=reference_rel(1e-3, 1e-2))
    assert doc["ppl_err"] == pytest.approx(REF["q4_1_ppl_err"], rel=reference_rel(1e-2, 5e-2))
    assert doc["chunks"] == REF["chunks"] and doc["tokens"] == REF["chunks"] * (REF["ctx"] - 1 - REF["ctx"] // 2)
    assert {"ppl", "ppl_err", "chunks", "tokens", "seconds", "tokens_per_s", "divergence"} <= set(doc)
    # the plain report says the JSON's figure in llama's words (of two windows here: a quarter of the time)
    two = json.loads(qcli("perplexity", "-m", "smollm2:135m", "-f", str(test_text), "-c", str(REF["ctx"]),
                          "--chunks", "2", "-t", "1", "--json").stdout)
    plain = qcli("perplexity", "-m", "smollm2:135m", "-f", str(test_text), "-c", str(REF["ctx"]), "--chunks", "2",
                 "-t", "1")
    assert two["chunks"] == 2 and f"Final estimate: PPL = {two['ppl']:.4f}" in plain.stdout
    assert "smollm2:135m: 2 windows" in plain.stderr and "smollm2:135m: 2/2 windows" in plain.stderr


def test_perplexity_of_damaged_weights_is_an_error_not_a_nan(qcli: CLI, smollm2_path: Path, tmp_path: Path) -> None:
    # the red team's model: 1 MB of SmolLM2's weights flipped, the header intact: `PPL = nan`, exit 0
    bad = tmp_path / "badweights.gguf"
    data = bytearray(smollm2_path.read_bytes())
    mid = len(data) // 2
    data[mid:mid + (1 << 20)] = bytes(b ^ 0xFF for b in data[mid:mid + (1 << 20)])
    bad.write_bytes(data)
    for extra in ([], ["--json"]):
        r = qcli("perplexity", "-m", str(bad), "-c", "128", "--chunks", "2", "-t", "1", *extra)
        assert r.returncode == 1 and r.stdout == "", (r.stdout, r.stderr[-2000:])
        assert r.stderr.endswith("localgen: error: the figures measured with badweights.gguf are not numbers "
                                 "(PPL = nan): its weights are likely damaged\n"), r.stderr[-2000:]
    # --save-logits: the file a run saved before stays as it was (it was replaced by the damaged model's, which
    # poisoned every measure against it), and numpy's warning of the NaN rows stays out of the one line
    logits = tmp_path / "ref.logits"
    assert qcli("perplexity", "-m", "smollm2:135m", "-c", "128", "--chunks", "2", "-t", "1", "--save-logits",
                str(logits)).returncode == 0
    before = logits.read_bytes()
    r = qcli("perplexity", "-m", str(bad), "-c", "128", "--chunks", "2", "-t", "1", "--save-logits", str(logits))
    assert r.returncode == 1 and "RuntimeWarning" not in r.stderr, r.stderr[-2000:]
    assert logits.read_bytes() == before and [p.name for p in tmp_path.iterdir() if "logits" in p.name] == [
        "ref.logits"]
    # as the reference, it is the one named (the model measured against it was)
    r = qcli("perplexity", "-m", "smollm2:135m", "--reference", str(bad), "-c", "128", "--chunks", "2", "-t", "1")
    assert r.returncode == 1 and r.stderr.endswith(
        "localgen: error: the figures measured with badweights.gguf are not numbers (PPL = nan): its weights are "
        "likely damaged\n"), r.stderr[-2000:]


def test_a_text_piped_in_with_no_f_is_said_to_be_unread(qcli: CLI) -> None:
    # `cat notes.txt | localgen perplexity -m M` measured the default text, with no word: a PPL of another text
    args = ("perplexity", "-m", "smollm2:135m", "-c", "128", "--chunks", "2", "-t", "1", "--json")
    piped = qcli(*args, input="Notes on the weather, word after word. " * 100)
    plain = qcli(*args)  # (an empty stdin, as a script's: nothing said)
    assert piped.returncode == plain.returncode == 0, piped.stderr
    assert "warning: stdin is not read: give -f - to measure it (the default text is measured)" in piped.stderr
    assert "stdin" not in plain.stderr, plain.stderr
    assert json.loads(piped.stdout)["ppl"] == json.loads(plain.stdout)["ppl"]
    # and what it did not read is left whole for what reads it next (a first check read one byte of it: in
    # `... | while read m; do localgen perplexity -m "$m" ...; done` the next name lost its first letter)
    import shlex
    import subprocess
    import sys

    line = " ".join(shlex.quote(a) for a in (sys.executable, "-m", "localgen", *args))
    after = subprocess.run(["sh", "-c", f"{line} > /dev/null 2>&1; cat"], input="smollm2:135m\nnext\n",
                           env=qcli.env, capture_output=True, text=True, timeout=300)
    assert after.stdout == "smollm2:135m\nnext\n", after.stdout


def test_a_reference_whose_figures_are_not_numbers_is_the_one_blamed() -> None:
    # a logits file with NaN rows said "the figures measured with bad.logits are not numbers (PPL = 276.06...):
    # its weights are likely damaged": a number, and weights, for a file of logits
    from types import SimpleNamespace

    from localgen.cli.perplexity import _check_numbers
    from localgen.errors import LocalgenError

    nan = float("nan")
    m = SimpleNamespace(ppl=276.06, model="smollm2:135m", divergence=SimpleNamespace(ppl_base=21.2, kld=nan))
    with pytest.raises(LocalgenError) as e:
        _check_numbers(m, {"file": "bad.logits"})
    assert str(e.value) == ("the figures measured with the reference bad.logits are not numbers (KL divergence = "
                            "nan): the logits file is likely damaged")
    m.divergence.ppl_base = nan
    with pytest.raises(LocalgenError) as e:
        _check_numbers(m, {"model": "f16.gguf", "ppl": nan})
    assert str(e.value) == ("the figures measured with the reference f16.gguf are not numbers (its PPL = nan): its "
                            "weights are likely damaged")


def test_a_logits_file_that_cannot_be_written_names_its_path(qcli: CLI, test_text: Path, tmp_path: Path) -> None:
    # under a file size limit (a disk that fills) it said only `File too large`
    logits = tmp_path / "out" / "f16.logits"
    logits.parent.mkdir()

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    r = subprocess.run(qcli.argv("perplexity", "-m", "smollm2:135m", "-f", str(test_text), "-c", "128", "--chunks",
                                 "2", "-t", "1", "--save-logits", str(logits)), env=qcli.env, capture_output=True,
                       text=True, preexec_fn=small_files, timeout=600)
    assert r.returncode == 1 and r.stderr.strip().splitlines()[-1] == f"localgen: error: cannot write {logits}: File " \
        "too large", r.stderr[-2000:]
    assert list(logits.parent.iterdir()) == [], "nothing partial is left"


def test_kl_divergence_agrees_with_llama_perplexity(qcli: CLI, smollm2_f16: Path, test_text: Path,
                                                     tmp_path: Path) -> None:
    """The reference's logits saved (llama-perplexity's format), then Q8_0 measured against them."""
    logits = tmp_path / "f16.logits"
    saved = qcli("perplexity", "-m", str(smollm2_f16), *_ppl_args(test_text), "--save-logits", str(logits))
    assert saved.returncode == 0, saved.stderr
    assert logits.read_bytes()[:8] == b"_logits_"
    q8 = tmp_path / "q8.gguf"
    assert qcli("quantize", str(smollm2_f16), "Q8_0", "-o", str(q8)).returncode == 0
    r = qcli("perplexity", "-m", str(q8), "-c", str(REF["ctx"]), "-t", "1", "--reference", str(logits), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)["divergence"]
    want = REF["quantized"]["Q8_0"]
    assert list(d["kld_percentiles"]) == ["max", "p99.9", "p99", "p95", "p90", "median", "p10", "p5", "p1", "p0.1",
                                          "min"]
    assert {"kld", "kld_err", "rms_dp", "same_top", "dp_mean", "dp_percentiles", "ppl_base"} <= set(d)
    assert d["kld"] == pytest.approx(want["kld"], rel=reference_rel(1e-2, 0.1))
    assert d["kld_percentiles"]["p99"] == pytest.approx(want["kld_p99"], rel=reference_rel(1e-2, 0.2))
    assert d["kld_percentiles"]["max"] == pytest.approx(want["kld_max"], rel=reference_rel(1e-2, 0.5))
    assert 100 * d["same_top"] == pytest.approx(want["same_top"], abs=0.01 if reference_kernels() else 1.0)
    assert 100 * d["rms_dp"] == pytest.approx(want["rms_dp"], abs=0.005 if reference_kernels() else 0.05)
    assert json.loads(r.stdout)["ppl"] == pytest.approx(want["ppl"], rel=reference_rel(1e-3, 1e-2))
    # without --ctx, the context the file was saved at (its header's); another one is refused in one line. (The
    # runs below measure the first two windows: the same figures as the first two of eight, at a quarter the time.)
    own = qcli("perplexity", "-m", str(q8), "-t", "1", "--reference", str(logits), "--json", "--chunks", "2")
    assert own.returncode == 0, own.stderr
    first = json.loads(own.stdout)["divergence"]["kld"]
    assert json.loads(own.stdout)["ctx"] == REF["ctx"] and json.loads(own.stdout)["chunks"] == 2 and first > 0
    other = qcli("perplexity", "-m", str(q8), "-c", str(2 * REF["ctx"]), "--reference", str(logits))
    assert other.returncode == 2
    assert f"the reference was measured at a context of {REF['ctx']}, not {2 * REF['ctx']}" in _one_line(other.stderr)
    # the file is llama-perplexity's format: its header and tokens, its steps (a few in millions may round the
    # other way); and llama-perplexity read localgen's file to the same KL divergence (scales and minimums too)
    import numpy as np

    data = logits.read_bytes()
    head = 20 + 4 * REF["ctx"] * REF["chunks"]
    rows = np.frombuffer(data[head:], dtype="<u2").reshape(-1, 49152 + 4)
    assert len(data) == REF["f16_logits"]["size"]
    assert hashlib.sha256(data[:head]).hexdigest() == REF["f16_logits"]["head_sha256"]
    if reference_kernels():  # another CPU's logits differ in their last bits
        assert abs(int(rows[:, 4:].sum(dtype=np.int64)) - REF["f16_logits"]["u16_sum"]) < 64
    assert want["kld_on_localgen_logits"] == pytest.approx(want["kld"], rel=1e-2)
    # llama-perplexity's spellings
    ll = qcli("perplexity", "-m", str(q8), "-c", str(REF["ctx"]), "-t", "1", "--kl-divergence-base", str(logits),
              "--kl-divergence", "--json", "--chunks", "2")
    assert json.loads(ll.stdout)["divergence"]["kld"] == first
    # a model as the reference: measured first on the same text, its logits in a temporary file, removed after
    m = qcli("perplexity", "-m", str(q8), "-f", str(test_text), "-c", str(REF["ctx"]), "-t", "1", "--chunks", "2",
             "--reference", str(smollm2_f16), "--json")
    assert m.returncode == 0, m.stderr
    assert json.loads(m.stdout)["divergence"]["kld"] == pytest.approx(first, rel=1e-6)
    assert list((_home(qcli) / "cache" / "perplexity").iterdir()) == []


def test_a_text_shorter_than_two_windows_is_one_line(qcli: CLI, tmp_path: Path) -> None:
    short = tmp_path / "short.txt"
    short.write_text("Just a few words, far fewer than two windows.\n")
    r = qcli("perplexity", "-m", "smollm2:135m", "-f", str(short), "-c", "128")
    assert r.returncode == 2
    assert "perplexity at a context of 128 needs at least 256 (two windows)" in _one_line(r.stderr)
    short.write_text("Hello")  # one token: "1 tokens" was said
    r = qcli("perplexity", "-m", "smollm2:135m", "-f", str(short), "-c", "16")
    assert r.returncode == 2
    assert "the text is 1 token; perplexity at a context of 16 needs at least 32" in _one_line(r.stderr)


def test_ctx_below_16_is_one_rule_for_every_window_flag(cli_in_process: InProcessCLI, tmp_path: Path) -> None:
    """perplexity, the ladder and bench --quality take a window of 16 tokens or more (the least any --ctx takes but
    0): -c 8 passed the flag's own bound (8) and then failed on the model's ("takes 0 ... or 16 tokens or more"),
    while -c 0 was refused by the flag's: two rules for one flag."""
    for args in (["perplexity"], ["quantize", str(tmp_path / "f16.gguf"), "--ladder", "Q8_0"],
                 ["bench", "--quality", "default", "--reference", "smollm2:135m"]):
        for ctx in ("8", "0", "15"):
            r = cli_in_process(*args, "-c", ctx)
            assert (r.returncode, r.stdout) == (2, ""), (args, ctx, r.stderr)
            assert f"-c must be at least 16, not {ctx}" in r.stderr and r.stderr.count("\n") == 1, (args, r.stderr)


def test_kl_divergence_base_is_always_a_file(cli_in_process: InProcessCLI, tmp_path: Path) -> None:
    """perplexity.md: with --kl-divergence, --kl-divergence-base FILE is --reference FILE: one not there is `no such
    file`, exit 2 (a name without .logits or a slash was looked up as a model: "unknown model", exit 1)."""
    for name in ("nothere.bin", "nothere"):
        r = cli_in_process("perplexity", "--kl-divergence", "--kl-divergence-base", name)
        assert (r.returncode, r.stdout) == (2, ""), r.stderr
        assert r.stderr == f"localgen: error: --kl-divergence-base {name}: no such file\n"


def test_a_fifo_given_as_the_reference_is_refused_never_opened(cli: CLI, tmp_path: Path) -> None:
    """--reference FIFO and --kl-divergence-base FIFO --kl-divergence hung for ever (the path was opened to read a
    logits file's magic); they are refused as bench --quality --reference refuses one, in one line, exit 2."""
    fifo = tmp_path / "ref.logits"
    os.mkfifo(fifo)
    r = cli("perplexity", "-m", "smollm2:135m", "--reference", str(fifo), timeout=60)
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert r.stderr == f"localgen: error: {fifo} is a FIFO (a pipe), not a model file\n"
    # llama-perplexity's spelling takes a logits file, never a model: the FIFO is named as not one (it was worded
    # as a model file), and so is a regular file of another kind
    text = tmp_path / "notes.txt"
    text.write_text("not logits")
    for path in (fifo, text):
        r = cli("perplexity", "-m", "smollm2:135m", "--kl-divergence-base", str(path), "--kl-divergence", timeout=60)
        assert (r.returncode, r.stdout) == (2, ""), r.stderr
        assert r.stderr == (f"localgen: error: --kl-divergence-base {path} is not a logits file (one that "
                            "--save-logits or llama-perplexity's --kl-divergence-base wrote)\n")


def test_a_model_given_for_the_text_is_refused_before_it_is_read(cli_in_process: InProcessCLI,
                                                                 smollm2_path: Path) -> None:
    """-f/--quality/--measure take a text; a GGUF given there by mistake is named as one (not read whole, gigabytes
    of it, only to fail as UTF-8), one line, exit 2."""
    for args in (["perplexity", "-f", str(smollm2_path)],
                 ["quantize", str(smollm2_path), "--ladder", "Q8_0", "--measure", str(smollm2_path)],
                 ["bench", "-m", str(smollm2_path), "--quality", str(smollm2_path), "--reference", str(smollm2_path)]):
        r = cli_in_process(*args)
        assert r.returncode == 2 and r.stdout == "", r.stderr
        assert r.stderr == (f"localgen: error: {smollm2_path} is a GGUF model, not a text (a text goes here; the "
                            "model to measure goes to -m, quantize's to SOURCE)\n")


def test_a_reference_with_another_vocabulary_is_one_line(qcli: CLI, test_text: Path) -> None:
    r = qcli("perplexity", "-m", "smollm2:135m", *_ppl_args(test_text), "--reference", "gemma3:270m")
    assert r.returncode == 2
    assert "the reference has another vocabulary" in _one_line(r.stderr)


def test_a_text_other_than_the_logits_files_is_named_as_such(qcli: CLI, test_text: Path, tmp_path: Path) -> None:
    """perplexity.md: a text given beside a logits file must be the one it was saved from; another is refused as
    another text, not as another vocabulary."""
    logits = tmp_path / "f16.logits"
    saved = qcli("perplexity", "-m", "smollm2:135m", "-f", str(test_text), "-c", "128", "--chunks", "2", "-t", "1",
                 "--save-logits", str(logits))
    assert saved.returncode == 0, saved.stderr
    other = tmp_path / "other.txt"
    other.write_text(" ".join(f"Line {i} of a text that is not the one the logits came from." for i in range(200)))
    r = qcli("perplexity", "-m", "smollm2:135m", "--reference", str(logits), "-f", str(other), "--chunks", "2")
    assert r.returncode == 2
    line = _one_line(r.stderr)
    assert "the text differs from the one f16.logits was saved from" in line and "vocabulary" not in line
    # the same beginning, edited past its first 200 tokens (of 512): said to be "another vocabulary"
    long = tmp_path / "long.logits"
    saved = qcli("perplexity", "-m", "smollm2:135m", "-f", str(test_text), "-c", "256", "--chunks", "2", "-t", "1",
                 "--save-logits", str(long))
    assert saved.returncode == 0, saved.stderr
    edited = tmp_path / "edited.txt"
    edited.write_text(test_text.read_text()[:1400] + other.read_text())
    r = qcli("perplexity", "-m", "smollm2:135m", "--reference", str(long), "-f", str(edited), "--chunks", "2")
    assert r.returncode == 2
    line = _one_line(r.stderr)
    assert "the text differs from the one long.logits was saved from" in line and "vocabulary" not in line
    same = qcli("perplexity", "-m", "smollm2:135m", "--reference", str(logits), "-f", str(test_text), "--chunks",
                "2", "-t", "1", "--json")
    assert same.returncode == 0, same.stderr


def test_a_batch_that_is_no_multiple_of_the_context_suggests_one(qcli: CLI, test_text: Path) -> None:
    """perplexity.md: the batch is smaller than --ctx or a multiple of it; the refusal says which -b fits."""
    r = InProcessCLI(qcli.env)("perplexity", "-m", str(test_text), "-f", str(test_text), "-c", "63")  # never loaded
    assert r.returncode == 2
    line = _one_line(r.stderr)
    assert "the batch (2048) must be smaller than the context (63) or a multiple of it" in line
    assert "give -b 2016, or -b 62" in line


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_prints_what_was_measured(qcli: CLI, test_text: Path, tmp_path: Path, sig: int) -> None:
    """Ctrl-C prints the figures of the windows measured; so does a SIGTERM (`timeout`), after which the process
    ends by it (it printed nothing)."""
    saved = tmp_path / "kept.logits"
    p = qcli.popen("perplexity", "-m", "smollm2:135m", "-f", str(test_text), "-c", "128", "-b", "128", "-t", "1",
                   "--chunks", "10", "--save-logits", str(saved), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stderr is not None and p.stdout is not None
    seen = b""
    while b": 1/10 windows" not in seen:  # the first window is measured (a pipe is told each tenth)
        line = p.stderr.readline()
        assert line, "perplexity ended before it could be stopped"
        seen += line
    p.send_signal(sig)
    rc = p.wait(timeout=60)
    out, err = p.stdout.read().decode(), p.stderr.read().decode()
    assert rc == (130 if sig == signal.SIGINT else -sig), err
    assert "Final estimate: PPL = " in out
    assert "interrupted after" in err and "the logits file was not written" in err and "Traceback" not in err
    assert err.count("interrupted") == 1, f"one line says it: {err!r}"
    assert list(tmp_path.glob("*kept.logits*")) == []


def test_a_second_ctrl_c_as_perplexity_winds_down_keeps_the_figures(qcli: CLI, test_text: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A second Ctrl-C a moment after the first (here: while the model is freed) printed only "interrupted": the
    figures of the windows measured and the "interrupted after N of M windows" line were lost. They are kept."""
    from types import SimpleNamespace

    from localgen.models import resolve
    from localgen.quant import measure as ms

    measured = SimpleNamespace(model="m", chunks=2, chunks_total=8, n_ctx=128, tokens=254, tokens_per_s=100.0,
                               divergence=None, ppl=12.5, ppl_err=0.25)

    def measure(*args: Any, **kw: Any) -> Any:
        try:
            os.kill(os.getpid(), signal.SIGINT)  # the first press, two windows in
        except KeyboardInterrupt:
            raise ms.Interrupted(measured) from None
        raise AssertionError("the first Ctrl-C was not taken")

    def press(*args: Any) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # the second, as the model is freed

    monkeypatch.setattr(resolve, "resolve", lambda *a, **kw: SimpleNamespace(name="m"))
    monkeypatch.setattr(ms, "open_model", lambda *a: SimpleNamespace(close=press))
    monkeypatch.setattr(ms, "perplexity", measure)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as a command on a terminal has it
    try:
        r = InProcessCLI(qcli.env)("perplexity", "-m", "m", "-f", str(test_text), "-c", "128", "-b", "128")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert r.returncode == 130, r.stderr
    assert "Final estimate: PPL = 12.5000" in r.stdout, (r.stdout, r.stderr)
    assert r.stderr.strip().splitlines()[-1] == "interrupted after 2 of 8 windows: the figures above cover those", \
        r.stderr


def test_ctrl_c_stops_a_decode_under_way(qcli: CLI, test_text: Path) -> None:
    """A decode of 16 windows (-c 128 -b 2048), seconds long, is stopped where it is by Ctrl-C (llama.cpp's abort
    callback), not run to its end: none of its windows is measured."""
    p = qcli.popen("perplexity", "-m", "smollm2:135m", "-f", str(test_text), "-c", "128", "-b", "2048", "-t", "1",
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stderr is not None and p.stdout is not None
    first = p.stderr.readline()  # "smollm2:135m: N windows": the first decode starts
    assert first.endswith(b" windows\n") and b"/" not in first, first
    p.send_signal(signal.SIGINT)
    rc = p.wait(timeout=120)
    out, err = p.stdout.read().decode(), p.stderr.read().decode()
    assert rc == 130, err
    assert out == "" and err.strip().splitlines()[-1] == "interrupted before the first window was measured", err
    assert "Traceback" not in err and "Exception ignored" not in err


def test_a_ctrl_c_noted_inside_llama_cpp_stops_the_decode_under_way(smollm2_path: Path) -> None:
    """The mechanism of the test above, without its race: a Ctrl-C landing in llama.cpp's abort check is noted
    there (logs.defer_interrupt), the check stops the decode under way (llama.cpp says ret = 2), and the Ctrl-C
    is raised once llama.cpp has returned; with no window of that decode measured."""
    import signal

    from localgen.engine import perplexity as ppl
    from localgen.engine.llama import Engine
    from localgen.models.resolve import resolve
    from localgen.native import logs
    from localgen.quant.text import default_text
    from localgen.types import LoadParams

    frames: list[bool] = []
    check = logs.abort_check(lambda: frames.append(logs.defer_interrupt(sys._getframe(1))) or False)
    check(None)  # a handler running inside the check defers the Ctrl-C...
    assert frames == [True] and logs._deferred and check(None) is True  # ...and the check stops the computation
    logs._deferred = False
    previous = signal.signal(signal.SIGINT, lambda signum, frame: None)  # a handler of ours (not Python's default)
    engine = Engine(resolve(str(smollm2_path)), LoadParams(n_ctx=128, n_threads=1, n_threads_batch=1))
    try:
        m = ppl.Perplexity(engine, ppl.windows(engine, default_text(), 128, 32), n_batch=2048, n_ubatch=512)
        try:
            logs._deferred = True  # a Ctrl-C, as defer_interrupt notes one inside llama.cpp's call
            with pytest.raises(KeyboardInterrupt):
                next(m.run())
            assert m.done == 0 and "failed to decode, ret = 2" in "\n".join(logs.lines(last=100))
        finally:
            m.close()
    finally:
        logs._deferred = False
        engine.close()
        signal.signal(signal.SIGINT, previous)


def _stopped_in_the_reference(q: CLI, *args: str) -> tuple[int, str, str]:
    """The command stopped with Ctrl-C once its --reference F16 has measured its first windows (a tenth of them:
    give --chunks 10 for the first alone): (exit status, stdout, stderr)."""
    p = q.popen(*args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stderr is not None and p.stdout is not None
    seen = b""
    while not re.search(rb"F16\.gguf: \d+/", seen):
        line = p.stderr.readline()
        assert line, f"{args[0]} ended before it could be stopped: {seen!r}"
        seen += line
    p.send_signal(signal.SIGINT)
    rc = p.wait(timeout=60)
    return rc, p.stdout.read().decode(), p.stderr.read().decode()


def test_ctrl_c_while_the_reference_model_is_measured_shows_none_of_its_figures(qcli: CLI, smollm2_f16: Path,
                                                                                test_text: Path) -> None:
    """--reference MODEL measures that model first: stopped then, the model asked for was not measured, and the
    reference's PPL is never printed as if it were the result."""
    rc, out, err = _stopped_in_the_reference(qcli, "perplexity", "-m", "smollm2:135m", "-f", str(test_text), "-c",
                                             "128", "-b", "128", "-t", "1", "--chunks", "10", "--reference",
                                             str(smollm2_f16))
    assert rc == 130, err
    assert out == "", "no figure on stdout: the reference's are not the result"
    last = err.strip().splitlines()[-1]
    assert re.fullmatch(r"interrupted while measuring the reference SmolLM2-135M-Instruct-F16\.gguf \(\d+ of \d+ "
                        r"windows\): smollm2:135m was not measured", last), err
    assert err.count("interrupted") == 1 and "Traceback" not in err
    assert list((_home(qcli) / "cache" / "perplexity").iterdir()) == []


def test_a_killed_save_logits_leaves_nothing(qcli: CLI, test_text: Path, tmp_path: Path) -> None:
    """perplexity.md: the --save-logits file is written with no name until whole, so SIGKILL leaves nothing in its
    folder; and every measurement first removes the reference logits a killed process left in the cache."""
    cache = _home(qcli) / "cache" / "perplexity"
    cache.mkdir(parents=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = [cache / f"reference-model-{int(dead.stdout)}.logits",
            cache / f".reference-ladder-{int(dead.stdout)}.logits.{int(dead.stdout)}.partial"]
    for path in left:
        path.write_bytes(b"_logits_")
    folder = tmp_path / "out"
    folder.mkdir()
    p = qcli.popen("perplexity", "-m", "smollm2:135m", "-f", str(test_text), "-c", "128", "-b", "128", "-t", "1",
                   "--save-logits", str(folder / "big.logits"), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stderr is not None
    seen = b""
    while not re.search(rb"smollm2:135m: \d+/", seen):  # a tenth of the windows measured, their logits written
        line = p.stderr.readline()
        assert line, f"perplexity ended before it could be stopped: {seen!r}"
        seen += line
    p.kill()
    assert p.wait(timeout=60) == -signal.SIGKILL
    assert list(folder.iterdir()) == []
    assert [x for x in left if x.exists()] == []
    assert ("a run killed while it writes leaves nothing there; elsewhere a hidden `.FILE.PID.partial` beside it, "
            "removed by the next `--save-logits` to that file") in _flat("perplexity.md")
    assert "one that a killed process left is removed by the next measurement" in _flat("perplexity.md")


def _logits_file(path: Path, n_ctx: int, tokens: list[int], n_vocab: int = 49152) -> Path:
    """A logits file in llama-perplexity's format: one window of `tokens` (n_ctx of them), its rows all zero."""
    import numpy as np

    from localgen.engine.perplexity import MAGIC
    from localgen.engine.scoring import row_width

    scored = n_ctx - 1 - n_ctx // 2
    with open(path, "wb") as f:
        f.write(MAGIC + np.array([n_ctx, n_vocab, 1], "<i4").tobytes() + np.array(tokens, "<i4").tobytes())
        f.write(np.zeros(row_width(n_vocab) * scored, "<u2").tobytes())
    return path


def test_a_logits_file_with_a_token_outside_its_vocabulary_is_damaged(qcli: CLI, test_text: Path,
                                                                       tmp_path: Path) -> None:
    """A token id past the vocabulary (or negative) aborted the process inside llama.cpp (std::out_of_range, when
    the text given with -f was compared with the file's tokens); it is refused as a damaged file, in one line."""
    for bad in (999999, -7):
        logits = _logits_file(tmp_path / "bad.logits", 32, [100] * 31 + [bad])
        r = qcli("perplexity", "-m", "smollm2:135m", "--reference", str(logits), "-f", str(test_text))
        assert (r.returncode, r.stdout) == (2, ""), r.stderr
        assert _one_line(r.stderr) == (f"localgen: error: {logits} is a damaged logits file (token id {bad} is "
                                       "outside its vocabulary of 49,152)")
    assert "one whose tokens lie outside its vocabulary as a damaged logits file" in _flat("perplexity.md")


def test_a_logits_file_saved_at_a_context_under_16_says_so(qcli: CLI, tmp_path: Path) -> None:
    """It said "--ctx takes 0 ... or 16 tokens or more, not 8", though no --ctx was typed."""
    logits = _logits_file(tmp_path / "ctx8.logits", 8, list(range(100, 108)))
    r = qcli("perplexity", "-m", "smollm2:135m", "--reference", str(logits))
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert _one_line(r.stderr) == (f"localgen: error: the reference {logits} was saved at a context of 8, which "
                                   "cannot be measured here (windows take 16 tokens or more)")
    assert "a file saved at a context under 16 tokens, which localgen does not measure, is refused as such" in (
        _flat("perplexity.md"))


def test_a_logits_file_that_cannot_be_written_or_read_is_one_line(qcli: CLI, tmp_path: Path) -> None:
    """Said before any measuring: no window is measured for a file that cannot be kept."""
    r = qcli("perplexity", "-m", "smollm2:135m", "--save-logits", "/nonexist/x.logits")
    assert r.returncode == 2 and r.stdout == ""
    assert _one_line(r.stderr) == ("localgen: error: --save-logits: cannot write /nonexist/x.logits: no such folder "
                                   "/nonexist")
    assert "windows" not in r.stderr
    for missing in ("nope.logits", str(tmp_path / "nope.logits"), "./gone/f16.gguf"):
        r = qcli("perplexity", "-m", "smollm2:135m", "--reference", missing)
        assert r.returncode == 2 and r.stdout == ""
        assert _one_line(r.stderr) == f"localgen: error: --reference {missing}: no such file"


def test_save_logits_never_overwrites_the_text_or_another_file(qcli: CLI, test_text: Path, tmp_path: Path) -> None:
    """Refused before any measuring, the file untouched; a logits file written before is refreshed."""
    text = tmp_path / "text.txt"
    text.write_bytes(test_text.read_bytes())
    notes = tmp_path / "notes.txt"
    notes.write_text("keep me\n")
    for target, said in ((text, "is the text being measured (-f)"), (notes, "exists and is not a logits file")):
        before = target.read_bytes()
        r = qcli("perplexity", "-m", "smollm2:135m", "-f", str(text), "-c", "64", "--save-logits", str(target))
        assert r.returncode == 2 and r.stdout == "" and said in _one_line(r.stderr), r.stderr
        assert target.read_bytes() == before
    logits = tmp_path / "x.logits"
    sizes = []
    for chunks in ("2", "3"):
        r = qcli("perplexity", "-m", "smollm2:135m", "-f", str(text), "-c", "64", "--chunks", chunks, "--save-logits",
                 str(logits))
        assert r.returncode == 0, r.stderr
        assert logits.read_bytes()[:8] == b"_logits_"
        sizes.append(logits.stat().st_size)
    assert sizes[0] < sizes[1]  # the second run wrote its own logits over the first's


# ---- the ladder ------------------------------------------------------------------------------------------------


def test_the_ladder_measures_each_type_and_keeps_the_rows(qcli: CLI, tiny_f16: Path, test_text: Path,
                                                         tmp_path: Path) -> None:
    """The ladder's figures are `perplexity --reference`'s for the same pair (which agree with llama-perplexity's:
    test_kl_divergence_agrees_with_llama_perplexity). A small model (tiny-dense) on two windows: what it makes is
    llama-quantize's bytes (test_quantize_writes_what_llama_quantize_writes_and_lists_it)."""
    assert qcli("quantize", str(tiny_f16), "Q8_0").returncode == 0  # made earlier: the ladder keeps it
    args = ["-c", str(REF["ctx"]), "--chunks", "2", "-t", str(REF["threads"])]
    r = qcli("quantize", str(tiny_f16), "--ladder", "Q8_0,Q4_K_M", "--measure", str(test_text), *args,
             "-p", "8", "-n", "4", "-r", "1", "--json", "--kld-bound", "0.02")
    assert r.returncode == 0, r.stderr
    assert "tiny-dense:q8_0: kept (made earlier from this source; --force makes it again)" in r.stderr
    doc = json.loads(r.stdout)
    assert set(doc) == {"run", "kld_bound", "rows", "best"} and doc["kld_bound"] == 0.02
    assert ("with `--ladder`, the table as one document, `run`, `kld_bound`, `rows` and `best`, as `bench --quality -o "
            "json` prints it") in _flat("quantize.md")
    rows = {row["type_name"]: row for row in doc["rows"]}
    assert set(rows) == {"F16", "Q8_0", "Q4_K_M"} and rows["F16"]["reference"]
    logits = tmp_path / "f16.logits"  # the F16's logits on the same two windows, as a user saves them
    saved = qcli("perplexity", "-m", str(tiny_f16), "-f", str(test_text), *args, "--save-logits", str(logits),
                 "--json")
    assert saved.returncode == 0, saved.stderr
    assert rows["F16"]["ppl"] == pytest.approx(json.loads(saved.stdout)["ppl"], rel=1e-6)
    for t in ("Q8_0", "Q4_K_M"):
        # perplexity's figures for the same pair, the file the ladder made (and kept) measured against the F16
        alone = qcli("perplexity", "-m", rows[t]["path"], "-t", str(REF["threads"]), "--chunks", "2",
                     "--reference", str(logits), "--json")
        assert alone.returncode == 0, alone.stderr
        d = json.loads(alone.stdout)["divergence"]
        assert 0 < rows[t]["kld"] == pytest.approx(d["kld"], rel=1e-6)
        assert rows[t]["ppl"] == pytest.approx(json.loads(alone.stdout)["ppl"], rel=1e-6)
        assert rows[t]["same_top"] == pytest.approx(d["same_top"], rel=1e-6)
        # quantize-choose.md: under 100 positions scored no percentile is given, as llama-perplexity gives none
        assert (rows[t]["kld_p99"] is None) == (d["kld_percentiles"] is None), (rows[t], d)
        assert rows[t]["size"] == Path(rows[t]["path"]).stat().st_size
        assert rows[t]["pp_ts"] > 0 and rows[t]["tg_ts"] > 0 and rows[t]["fits"] in ("CPU only", "full GPU")
    assert rows["Q8_0"]["bits_per_weight"] > rows["Q4_K_M"]["bits_per_weight"]
    within = [row for row in doc["rows"] if row["reference"] or row["kld"] <= 0.02]
    assert doc["best"] == max(within, key=lambda row: row["tg_ts"])["model"]
    listed = {m["name"] for m in json.loads(qcli("list", "--json").stdout)}
    assert {"tiny-dense:q8_0", "tiny-dense:q4_k_m"} <= listed
    run = doc["run"]
    shown = qcli("bench", "history", str(run), "-o", "json")
    assert [row["type_name"] for row in json.loads(shown.stdout)["rows"]] == ["F16", "Q8_0", "Q4_K_M"]
    text = qcli("bench", "history", str(run)).stdout
    assert "fastest within a mean KLD of 0.02" in text
    compared = json.loads(qcli("bench", "compare", str(run), str(run), "--json").stdout)
    assert [x["a_kld"] for x in compared["results"]] == [None, rows["Q8_0"]["kld"], rows["Q4_K_M"]["kld"]]


def test_the_ladder_refuses_before_it_makes_anything(qcli: CLI, smollm2_f16: Path, test_text: Path,
                                                     tmp_path: Path) -> None:
    """A text shorter than two windows (counted in the source's tokens) and a type the source cannot take are
    refused before the first type is made or the source loaded."""
    short = tmp_path / "short.txt"
    short.write_text("Just a few words, far fewer than two windows.\n")
    r = qcli("quantize", str(smollm2_f16), "--ladder", "Q4_0,Q8_0", "--measure", str(short), "--ctx", "128")
    assert r.returncode == 2
    assert "perplexity at a context of 128 needs at least 256 (two windows)" in _one_line(r.stderr)
    assert "Q4_0" not in r.stderr and _made(qcli) == []
    r = qcli("quantize", str(smollm2_f16), "--ladder", "Q4_0,IQ2_XXS", "--measure", str(test_text), "--ctx", "128")
    assert r.returncode == 2 and "IQ2_XXS needs an importance matrix" in _one_line(r.stderr)
    assert _made(qcli) == []


@pytest.mark.parametrize(("args", "needle"), [
    (["-r", "2000"], "--repetitions must be within 1 to 1,000, not 2000"),
    (["-p", "0", "-n", "3000000000"], "--n-gen must be at most 2,147,483,647"),
    (["-p", "9000", "-n", "0"], "pp9000 needs a context of 9,000 tokens (-p): past the 8,192 "),
])
def test_the_ladder_refuses_bench_sizes_before_it_makes_anything(qcli: CLI, smollm2_f16: Path, test_text: Path,
                                                               args: list[str], needle: str) -> None:
    """quantize.md: bench's sizes (-p, -n, -r) are checked with the types, as bench --quality checks them, not
    after every type is made and the source measured (-p past the trained context was timed, never refused)."""
    r = qcli("quantize", str(smollm2_f16), "--ladder", "Q8_0", "--measure", str(test_text), "--ctx", "128", *args)
    assert r.returncode == 2 and needle in _one_line(r.stderr), r.stderr
    assert "Q8_0" not in r.stderr and _made(qcli) == []


def test_the_ladders_options_without_the_ladder_are_refused(qcli: CLI, smollm2_f16: Path, tmp_path: Path) -> None:
    """A single quantization measures nothing: --measure (a file not there too), -p and the other ladder options
    given to it are one line, nothing made, rather than ignored in silence."""
    out = tmp_path / "one.gguf"
    r = qcli("quantize", str(smollm2_f16), "Q8_0", "-o", str(out), "--measure", str(tmp_path / "nothere.txt"),
             "-p", "5")
    assert r.returncode == 2 and r.stdout == ""
    assert _one_line(r.stderr) == ("localgen: error: --measure, -p are for --ladder (add --ladder TYPES, or leave "
                                   "them out)")
    r = qcli("quantize", str(smollm2_f16), "Q8_0", "-o", str(out), "--kld-bound", "0.1")
    assert _one_line(r.stderr) == "localgen: error: --kld-bound is for --ladder (add --ladder TYPES, or leave them out)"
    assert r.returncode == 2 and not out.exists()


def test_the_ladder_refuses_a_model_or_an_imatrix_it_cannot_finish_with(qcli: CLI, smollm2_f16: Path,
                                                                       tmp_path: Path) -> None:
    """quantize.md: nothing is made where the ladder would stop later: a model whose vocabulary adds an end token
    to every text (perplexity cannot measure it), or an importance matrix lacking a tensor a type needs one for
    (llama.cpp stops there, part-way through that type's file)."""
    import numpy as np

    from localgen.quant.imatrix import write_legacy
    from tests.tiny_bert import build

    bert = build(tmp_path / "bert.gguf")
    r = qcli("quantize", str(bert), "--ladder", "Q8_0,Q4_0", "--ctx", "16", "-p", "0", "-n", "0")
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert _one_line(r.stderr).startswith("localgen: error: bert.gguf's vocabulary adds an end token to every text")
    assert _made(qcli) == []
    one = tmp_path / "im_one.dat"  # an importance matrix for one tensor only
    write_legacy(one, {"blk.0.attn_q.weight": np.ones(576, np.float32)})
    r = qcli("quantize", str(smollm2_f16), "--ladder", "Q4_0,IQ2_XXS", "--imatrix", str(one), "--ctx", "128",
             "-p", "0", "-n", "0")
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert _one_line(r.stderr).startswith("localgen: error: IQ2_XXS needs an importance matrix for "
                                          "blk.3.ffn_down.weight (and 26 more): the importance matrix given has none")
    assert _made(qcli) == []
    r = qcli("quantize", str(smollm2_f16), "IQ3_XXS", "--imatrix", str(one), "-o", str(tmp_path / "iq3.gguf"))
    assert r.returncode == 2 and "IQ3_XXS needs an importance matrix for blk.0.ffn_down.weight" in r.stderr
    assert not (tmp_path / "iq3.gguf").exists()


def test_the_ladder_checks_room_for_all_its_types_together(qcli: CLI, smollm2_f16: Path, test_text: Path,
                                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Room for Q8_0 (138 MiB) alone and for Q4_0 alone, but not for both: refused before the first is made."""
    from collections import namedtuple

    from localgen.quant import quantize as q

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(q.shutil, "disk_usage", lambda _p: usage(1 << 30, (1 << 30) - (170 << 20), 170 << 20))
    args = ("quantize", str(smollm2_f16), "--measure", str(test_text), "--ctx", "128")
    for t in ("Q8_0", "Q4_0"):  # each alone has room
        assert q.plan(smollm2_f16, t, tmp_path / f"{t}.gguf", q.Options()).expected < (170 - 16) << 20
    r = InProcessCLI(qcli.env)(*args, "--ladder", "Q8_0,Q4_0")
    assert r.returncode == 1, r.stderr
    line = _one_line(r.stderr)
    assert re.search(r"not enough disk space in .*: the 2 results need 2\d\d MiB and the source's logits .* take "
                     r"\d+ MiB, 170 MiB is free", line), line
    assert _made(qcli) == []


def test_the_ladder_keeps_only_a_type_made_from_this_source(qcli: CLI, smollm2_f16: Path, tmp_path: Path) -> None:
    """quantize.md: a type made earlier is kept only where it was made from this source with these options: one of
    that name made from another file (or with other options) is refused before anything is made, and left as it
    was; `rm` takes its record with it."""
    other = tmp_path / "other" / smollm2_f16.name
    other.parent.mkdir()
    os.link(smollm2_f16, other)  # another path to the same bytes: another source, as far as localgen can tell
    assert qcli("quantize", str(other), "Q8_0").returncode == 0
    made = _home(qcli) / "data" / "quantized" / "smollm2-135m-instruct@q8_0.gguf"
    before = made.stat().st_mtime_ns
    args = ("--ctx", "128", "--chunks", "4", "-p", "0", "-n", "0")
    r = qcli("quantize", str(smollm2_f16), "--ladder", "Q8_0", *args)
    assert r.returncode == 2, r.stderr
    assert _one_line(r.stderr) == (
        "localgen: error: the quantized model smollm2-135m-instruct:q8_0 exists, made from "
        f"{os.path.realpath(other)}: the ladder measures the types made from this source (--force makes it again "
        "from this source, replacing it; --name NAME makes the ladder's types under another name)")
    assert made.stat().st_mtime_ns == before and "measuring" not in r.stderr
    assert qcli("bench", "history").stderr == "no benchmark runs yet: localgen bench\n"
    assert qcli("quantize", str(smollm2_f16), "Q8_0", "--force").returncode == 0  # from this source now
    pure = qcli("quantize", str(smollm2_f16), "--ladder", "Q8_0", "--pure", *args)
    assert pure.returncode == 2 and "exists, made with other options:" in _one_line(pure.stderr)
    assert qcli("rm", "smollm2-135m-instruct:q8_0", "--yes").returncode == 0
    assert list(made.parent.iterdir()) == []  # the record went with the file
    assert ("one made earlier is kept only where it was made from this source with the same options") \
        in _flat("quantize.md")


def test_the_ladder_checks_the_disk_and_the_history_before_it_makes_anything(
        qcli: CLI, smollm2_f16: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """quantize.md: the room for the types and for the source's logits (which the ladder keeps in the cache while it
    measures), and a benchmark history that can keep the rows, are checked before the first type is made."""
    from collections import namedtuple

    from localgen.quant import quantize as q

    history = _home(qcli) / "data" / "bench.sqlite"
    history.parent.mkdir(parents=True)
    history.write_bytes(b"not a database" * 100)
    args = ("quantize", str(smollm2_f16), "--ladder", "Q8_0", "--ctx", "256", "--chunks", "40", "-p", "0", "-n", "0")
    r = InProcessCLI(qcli.env)(*args)
    assert r.returncode == 1 and "the benchmark history" in _one_line(r.stderr) and "is unreadable" in r.stderr
    assert _made(qcli) == [] and history.read_bytes() == b"not a database" * 100
    history.unlink()
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(q.shutil, "disk_usage", lambda _p: usage(1 << 30, (1 << 30) - (200 << 20), 200 << 20))
    r = InProcessCLI(qcli.env)(*args)  # room for Q8_0 (138 MiB) alone, not for the logits of 40 windows too
    assert r.returncode == 1, r.stderr
    line = _one_line(r.stderr)
    assert re.search(r"not enough disk space in .*: the result needs 13\d MiB and the source's logits \(the types "
                     r"are measured against them\) take 4\d\d MiB, 200 MiB is free \(free some space, or measure "
                     r"fewer windows \(--chunks N\)\)$", line), line
    assert "--save-logits" not in line and _made(qcli) == []
    # perplexity --reference MODEL: the reference's logits, named as such
    monkeypatch.setattr(q.shutil, "disk_usage", lambda _p: usage(1 << 30, 1 << 30, 1 << 20))
    r = InProcessCLI(qcli.env)("perplexity", "-m", "smollm2:135m", "--reference", str(smollm2_f16), "-c", "256",
                               "--chunks", "40")
    assert r.returncode == 1
    assert re.fullmatch(r"localgen: error: the reference SmolLM2-135M-Instruct-F16\.gguf's logits \(measured "
                        r"first\) take 4\d\d MiB and .* has 1 MiB free \(.*\)", _one_line(r.stderr))


def test_bench_quality_measures_files_already_here(qcli: CLI, tiny_f16: Path, test_text: Path,
                                                   tmp_path: Path) -> None:
    """A small model (tiny-dense) on two windows: bench's figures are `perplexity --reference`'s for the same pair
    (which agree with llama-perplexity's: test_kl_divergence_agrees_with_llama_perplexity)."""
    q8 = tmp_path / "model-Q8_0.gguf"
    assert qcli("quantize", str(tiny_f16), "Q8_0", "-o", str(q8)).returncode == 0
    sizes = ["-c", str(REF["ctx"]), "--chunks", "2", "-t", "1"]
    r = qcli("bench", "-m", str(q8), "--quality", str(test_text), "--reference", str(tiny_f16), *sizes, "-p", "8",
             "-n", "4", "-r", "1", "-o", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [row["model"] for row in doc["rows"]] == ["tiny-dense-F16.gguf", "model-Q8_0.gguf"]
    alone = qcli("perplexity", "-m", str(q8), "-f", str(test_text), *sizes, "--reference", str(tiny_f16), "--json")
    assert alone.returncode == 0, alone.stderr
    want = json.loads(alone.stdout)["divergence"]["kld"]
    assert 0 < doc["rows"][1]["kld"] == pytest.approx(want, rel=1e-6)
    lines = qcli("bench", "history", str(doc["run"])).stdout.splitlines()
    assert lines[0].split()[:4] == ["model", "type", "size", "bpw"]
    q8_row = next(line for line in lines if line.startswith("model-Q8_0.gguf"))
    kld = float(q8_row.split()[8])  # the mean KLD column (the size is two words)
    assert kld == pytest.approx(want, abs=5.1e-7)  # as printed: to 6 places
    assert lines[-1].startswith("fastest within a mean KLD of 0.05: ")
    # the reference among the -m files, and a file given twice: one row each, as `bench compare` pairs rows by file
    again = qcli("bench", "-m", f"{q8},{tiny_f16},{q8}", "--quality", str(test_text), "--reference",
                 str(tiny_f16), *sizes, "-p", "8", "-n", "4", "-r", "1", "-o", "json")
    assert again.returncode == 0, again.stderr
    assert [(row["model"], row["reference"]) for row in json.loads(again.stdout)["rows"]] == [
        ("tiny-dense-F16.gguf", True), ("model-Q8_0.gguf", False)]
    # every -o of bench history, on a quality run: its rows, not speed records
    csv_rows = qcli("bench", "history", str(doc["run"]), "-o", "csv").stdout.splitlines()
    assert csv_rows[0].startswith("model,path,type_name,size,bits_per_weight") and len(csv_rows) == 3
    jsonl = [json.loads(x) for x in qcli("bench", "history", str(doc["run"]), "-o", "jsonl").stdout.splitlines()]
    assert [x["kld"] for x in jsonl] == [row["kld"] for row in doc["rows"]]
    md = qcli("bench", "history", str(doc["run"]), "-o", "md").stdout.splitlines()
    assert md[0].startswith("| model | type | size |") and md[-1].startswith("fastest within a mean KLD of 0.05")
    assert json.loads(qcli("bench", "history", str(doc["run"]), "-o", "json").stdout) == doc
    runs = len(json.loads(qcli("bench", "history", "-o", "json").stdout))
    bad = qcli("bench", "-m", str(q8), "--quality", str(test_text), "--reference", "gemma3:270m")
    assert bad.returncode == 2 and "another vocabulary" in _one_line(bad.stderr)
    short = tmp_path / "short.txt"
    short.write_text("Just a few words, far fewer than two windows.\n")
    bad = qcli("bench", "-m", str(q8), "--quality", str(short), "--reference", str(tiny_f16), "-c", "128")
    assert bad.returncode == 2 and "needs at least 256 (two windows)" in _one_line(bad.stderr)
    # bench.md: a run refused before its first row keeps none
    assert len(json.loads(qcli("bench", "history", "-o", "json").stdout)) == runs


def test_ctrl_c_before_the_ladders_first_row_keeps_no_run(qcli: CLI, tiny_f16: Path, test_text: Path) -> None:
    """Stopped while the reference (a small model with SmolLM2's vocabulary, tiny-dense) is measured."""
    rc, out, err = _stopped_in_the_reference(qcli, "bench", "-m", "smollm2:135m", "--quality", str(test_text),
                                             "--reference", str(tiny_f16), "-c", "128", "--chunks", "10", "-t",
                                             "1", "-p", "8", "-n", "4", "-r", "1")
    assert rc == 130 and out == "", err
    assert err.strip().splitlines()[-1] == "interrupted before the first row was whole: nothing saved"
    assert err.count("interrupted") == 1 and "Traceback" not in err
    assert qcli("bench", "history").stderr == "no benchmark runs yet: localgen bench\n"


# ---- create -q and /api/create's quantize ---------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_create_q_stopped_mid_way_writes_neither_model_nor_preset(qcli: CLI, smollm2_f16: Path, tmp_path: Path,
                                                                  sig: signal.Signals) -> None:
    """quantize.md: as quantize's, a create -q stopped by Ctrl-C (130) or a SIGTERM (ended by it: a SIGTERM's
    default left its temporary file and said nothing) writes nothing, says so in one line, and makes no preset."""
    mf = tmp_path / "Modelfile"
    mf.write_text(f"FROM {smollm2_f16}\n")
    p = qcli.popen("create", "mybot", "-f", str(mf), "-q", "Q4_K_M", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _wait_for_bytes(p)
    p.send_signal(sig)
    rc = p.wait(timeout=60)
    err = p.stderr.read().decode() if p.stderr else ""
    said = "interrupted" if sig == signal.SIGINT else "stopped by SIGTERM"
    assert rc == (130 if sig == signal.SIGINT else -signal.SIGTERM), (rc, err)
    assert f"localgen: {said}: nothing was written (llama.cpp's call cannot be stopped" in err, err
    assert "Traceback" not in err
    assert _made(qcli) == [] and not [f for f in (_home(qcli) / "data" / "quantized").iterdir()]
    assert not {"mybot", "mybot:q4_k_m"} & {m["name"] for m in json.loads(qcli("list", "--json").stdout)}
    assert "`create -q` stopped the same way writes neither the model nor the preset" in _flat("quantize.md")


def test_create_q_quantizes_the_from_model_then_makes_the_preset(qcli: CLI, smollm2_f16: Path,
                                                                 tmp_path: Path) -> None:
    mf = tmp_path / "Modelfile"
    mf.write_text(f"FROM {smollm2_f16}\nPARAMETER temperature 0.3\n")
    r = qcli("create", "mybot", "-f", str(mf), "-q", "Q4_K_M", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"name": "mybot", "base": "mybot:q4_k_m"}
    listed = {m["name"]: m for m in json.loads(qcli("list", "--json").stdout)}
    assert listed["mybot:q4_k_m"]["source"] == "quantized" and listed["mybot"]["base"] == "mybot:q4_k_m"
    assert sha256_file(Path(listed["mybot:q4_k_m"]["path"])) == REF["quantized"]["Q4_K_M"]["sha256"]
    mf.write_text("FROM smollm2:135m\n")
    bad = qcli("create", "other", "-f", str(mf), "-q", "Q4_K_M")
    assert bad.returncode == 1 and "already quantized (Q4_1)" in _one_line(bad.stderr)
    assert "other:q4_k_m" not in {m["name"] for m in json.loads(qcli("list", "--json").stdout)}
    # models.md: removing a model a preset is made on says so in one warning line
    gone = qcli("rm", "mybot:q4_k_m", "--yes")
    assert gone.returncode == 0, gone.stderr
    assert gone.stderr == "warning: the preset mybot is made on mybot:q4_k_m: without it they cannot run\n"


def test_create_q_hints_name_what_create_can_do(qcli: CLI, smollm2_f16: Path, tmp_path: Path) -> None:
    """create has neither --imatrix nor --allow-requantize: its refusals never point at them."""
    mf = tmp_path / "Modelfile"
    mf.write_text(f"FROM {smollm2_f16}\n")
    r = qcli("create", "mybot", "-f", str(mf), "-q", "IQ2_XS")
    line = _one_line(r.stderr)
    assert r.returncode == 2 and "IQ2_XS needs an importance matrix" in line
    assert "give one with --imatrix" not in line and "`localgen quantize MODEL IQ2_XS --imatrix FILE`" in line
    mf.write_text("FROM smollm2:135m\n")
    r = qcli("create", "mybot", "-f", str(mf), "-q", "Q4_K_M")
    line = _one_line(r.stderr)
    assert r.returncode == 1 and "already quantized" in line
    assert "--allow-requantize" not in line and "FROM this one without -q" in line
    assert _made(qcli) == []


def test_create_q_checks_everything_first_and_replaces_only_with_force(qcli: CLI, tiny_f16: Path,
                                                                       tmp_path: Path) -> None:
    """A second `create -q` is refused before it quantizes (the preset exists; then, the preset removed, the
    quantized model exists), and the model made first is the one kept; --force makes both again. (A small model,
    tiny-dense: what is made is not the point.)"""
    mf = tmp_path / "Modelfile"
    mf.write_text(f"FROM {tiny_f16}\nTEMPLATE {{% if %}}\n")
    bad = qcli("create", "mybot", "-f", str(mf), "-q", "Q4_K_M")
    assert bad.returncode == 2 and "TEMPLATE does not compile" in _one_line(bad.stderr) and _made(qcli) == []
    mf.write_text(f"FROM {tiny_f16}\n")
    bad = qcli("create", "mybot", "-f", str(mf), "-q", "Q9_X")
    assert bad.returncode == 2 and "unknown quantization type" in _one_line(bad.stderr) and _made(qcli) == []
    assert qcli("create", "mybot", "-f", str(mf), "-q", "Q4_K_M").returncode == 0
    path = _home(qcli) / "data" / "quantized" / "mybot@q4_k_m.gguf"
    first = path.stat()
    again = qcli("create", "mybot", "-f", str(mf), "-q", "Q4_K_M")
    assert again.returncode == 2 and "a preset named 'mybot' exists" in _one_line(again.stderr)
    assert "quantized to" not in again.stderr and "Q4_K_M mybot" not in again.stderr
    assert (path.stat().st_ino, path.stat().st_mtime_ns) == (first.st_ino, first.st_mtime_ns)
    assert qcli("rm", "mybot", "--yes").returncode == 0
    again = qcli("create", "mybot", "-f", str(mf), "-q", "Q4_K_M")
    assert again.returncode == 2 and "the quantized model mybot:q4_k_m exists" in _one_line(again.stderr)
    assert (path.stat().st_ino, path.stat().st_mtime_ns) == (first.st_ino, first.st_mtime_ns)
    assert "mybot" not in {m["name"] for m in json.loads(qcli("list", "--json").stdout)}
    forced = qcli("create", "mybot", "-f", str(mf), "-q", "q4_k", "--force", "--json")
    assert forced.returncode == 0, forced.stderr
    assert json.loads(forced.stdout) == {"name": "mybot", "base": "mybot:q4_k_m"}
    assert path.stat().st_ino != first.st_ino and _made(qcli) == ["mybot@q4_k_m.gguf"]


def test_api_create_quantize(qcli: CLI, tiny_f16: Path, tmp_path: Path) -> None:
    """Ollama's `quantize`: the `from` model (one offered here, never a path) quantized, then the preset. (A small
    model, tiny-dense: what it writes is what `localgen quantize` writes, which is llama-quantize's bytes.)"""
    import httpx

    from tests.test_serve import Server

    made = qcli("quantize", str(tiny_f16), "F16", "--name", "smol-f16")  # an F16 model this server offers
    assert made.returncode == 0, made.stderr
    cli_q8 = tmp_path / "cli-q8.gguf"  # what the CLI writes of the same F16
    assert qcli("quantize", str(tiny_f16), "Q8_0", "-o", str(cli_q8)).returncode == 0
    (tmp_path / "Modelfile").write_text(f"FROM {tiny_f16}\nPARAMETER temperature 0.25\n")
    made = qcli("create", "f16p", "-f", str(tmp_path / "Modelfile"))  # a preset of a file's path
    assert made.returncode == 0, made.stderr
    s = Server(qcli.env, "-np", "1", "--ctx", "256")
    try:
        r = httpx.post(f"{s.url}/api/create", timeout=300, json={
            "model": "tiny", "from": "smol-f16:f16", "quantize": "q8_0", "stream": False})
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "success"
        names = [m["name"] for m in httpx.get(f"{s.url}/api/tags", timeout=30).json()["models"]]
        assert "tiny" in names and "tiny:q8_0" in names
        answer = httpx.post(f"{s.url}/api/generate", timeout=300, json={
            "model": "tiny", "prompt": "Hi", "stream": False, "options": {"num_predict": 2}})
        assert answer.status_code == 200, answer.text
        bad = httpx.post(f"{s.url}/api/create", timeout=60, json={
            "model": "x", "from": "smol-f16:f16", "quantize": "q9_z"})
        assert bad.status_code == 400 and "unknown quantization type" in bad.json()["error"]
        path = Path(qcli.env["LOCALGEN_HOME"]) / "data" / "quantized" / "tiny@q8_0.gguf"
        assert sha256_file(path) == sha256_file(cli_q8)
        inode = path.stat().st_ino  # the preset removed, its quantized model is kept: made again only with force
        assert httpx.request("DELETE", f"{s.url}/api/delete", json={"model": "tiny"}, timeout=60).status_code == 200
        again = {"model": "tiny", "from": "smol-f16:f16", "quantize": "q8_0", "stream": False}
        refused = httpx.post(f"{s.url}/api/create", timeout=300, json=again)
        assert refused.status_code == 400 and "tiny:q8_0 exists" in refused.json()["error"]
        assert path.stat().st_ino == inode
        forced = httpx.post(f"{s.url}/api/create", timeout=300, json={**again, "force": True})
        assert forced.status_code == 200, forced.text
        assert path.stat().st_ino != inode
        gone = httpx.request("DELETE", f"{s.url}/api/delete", json={"model": "tiny:q8_0"}, timeout=60)
        assert gone.status_code == 200, gone.text
        assert not path.exists()
        # FROM a preset of a file's path: the preset is looked up (serve's names are never paths)
        child = httpx.post(f"{s.url}/api/create", timeout=300, json={
            "model": "child", "from": "f16p", "quantize": "q8_0", "stream": False})
        assert child.status_code == 200, child.text
        shown = httpx.post(f"{s.url}/api/show", json={"model": "child"}, timeout=60).json()
        assert "FROM child:q8_0" in shown["modelfile"] and "temperature 0.25" in shown["modelfile"], shown
    finally:
        assert s.stop() == 0


def test_most_of_smollm2s_matrices_take_a_fallback_type(smollm2_f16: Path, tmp_path: Path) -> None:
    """docs/quantize-choose.md: SmolLM2's 576-wide rows are not a multiple of a k-quant block (256), so llama.cpp
    quantizes most of its matrices to fallback types (its dry run says how many)."""
    import re

    from localgen.models.gguf_meta import read_summary
    from localgen.native import logs
    from localgen.quant import quantize as q

    assert read_summary(str(smollm2_f16)).n_embd == 576 and 576 % 256
    q.plan(smollm2_f16, "Q4_K_M", tmp_path / "x.gguf", q.Options())
    m = re.search(r"(\d+) of (\d+) tensor\(s\) required fallback", "\n".join(logs.lines(last=80)))
    assert m and int(m.group(1)) > int(m.group(2)) / 2
    assert list(tmp_path.iterdir()) == []  # a plan writes nothing


def test_the_ladder_on_a_busy_machine_says_so_as_tune_does(qcli: CLI, tiny_f16: Path, test_text: Path) -> None:
    """Other work on every CPU (busy loops) while the ladder measures: it warns before measuring and after the
    table, with tune's check, that the speeds reflect it; under load it once concluded F16 fastest unsaid. (A
    small model, two windows: the warnings are the point, not the figures.)"""
    from tests.test_tune import _hogs

    hogs = _hogs()
    try:
        r = qcli("quantize", str(tiny_f16), "--ladder", "Q8_0", "--measure", str(test_text), "-c", "128", "--chunks",
                 "2", "-t", "1", "-p", "8", "-n", "4", "-r", "1")
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert any(ln.startswith("warning: this machine is busy (other work takes ") and ln.endswith(
        "the figures will reflect it, and the speeds will favour whichever type was measured when it was "
        "quieter") for ln in lines), r.stderr
    assert lines[-1].startswith("warning: measured on a busy machine: other work took "), r.stderr
    assert lines[-1].endswith("so the speeds reflect it; measure again on a quiet machine before choosing a type "
                              "by its speed"), r.stderr


def test_a_ladder_that_times_nothing_says_nothing_of_timing_or_load(qcli: CLI, tiny_f16: Path,
                                                                    tmp_path: Path) -> None:
    """`-p 0 -n 0` measures no speed: no `timing NAME` step, and no busy-machine warning about speeds that were
    never measured (both were said; the busy line where other work took the CPUs, as tests running beside do).
    (A small model, tiny-dense: the figures are not the point.)"""
    other = tmp_path / "copy.gguf"
    os.link(tiny_f16, other)
    r = qcli("bench", "-m", str(other), "--quality", "default", "--reference", str(tiny_f16), "-c", "64",
             "--chunks", "2", "-t", "1", "-p", "0", "-n", "0")
    assert r.returncode == 0, r.stderr
    assert "measuring copy.gguf" in r.stderr and "none was timed (-p 0 -n 0)" in r.stdout, (r.stdout, r.stderr)
    assert "timing " not in r.stderr and "busy" not in r.stderr, r.stderr
    # the JSON's `best` was the reference itself (KLD 0, every speed None), where the closing line names none
    r = qcli("bench", "-m", str(other), "--quality", "default", "--reference", str(tiny_f16), "-c", "64",
             "--chunks", "2", "-t", "1", "-p", "0", "-n", "0", "-o", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["best"] is None and [row["model"] for row in doc["rows"] if row["kld"] is not None] == ["copy.gguf"]
    assert ("`best` is null where the closing line names no fastest type: nothing timed, with `-p 0 -n 0`, or only "
            "the reference measured") in _flat("quantize.md")


def test_create_q_from_a_preset_keeps_its_settings_and_adapter(qcli: CLI, smollm2_f16: Path, tmp_path: Path,
                                                                smollm2_path: Path) -> None:
    """`create -q` FROM a preset keeps that preset's settings (its ADAPTER too) under the Modelfile's own, as
    `create` without -q does; the preset's Modelfile had only the child's own lines."""
    from tests import tiny_lora

    lora = tiny_lora.build(smollm2_path, tmp_path / "tiny-lora.gguf")
    mf = tmp_path / "Modelfile"
    mf.write_text(f"FROM {smollm2_f16}\nADAPTER {lora}\nPARAMETER temperature 0.3\nSYSTEM be brief\n")
    assert qcli("create", "f16p", "-f", str(mf)).returncode == 0
    mf.write_text("FROM f16p\nPARAMETER top_k 5\n")
    r = qcli("create", "child", "-f", str(mf), "-q", "Q8_0")
    assert r.returncode == 0, r.stderr
    assert qcli("show", "child", "--modelfile").stdout == (
        f"FROM child:q8_0\nADAPTER {lora}\nPARAMETER temperature 0.3\nPARAMETER top_k 5\nSYSTEM be brief\n")


def test_create_q_that_cannot_write_the_preset_quantizes_nothing(qcli: CLI, smollm2_f16: Path, tmp_path: Path) -> None:
    """quantize.md: everything is checked before the quantization starts, the presets folder too (here a file
    where it should be): create -q quantized the model whole, then failed to write the preset."""
    folder = _home(qcli) / "data" / "presets"
    folder.parent.mkdir(parents=True)
    folder.write_text("")
    mf = tmp_path / "Modelfile"
    mf.write_text(f"FROM {smollm2_f16}\n")
    r = qcli("create", "mybot", "-f", str(mf), "-q", "Q8_0")
    assert r.returncode == 1 and "quantized to" not in r.stderr, r.stderr
    assert _one_line(r.stderr).startswith(f"localgen: error: cannot write the preset {folder / 'mybot.json'}: ")
    assert _made(qcli) == []


def test_a_rename_without_hard_links_that_fails_leaves_no_empty_result(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the disk has no hard links, the result's name is held by an empty file, then renamed over: a rename
    that fails let go of nothing, and the empty file stayed as the result (refusing the next quantize as "exists",
    listed as a model); now it is removed, and the finished file is left where it was."""
    import errno

    from localgen import unnamed

    done = tmp_path / ".q.gguf.1.partial"
    done.write_bytes(b"GGUF....")
    target = tmp_path / "q.gguf"

    def no_links(*args: object, **kw: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    def refused(*args: object, **kw: object) -> None:
        raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(os, "link", no_links)
    monkeypatch.setattr(os, "replace", refused)
    with pytest.raises(PermissionError):
        unnamed.rename_new(done, target)
    assert not target.exists() and done.read_bytes() == b"GGUF...."


def test_pull_of_a_model_quantized_here_says_so(qcli: CLI, smollm2_f16: Path, tmp_path: Path) -> None:
    """models.md: `pull` of a model `quantize` made here said `unknown model`, and a preset made on it hinted to
    pull it: one line saying it was made on this machine, and no hint to pull what cannot be pulled."""
    assert qcli("quantize", str(smollm2_f16), "Q8_0").returncode == 0
    made = _home(qcli) / "data" / "quantized" / "smollm2-135m-instruct@q8_0.gguf"
    r = qcli("pull", "smollm2-135m-instruct:q8_0")
    assert r.returncode == 1 and _one_line(r.stderr) == (
        f"localgen: error: smollm2-135m-instruct:q8_0 was quantized on this machine ({made}); there is nothing to "
        "pull"), r.stderr
    (tmp_path / "Modelfile").write_text("FROM smollm2-135m-instruct:q8_0\n")
    assert qcli("create", "mine", "-f", str(tmp_path / "Modelfile")).returncode == 0
    r = qcli("pull", "mine")
    assert r.returncode == 1 and _one_line(r.stderr) == (
        "localgen: error: mine is a preset of smollm2-135m-instruct:q8_0; it has no files of its own"), r.stderr
