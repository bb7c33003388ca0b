"""Every input file a flag names, missing or a folder, is one usage error of one shape: `FLAG PATH: why`, exit 2,
nothing on stdout, before anything loads. Click's own checks said `Invalid value for '--file': Path ... does not
exist.`, the others each their own words (`no such file: X`, `no LoRA adapter file 'X'`, `cannot read the
Modelfile X: ...`), and `perplexity --reference` exited 1."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import CLI, InProcessCLI

# (the command with {} for the path, the flag as the error names it); each before a model loads
FLAGS = [
    (["run", "--file", "{}"], "--file"),
    (["run", "-f", "{}"], "-f/--document"),
    (["run", "--document", "{}"], "-f/--document"),
    (["run", "-p", "hi", "--image", "{}"], "--image"),
    (["run", "-p", "hi", "-a", "{}"], "-a/--attach"),
    (["run", "-p", "hi", "-jf", "{}"], "-jf/--json-schema-file"),
    (["run", "-p", "hi", "--chat-template-file", "{}"], "--chat-template-file"),
    (["chat", "--functions", "{}"], "--functions"),
    (["run", "-p", "hi", "--mmproj", "{}"], "--mmproj"),
    (["run", "-p", "hi", "--lora", "{}"], "--lora"),
    (["chat", "--lora-scaled", "{}:0.5"], "--lora-scaled"),
    (["embed", "--file", "{}"], "--file"),
    (["rerank", "a query", "--file", "{}"], "--file"),
    (["serve", "--api-key-file", "{}"], "--api-key-file"),
    (["ps", "--api-key-file", "{}"], "--api-key-file"),
    (["launch", "codex", "--print-env", "--api-key-file", "{}"], "--api-key-file"),
    (["create", "bot", "-f", "{}"], "-f/--file"),
    (["perplexity", "-f", "{}"], "-f/--file"),
    (["perplexity", "--reference", "{}"], "--reference"),
    (["quantize", "smollm2:135m", "Q4_0", "--imatrix", "{}"], "--imatrix"),
    (["quantize", "smollm2:135m", "--ladder", "Q4_0", "--measure", "{}"], "--measure"),
]


@pytest.mark.parametrize(("args", "flag"), FLAGS, ids=[" ".join(a[:-1]) for a, _ in FLAGS])
def test_a_missing_input_file_is_one_usage_error_naming_the_flag(cli_in_process: InProcessCLI, tmp_path: Path,
                                                                 args: list[str], flag: str) -> None:
    missing = tmp_path / "no such dir" / "notes.txt"
    r = cli_in_process(*(a.format(missing) for a in args))
    assert (r.returncode, r.stdout) == (2, ""), (r.returncode, r.stdout, r.stderr)
    assert r.stderr == f"localgen: error: {flag} {missing}: no such file\n", r.stderr


@pytest.mark.parametrize(("args", "flag"), [(a, f) for a, f in FLAGS if f != "--reference"],
                         ids=[" ".join(a[:-1]) for a, f in FLAGS if f != "--reference"])
def test_a_folder_for_an_input_file_is_one_usage_error_naming_the_flag(cli_in_process: InProcessCLI, tmp_path: Path,
                                                                       args: list[str], flag: str) -> None:
    r = cli_in_process(*(a.format(tmp_path) for a in args))
    assert (r.returncode, r.stdout) == (2, ""), (r.returncode, r.stdout, r.stderr)
    assert r.stderr == f"localgen: error: {flag} {tmp_path}: a folder, not a file\n", r.stderr


def test_the_flags_that_take_a_file_or_a_text_say_both(cli_in_process: InProcessCLI, tmp_path: Path) -> None:
    """-j takes a schema or a file's path, --grammar a grammar or a file's path, --docs files or folders: a path to
    nothing says so in the same shape."""
    missing = tmp_path / "schema.json"
    r = cli_in_process("run", "-p", "hi", "-j", str(missing))
    assert (r.returncode, r.stderr) == (2, f"localgen: error: -j/--json-schema {missing}: no such file, and the "
                                           "text is not JSON\n"), r.stderr
    r = cli_in_process("run", "-p", "hi", "--grammar", str(tmp_path))
    assert r.returncode == 2 and r.stderr.startswith(f"localgen: error: --grammar {tmp_path}: a folder, not a file, "
                                                     "and the text is not GBNF"), r.stderr
    r = cli_in_process("embed", "--store", "s", "--docs", str(missing))
    assert (r.returncode, r.stderr) == (2, f"localgen: error: --docs {missing}: no such file or folder\n"), r.stderr
    # a pipe or a device is read as a file, as before: only what is not there, or a folder, is refused
    r = cli_in_process("run", "-m", "/nonexistent.gguf", "-f", "/dev/null")
    assert r.returncode == 2 and "-f /dev/null is only whitespace" in r.stderr, r.stderr
    r = cli_in_process("run", "-p", "hi", "--grammar", "/dev/null")  # --grammar's too (`--grammar <(cmd)` was "not
    assert (r.returncode, r.stderr) == (2, "localgen: error: the grammar file /dev/null is empty\n"), r.stderr  # a
    # file, and the text is not GBNF", where -j <(cmd) was read)


# a model flag's name that is a file's path (models/names.py: /abs, ./rel, ~/m, NAME.gguf, or a file that is there),
# with what else the command needs; each refused before a model loads, after the command's other usage errors
MODEL_FLAGS = [
    (["run", "-m", "{}", "-p", "hi"], "-m/--model"),
    (["run", "--draft", "{}", "-p", "hi"], "-md/--draft"),
    (["run", "-md", "{}", "-p", "hi"], "-md/--draft"),
    (["chat", "-m", "{}"], "-m/--model"),
    (["embed", "-m", "{}", "a text"], "-m/--model"),
    (["rerank", "a query", "a document", "-m", "{}"], "-m/--model"),
    (["bench", "-m", "{}", "-p", "8", "-n", "0"], "-m/--model"),
    (["bench", "-m", "smollm2:135m,{}", "-p", "8", "-n", "0"], "-m/--model"),  # one of a sweep's models
    (["serve", "--draft", "{}"], "-md/--draft"),
    (["serve", "-m", "{}"], "-m/--model"),
    (["serve", "-m", "smollm2:135m", "-m", "{}"], "-m/--model"),
    (["perplexity", "-m", "{}"], "-m/--model"),
    (["fit", "-m", "{}"], "-m/--model"),
    (["doctor", "-m", "{}"], "-m/--model"),
    (["tune", "-m", "{}"], "-m/--model"),
    (["quantize", "{}", "Q4_0"], "SOURCE"),  # quantize's model is its first argument
]


@pytest.mark.parametrize(("args", "flag"), MODEL_FLAGS, ids=[" ".join(a[:3]) for a, _ in MODEL_FLAGS])
def test_a_model_path_to_nothing_is_one_usage_error_naming_the_flag(cli: CLI, tmp_path: Path, args: list[str],
                                                                    flag: str) -> None:
    """A path given as the model is an input file: not there, or a folder, is the same usage error as any other
    flag's (exit 2, `FLAG PATH: why`), where it said `no such model file: PATH` and exited 1 (perplexity, fit,
    doctor, tune and quantize did until this session); every command that takes a model, in a process of its own."""
    missing = tmp_path / "no such dir" / "model.gguf"
    for path, why in ((missing, "no such file"), (tmp_path, "a folder, not a file")):
        r = cli(*(a.format(path) for a in args), input="hi\n")
        assert (r.returncode, r.stdout) == (2, ""), (r.returncode, r.stdout, r.stderr)
        assert r.stderr == f"localgen: error: {flag} {path}: {why}\n", r.stderr


def test_a_pipe_or_a_device_given_as_a_model_is_refused_not_waited_on(cli: CLI, tmp_path: Path) -> None:
    """models.md: a model is a regular file: a FIFO (which waited forever for a writer), a device (`/dev/zero` was
    "the file is empty") or a `<(cmd)` pipe is refused in one line, exit 2, by a flag, a command's model argument,
    LOCALGEN_MODEL and a Modelfile's FROM alike."""
    import os

    fifo = tmp_path / "fifo.gguf"
    os.mkfifo(fifo)
    for args, said in ((["run", "-m", str(fifo), "-p", "hi"], f"-m/--model {fifo}: a FIFO (a pipe), not a model file"),
                       (["serve", "--draft", "/dev/zero"], "-md/--draft /dev/zero: a device, not a model file"),
                       (["quantize", str(fifo), "Q4_0"], f"SOURCE {fifo}: a FIFO (a pipe), not a model file"),
                       (["show", str(fifo)], f"{fifo} is a FIFO (a pipe), not a model file"),
                       (["show", "/dev/zero"], "/dev/zero is a device, not a model file")):
        r = cli(*args, timeout=120)
        assert (r.returncode, r.stdout) == (2, ""), (args, r.stderr)
        assert r.stderr.splitlines()[0] == f"localgen: error: {said}", (args, r.stderr)
    r = CLI({**cli.env, "LOCALGEN_MODEL": str(fifo)})("run", "-p", "hi", timeout=120)
    assert (r.returncode, r.stderr) == (2, f"localgen: error: LOCALGEN_MODEL={fifo}: a FIFO (a pipe), not a model "
                                           "file\n")
    (tmp_path / "Modelfile").write_text("FROM ./fifo.gguf\n")
    r = CLI({**cli.env, "LOCALGEN_HOME": str(tmp_path / "home")})("create", "p", "-f", str(tmp_path / "Modelfile"),
                                                                   timeout=120)
    assert r.returncode == 2 and r.stderr.startswith(f"localgen: error: {fifo} is a FIFO (a pipe), not a model file")


