"""The README's promises that broke in review: validation everywhere, untrusted templates and GGUFs, errors
as one line, caches that never cost an answer, pipes, llama.cpp's spellings, and tests that assert."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from localgen import settings
from localgen.engine.template import ChatTemplate
from localgen.errors import ModelLoadError, TemplateError, UsageError
from tests.conftest import CLI, ROOT, knows_the_bandwidth
from tests.gguf_edit import rewrite_strings

QUICK = ["-n", "8", "--ctx", "512", "--temperature", "0"]


def one_line_error(r: subprocess.CompletedProcess[str], code: int, needle: str) -> None:
    assert r.returncode == code, r.stderr
    assert r.stderr.startswith("localgen: error:") and r.stderr.count("\n") == 1, r.stderr
    assert needle in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


# ---- one validation of every setting -------------------------------------------------------------------


def test_settings_check_types_ranges_and_stop_strings() -> None:
    assert settings.check("top_k", 3) == 3
    for bad in (3.5, True, "3", None):
        with pytest.raises(UsageError, match="top_k"):
            settings.check("top_k", bad)
    with pytest.raises(UsageError, match="finite"):
        settings.check("temperature", float("nan"))
    with pytest.raises(UsageError, match="within"):
        settings.check("top_p", 1.5)
    assert settings.check("temperature", 1) == 1.0
    assert settings.check("stop", "abc") == ("abc",), "one stop string, not three one-character ones"
    assert settings.check("stop", ["a", "bc"]) == ("a", "bc")
    with pytest.raises(UsageError, match="list of strings"):
        settings.check("stop", ["a", 1])
    assert settings.check("logit_bias", ["15+1.5", "7-inf"]) == ((15, 1.5), (7, float("-inf")))
    assert settings.check("logit_bias", {"15": -2}) == ((15, -2.0),)
    assert settings.parse_text("temp", "0.3") == ("temperature", 0.3)
    assert settings.parse_text("seed", "none") == ("seed", None)
    with pytest.raises(UsageError, match="takes an integer"):
        settings.parse_text("top_k", "2.5")


def test_jsonl_lines_are_validated_and_the_others_go_on(cli: CLI, tmp_path: Path) -> None:
    f = tmp_path / "lines.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in [
        {"prompt": "x", "top_k": 3.5},
        {"prompt": "Count from 1 to 20.", "stop": "5.", "max_tokens": 40},
        {"prompt": "y", "temperature": True},
        {"prompt": "z", "stop": [1]},
    ]) + "\nSay hi.\n")  # a line that is not JSON is a prompt as it is (docs/run.md), in a .jsonl file too
    r = cli("run", "--file", str(f), "--json", "--temperature", "0", "--ctx", "512", "-n", "8")
    assert r.returncode == 1, r.stderr
    docs = [json.loads(line) for line in r.stdout.splitlines()]
    assert "top_k must be an integer" in docs[0]["error"]
    assert docs[1]["finish_reason"] == "stop" and docs[1]["text"].strip().endswith("4"), docs[1]
    assert "temperature must be a number" in docs[2]["error"]
    assert "stop must be a string or a list of strings" in docs[3]["error"]
    assert docs[4]["text"] and "error" not in docs[4] and docs[4]["completion_tokens"] <= 8, docs[4]
    assert "Traceback" not in r.stderr


def test_flags_reject_nan_and_chat_set_checks_types(cli: CLI) -> None:
    one_line_error(cli("run", "-p", "x", "--temperature", "nan"), 2, "--temperature")
    one_line_error(cli("run", "-p", "x", "--dry-base", "nan"), 2, "--dry-base")
    r = cli("chat", "-n", "4", input="/set top_k 2.5\n")
    one_line_error(r, 2, "top_k takes an integer")


def test_user_catalogue_and_saved_chat_settings_are_validated(cli: CLI, home: Path) -> None:
    user = home / "config" / "models.toml"
    user.parent.mkdir(parents=True, exist_ok=True)
    user.write_text('[models."bad:1b"]\nrepo = "a/b"\nsampling = { top_k = 3.5 }\n')
    try:  # a warning for a run of another model; the entry's error where it is used
        r = cli("run", "-p", "x", "-n", "1")
        assert r.returncode == 0 and r.stderr.count("\n") == 1 and r.stderr.startswith("warning: "), r.stderr
        one_line_error(cli("run", "-m", "bad:1b", "-p", "x"), 2, 'models."bad:1b"] sampling: top_k must be an integer')
    finally:
        user.unlink()
    saved = home / "data" / "chats" / "badset.json"
    saved.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"format": 1, "name": "badset", "model": "smollm2:135m", "messages": [],
                       "settings": {"stop": "abc", "top_p": 7}})
    saved.write_text(text)
    one_line_error(cli("chat", "--resume", "badset", input="hi\n"), 1, "top_p must be within 0 to 1")
    assert saved.read_text() == text, "the user's file is left as it is"


def test_conflicting_flags_fail_before_any_load(cli: CLI, tmp_path: Path) -> None:
    f = tmp_path / "p.txt"
    f.write_text("a\n")
    missing = ["-m", "nobody/nothing:Q4_0", "--offline"]  # loading it would fail: the usage error must come first
    cases = [
        (["-p", "x", "--draft", "m", "--lookup"], "--draft and --lookup cannot be combined"),
        (["-p", "x", "--beams", "2", "--json-schema", "{}"], "--beams cannot be combined"),
        (["--file", str(f), "--beams", "2"], "--beams cannot be used with --file"),
        (["--file", str(f), "-f", str(f)], "-f/--document cannot be used with --file"),
        (["--each-line", "--draft", "m"], "--draft cannot be used with --file/--each-line"),
        (["--file", str(f), "--prompt-cache"], "--prompt-cache cannot be used"),
        (["-p", "x", "--logprobs", "2"], "--logprobs adds to the JSON output"),
        (["hello", "-p", "x"], "give the prompt once"),
    ]
    for args, needle in cases:
        one_line_error(cli("run", *missing, *args), 2, needle)


def test_max_tokens_zero_generates_nothing(cli: CLI, tmp_path: Path) -> None:
    doc = json.loads(cli("run", "-p", "Tell me a story.", "-n", "0", "--json").stdout)
    assert doc["text"] == "" and doc["finish_reason"] == "length" and doc["stats"]["completion_tokens"] == 0
    f = tmp_path / "p.txt"
    f.write_text("one\ntwo\n")
    r = cli("run", "--file", str(f), "-n", "0", "--json", "--parallel", "2")
    assert [json.loads(x)["completion_tokens"] for x in r.stdout.splitlines()] == [0, 0]
    r = cli("run", "-p", "x", "-n", "0", "--beams", "2", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["text"] == ""


# ---- untrusted chat templates and GGUF files -----------------------------------------------------------


@pytest.mark.parametrize("source", [
    "{{ 1 // 0 }}", "{{ 1e300 ** 2 }}", '{{ "a"|center(4000000000) }}', "{{ ((10**64)**64)**64 }}",
    '{{ "%1000000000d" % 1 }}', '{{ "{:>1000000000}".format(1) }}', '{{ "%*d" % (1000000000, 1) }}',
    '{{ "x".ljust(10**9) }}', '{{ "a"|indent(10**9) }}', '{{ "a"|wordwrap(10**9) }}', '{{ "%.2000000f"|format(1.0) }}',
    "{{ messages[5].content }}", "{% for m in messages %}{{ m.no_such|int // 0 }}{% endfor %}",
])
def test_hostile_templates_are_template_errors(source: str) -> None:
    with pytest.raises(TemplateError):
        ChatTemplate(source, "<s>", "</s>").render([{"role": "user", "content": "hi"}])


_DOUBLING = ('{%% set ns = namespace(s=%s) %%}{%% for i in range(40) %%}{%% set ns.s = %s %%}{%% endfor %%}'
             '{{ ns.s|length }}')


@pytest.mark.parametrize(("start", "step"), [
    ('"a"', "ns.s ~ ns.s"), ('"a"', "ns.s + ns.s"), ("[1]", "ns.s + ns.s"), ('"a"', '"%s%s" % (ns.s, ns.s)'),
    ('"a"', '"{}{}".format(ns.s, ns.s)'), ('"a"', "[ns.s, ns.s]|join"), ('"a"', '"".join([ns.s, ns.s])'),
    ('"aa"', 'ns.s.replace("a", "aa")'),
])
def test_a_template_doubling_a_string_is_stopped_at_the_output_cap(start: str, step: str) -> None:
    """Every way a template builds a string or list is refused past the output's cap, before it is built: a
    template doubling one stopped only at the 2 s limit, at about 1 GB."""
    with pytest.raises(TemplateError, match=r"unsafe: (string|list) too long"):
        ChatTemplate(_DOUBLING % (start, step), "<s>", "</s>").render([{"role": "user", "content": "hi"}])


def test_a_long_message_still_renders_through_every_way_of_joining() -> None:
    t = ChatTemplate("{% for m in messages %}{{ '<|u|>' + m.content ~ '|' }}{{ '%s' % m.content|length }}"
                     "{{ '{}'.format(m.role) }}{{ [m.role, 'x']|join(',') }}{{ m.content[:3].replace('a', 'b') }}"
                     "{% endfor %}", "", "")
    content = "a" * 3_000_000
    assert t.render([{"role": "user", "content": content}]) == f"<|u|>{content}|3000000useruser,xbbb"


def test_hf_generation_tag_and_full_tojson() -> None:
    t = ChatTemplate("{% for m in messages %}{% generation %}[{{ m.content }}]{% endgeneration %}{% endfor %}"
                     "{{ messages|tojson(indent=1, sort_keys=true, separators=(',', ': ')) }}", "", "")
    out = t.render([{"role": "user", "content": "é"}])
    assert out == '[é][\n {\n  "content": "é",\n  "role": "user"\n }\n]'


def test_hostile_template_from_a_gguf_is_one_line(cli: CLI, smollm2_path: Path, tmp_path: Path) -> None:
    template = '{{ "a"|center(4000000000) }}'
    bad = rewrite_strings(smollm2_path, tmp_path / "t.gguf", {"tokenizer.chat_template": template})
    one_line_error(cli("run", "-m", str(bad), "-p", "hi", *QUICK), 1, "chat template tried something unsafe")


# Each ran one C-level call for minutes or built gigabytes before a cap (the time limit never fires inside one):
# Python's sum adding lists, a list of one list held many times (small in memory, huge as text, to compare or
# print), amplifying filters and methods, the text of a block collected in a loop.
_BIG = "'a'*1000000"
_NESTED = ("{% set ns = namespace(s=[1]) %}{% for i in range(40) %}{% set ns.s = STEP %}{% endfor %}"
           "{{ ns.s == ns.s|list }}")


@pytest.mark.parametrize("source", [
    "{{ ([[0]]*1000000)|sum(start=[])|length }}",
    f"{{{{ (({_BIG})|replace('a','b'*2000))|length }}}}", f"{{{{ ('%s'*1000)|format(*([{_BIG}]*1000))|length }}}}",
    f"{{{{ [{_BIG}]*500 }}}}", f"{{{{ ('%s' % ([{_BIG}]*50,))|length }}}}", f"{{{{ ([{_BIG}]*50)|tojson|length }}}}",
    f"{{{{ ([{_BIG}]*50)|string|length }}}}", f"{{{{ ('%(a)s'*100) % {{'a': {_BIG}}} }}}}",
    f"{{{{ ('{{0}}'*100).format({_BIG}) }}}}", _NESTED.replace("STEP", "[ns.s, ns.s]"),
    _NESTED.replace("STEP", "{'a': ns.s, 'b': ns.s}"), _NESTED.replace("STEP", "{}.fromkeys(range(3), ns.s)"),
    _NESTED.replace("STEP", "range(3)|map(attribute='x', default=ns.s)|list"),
    f"{{% set x %}}{{% for i in range(100000) %}}{{{{ {_BIG} }}}}{{% endfor %}}{{% endset %}}{{{{ x|length }}}}",
    f"{{% macro m() %}}{{% for i in range(100000) %}}{{{{ {_BIG} }}}}{{% endfor %}}{{% endmacro %}}"
    "{{ m()|length }}",
    "{{ ('\t'*1000000).expandtabs(100000)|length }}", "{{ ('a\n'*500000)|indent(100000)|length }}",
    "{{ [1]|batch(1000000000, 'x')|list|length }}", "{{ ('&'*1000000)|e|length }}",
])
def test_a_template_can_run_no_long_c_level_step(source: str) -> None:
    """No single step of a template runs long or builds past the output's cap: each is refused before (a
    template summing lists froze run, chat, bench and the whole serve process, which only SIGKILL ended)."""
    with pytest.raises(TemplateError, match=r"unsafe: [a-z]+ (too long|count too large)"):
        ChatTemplate(source, "<s>", "</s>").render([{"role": "user", "content": "hi"}])


def test_a_tool_call_of_many_floats_renders() -> None:
    """A float was measured as '%f' of 1e308 writes it (330 characters) wherever it was: a tool call of 13,000
    floats (93 KB of JSON: plot data, coordinates) was refused as past the 4 MiB cap. Its repr or JSON is at most
    24 characters; a format's measure keeps the 330."""
    points = [i / 7 for i in range(13_000)]
    t = ChatTemplate("{% for m in messages %}{{ m.tool_calls[0].function.arguments|tojson }}"
                     "{{ m.tool_calls[0].function.arguments }}{% endfor %}", "<s>", "</s>")
    call = {"function": {"name": "plot", "arguments": {"points": points}}}
    out = t.render([{"role": "assistant", "content": "", "tool_calls": [call]}])
    assert out.startswith(json.dumps({"points": points})), out[:100]
    with pytest.raises(TemplateError, match=r"unsafe: string too long"):  # '%f' of a large float is 316 characters
        ChatTemplate("{{ ('%f' * 13000) % x }}", "<s>", "</s>").render(
            [{"role": "user", "content": "hi"}], x=tuple([1e308] * 13_000))


