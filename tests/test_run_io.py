"""run's and chat's input and output at the process's edges, as the run/chat red team found them wrong: stdin whose
bytes are not UTF-8 under a strict locale (en_US.UTF-8, where Python's stdin raised), a stdout the shell closed,
--each-line with --no-stdin, a JSONL "id" that JSON cannot hold, a chat message tens of megabytes long, and the
order of run's attachments (docs/run.md, docs/media.md)."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CLI, ROOT, SAFETY_NET_S, InProcessCLI


def _strict(value: str) -> Any:
    raise ValueError(f"{value} is not JSON")


@pytest.fixture(scope="module")
def strict_locale(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """en_US.UTF-8, built as the red team built it (localedef into a folder LOCPATH names): under it Python's stdin
    is strict, where under C.UTF-8 it keeps a bad byte (surrogateescape)."""
    folder = tmp_path_factory.mktemp("locales")
    if shutil.which("localedef") is None:
        pytest.skip("no localedef on this machine to build en_US.UTF-8 with")
    made = subprocess.run(["localedef", "-i", "en_US", "-f", "UTF-8", str(folder / "en_US.UTF-8")],
                          capture_output=True, timeout=120)
    if not (folder / "en_US.UTF-8").is_dir():
        pytest.skip(f"localedef could not build en_US.UTF-8: {made.stderr.decode(errors='replace')[-300:]}")
    return {"LOCPATH": str(folder), "LANG": "en_US.UTF-8"}


def _fresh(cli: CLI, args: list[str], data: bytes, env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    """`localgen ARGS` in an interpreter of its own (a forked one keeps the fork server's stdin encoding), `data`
    piped in, the environment's locale variables replaced by `env`'s."""
    base = {k: v for k, v in cli.env.items() if not k.startswith("LC_") and k not in ("LANG", "LOCPATH",
                                                                                        "PYTHONIOENCODING")}
    return subprocess.run(cli.argv(*args), input=data, capture_output=True, env={**base, **env}, cwd=ROOT,
                          timeout=SAFETY_NET_S)


@pytest.mark.parametrize("how", ["en_US.UTF-8", "PYTHONIOENCODING=utf-8:strict"])
def test_stdin_that_is_not_utf8_is_told_alike_under_any_locale(cli: CLI, strict_locale: dict[str, str],
                                                                how: str) -> None:
    """run.md: a piped prompt that is not UTF-8 says the byte and where (`byte 0xe9 at character 4`); with
    --each-line such a line fails alone, with its number, the others answered; a scripted chat's message, the
    same. Under en_US.UTF-8 each was a UnicodeDecodeError traceback (--each-line answered no line), or a bare
    `stdin is not UTF-8 text`."""
    strict = strict_locale if how == "en_US.UTF-8" else {"LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8:strict"}
    cases = [(["run", "-n", "2"], b"caf\xe9 ok"),
             (["run", "--each-line", "-n", "2", "--temperature", "0"], b"hi\n\xe9t\xe9\nyo\n"),
             (["chat", "-n", "2", "--temperature", "0"], b"hi\n\xe9t\xe9\nyo\n")]
    said = []
    for args, data in cases:
        r = _fresh(cli, args, data, strict)
        assert b"Traceback" not in r.stderr, r.stderr.decode()[-2000:]
        plain = _fresh(cli, args, data, {"LANG": "C.UTF-8"})
        assert (r.returncode, r.stdout, r.stderr) == (plain.returncode, plain.stdout, plain.stderr), args
        said.append(r)
    one, each, chat = said
    assert one.returncode == 2
    assert one.stderr == b"localgen: error: stdin is not valid UTF-8 text: byte 0xe9 at character 4 is not UTF-8\n"
    lines = each.stdout.decode().split("\n")
    assert each.returncode == 1 and len(lines) == 4 and lines[0] and lines[1] == "" and lines[2], each.stdout
    assert each.stderr == (b"localgen: error: line 2: the line is not valid UTF-8 text: byte 0xe9 at character 1 is "
                           b"not UTF-8\n")
    assert chat.returncode == 2 and chat.stdout.strip(), chat.stdout  # "hi" answered, then the script ends
    assert chat.stderr.endswith(b"localgen: error: the message is not valid UTF-8 text: byte 0xe9 at character 1 "
                                b"is not UTF-8\n"), chat.stderr


def test_a_byte_order_mark_and_crlf_on_stdin_or_in_a_file_are_read_as_a_file_s_are(cli: CLI, home: Path,
                                                                                    tmp_path: Path) -> None:
    """run.md, chat.md: stdin is read as -f reads a file: a byte order mark at its start is dropped (Notepad writes
    one), CRLF and CR are LF. The BOM made --file's and --each-line's first JSON line a plain prompt (its "id" and
    "max_tokens" lost), and a scripted chat's first line (/set ...) a message to the model; stdin's CR reached the
    prompt (`Say yes\r`) and the saved chat."""
    lines = '\ufeff{"prompt": "Say yes.", "id": "first", "max_tokens": 1}\r\n{"prompt": "Say no.", "id": "second"}\r\n'
    jsonl = tmp_path / "bom.jsonl"
    jsonl.write_bytes(lines.encode())
    for r in (cli("run", "--each-line", "--json", "-n", "2", "--temperature", "0", input=lines),
              cli("run", "--file", str(jsonl), "--json", "-n", "2", "--temperature", "0")):
        assert r.returncode == 0, r.stderr
        docs = [json.loads(line) for line in r.stdout.splitlines()]
        assert [(d["id"], d["completion_tokens"]) for d in docs] == [("first", 1), ("second", 2)], r.stdout
    r = cli("run", "--verbose-prompt", "-n", "1", "--temperature", "0", input="\ufeffSay yes\r\nand no\rok\r\n")
    assert r.returncode == 0, r.stderr
    assert "\nSay yes\nand no\nok<|im_end|>" in r.stderr and "\r" not in r.stderr, repr(r.stderr)
    r = cli("chat", "bom-crlf", "-n", "2", input="\ufeff/set temperature 0\r\nSay yes\r\n")
    assert r.returncode == 0, r.stderr
    saved = json.loads((home / "data" / "chats" / "bom-crlf.json").read_text())
    assert [m["content"] for m in saved["messages"] if m["role"] == "user"] == ["Say yes"]
    assert saved["settings"]["temperature"] == 0


def test_output_in_a_code_page_that_lacks_a_character_is_written_as_utf8(cli: CLI) -> None:
    """run.md: stdout and stderr that are not a terminal write UTF-8. Windows's redirected output is in the ANSI code
    page, strictly (PYTHONIOENCODING=cp1252 here): an answer holding 你好 ✓ was a UnicodeEncodeError traceback,
    and an error line naming them said \\u4f60."""
    cp1252 = {"LANG": "C.UTF-8", "PYTHONIOENCODING": "cp1252"}
    r = _fresh(cli, ["run", "--grammar", 'root ::= "你好 ✓"', "-n", "16", "Say hi."], b"", cp1252)
    assert r.returncode == 0 and r.stdout == "你好 ✓\n".encode(), r.stderr.decode()[-2000:]
    r = _fresh(cli, ["run", "-m", "你好✓", "hi"], b"", cp1252)
    assert r.returncode == 1 and "你好✓".encode() in r.stderr and b"Traceback" not in r.stderr, r.stderr


def test_a_terminal_that_is_not_utf8_shows_a_question_mark_for_what_it_cannot(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A console in a code page (cp1252): the answer's 你 is `?` there, never a UnicodeEncodeError."""
    from localgen.cli.main import utf8_output

    class Console(io.TextIOWrapper):
        def isatty(self) -> bool:
            return True

    shown = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", Console(shown, encoding="cp1252", errors="strict"))
    utf8_output()
    sys.stdout.write("你 é\n")
    sys.stdout.flush()
    assert shown.getvalue() == "? é\n".encode("cp1252")


def test_a_stream_made_utf8_keeps_its_error_handler(monkeypatch: pytest.MonkeyPatch) -> None:
    """A redirected stderr in latin-1 becomes UTF-8 and keeps its backslashreplace: a file name holding a byte that
    is not UTF-8 (a lone surrogate) is still said, not dropped (reconfigure alone made it strict, and ErrWriter
    drops a line that cannot be written). A stream whose encoding is None is left alone, not a TypeError."""
    from localgen.cli.main import utf8_output

    written = io.BytesIO()
    monkeypatch.setattr(sys, "stderr", io.TextIOWrapper(written, encoding="latin-1", errors="backslashreplace"))
    monkeypatch.setattr(sys, "stdout", type("Bare", (), {"encoding": None})())
    utf8_output()
    sys.stderr.write("no such file: x\udcff.gguf\n")
    sys.stderr.flush()
    assert written.getvalue() == b"no such file: x\\udcff.gguf\n"


def _closing_stdout() -> None:
    os.close(1)


def test_an_answer_into_a_closed_stdout_is_an_error_as_into_dev_full(cli: CLI) -> None:
    """run.md: a stdout the shell closed (`>&-`) is one error line and exit 1, as `> /dev/full` is; the answer was
    lost with exit 0 and nothing said."""
    for args in (["run", "-p", "hi", "-n", "2"], ["run", "-p", "hi", "-n", "2", "--json"], ["list"]):
        r = subprocess.run(cli.argv(*args), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, env=cli.env, cwd=ROOT,
                           preexec_fn=_closing_stdout, timeout=SAFETY_NET_S)
        assert r.returncode == 1, (args, r.stderr)
        assert r.stderr == b"localgen: error: stdout is closed: the output has nowhere to go\n", (args, r.stderr)
    words = " ".join((ROOT / "docs" / "run.md").read_text().split())
    assert "`run >&-`: `localgen: error: stdout is closed: the output has nowhere to go`, exit 1" in words


def test_each_line_with_no_stdin_is_a_usage_error(cli_in_process: InProcessCLI) -> None:
    """run.md: flags a mode cannot use are refused; --each-line's prompts are stdin's lines, which --no-stdin said
    not to read (it read them anyway)."""
    r = cli_in_process("run", "--each-line", "--no-stdin", "-n", "1", input="hi\n")
    assert r.returncode == 2 and r.stdout == "", r
    assert r.stderr.startswith("localgen: error: --each-line reads its prompts from stdin: it cannot be combined "
                               "with --no-stdin"), r.stderr
    assert r.stderr.count("\n") == 1
    assert "`--no-stdin` with `--each-line`" in " ".join((ROOT / "docs" / "run.md").read_text().split())


@pytest.mark.parametrize("ident", ["NaN", "Infinity", "-1e400", "1e400"])
def test_a_json_line_whose_id_json_cannot_hold_fails_alone(ident: str) -> None:
    """An "id" is written back with the answer: NaN (or 1e400, read as an infinity) was written as `NaN`, which no
    JSON reader takes (jq refused the whole output). The line fails alone, as a bad setting's does."""
    from localgen.cli.run.many import parse
    from localgen.types import SamplingParams

    source = io.StringIO(f'{{"prompt": "hi", "id": {ident}}}\n{{"prompt": "yo", "id": 1e300}}\n')
    bad, good = parse(source, None, None, SamplingParams())
    assert bad.prompt is None and bad.ident is None
    assert bad.error is not None and bad.error.startswith('"id" holds NaN or an infinity'), bad.error
    assert good.error is None and good.ident == 1e300


def test_run_file_json_writes_only_json(cli: CLI, tmp_path: Path) -> None:
    """Every line `run --file --json` writes is JSON (no `NaN`), a line whose "id" is NaN an error line."""
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text('{"prompt": "hi", "id": NaN}\n{"prompt": "hi", "id": 1e400}\n{"prompt": "hi", "id": "ok"}\n')
    r = cli("run", "--file", str(jsonl), "--json", "-n", "2", "--temperature", "0")
    docs = [json.loads(line, parse_constant=_strict) for line in r.stdout.splitlines()]
    assert r.returncode == 1 and [d["line"] for d in docs] == [1, 2, 3], r.stdout
    assert "NaN or an infinity" in docs[0]["error"] and "NaN or an infinity" in docs[1]["error"]
    assert docs[2]["id"] == "ok" and "text" in docs[2]


def test_run_file_plain_writes_each_answer_on_one_line_and_a_blank_line_for_a_blank_one(cli: CLI,
                                                                                        tmp_path: Path) -> None:
    """run.md: in plain `--file` output any run of white space inside an answer (line breaks, tabs, CR, NBSP) becomes
    one space, white space at either end goes, and a blank input line gives a blank output line (a grammar makes
    the answer)."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("First prompt.\n\nSecond prompt.\n")
    r = cli("run", "--file", str(prompts), "--grammar", 'root ::= " one  two\t\tthree\nfour\r\nfive\u00a0six  "',
            "-n", "30", "--temperature", "0")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "one two three four five six\n\none two three four five six\n"


def test_a_chat_message_too_big_for_the_window_is_refused_by_its_size(cli: CLI) -> None:
    """run.md: a prompt of more characters than the window could hold is refused by its size before it is templated
    or tokenized; chat's message too (between 4 and 64 MiB it reached the template, whose output cap spoke:
    `the model's chat template tried something unsafe: string too long`)."""
    r = cli("chat", "-n", "2", input="x" * 5_000_000 + "\n")
    assert r.returncode == 1, r.stderr[-2000:]
    first = r.stderr.strip().splitlines()[0]
    assert first.startswith("localgen: error: the prompt is 5,000,000 characters; the context window of 4,096 "
                            "tokens holds at most 131,072"), r.stderr[-2000:]
    assert "template" not in r.stderr


def test_run_s_attachments_go_in_the_order_given(cli_in_process: InProcessCLI, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """media.md: the pictures and clips go to the model in the order the command line gives them, whatever their
    flags (`-a photo.png --image python.png`: all --image files went first, then --video, then -a)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from make_mmproj import png

    sizes = {"a": (40, 30), "b": (50, 20), "c": (30, 60), "d": (20, 20)}
    for name, (w, h) in sizes.items():
        (tmp_path / f"{name}.png").write_bytes(png(w, h))
    plans: list[Any] = []
    import localgen.cli.run.execute as execute

    monkeypatch.setattr(execute, "execute", plans.append)  # the checked plan, nothing loaded
    for flags in (["-a", "a", "--image", "b", "-a", "c", "--image", "d"],
                  ["--image", "d", "--attach=c", "--image=b", "-a", "a"]):
        args = [a if a.startswith("-") else str(tmp_path / f"{a}.png") for a in flags]
        args = [a.replace("=", f"={tmp_path}/") + ".png" if "=" in a else a for a in args]
        r = cli_in_process("run", "-p", "Compare them.", *args)
        assert r.returncode == 0, r.stderr
        names = [f.removeprefix("--attach=").removeprefix("--image=") for f in flags if not f.startswith("-")
                 or "=" in f]
        assert [(m.width, m.height) for m in plans[-1].media] == [sizes[n] for n in names], flags
    words = " ".join((ROOT / "docs" / "media.md").read_text().split())
    assert "in the order the command line gives them, whatever their flags" in words