# each command whose -m LOCALGEN_MODEL gives, with what else it needs
ENV_MODEL = [["run", "-p", "hi"], ["chat"], ["serve"], ["bench", "-p", "8", "-n", "0"], ["embed", "a text"],
             ["rerank", "a query", "a document"], ["perplexity"], ["fit"], ["doctor"], ["tune"]]


@pytest.mark.parametrize("args", ENV_MODEL, ids=[a[0] for a in ENV_MODEL])
def test_a_model_from_localgen_model_that_is_not_there_names_the_variable(cli: CLI, tmp_path: Path,
                                                                         args: list[str]) -> None:
    """LOCALGEN_MODEL's model, a path to nothing or a name that is no model, says where it came from: the
    variable, not the -m that was never typed (`LOCALGEN_MODEL=PATH: no such file`, exit 2, as -m's; `LOCALGEN_MODEL=
    NAME: unknown model ...`, exit 1); a -m typed beside it is the one named."""
    gone = tmp_path / "gone.gguf"
    env = CLI({**cli.env, "LOCALGEN_MODEL": str(gone)})
    r = env(*args, input="hi\n")
    assert (r.returncode, r.stdout, r.stderr) == (2, "", f"localgen: error: LOCALGEN_MODEL={gone}: no such file\n")
    r = env(args[0], "-m", str(tmp_path / "typed.gguf"), *args[1:], input="hi\n")
    assert (r.returncode, r.stderr) == (2, f"localgen: error: -m/--model {tmp_path / 'typed.gguf'}: no such file\n")
    r = CLI({**cli.env, "LOCALGEN_MODEL": "nosuchmodel"})(*args, input="hi\n")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("localgen: error: LOCALGEN_MODEL=nosuchmodel: unknown model 'nosuchmodel'"), r.stderr