def test_what_bytes_and_translate_would_amplify_is_refused() -> None:
    for source in ("{{ ('a'.encode()*10)|length }}", "{{ 'abc'.translate({97: 'x'*1000}) }}"):
        with pytest.raises(TemplateError, match="unsafe: access to attribute"):
            ChatTemplate(source, "<s>", "</s>").render([{"role": "user", "content": "hi"}])


def test_a_template_too_big_to_compile_is_refused_before_compiling() -> None:
    """Compiling is not under the time limit: 300,000 `{{ bos_token }}` took 52 s and 2.9 GB."""
    with pytest.raises(TemplateError, match=r"too long to compile: it has more than 50,000 Jinja tokens"):
        ChatTemplate("{{ bos_token }}" * 20_000, "<s>", "</s>")
    with pytest.raises(TemplateError, match=r"too long to compile: it has 1,048,577 characters, more than the "
                                             r"1,048,576 allowed"):
        ChatTemplate("x" * ((1 << 20) + 1), "<s>", "</s>")


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "tests" / "data" / "templates").iterdir()))
def test_published_templates_render_under_the_caps(name: str) -> None:
    schema = {"type": "object", "properties": {"x": {"type": "string"}}}
    tools = [{"type": "function", "function": {"name": "f", "description": "d" * 1000, "parameters": schema}}]
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u" * 1_000_000},
                {"role": "assistant", "content": "a"}, {"role": "user", "content": "again"}]
    out = ChatTemplate((ROOT / "tests" / "data" / "templates" / name).read_text(), "<s>", "</s>").render(
        messages, tools=tools)
    assert "u" * 1_000_000 in out and "again" in out


