"""Hostile values on the command line (found by fuzzing every command's every option: empty, blank, huge,
negative, NaN, control characters, 100 KB strings, directories, /dev/null): each gets one line on stderr, exit 2
for a usage error, no traceback, no hang, and nothing written to the user's data."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from localgen import placement
from tests.conftest import CLI, ROOT, InProcessCLI

BIG = "A" * 100_000


def one_line_usage_error(r: object, *names: str) -> str:
    """The error line of a refused call, checked: exit 2, no traceback, one line naming each of `names`."""
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])  # type: ignore[attr-defined]
    err: str = r.stderr  # type: ignore[attr-defined]
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("localgen: error: "), err[-2000:]
    assert len(lines[0]) < 1000, "the value is not echoed whole"
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


def test_n_cpu_moe_past_any_model_s_layers_is_every_layer_not_a_pattern_each() -> None:
    # --n-cpu-moe 99999999999999999999 made a pattern per layer up to it: fit, run and serve never ended
    assert placement.n_cpu_moe(10**6) == placement.n_cpu_moe(512)  # llama.cpp's LLAMA_MAX_LAYERS
    assert len(placement.n_cpu_moe(10**6)) == 512
    assert placement.n_cpu_moe(3) == [(rf"blk\.{i}{placement.EXPS}", "CPU") for i in range(3)]


def test_fit_takes_a_huge_n_cpu_moe_as_every_layer(cli_in_process: InProcessCLI) -> None:
    """The largest a C int holds (past it, tests/test_c_int_bounds.py: refused, as llama.cpp's stoi refuses it) is
    every layer, not a pattern per number up to it (fit hung filling memory)."""
    r = cli_in_process("fit", "-m", "smollm2:135m", "--n-cpu-moe", "2147483647", "--json")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize(("args", "names"), [
    (("--host", "\x1b[2J"), ("--host",)),
    (("--host", "é✓日本"), ("--host",)),
    (("--host", BIG), ("--host",)),
    (("--api-key", "\x1b[2J\u202e"), ("--api-key",)),
])
def test_ps_refuses_a_host_or_key_no_url_or_header_can_carry(cli_in_process: InProcessCLI, args: tuple[str, ...],
                                                               names: tuple[str, ...]) -> None:
    one_line_usage_error(cli_in_process("ps", "--port", "9", *args), *names)


@pytest.mark.parametrize("command", ["run", "chat"])
@pytest.mark.parametrize("schema", ["-1", "null", '"x"', "1e400", "[" + ",".join(["1"] * 100) + "]"])
def test_a_json_schema_that_is_no_object_is_one_line(cli_in_process: InProcessCLI, command: str,
                                                      schema: str) -> None:
    # validator_for looked for "$schema" inside a number: a TypeError's traceback (exit 2 as every invalid schema)
    r = cli_in_process(command, "-m", "smollm2:135m", "-n", "1", "--json-schema", schema, input="hi\n")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    line, = r.stderr.strip().splitlines()
    assert line.startswith("localgen: error: the JSON schema is not valid: ") and len(line) < 200, line


@pytest.mark.parametrize("index", ["²", "٠"])
def test_a_schema_reference_with_a_unicode_digit_points_at_nothing(cli_in_process: InProcessCLI, index: str) -> None:
    # a JSON Pointer's array index is ASCII digits: "²" was int()'s ValueError as the message, "٠" item 0
    schema = ('{"type": "array", "prefixItems": [{"type": "string"}], "items": {"$ref": "#/prefixItems/'
              + index + '"}}')
    r = cli_in_process("run", "-m", "smollm2:135m", "-n", "1", "--json-schema", schema, input="hi\n")
    said = f"localgen: error: the schema reference '#/prefixItems/{index}' points at nothing\n"
    assert r.returncode == 2 and r.stderr == said, r.stderr


@pytest.mark.parametrize(("args", "said"), [
    (["-j", '{"type": "string", "pattern": "^a{1,20000}$"}'], "pattern repeat {1,20000} is 20,000; at most 4,096"),
    (["-j", '{"type": "string", "pattern": "^' + "(" * 150 + "a" + ")" * 150 + '$"}'],
     "nests groups more than 100 deep"),
    (["-j", '{"type": "string", "pattern": "^' + "(" * 20_000 + ")" * 20_000 + '$"}'], "nests too deeply"),
    (["--grammar", "root ::= " + "(" * 20_000 + '"a"' + ")" * 20_000], "nests groups 20,000 deep; at most 1,000"),
])
def test_a_grammar_nested_past_llama_cpp_s_stack_is_one_line_not_a_crash(cli: CLI, args: list[str],
                                                                         said: str) -> None:
    # a pattern's {1,20000} became 20,000 nested optionals, and llama.cpp's parser, recursing on each, overflowed
    # its stack: exit 139 and nothing printed (a real process: a crash is not an exception)
    r = cli("run", "-m", "smollm2:135m", "-n", "8", *args, "hi")
    assert said in one_line_usage_error(r) and r.stdout == ""


def _big_enum(path: Path) -> str:
    import json

    path.write_text(json.dumps({"enum": [f"v{i}" for i in range(300_000)]}))  # 3.2 MB: minutes in llama.cpp
    return str(path)


def _big_gbnf(path: Path) -> str:
    path.write_text("root ::= " + " | ".join(f'"w{i}"' for i in range(200_000)) + "\n")  # 2.2 MB
    return str(path)


@pytest.mark.parametrize("command", ["run", "chat"])
@pytest.mark.parametrize(("make", "said"), [
    (lambda p: ["-j", '{"type": "string", "minLength": 1000000000}'], "minLength is 1,000,000,000; at most 4,096"),
    (lambda p: ["-j", '{"type": "array", "minItems": 1e8, "items": {"type": "integer"}}'],
     "minItems is 100,000,000; at most 4,096"),
    (lambda p: ["-j", '{"type": "array", "minItems": 3, "maxItems": 1}'], "minItems 3 above its maxItems 1"),
    (lambda p: ["-jf", _big_enum(p / "enum.json")], "characters; at most 65,536"),
    (lambda p: ["--grammar", _big_gbnf(p / "big.gbnf")], "characters; at most 131,072"),
    (lambda p: ["--grammar", "root ::= " + "|".join(['"a"'] * 50_000)], "--grammar is 200,008 characters"),
])
def test_a_schema_or_grammar_past_serve_s_bounds_is_refused_before_any_work(
        cli_in_process: InProcessCLI, tmp_path: Path, command: str, make: object, said: str) -> None:
    # run -j took 12 GB for minLength 10^9, and a 3 MB enum or a 2 MB grammar hung inside llama.cpp's grammar
    # parse, where Ctrl-C cannot reach: serve's bounds now hold for the flags too, before the model loads
    args = make(tmp_path)  # type: ignore[operator]
    r = cli_in_process(command, "-m", "smollm2:135m", "-n", "1", *args, *(["-p", "JSON"] if command == "run" else []),
                       input="hi\n")
    assert said in one_line_usage_error(r)


@pytest.mark.parametrize("args", [
    ("fit", "-m", "smollm2:135m", "--cache-type-k", BIG),
    ("fit", "-m", "smollm2:135m", "--rope-scaling", BIG),
    ("run", "-m", "smollm2:135m", "-n", "1", "--attach", BIG, "hi"),
])
def test_an_error_quoting_a_huge_value_keeps_its_start_and_end(cli_in_process: InProcessCLI,
                                                               args: tuple[str, ...]) -> None:
    # the 100 KB value came back whole, in one 100 KB line
    r = cli_in_process(*args)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    line, = r.stderr.strip().splitlines()
    assert line.startswith("localgen: error: ") and len(line) < 1200, len(line)
    assert "characters left out" in line


@pytest.mark.parametrize("value", ["\x1b[2J\u202eX\x07", "a\rb", "\x9b31m"])
def test_an_error_shows_a_value_s_control_characters_escaped(cli_in_process: InProcessCLI, value: str) -> None:
    # "-a/--attach ESC[2J: no such file": the terminal cleared the screen instead of showing the name
    r = cli_in_process("run", "-m", "smollm2:135m", "-n", "1", "--attach", value, "hi")
    assert r.returncode == 2
    assert r.stderr.isprintable() is False and r.stderr.endswith("\n")
    line = r.stderr[:-1]
    assert line.isprintable() and line.startswith("localgen: error: -a/--attach "), repr(line)
    assert line.endswith(": no such file"), repr(line)
    assert value.encode("unicode_escape").decode() in line


def test_an_empty_attachment_name_is_said_so(cli_in_process: InProcessCLI) -> None:
    # Path("") is the current folder: "localgen: error:  is a folder, not a file"
    for value in ("", "  "):
        line = one_line_usage_error(cli_in_process("run", "-m", "smollm2:135m", "-n", "1", "--attach", value, "hi"))
        assert "empty attachment name" in line, line


@pytest.mark.parametrize("args", [("bench", "history", "99999999999999999999"),
                                  ("bench", "compare", "99999999999999999999", "1"),
                                  ("bench", "compare", "1", "99999999999999999999")])
def test_a_run_number_past_what_sqlite_stores_is_no_run(cli_in_process: InProcessCLI, args: tuple[str, ...]) -> None:
    # OverflowError: Python int too large to convert to SQLite INTEGER
    r = cli_in_process(*args)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.startswith("localgen: error: no benchmark run ") and r.stderr.count("\n") == 1, r.stderr


@pytest.mark.parametrize("bad", ["no-such-model-here", "\x1b[2J\u202e\x07"])
def test_serve_finds_every_model_before_it_loads_one(cli: CLI, bad: str) -> None:
    # the first -m was loaded (and its worker left running: a segfault at exit, 1 run in 6) before the second's
    # name was found unknown
    with socket.socket() as s:  # a port free now: the check that it is comes before the models
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = cli("serve", "-m", "smollm2:135m", "-m", bad, "--port", str(port), timeout=120)
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    assert r.stderr.startswith("localgen: error: unknown model ") and r.stderr.count("\n") == 1, r.stderr


@pytest.mark.parametrize("host", ["\x1b[2J\u202e\x07", "local host", "127.0.0.1\n"])
def test_serve_refuses_a_host_with_control_characters(cli_in_process: InProcessCLI, host: str) -> None:
    # bind() raised "TypeError: encoding of hostname failed": a traceback
    line = one_line_usage_error(cli_in_process("serve", "--host", host, "--port", "1"), "--host")
    assert "not a host name or address" in line, line


@pytest.mark.parametrize(("flags", "words"), [
    (("--cache-disk", "99999999999T"), "--cache-disk: '99999999999T' is over 1 EiB, more than a disk holds"),
    (("--cache-ram", "99999999T"), "--cache-ram: '99999999T' is over 1 PiB, more memory than a machine has"),
    (("--max-memory", "2000P"), "--max-memory '2000P' is over 1 PiB, more memory than a machine has"),
])
def test_serve_refuses_a_size_past_any_machine(cli_in_process: InProcessCLI, flags: tuple[str, str],
                                                words: str) -> None:
    """Taken, /health showed a limit past 64 bits (109951162776500490000000), which readers of JSON and /metrics in
    other languages cannot hold."""
    line = one_line_usage_error(cli_in_process("serve", *flags, "--port", "1"), flags[0])
    assert words in line, line


def test_quantize_to_a_folder_it_cannot_write_is_refused_before_the_work() -> None:
    # llama.cpp was asked to write there, and the error blamed the disk: "the disk is full or the file too large"
    top = Path(tempfile.mkdtemp(prefix="localgen-ro-", dir="/tmp"))
    try:
        top.chmod(0o777)  # the home is the user's; only the output's folder is not
        folder = top / "ro"
        folder.mkdir(mode=0o555)
        folder.chmod(0o555)
        env = {"PATH": os.environ.get("PATH", ""), "LOCALGEN_HOME": str(top / "home"), "HF_HOME": str(top / "hf"),
               "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
        as_nobody: list[str] = []
        if os.geteuid() == 0:  # root writes anywhere: run as nobody
            if shutil.which("setpriv") is None:
                pytest.skip("root, and no setpriv to run as another user")
            as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        r = subprocess.run([*as_nobody, sys.executable, "-m", "localgen", "quantize", "smollm2:135m", "Q8_0",
                            "--allow-requantize", "--output", str(folder / "q.gguf")], env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        line = one_line_usage_error(r)
        assert f"cannot write in {folder}: permission denied" in line, line
        assert list(folder.iterdir()) == []
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.mark.parametrize("command", ["run", "serve"])
@pytest.mark.parametrize(("flag", "value"), [("--yarn-orig-ctx", "99999999999999999999"),
                                             ("--main-gpu", "4294967296")])
def test_a_load_number_past_a_c_int_is_refused(cli_in_process: InProcessCLI, command: str, flag: str,
                                               value: str) -> None:
    # ctypes wraps it silently: --yarn-orig-ctx 99999999999999999999 ran with some other number
    # serve's bad --log-format, found after the flags are parsed, keeps a regression from starting a server
    args = ["-m", "smollm2:135m", flag, value] + (["-n", "1", "hi"] if command == "run" else ["--log-format", "x"])
    one_line_usage_error(cli_in_process(command, *args), flag, "2,147,483,647")


def test_ps_sends_a_key_outside_ascii_as_serve_compares_it(cli_in_process: InProcessCLI) -> None:
    # httpx refused to encode the header: a UnicodeEncodeError's traceback (serve compares the key's UTF-8 bytes)
    r = cli_in_process("ps", "--port", "9", "--api-key", "é✓日本")
    assert r.returncode == 1 and r.stderr.startswith("localgen: error: no localgen serve is running at "), r.stderr


def test_serve_refuses_a_key_longer_than_a_request_s_headers_hold(cli_in_process: InProcessCLI) -> None:
    with socket.socket() as taken:  # a regression fails on the port in use, not by serving
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        r = cli_in_process("serve", "--api-key", BIG, "--port", str(taken.getsockname()[1]))
    line = one_line_usage_error(r, "--api-key")
    assert "100,000 characters" in line, line


@pytest.mark.parametrize("args", [
    ("perplexity", "-m", "smollm2:135m", "--file", str(ROOT / "README.md"), "--ctx", "64", "--chunks", "1"),
    ("rpc-server", "--port", "1"),
    ("quantize", "smollm2:135m", "Q8_0", "--allow-requantize", "--output", "/nonexistent/q.gguf"),
])
def test_threads_past_what_any_machine_has_are_refused(cli: CLI, args: tuple[str, ...]) -> None:
    # perplexity --threads 99999999999999999999: llama.cpp's std::bad_alloc, SIGABRT and a gdb backtrace;
    # rpc-server served with the number wrapped to another
    r = cli(*args, "--threads", "99999999999999999999", timeout=60)
    one_line_usage_error(r, "--threads", "1024")


@pytest.mark.parametrize(("flag", "value", "high"), [("-t", "99999999999999999999", "within 1 to 1,024"),
                                                     ("-b", "4294967296", "at most 2,147,483,647")])
def test_bench_refuses_a_sweep_value_past_what_llama_cpp_takes(cli: CLI, flag: str, value: str, high: str) -> None:
    # bench -t 99999999999999999999: llama.cpp's std::bad_alloc, an abort (exit -6) after "saved as run N"
    r = cli("bench", "-p", "4", "-n", "1", "-r", "1", "--no-e2e", flag, value, timeout=120)
    one_line_usage_error(r, f"must be {high}")


@pytest.mark.parametrize("source", ["/dev/zero", "sparse", "stdin"])
def test_perplexity_refuses_a_text_past_its_cap_before_reading_it_whole(cli_in_process: InProcessCLI,
                                                                      tmp_path: Path, source: str) -> None:
    # /dev/zero was a MemoryError traceback, read whole and then tokenized: now read to one byte past 64 MiB
    path = source
    if source == "sparse":
        path = str(tmp_path / "big.txt")
        with open(path, "wb") as f:
            f.truncate(64 * 2**20 + 1)  # refused by its size: nothing of it is read
    if source == "stdin":
        r = cli_in_process("perplexity", "-m", "smollm2:135m", "-f", "-", input="a" * (64 * 2**20 + 1))
    else:
        r = cli_in_process("perplexity", "-m", "smollm2:135m", "-f", path)
    line = one_line_usage_error(r, "larger than 64 MiB, the most localgen measures on")
    assert line.startswith(f"localgen: error: {'stdin' if source == 'stdin' else path} is larger"), line


def test_perplexity_reads_only_the_text_its_windows_take(cli: CLI, tmp_path: Path) -> None:
    # docs/perplexity.md: a 60 MiB text was read and tokenized whole (a minute of two busy cores) to measure two
    # windows; now only its beginning is read, so a byte that is not UTF-8 at its end goes unread, and the figures
    # are those of the beginning alone
    import json

    from localgen.quant.text import default_text

    body = default_text()[:20_000].encode("utf-8")
    small, big = tmp_path / "small.txt", tmp_path / "big.txt"
    small.write_bytes(body)
    big.write_bytes(body + b"\n" + body * (60 * 2**20 // len(body)) + b"\xff")
    args = ("-m", "smollm2:135m", "-c", "64", "--chunks", "2", "-t", "1", "--json")
    r = cli("perplexity", "-f", str(big), *args)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ppl"] == json.loads(cli("perplexity", "-f", str(small), *args).stdout)["ppl"]
    r = cli("perplexity", "-f", str(big), "-m", "smollm2:135m", "-c", "64", "-t", "1")  # all of it: read whole
    one_line_usage_error(r, f"{big} is not UTF-8 text")


def test_quantize_refuses_an_importance_matrix_that_is_a_device(cli_in_process: InProcessCLI, smollm2_path: Path,
                                                                tmp_path: Path) -> None:
    # --imatrix /dev/zero was read whole: a MemoryError traceback
    r = cli_in_process("quantize", str(smollm2_path), "Q8_0", "--allow-requantize", "--imatrix", "/dev/zero",
                       "-o", str(tmp_path / "x.gguf"))
    one_line_usage_error(r, "the importance matrix /dev/zero is not a regular file")
    assert not list(tmp_path.iterdir())


def test_quantize_refuses_an_importance_matrix_that_is_a_fifo(cli: CLI, smollm2_path: Path, tmp_path: Path) -> None:
    # --imatrix FIFO hung for ever: the file was opened (which waits for a writer) before it was checked
    fifo = tmp_path / "imatrix"
    os.mkfifo(fifo)
    r = cli("quantize", str(smollm2_path), "Q8_0", "--allow-requantize", "--imatrix", str(fifo),
            "-o", str(tmp_path / "x.gguf"), timeout=60)
    one_line_usage_error(r, f"the importance matrix {fifo} is not a regular file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["imatrix"]