def test_a_model_path_is_one_by_its_look_and_a_name_keeps_its_own_error(cli_in_process: InProcessCLI,
                                                                         tmp_path: Path) -> None:
    """nope.gguf and sub/nope.gguf are paths (relative to the working folder), as LOCALGEN_MODEL's value is -m's;
    a name that is no path is the resolver's (`unknown model`, exit 1), as before."""
    for name in ("nope.gguf", "sub/nope.gguf", "./nope", "~/no-such-dir/m.gguf"):
        r = cli_in_process("run", "-m", name, "-p", "hi")
        assert (r.returncode, r.stderr) == (2, f"localgen: error: -m/--model {name}: no such file\n"), r.stderr
    for name in ("nosuchmodel", "nosuchmodel@Q8_0"):
        r = cli_in_process("run", "-m", name, "-p", "hi")
        assert r.returncode == 1 and r.stderr.startswith(f"localgen: error: unknown model {name.split('@')[0]!r}"), \
            r.stderr


def _limited() -> None:  # a file read whole stops at this bound instead of at the machine's memory
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


# (the command with {} for the path, what the error calls the file {} names, the bound)
CAPPED = [
    (["create", "bot", "-f", "{}"], "the Modelfile {}", "1 MiB, the most localgen reads of it"),
    (["serve", "--port", "18999", "--api-key-file", "{}"], "the API key file {}",
     "64 KiB, the most localgen reads of it"),
    (["ps", "--api-key-file", "{}"], "the API key file {}", "64 KiB, the most localgen reads of it"),
    (["launch", "claude", "--print-env", "--api-key-file", "{}"], "the API key file {}",
     "64 KiB, the most localgen reads of it"),
    (["run", "-m", "smollm2:135m", "-p", "hi", "--image", "{}"], "{}",
     "{size}; an attachment may be at most 64 MiB"),
]