def test_a_template_summing_lists_or_rendering_nothing_is_one_line(cli: CLI, smollm2_path: Path,
                                                                    tmp_path: Path) -> None:
    """The sum froze `localgen run` (only kill -9 ended it); a template that renders nothing was reported as the
    user's empty prompt (exit 2)."""
    bad = rewrite_strings(smollm2_path, tmp_path / "sum.gguf",
                          {"tokenizer.chat_template": "{{ ([[0]]*1000000)|sum(start=[])|length }}"})
    one_line_error(cli("run", "-m", str(bad), "-p", "hi", *QUICK), 1, "template tried something unsafe: list too")
    empty = rewrite_strings(smollm2_path, tmp_path / "empty.gguf",
                            {"tokenizer.chat_template": "{% if 0 %}x{% endif %}"})
    one_line_error(cli("run", "-m", str(empty), "-p", "hello there", *QUICK), 1,
                   "the model's chat template rendered nothing for this conversation")


@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_gguf_with_inf_or_nan_for_an_integer_is_a_format_error(cli: CLI, smollm2_path: Path, tmp_path: Path,
                                                               value: float) -> None:
    bad = rewrite_strings(smollm2_path, tmp_path / "inf.gguf", {"llama.context_length": value})
    one_line_error(cli("run", "-m", str(bad), "-p", "hi", *QUICK), 1, "llama.context_length is")
    one_line_error(cli("show", str(bad)), 1, "not a whole number")