@pytest.mark.parametrize("args", [["run", "-p", "Tell me a story."], ["chat", "-n", "8"]], ids=["run", "chat"])
def test_llama_cpp_aborting_mid_answer_ends_the_answers_line_before_its_error(cli_env: dict[str, str],
                                                                               args: list[str]) -> None:
    """rpc.md: an RPC server gone mid-answer is one error line. llama.cpp's abort ends the process from inside the
    decode: the error was glued to the answer (`...there was a dragonlocalgen: error: ...`), the answer's line never
    ended. The abort comes here at the answer's second piece, as a server gone would end the next decode."""
    script = ("from localgen.engine import generate\nfrom localgen.native.lib import libggml\n"
              "real = generate.Generation.__iter__\n"
              "def pieces(self):\n    for i, chunk in enumerate(real(self)):\n"
              "        if i == 1:\n"
              "            libggml().ggml_abort(b'ggml-rpc.cpp', 1, b'Remote RPC server crashed')\n"
              "        yield chunk\n"
              "generate.Generation.__iter__ = pieces\nfrom localgen.cli.main import main\n"
              f"main({[*args, '-n', '8', '--temperature', '0']!r})\n")
    r = subprocess.run([sys.executable, "-c", script], env=cli_env, cwd=ROOT, capture_output=True, text=True,
                       input="Tell me a story.\n", timeout=SAFETY_NET_S)
    assert r.returncode == 1 and r.stdout.strip() and r.stdout.endswith("\n"), r.stdout
    assert r.stderr == ("localgen: error: llama.cpp stopped: Remote RPC server crashed (an RPC server went away or "
                        "failed: a generation cannot go on without it; run again)\n"), r.stderr