@pytest.mark.parametrize("kind", ["/dev/zero", "sparse"])
@pytest.mark.parametrize(("args", "what", "bound"), CAPPED, ids=[" ".join(a[:-1]) for a, _, _ in CAPPED])
def test_a_file_read_whole_is_refused_past_its_bound_before_it_is_read(cli_env: dict[str, str], tmp_path: Path,
                                                                        kind: str, args: list[str], what: str,
                                                                        bound: str) -> None:
    """A Modelfile, an API key file and an image are read only up to one byte past their bound (a device such as
    /dev/zero stats as 0 bytes), and a regular file past it is refused by its size unread: one usage error naming
    the file and the bound. /dev/zero was read until MemoryError, a 300 MB Modelfile read whole."""
    import subprocess
    import sys

    path = "/dev/zero"
    if kind == "sparse":
        path = str(tmp_path / "big")
        with open(path, "wb") as f:
            f.truncate(300 << 20)
    r = subprocess.run([sys.executable, "-m", "localgen", *(a.format(path) for a in args)],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, env=cli_env, timeout=300,
                       preexec_fn=_limited)
    assert (r.returncode, r.stdout) == (2, ""), (r.returncode, r.stdout, r.stderr)
    size = "is 300.0 MiB" if kind == "sparse" else "is larger than 64 MiB"  # an image's error says its size
    bound = bound.format(size=size) if "{size}" in bound else f"is larger than {bound}"
    assert r.stderr == f"localgen: error: {what.format(path)} {bound}\n", r.stderr


def test_a_modelfile_on_stdin_is_read_only_to_its_bound(cli_in_process: InProcessCLI) -> None:
    """`create -f -` reads stdin up to one byte past 1 MiB, as `-f FILE` is bounded: a larger text is one usage
    error (it was one character past: 1 MiB of 4-byte characters, 4 MiB, was taken)."""
    for text in ("#" * ((1 << 20) + 1), "# " + "\U0001F600" * 300_000):
        r = cli_in_process("create", "bot", "-f", "-", input=text)
        assert (r.returncode, r.stdout) == (2, ""), (r.returncode, r.stdout, r.stderr)
        assert r.stderr == ("localgen: error: the Modelfile on stdin is larger than 1 MiB, the most localgen reads "
                            "of it\n")


def test_a_file_an_editor_wrote_with_a_byte_order_mark_reads_as_without_it(cli: CLI, tmp_path: Path) -> None:
    """run.md: a byte order mark at the start of a file localgen reads (Notepad writes one) is dropped, as a
    Modelfile's is: a -f document's text did not begin with it, and a -jf schema file and a --grammar file holding
    one were refused as not JSON and not GBNF."""
    bom = b"\xef\xbb\xbf"
    (tmp_path / "doc.txt").write_bytes(bom + b"Is water wet?\r\n")
    (tmp_path / "schema.json").write_bytes(bom + b'{"type": "boolean"}\r\n')
    (tmp_path / "yes.gbnf").write_bytes(bom + b'root ::= "yes"\r\n')
    r = cli("run", "-f", str(tmp_path / "doc.txt"), "-jf", str(tmp_path / "schema.json"), "--verbose-prompt",
            "-n", "8", "--temperature", "0")
    assert r.returncode == 0 and r.stdout.strip() in ("true", "false"), (r.stdout, r.stderr)
    assert "<|im_start|>user\nIs water wet?\n<|im_end|>" in r.stderr and "\ufeff" not in r.stderr, r.stderr
    r = cli("run", "-p", "Is water wet?", "--grammar", str(tmp_path / "yes.gbnf"), "-n", "4", "--temperature", "0")
    assert (r.returncode, r.stdout) == (0, "yes\n"), (r.stdout, r.stderr)