# ---- errors, caches and pipes ---------------------------------------------------------------------------


def test_an_unwritable_data_dir_is_one_line(cli_env: dict[str, str], tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "data").mkdir(parents=True)
    (home / "data" / "chats").write_text("a file where the chats folder should be")
    r = CLI({**cli_env, "LOCALGEN_HOME": str(home)})("chat", "x", "-n", "4", input="hi\n")
    # the answer is given; one warning says why it is not saved, and the exit says so (chat.md, Saving)
    assert r.returncode == 1 and r.stdout.strip(), r.stderr
    warned, error = r.stderr.splitlines()
    chats = home / "data" / "chats"
    said = f"cannot write {chats / 'x.json'}: {chats} is a file, not a folder"
    assert warned.startswith(f"warning: {said}; "), r.stderr
    assert error.startswith(f"localgen: error: the conversation was not saved: {said} "), r.stderr
    assert "Traceback" not in r.stderr


def test_an_unwritable_prompt_cache_warns_once_and_answers(cli_env: dict[str, str], tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "cache").mkdir(parents=True)
    (home / "cache" / "prompt-states").write_text("not a folder")
    doc = tmp_path / "doc.txt"
    # 20 lines: a shared prefix of some 300 tokens, past the prompt cache's 256 (shorter would be "skipped")
    doc.write_text("\n".join(f"Line {i}: the river passes mill number {i}." for i in range(20)))
    r = CLI({**cli_env, "LOCALGEN_HOME": str(home)})("run", "-f", str(doc), "-p", "Which mill is first?", "--json",
                                                      "-n", "4", "--ctx", "2048")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["text"] and json.loads(r.stdout)["prompt_cache"] == "unwritable"
    assert r.stderr.count("warning: the prompt cache cannot be written") == 1 and r.stderr.count("\n") == 1


def test_a_prompt_cache_on_a_full_disk_names_its_file_once_and_says_why(cli_env: dict[str, str],
                                                                       tmp_path: Path) -> None:
    """On a full disk the warning names the cache's folder once (it said `....14259.tmp.14259.tmp`, the inner
    step's own temporary file) and says the disk is full: looked at while the part written still fills it."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode:
        pytest.skip("mounting needs unshare and the right to use it (root)")
    home = tmp_path / "home"
    folder = home / "cache" / "prompt-states"
    folder.mkdir(parents=True)
    doc = tmp_path / "doc.txt"
    doc.write_text("\n".join(f"Line {i}: the river passes mill number {i}." for i in range(20)))
    env = {**cli_env, "LOCALGEN_HOME": str(home), "F": str(folder), "PY": sys.executable}
    r = subprocess.run(["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=64k tmpfs "$F" && exec "$PY" -m '
                        'localgen "$@"', "sh", "run", "-f", str(doc), "-p", "Which mill is first?", "--json", "-n",
                        "4", "--ctx", "2048"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and json.loads(r.stdout)["prompt_cache"] == "unwritable", r.stderr
    assert r.stderr == (f"warning: the prompt cache cannot be written ({folder}: No space left on device); "
                        "answering without it\n"), r.stderr


def test_resume_with_another_model_file_never_reuses_its_kv(cli: CLI, smollm2_path: Path, tmp_path: Path) -> None:
    r = cli("chat", "kvswap", "-n", "6", "--temperature", "0", input="Tell me about rivers.\n")
    assert r.returncode == 0, r.stderr
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(smollm2_path, copy)
    r = cli("chat", "--resume", "kvswap", "-m", str(copy), "-n", "6", "--stats", input="And lakes?\n")
    assert r.returncode == 0, r.stderr
    assert "of the history kept ready" not in r.stderr, "another model file has another identity"
    stats = next(ln for ln in r.stderr.splitlines() if "tok/s" in ln)
    assert stats.startswith(tuple(f"{n} tokens" for n in range(1, 7)))


def test_assembled_embedded_model_is_checked_before_use(home: Path) -> None:
    from localgen.models import embedded

    model = embedded.EMBEDDED["gemma3:270m"]
    path = embedded.locate(model)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size // 2)  # a crash or a full disk left half a file
    again = embedded.locate(model)
    assert again.stat().st_size == size
    from localgen.models.download import sha256_file

    assert sha256_file(again) == model.sha256


def _pipe_to_head(cmd: list[str], env: dict[str, str], stdin: str | None = None) -> tuple[int, str, bytes]:
    assert cmd[:3] == [sys.executable, "-m", "localgen"]
    p = CLI(env).popen(*cmd[3:], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL)
    assert p.stdout is not None and p.stderr is not None
    if stdin is not None:
        assert p.stdin is not None
        p.stdin.write(stdin.encode())
        p.stdin.close()
    first = p.stdout.readline()
    p.stdout.close()  # what `head -1` does
    rc = p.wait(timeout=180)
    return rc, p.stderr.read().decode(), first


def test_every_command_ends_quietly_when_its_reader_goes(cli_env: dict[str, str], tmp_path: Path) -> None:
    env = {**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")}
    user = tmp_path / "home" / "config" / "models.toml"
    user.parent.mkdir(parents=True)
    user.write_text("".join(f'[models."m{i}:1b"]\nrepo = "someone/M{i}-GGUF"\ndescription = "{"x" * 40}"\n'
                            for i in range(2000)))  # far more than a pipe buffer
    knows_the_bandwidth(tmp_path / "home")
    lg = [sys.executable, "-m", "localgen"]
    for cmd, stdin in [
        ([*lg, "list", "--catalogue"], None),
        ([*lg, "bench", "-p", "1-48", "-n", "1", "-r", "1", "--no-e2e", "-o", "jsonl"], None),
        ([*lg, "chat", "-n", "16", "--temperature", "0"], "Hi\nTell me about rivers.\nAnd lakes?\nAnd seas?\n"),
    ]:
        rc, err, first = _pipe_to_head(cmd, env, stdin)
        assert first.strip(), cmd
        assert rc == 0 and err == "", (cmd, rc, err)


def test_oserror_messages_name_the_path() -> None:
    from localgen.cli.main import describe_os_error

    assert describe_os_error(OSError(28, "No space left on device", "/x/y")) == \
        "cannot write /x/y: No space left on device"
    assert describe_os_error(OSError(30, "Read-only file system", "/ro")) == "cannot write /ro: Read-only file system"
    # a reader meets these too (`logs` with a data dir it cannot enter): never "cannot write"
    assert describe_os_error(OSError(13, "Permission denied", "/x/l.db")) == "cannot use /x/l.db: Permission denied"
    assert describe_os_error(OSError(20, "Not a directory", "/x/y")) == "cannot use /x/y: Not a directory"


def test_an_oserror_in_localgens_own_folder_says_what_to_do(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # a LOCALGEN_HOME under /sys or /proc said `cannot use /sys/lg: Operation not permitted`, or `cannot read
    # /proc/lg` of a folder it could not make, and neither named the home nor what to do
    from localgen.cli.main import describe_os_error

    home = tmp_path / "lg"
    monkeypatch.setenv("LOCALGEN_HOME", str(home))
    hint = f" (LOCALGEN_HOME is {str(home)!r}: give a folder localgen can write, or unset it)"
    assert describe_os_error(OSError(1, "Operation not permitted", str(home / "data"))) == \
        f"cannot use {home / 'data'}: Operation not permitted{hint}"
    assert describe_os_error(OSError(2, "No such file or directory", str(home))) == \
        f"cannot make {home}: No such file or directory{hint}"
    assert describe_os_error(OSError(2, "No such file or directory", "/x/y")) == \
        "cannot read /x/y: No such file or directory"  # (not localgen's own: as it was)


# ---- the OOM retry --------------------------------------------------------------------------------------


def test_out_of_memory_retries_with_fewer_layers_then_the_cpu_alone(smollm2_path: Path) -> None:
    from localgen.models import fit
    from localgen.models.load import open_engine
    from localgen.models.resolve import resolve
    from localgen.types import LoadParams

    ref = resolve(str(smollm2_path))
    tried: list[tuple[int | None, bool]] = []

    def full_gpu(ref: Any, params: LoadParams, verbose: bool = False, cpu_only: bool = False) -> str:
        tried.append((params.n_gpu_layers, cpu_only))
        if not cpu_only:
            raise ModelLoadError("llama.cpp could not load the model",
                                 log=["ggml_cuda: cudaMalloc failed: out of memory"])
        return "engine"

    warnings: list[str] = []
    gpu = fit.Machine(ram=64 << 30, gpus=(8 << 30,), described=True)  # (the retry is for a machine with a GPU)
    got = open_engine(ref, LoadParams(n_gpu_layers=-1), warn=warnings.append, factory=full_gpu, machine=gpu)
    assert got == "engine"
    assert tried == [(-1, False), (15, False), (7, False), (3, False), (1, False), (0, True)]
    assert warnings[0] == "not enough GPU memory for all layers; retrying with 15"
    assert warnings[-1] == "not enough GPU memory for 1 layers; running on the CPU alone"

    def other_error(ref: Any, params: LoadParams, verbose: bool = False, cpu_only: bool = False) -> str:
        raise ModelLoadError("llama.cpp could not load the model: bad magic")

    with pytest.raises(ModelLoadError, match="bad magic"):
        open_engine(ref, LoadParams(n_gpu_layers=-1), factory=other_error, machine=gpu)
    # --rpc from a machine with no GPU: the layers went to the servers' devices, whose memory ran short (fewer
    # layers help), not this machine's RAM
    tried.clear()
    cpu = fit.Machine(ram=64 << 30, gpus=(), described=True)
    got = open_engine(ref, LoadParams(n_gpu_layers=-1, rpc=("127.0.0.1:50052",)), warn=warnings.append,
                      factory=full_gpu, machine=cpu)
    assert got == "engine" and tried[:2] == [(-1, False), (15, False)], tried


# ---- tests that assert: context, content and order, sampler paths, environment ---------------------------


def test_context_full_stops_with_warning(cli: CLI) -> None:
    # 185 of the window's 256 tokens in the prompt (cheaper to evaluate than to generate): the answer fills 71
    prompt = "Tell me a very long story about " + "a mill, a bridge, a boat, a bird, " * 12 + "and a town."
    r = cli("run", "-p", prompt, "--ctx", "64", "--json", "--temperature", "1", "--seed", "3", "--ignore-eos")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["finish_reason"] == "context"
    assert doc["stats"]["prompt_tokens"] + doc["stats"]["completion_tokens"] == doc["load"]["n_ctx"] == 256
    assert f"context window ({doc['load']['n_ctx']} tokens) is full" in r.stderr


def test_stdin_system_and_prompt_reach_the_model_in_order(cli: CLI) -> None:
    r = cli("run", "-p", "QUESTION-TEXT", "--system", "SYSTEM-TEXT", "--verbose-prompt", *QUICK,
            input="PIPED-TEXT\n")
    assert r.returncode == 0, r.stderr
    shown = r.stderr
    assert shown.index("SYSTEM-TEXT") < shown.index("PIPED-TEXT") < shown.index("QUESTION-TEXT")
    assert "PIPED-TEXT\n\nQUESTION-TEXT" in shown
    assert "<|im_start|>system\nSYSTEM-TEXT<|im_end|>" in shown and "<|im_start|>user\nPIPED-TEXT" in shown
    raw = cli("run", "--raw", "-p", "QUESTION", "--verbose-prompt", *QUICK, input="PIPED\n")
    assert "prompt:\nPIPED\n\nQUESTION\n" in raw.stderr


def test_sampler_paths_agree_with_penalties_on(cli: CLI, tmp_path: Path, smollm2_engine: Any) -> None:
    prompt = "List the days of the week, then list them again."
    common = ["-n", "40", "--temperature", "0", "--ctx", "512", "--no-prompt-cache"]
    penalty = ["--repeat-penalty", "1.5"]
    plain = cli("run", "-p", prompt, *common, *penalty)
    f = tmp_path / "p.jsonl"
    f.write_text((json.dumps({"prompt": prompt}) + "\n") * 2)
    batched = cli("run", "--file", str(f), "--parallel", "2", "--exact", "--json", *common, *penalty)
    without = cli("run", "-p", prompt, *common)
    assert plain.returncode == batched.returncode == without.returncode == 0
    texts = [json.loads(x)["text"] for x in batched.stdout.splitlines()]
    assert plain.stdout.strip() == texts[0].strip() == texts[1].strip()
    assert plain.stdout != without.stdout, "the penalty changes the greedy text"
    # The speculative path's sampling, with a drafter that never proposes (so every check is one token,
    # through the same kernels as plain decoding): the same chain, accepted in the same order.
    from localgen.native.prompt import Prompt
    from localgen.types import SamplingParams

    class Silent:
        def propose(self, context: list[int], k: int) -> list[int]:
            return []

        def close(self) -> None:
            pass

    eng = smollm2_engine
    chat = Prompt.text(eng.chat_tokens([{"role": "user", "content": prompt}]))
    s = SamplingParams(temperature=0, repeat_penalty=1.5, frequency_penalty=0.5, max_tokens=40)
    eng.kv.clear()
    alone = "".join(c.text for c in eng.generate(chat, s))
    eng.kv.clear()
    speculative = "".join(c.text for c in eng.generate(chat, s, drafter=Silent()))
    assert alone == speculative


def test_localgen_environment_variables(cli_env: dict[str, str], smollm2_path: Path, tmp_path: Path) -> None:
    copy = tmp_path / "env-model.gguf"
    shutil.copyfile(smollm2_path, copy)
    env = {**cli_env, "LOCALGEN_HOME": str(tmp_path / "home"), "LOCALGEN_MODEL": str(copy), "LOCALGEN_CTX": "768"}

    def lg(*args: str, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """A process of its own in this environment: the fork server's child where only LOCALGEN_* differ
        (it reads them after the fork, as a fresh interpreter would; tests/test_forkserver.py checks that)."""
        return CLI({**env, **(extra or {})})(*args)

    doc = json.loads(lg("run", "-p", "hi", "-n", "2", "--json").stdout)
    assert doc["model"]["file"] == str(copy) and doc["load"]["n_ctx"] == 768
    one_line_error(lg("run", "-m", "acme/Nothing-GGUF:Q4_0", "-p", "hi", extra={"LOCALGEN_OFFLINE": "1"}), 1,
                   "localgen is offline")
    debug = lg("run", "-m", "nosuchmodel", "-p", "x", extra={"LOCALGEN_DEBUG": "1"})
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "ModelNotFoundError" in debug.stderr
    # 22 lines: a shared prefix of some 300 tokens, past the prompt cache's 256, so a state is made unless the cap
    # is 0 (a shorter one is never saved)
    text = "\n".join(f"Line {i}: mill {i} on the river." for i in range(22))
    (tmp_path / "d.txt").write_text(text)
    for cap, kept in (("0", 0), ("", 1)):
        r = lg("run", "-f", str(tmp_path / "d.txt"), "-p", "First?", "-n", "2",
               extra={"LOCALGEN_PROMPT_CACHE_MB": cap})
        assert r.returncode == 0, r.stderr
        # a 0 MB cap keeps nothing; LOCALGEN_HOME holds every location
        assert len(list((tmp_path / "home" / "cache" / "prompt-states").glob("*.state"))) == kept, cap


def test_doctor_exits_1_when_a_gpu_cannot_be_used(cli_env: dict[str, str], tmp_path: Path) -> None:
    from localgen.native.devices import backend_info

    if backend_info()["gpu_offload"]:
        pytest.skip("this build can use a GPU")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA GeForce RTX 4090, 24564, 24000'\n")
    smi.chmod(0o755)
    env = {**cli_env, "PATH": f"{bin_dir}{os.pathsep}{cli_env.get('PATH', '')}"}
    r = subprocess.run([sys.executable, "-m", "localgen", "doctor", "--no-check"], env=env, capture_output=True,
                       text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "PROBLEM   a GPU is present but this llama-cpp-python cannot use it" in r.stdout
    assert "scripts/install.sh --cuda" in r.stdout


@pytest.mark.parametrize(("script", "said"), [
    ("echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\"; exit 9",
     "nvidia-smi failed (exit 9): NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.)"),
    ("echo", "nvidia-smi lists no GPU)"),
])
def test_doctor_says_what_nvidia_smi_said_when_it_finds_no_gpu(cli_env: dict[str, str], tmp_path: Path, script: str,
                                                               said: str) -> None:
    """An nvidia-smi that fails (a driver not loaded) is not "no nvidia-smi": doctor's GPU line says what it said."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\n{script}\n")
    smi.chmod(0o755)
    env = {**cli_env, "PATH": f"{bin_dir}{os.pathsep}{cli_env.get('PATH', '')}"}
    r = subprocess.run([sys.executable, "-m", "localgen", "doctor", "--no-check"], env=env, capture_output=True,
                       text=True, cwd=ROOT, timeout=60)
    gpu = next(line for line in r.stdout.splitlines() if line.startswith("GPU "))
    assert gpu.startswith("GPU       none found (") and gpu.endswith(said), gpu


def test_a_gpu_whose_memory_nvidia_smi_calls_na_is_still_a_gpu(cli_env: dict[str, str], tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """MIG slices and NVIDIA's unified-memory chips answer `[N/A]` for memory: the GPU is listed all the same
    (doctor names it and, on a CPU-only build, says it cannot be used), and a plan puts nothing on a GPU whose
    memory neither nvidia-smi nor llama.cpp reports."""
    from localgen import hardware
    from localgen.models import fit
    from localgen.native import devices
    from localgen.native.devices import backend_info

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3, [N/A], [N/A]'\n"
                   "echo 'NVIDIA GB10, [N/A], 1000'\necho 'NVIDIA A100, 40960, 40000'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    found = hardware.gpus()
    assert [(g.name, g.total, g.free) for g in found] == [
        ("NVIDIA H100 80GB HBM3", None, None), ("NVIDIA GB10", None, 1000 << 20),
        ("NVIDIA A100", 40960 << 20, 40000 << 20)]
    # llama.cpp's backends know a MIG slice's memory: the plan takes theirs; where they know none, 0 (off the GPU)
    monkeypatch.setattr(hardware, "available_ram_bytes", lambda: 8 << 30)
    cuda = [devices.Device("CUDA0", "H100 MIG 1g.10gb", devices.GPU, 9 << 30, 10 << 30)]
    monkeypatch.setattr(devices, "devices", lambda: cuda)
    assert fit.this_machine(True).gpus == (9 << 30,)
    cuda = [devices.Device("CUDA0", "H100", devices.GPU, 0, 0), devices.Device("CUDA1", "", devices.GPU, 0, 0)]
    assert fit.this_machine(True).gpus == (0, 1000 << 20, 40000 << 20)
    assert fit.this_machine(True).gpu_budget(0) == 0
    assert fit.this_machine(False).gpus == ()

    env = {**cli_env, "PATH": f"{bin_dir}{os.pathsep}{cli_env.get('PATH', '')}"}
    r = subprocess.run([sys.executable, "-m", "localgen", "doctor", "--no-check"], env=env, capture_output=True,
                       text=True, cwd=ROOT, timeout=60)
    lines = [line for line in r.stdout.splitlines() if line.startswith("GPU ")]
    assert lines[0] == ("GPU       NVIDIA H100 80GB HBM3 · memory not reported by nvidia-smi ([N/A]: MIG or unified "
                        "memory); plans ask llama.cpp's CUDA backend, else keep the model off it"), r.stdout
    assert len(lines) == 3 and lines[2].startswith("GPU       NVIDIA A100 · 40.0 GiB"), r.stdout
    if not backend_info()["gpu_offload"]:
        assert r.returncode == 1 and "PROBLEM   a GPU is present but this llama-cpp-python cannot use it" in r.stdout


def test_stop_with_parallel_and_with_beams(cli: CLI, tmp_path: Path) -> None:
    prompt = "Count from 1 to 20."
    f = tmp_path / "p.txt"
    f.write_text(prompt + "\n" + prompt + "\n")
    r = cli("run", "--file", str(f), "--parallel", "2", "--stop", " 5", "--json", "-n", "60", "--temperature", "0")
    docs = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(docs) == 2
    assert all(d["finish_reason"] == "stop" and "4" in d["text"] and " 5" not in d["text"] for d in docs), docs
    r = cli("run", "-p", prompt, "--beams", "2", "--stop", " 5", "--json", "-n", "60")
    doc = json.loads(r.stdout)
    assert all(" 5" not in b["text"] and b["finish_reason"] == "stop" for b in doc["beams"]), doc["beams"]


# ---- conventions a llama.cpp or Ollama user brings ------------------------------------------------------


def test_positional_prompt_and_llama_cpp_spellings(cli: CLI, tmp_path: Path) -> None:
    by_flag = cli("run", "-p", "Name a colour.", *QUICK)
    by_arg = cli("run", "Name a colour.", *QUICK)
    assert by_arg.returncode == 0 and by_arg.stdout == by_flag.stdout
    doc = json.loads(cli("run", "hi", "--ctx-size", "768", "--n-predict", "3", "--json", "-fa", "off").stdout)
    assert doc["load"]["n_ctx"] == 768 and doc["stats"]["completion_tokens"] <= 3 and doc["load"]["flash_attn"] is False
    assert json.loads(cli("run", "hi", "-n", "1", "--json", "-fa").stdout)["load"]["flash_attn"] is True
    # auto: llama.cpp decides (its log says what), and --json reports its decision
    auto = cli("run", "hi", "-n", "1", "--json", "-fa", "auto", "--verbose")
    assert re.search(r"llama_context: flash_attn += auto", auto.stderr), "auto reached llama.cpp as auto"
    decided = re.search(r"Flash Attention (enabled|not supported|disabled)", auto.stderr)
    assert decided, auto.stderr
    assert json.loads(auto.stdout)["load"]["flash_attn"] is (decided.group(1) == "enabled")
    schema = json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]})
    inline = json.loads(cli("run", "Answer as JSON.", "-j", schema, "--json", *QUICK[:2], "-n", "20").stdout)
    assert json.loads(inline["text"]) in ({"ok": True}, {"ok": False})
    path = tmp_path / "s.json"
    path.write_text(schema)
    from_file = json.loads(cli("run", "Answer as JSON.", "-jf", str(path), "--json", "-n", "20").stdout)
    assert isinstance(json.loads(from_file["text"])["ok"], bool)
    g = tmp_path / "yn.gbnf"
    g.write_text('root ::= "yes" | "no"\n')
    assert cli("run", "Is water wet?", "--grammar-file", str(g), "-n", "4").stdout.strip() in ("yes", "no")
    wide = subprocess.run([*cli.argv("run", "--help-all")], env={**cli.env, "COLUMNS": "220"}, capture_output=True,
                          text=True, cwd=ROOT, timeout=60)
    assert "-md" in wide.stdout and "--model-draft" in wide.stdout and "--n-predict" in wide.stdout


def test_a_lone_f_file_is_the_prompt(cli: CLI, tmp_path: Path) -> None:
    p = tmp_path / "prompt.txt"
    p.write_text("PROMPT-FROM-FILE")
    r = cli("run", "-f", str(p), "--verbose-prompt", *QUICK)
    assert r.returncode == 0, r.stderr
    assert "user\nPROMPT-FROM-FILE<|im_end|>" in r.stderr and "prompt.txt:" not in r.stderr
    r = cli("run", "-f", str(p), "-p", "QUESTION", "--verbose-prompt", *QUICK)
    assert "prompt.txt:\n\nPROMPT-FROM-FILE\n\nQUESTION" in r.stderr


def test_no_stdin_keeps_a_while_read_loop_whole(cli_env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "items.txt").write_text("red\ngreen\nblue\n")
    script = (f"while read -r line; do {sys.executable} -m localgen run --no-stdin -p \"$line\" -n 2 --ctx 512 "
              "--temperature 0 --raw; echo \"== $line\"; done < items.txt")
    r = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=cli_env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    assert [ln for ln in r.stdout.splitlines() if ln.startswith("== ")] == ["== red", "== green", "== blue"]
    swallowed = subprocess.run(["bash", "-c", script.replace("--no-stdin ", "")], cwd=tmp_path, env=cli_env,
                               capture_output=True, text=True, timeout=900)
    assert [ln for ln in swallowed.stdout.splitlines() if ln.startswith("== ")] == ["== red"], \
        "without --no-stdin the first run reads the rest of the loop's input (the pitfall the README warns of)"


def test_flash_attn_value_is_checked() -> None:
    from localgen.cli.main import normalize_argv

    assert normalize_argv(["run", "-fa", "-p", "x"]) == ["run", "--flash-attn=on", "-p", "x"]
    assert normalize_argv(["run", "-fa", "auto"]) == ["run", "--flash-attn=auto"]
    assert normalize_argv(["run", "-p", "x", "--", "-fa"]) == ["run", "-p", "x", "--", "-fa"]
    assert normalize_argv(["bench", "-fa", "0,1"]) == ["bench", "-fa", "0,1"]



def test_out_of_memory_with_no_gpu_is_one_error_that_says_ram(smollm2_path: Path) -> None:
    """On a machine with no GPU an out-of-memory load was said as "not enough GPU memory for 0 layers; running on
    the CPU alone" and the model loaded a second time, to the same error: now one error that says RAM."""
    from localgen.models import fit
    from localgen.models.load import open_engine
    from localgen.models.resolve import resolve
    from localgen.types import LoadParams

    ref = resolve(str(smollm2_path))
    tried: list[bool] = []

    def full_ram(ref: Any, params: LoadParams, verbose: bool = False, cpu_only: bool = False) -> str:
        tried.append(cpu_only)
        raise ModelLoadError("llama.cpp could not create a context for smollm2:135m: ggml_aligned_malloc: "
                             "insufficient memory (attempted to allocate 18821.25 MB)")

    warnings: list[str] = []
    with pytest.raises(ModelLoadError) as e:
        open_engine(ref, LoadParams(), warn=warnings.append, factory=full_ram, machine=fit.Machine(ram=64 << 30))
    assert e.value.message.startswith("not enough RAM: llama.cpp could not create a context"), e.value.message
    assert tried == [False] and not warnings, (tried, warnings)


@pytest.mark.skipif(os.name != "posix", reason="ulimit")
def test_a_context_past_what_ram_holds_is_said_with_separators_and_one_ram_error(cli_env: dict[str, str]) -> None:
    """`--ctx 1000000000 --rope-scaling linear` under a 2 GB address-space limit said "context 885248 tokens, not
    1000000000", then "not enough GPU memory for 0 layers" on a machine with no GPU, and loaded again; --ctx
    2147483647 was said as "not 2147483648" (the value rounded). Now the numbers have their separators, the
    value given is the one said, and the shortage is one error that says RAM."""
    from localgen.native.devices import backend_info

    if backend_info()["gpu_offload"]:
        pytest.skip("a GPU build retries with fewer layers (test_out_of_memory_retries_with_fewer_layers...)")
    for ctx, rope in (("1000000000", "linear"), ("2147483647", "yarn")):
        r = subprocess.run(["bash", "-c", 'ulimit -v 2000000; exec "$@"', "sh", sys.executable, "-m", "localgen",
                            "run", "-p", "hi", "-n", "2", "--ctx", ctx, "--rope-scaling", rope],
                           env=cli_env, capture_output=True, text=True, timeout=600)
        given = f"{int(ctx):,}"
        lines = r.stderr.splitlines()
        assert r.returncode == 1 and "GPU" not in r.stderr, r.stderr
        assert re.fullmatch(rf"warning: context [\d,]+ tokens, not {given}: at {given} the model does not fit RAM "
                            r"\(`localgen fit -m smollm2:135m` shows the plan\)", lines[0]), lines
        assert len(lines) == 2 and lines[1].startswith("localgen: error: not enough RAM: "), lines
