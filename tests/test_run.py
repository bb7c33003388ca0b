"""`localgen run` driven as a user drives it: a subprocess, real models, stdout and stderr apart."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CLI, ROOT, SAFETY_NET_S, InProcessCLI

QUICK = ["-n", "12", "--ctx", "512"]


def test_streams_answer_to_stdout_only(cli: CLI) -> None:
    r = cli("run", "-p", "Why is the sky blue?", "--seed", "1", *QUICK)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip(), "no answer on stdout"
    assert r.stdout.endswith("\n")
    assert "\x1b[" not in r.stdout, "escape codes in piped output"
    assert r.stderr == "", "stderr should be silent in a pipe without --stats"


def _stats_line() -> re.Pattern[str]:
    """docs/run.md's example --stats line as a pattern: each of its numbers any number with as many decimals, its
    stop reason length or eos (what -n 12 ends with), then the line's end."""
    shown = re.search(r"`(\d+ prompt tokens · [^`]+)`", (ROOT / "docs" / "run.md").read_text(encoding="utf-8"))
    assert shown is not None and shown[1].endswith(" · stop: length"), "docs/run.md shows no whole --stats line"

    def number(n: str) -> str:
        decimals = n.partition(".")[2]
        return r"[\d,]+" + (r"\." + r"\d" * len(decimals) if decimals else "")

    parts = re.split(r"(\d+(?:\.\d+)?)", shown[1].removesuffix("length"))  # text, a number, text, ...
    return re.compile("".join(number(p) if i % 2 else re.escape(p) for i, p in enumerate(parts)) + r"(length|eos)\n")


def test_stats_go_to_stderr(cli: CLI) -> None:
    """docs/run.md: --stats is one line on stderr, its fields in the order the page shows them; where the weights
    sit in more than one place (a GPU and RAM), a second line says where, as the page shows it (on an H200 the
    second line failed a test that took stderr for the one line)."""
    from localgen.native.devices import has_gpu

    r = cli("run", "-p", "Hello", "--stats", "--seed", "1", "--no-prompt-cache", *QUICK)
    assert r.returncode == 0, r.stderr
    stats, _, rest = r.stderr.partition("\n")
    assert _stats_line().fullmatch(stats + "\n"), r.stderr
    weights = re.compile(r"weights: \w+ [\d.,]+ MiB( · \w+ [\d.,]+ MiB)+")
    shown = re.search(r"`(weights: [^`]+)`", (ROOT / "docs" / "run.md").read_text(encoding="utf-8"))
    assert shown is not None and weights.fullmatch(shown[1]), shown
    if has_gpu():
        assert weights.fullmatch(rest.removesuffix("\n")) and rest.endswith("\n"), r.stderr
    else:  # all in RAM: one place, no second line
        assert rest == "", r.stderr
    assert "prompt tokens" not in r.stdout
    # its figures agree: the tokens after the first were decoded between the first token and the end, so the
    # decode rate is at least those tokens over that time (as shown: the rate to 0.1 tok/s, the times to 0.01 s)
    shown = re.search(r"([\d,]+) generated · .* decode ([\d.,]+) tok/s · first token ([\d.,]+) s .* total ([\d.,]+) s",
                      r.stderr)
    assert shown is not None, r.stderr
    n, rate, first, total = (float(f.replace(",", "")) for f in shown.groups())
    assert n > 1 and (n - 1) / (rate + 0.05) <= total - first + 0.01, r.stderr


def test_json_reports_text_model_settings_and_stats(cli: CLI) -> None:
    r = cli("run", "-p", "Name a colour.", "--json", "--seed", "7", "--temperature", "0.5", *QUICK)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 1, "--json prints exactly one object"
    doc = json.loads(lines[0])
    assert doc["finish_reason"] in ("length", "eos")
    assert doc["model"]["name"] == "smollm2:135m"
    assert doc["model"]["quantization"] == "Q4_1"
    assert doc["model"]["file"].endswith(".gguf")
    # the model's own figures, not only their names: SmolLM2-135M is a llama of 134,515,008 weights (test_models)
    assert doc["model"]["architecture"] == "llama" and doc["model"]["parameters"] == 134_515_008, doc["model"]
    assert doc["model"]["file_size"] == Path(doc["model"]["file"]).stat().st_size
    assert doc["seed"] == 7
    assert doc["sampling"]["temperature"] == 0.5
    assert doc["load"]["n_ctx"] == 512 and doc["load"]["n_threads"] >= 1
    stats = doc["stats"]
    assert stats["completion_tokens"] <= 12 and stats["prompt_tokens"] > 5
    for key in ("load_s", "ttft_s", "prefill_tps", "decode_tps", "total_s", "cached_tokens"):
        assert key in stats
    # docs/run.md lists every key of the object: a new one must be documented
    assert set(doc) == {"text", "finish_reason", "model", "seed", "sampling", "load", "stats", "localgen",
                        "prompt_cache", "conversation_id"}, sorted(doc)
    assert set(doc["model"]) == {"name", "file", "source", "quantization", "architecture", "parameters",
                                 "file_size"}, sorted(doc["model"])
    assert doc["text"]


def test_without_flash_attention_the_thread_count_leaves_a_greedy_answer_as_it_is(cli: CLI) -> None:
    """docs/exactness.md: under CPU flash attention -t can change a greedy answer; with --no-flash-attn, -t 1, 2 and
    3 give the same text (each row of a product is one thread's)."""
    args = ["run", "-p", "Write two sentences about the sea.", "-n", "48", "--temperature", "0", "--no-flash-attn",
            "--no-prompt-cache"]
    runs = [cli(*args, "-t", t) for t in ("1", "2", "3")]
    assert all(r.returncode == 0 and r.stdout.strip() for r in runs), [r.stderr for r in runs]
    assert len({r.stdout for r in runs}) == 1, [r.stdout for r in runs]


def test_same_seed_same_text_and_no_seed_differs(cli: CLI) -> None:
    args = ["run", "-p", "Write one sentence about a dog.", *QUICK, "--temperature", "1.0"]
    a = cli(*args, "--seed", "42")
    b = cli(*args, "--seed", "42")
    assert a.returncode == b.returncode == 0
    assert a.stdout == b.stdout
    unseeded = [json.loads(cli(*args, "--json").stdout) for _ in range(3)]
    assert len({d["seed"] for d in unseeded}) == 3, "each run without --seed picks a new seed"
    assert len({d["text"] for d in unseeded}) > 1, "runs without --seed should differ"
    # the seed an unseeded run reports reproduces it
    again = json.loads(cli(*args, "--json", "--seed", str(unseeded[0]["seed"])).stdout)
    assert again["text"] == unseeded[0]["text"]
    random = [json.loads(cli(*args, "--json", "--seed", "-1").stdout) for _ in range(2)]  # llama.cpp's "random"
    assert len({d["seed"] for d in random}) == 2 and -1 not in {d["seed"] for d in random}


def test_stdin_and_prompt_combine(cli: CLI) -> None:
    alone = json.loads(cli("run", "-p", "Summarize this.", "--json", *QUICK).stdout)
    both = json.loads(
        cli("run", "-p", "Summarize this.", "--json", *QUICK, input="The cat sat on the mat all day long.\n").stdout
    )
    only_stdin = cli("run", "--json", *QUICK, input="Say hello.\n")
    assert only_stdin.returncode == 0, only_stdin.stderr
    assert both["stats"]["prompt_tokens"] > alone["stats"]["prompt_tokens"] + 8


def test_piped_text_comes_first_then_the_prompt(cli: CLI, tmp_path: Path) -> None:
    """docs/ci.md: "Piped text comes first, then the `-p` prompt" (`git diff | localgen run -p "Write a commit
    message ..."`), a blank line between, as the log keeps the prompt the model was given."""
    lg = CLI({**cli.env, "LOCALGEN_HOME": str(tmp_path / "home")})
    diff = "diff --git a/x b/x\n+hello\n"
    r = lg("run", "-p", "Write a commit message for this diff.", "-n", "2", "--temperature", "0", input=diff)
    assert r.returncode == 0, r.stderr
    [logged] = json.loads(lg("logs", "-n", "1", "--json").stdout)
    assert logged["prompt"] == "diff --git a/x b/x\n+hello\n\nWrite a commit message for this diff.", logged["prompt"]


def test_raw_completion_on_base_model(cli: CLI) -> None:
    r = cli("run", "-m", "gemma3:270m", "--raw", "-p", "Paris is the capital of", "--temperature", "0", *QUICK)
    assert r.returncode == 0, r.stderr
    assert "France" in r.stdout


def test_model_by_path(cli: CLI, smollm2_path: Path) -> None:
    r = cli("run", "-m", str(smollm2_path), "-p", "Hi", "--json", *QUICK)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["model"]["source"] == "path"


def test_a_model_file_whose_name_is_not_utf8_answers_in_valid_json_and_is_logged(cli: CLI, smollm2_path: Path,
                                                                                    tmp_path: Path) -> None:
    """run.md: stdout is UTF-8. A file name's byte that is not UTF-8 (0xe8, as Latin-1 writes è) went raw into
    --json's model name and file, then the log's sqlite raised UnicodeEncodeError (a traceback, not logged); its
    escaped path is opened again by --continue."""
    link = tmp_path / "mod\udce8le.gguf"  # the byte 0xe8 on disk
    link.symlink_to(smollm2_path)
    r = subprocess.run(cli.argv("run", "-m", str(link), "-p", "Hi", "--json", *QUICK), capture_output=True,
                       env=cli.env, timeout=600)
    assert r.returncode == 0 and r.stderr == b"", r.stderr.decode(errors="replace")
    model = json.loads(r.stdout.decode("utf-8"))["model"]
    assert model["name"] == "mod\\xe8le.gguf" and model["file"] == str(tmp_path / "mod\\xe8le.gguf"), model
    logged = cli("logs", "-n", "1", "--json")
    assert logged.returncode == 0, logged.stderr
    assert json.loads(logged.stdout)[0]["model"] == "mod\\xe8le.gguf", logged.stdout
    r = subprocess.run(cli.argv("run", "--continue", "-p", "And?", "--json", *QUICK), capture_output=True,
                       env=cli.env, timeout=600)  # the path, logged escaped, opens again (it said "not here any more")
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    assert json.loads(r.stdout.decode("utf-8"))["model"]["file"] == str(tmp_path / "mod\\xe8le.gguf"), r.stdout


def test_a_chat_with_a_model_file_whose_name_is_not_utf8_saves_and_resumes(cli: CLI, smollm2_path: Path,
                                                                            tmp_path: Path, home: Path) -> None:
    """The chat's file held the path's raw byte: its save raised UnicodeEncodeError, and the prompt cache's key
    another, two tracebacks after the first answer and nothing saved. The path is kept escaped in the JSON
    (\\udce8, read back as the same path) and the keys hash its bytes."""
    link = tmp_path / "mod\udce8le.gguf"
    link.symlink_to(smollm2_path)
    r = subprocess.run(cli.argv("chat", "latin1", "-m", str(link), *QUICK), input=b"Hi\n", capture_output=True,
                       env=cli.env, timeout=600)
    assert r.returncode == 0 and b"Traceback" not in r.stderr, r.stderr.decode(errors="replace")
    saved = json.loads((home / "data" / "chats" / "latin1.json").read_text(encoding="utf-8"))
    assert saved["model"] == str(link) and len(saved["messages"]) == 2, saved
    r = subprocess.run(cli.argv("chat", "--resume", "latin1", *QUICK), input=b"/show\n", capture_output=True,
                       env=cli.env, timeout=600)
    assert r.returncode == 0 and b"conversation latin1 \xc2\xb7 2 messages" in r.stderr, r.stderr
    try:
        listed = subprocess.run(cli.argv("chat", "--list"), capture_output=True, env=cli.env, timeout=600)
        assert listed.returncode == 0 and b"mod\\xe8le.gguf" in listed.stdout, listed.stderr  # escaped, as logged
    finally:  # the home is the worker's: its other `chat --list` tests need not meet it
        (home / "data" / "chats" / "latin1.json").unlink(missing_ok=True)


def test_stop_sequence(cli: CLI) -> None:
    r = cli("run", "-p", "Count from 1 to 20, separated by commas.", "--temperature", "0", "-n", "60",
            "--stop", "5", "--json")
    doc = json.loads(r.stdout)
    assert doc["finish_reason"] == "stop"
    assert "5" not in doc["text"] and "4" in doc["text"]


def test_grammar_constrains_output(cli: CLI, tmp_path: Path) -> None:
    g = tmp_path / "yesno.gbnf"
    g.write_text('root ::= "yes" | "no"\n')
    r = cli("run", "-p", "Is water wet?", "--grammar", str(g), "--json", "-n", "10")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["text"] in ("yes", "no")


def test_json_schema_constrains_output(cli: CLI, tmp_path: Path) -> None:
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }))
    r = cli("run", "-p", "Give me a person as JSON.", "--json-schema", str(schema), "--json", "-n", "60",
            "--temperature", "0")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["finish_reason"] == "eos", doc
    person = json.loads(doc["text"])
    assert isinstance(person["name"], str) and isinstance(person["age"], int)


def test_bad_grammar_is_a_clear_error(cli: CLI, tmp_path: Path) -> None:
    g = tmp_path / "bad.gbnf"
    g.write_text("root ::= ( unclosed\n")
    r = cli("run", "-p", "x", "--grammar", str(g), *QUICK)
    assert r.returncode == 2  # bad usage, as a --grammar path that does not exist or a -f file not UTF-8
    assert r.stderr == "localgen: error: the grammar does not parse: expecting ')' at the end of the grammar\n"
    s = tmp_path / "bad.json"
    s.write_text("{not json")
    r = cli("run", "-p", "x", "--json-schema", str(s), *QUICK)
    assert r.returncode == 2 and "not valid JSON" in r.stderr
    # valid JSON, but no JSON Schema: checked against the metaschema before it becomes a grammar (the converter
    # took them for "anything": `null`, exit 0)
    s.write_text('{"type": "objekt"}')
    for args, where in ((["-j", '{"type": "objekt"}'], "at type"), (["-jf", str(s)], "at type"),
                        (["-j", '{"type": "object", "properties": {"a": {"type": "strng"}}}'], "at properties/a/type")):
        r = cli("run", "-p", "x", *args, *QUICK)
        assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
        assert r.stderr.startswith(f"localgen: error: the JSON schema is not valid {where}: "), r.stderr


def test_a_grammar_that_allows_no_token_is_an_error_or_the_end_not_an_abort(cli: CLI) -> None:
    # every token -inf (a grammar complete while ignore_eos bans the end, or one that admits nothing this model
    # has): the chain still picked one, llama.cpp's grammar threw accepting it, and the process aborted (rc 134)
    for temperature in ("0", "0.8"):
        r = cli("run", "-p", "hi", "-n", "10", "--ignore-eos", "-j", '{"const": 1}', "--temperature", temperature,
                "--json", "--ctx", "512")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)  # the grammar complete, the answer ends there (it went on, unseen, to -n)
        assert (doc["text"], doc["finish_reason"], doc["stats"]["completion_tokens"]) == ("1", "eos", 1), doc
    for grammar in ('root ::= "\\x00"', "root ::= [^\\x00-\\U0010FFFF]", "root ::= <|im_end|>",
                    "root ::= <[99999999]>"):
        r = cli("run", "-p", "hi", "--grammar", grammar, *QUICK)
        assert r.returncode == 2 and r.stdout == "", (grammar, r.returncode, r.stderr)
        assert r.stderr.startswith("localgen: error: the grammar admits no token of this model at its start"), r.stderr
        assert r.stderr.count("\n") == 1, r.stderr


def test_a_grammar_llama_cpp_refuses_after_parsing_says_why(cli: CLI) -> None:
    for grammar, why in (('root ::= root "a"', "a rule is left-recursive"),
                         ('x ::= "a"', "it has no root rule (root ::= ...)")):
        r = cli("run", "-p", "hi", "--grammar", grammar, *QUICK)
        assert r.returncode == 2 and r.stderr.startswith(f"localgen: error: the grammar does not parse: {why}"), \
            r.stderr


def test_a_json_schema_answer_holds_no_raw_control_character(cli: CLI) -> None:
    # the schema's `char` admitted U+0000-U+001F raw: a poem's line break made the answer invalid JSON
    r = cli("run", "-p", "Write a short poem.", "--temperature", "0", "-n", "60", "--ctx", "512", "-j",
            '{"type": "string", "maxLength": 80}')
    assert r.returncode == 0, r.stderr
    assert isinstance(json.loads(r.stdout), str), r.stdout


@pytest.mark.parametrize(("schema", "said"), [
    ('{"allOf": [{"type": "string"}, {"type": "integer"}]}', "allOf whose parts allow no type in common"),
    ('{"type": "string", "enum": [1, 2]}', "enum with no string among its values"),
    ('{"type": "integer", "const": "a"}', 'const "a", which is not of type integer'),
    ('{"not": {}}', "has not: {}"),
    ('{"properties": {"a": false}, "required": ["a"]}', "requires the property 'a', whose schema is false"),
    ("false", "the JSON schema is false"),
    ('{"type": "object", "properties": {"x": {"type": "null", "const": 0}}, "required": ["x"]}',
     "part at properties/x has const 0"),
    ('{"anyOf": [{"type": "string", "enum": [1]}, false]}', "an anyOf of which no part can be met"),
    ('{"type": "object", "properties": {}, "required": ["a"], "additionalProperties": false}',  # answered { }
     "requires the property 'a', which additionalProperties: false forbids"),
    ('{"allOf": [{"const": 1}, {"const": 2}]}', "no value that its const and enum (its allOf's parts' too) all allow"),
])
def test_a_json_schema_no_value_meets_is_refused_naming_the_part(cli: CLI, schema: str, said: str) -> None:
    # they became grammars whose answers broke the schema (`-j false` answered null, exit 0)
    r = cli("run", "-p", "hi", "-j", schema, *QUICK)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert said in r.stderr and "no value meets it" in r.stderr, r.stderr


@pytest.mark.parametrize("schema", [
    {"allOf": [{"enum": ["a", "b"]}, {"enum": ["c"]}]}, {"const": "x", "enum": ["y"]},
    {"allOf": [{"const": True}, {"enum": [1]}]}, {"type": "object", "properties": {"k": {"allOf": [{"const": 1}, {
        "const": 2}]}}, "required": ["k"]},
])
def test_const_and_enum_values_with_none_in_common_are_refused(schema: Any) -> None:
    """allOf's const and enum were merged "first wins" (allOf [{const: 1}, {const: 2}] answered 1, 200); a const
    beside an enum without it too: no value meets them together (true is not 1)."""
    from localgen.engine.grammar import grammar_from_json_schema
    from localgen.errors import GrammarError

    with pytest.raises(GrammarError, match=r"const and enum \(its allOf's parts' too\) all allow: no value meets it"):
        grammar_from_json_schema(json.dumps(schema))


def test_an_allofs_const_and_enum_hold_the_values_they_share() -> None:
    """The merged grammar answers only what every part allows (it took the first part's enum: "a" broke the
    second part); 1 and 1.0 are one JSON value."""
    from localgen.engine.grammar import grammar_from_json_schema

    both = grammar_from_json_schema(json.dumps({"allOf": [{"enum": ["a", "b"]}, {"enum": ["b", "c"]}]}))
    assert 'schema0 ::= "\\"b\\""' in both.splitlines(), both
    number = grammar_from_json_schema(json.dumps({"allOf": [{"const": 1}, {"enum": [1.0, 2]}]}))
    assert 'schema0 ::= "1"' in number.splitlines(), number


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": {"type": "string"}, "b": {"not": {}}}, "required": ["a"]},  # zod's never
    {"type": "object", "additionalProperties": {"not": {}}}, {"patternProperties": {"^x": {"not": {}}}},
    {"type": "array", "prefixItems": [{"type": "string"}], "items": {"not": {}}},
    {"if": {"required": ["a"]}, "then": {"not": {}}},
    {"anyOf": [{"type": "string"}, {"type": "integer", "enum": ["x"]}]},
    {"type": "integer", "const": 10**400}, {"type": ["string", "null"], "enum": ["a", None]},
])
def test_a_schema_saying_never_this_where_a_value_may_be_absent_is_taken(schema: Any) -> None:
    """Only the parts every value must meet are checked: a property not required, additionalProperties, items,
    then/else or one anyOf branch that no value meets says "never this" (zod writes z.never() as not: {}); they
    were refused, and a tool with one broke every request that offered it. A huge integer const is no float."""
    from localgen.engine.satisfiable import check_satisfiable

    check_satisfiable(schema)


def test_system_prompt_is_used(cli: CLI, smollm2_engine: Any) -> None:
    system = "You answer only in French, briefly."
    plain = json.loads(cli("run", "-p", "Hi", "--json", *QUICK).stdout)
    with_sys = json.loads(cli("run", "-p", "Hi", "--system", system, "--json", *QUICK).stdout)
    assert with_sys["stats"]["prompt_tokens"] != plain["stats"]["prompt_tokens"]
    # the prompt is the template's rendering of a system turn and the question (the session's SmolLM2)
    said = [{"role": "system", "content": system}, {"role": "user", "content": "Hi"}]
    assert with_sys["stats"]["prompt_tokens"] == len(smollm2_engine.chat_tokens(said)), with_sys["stats"]


def test_context_full_stops_with_warning(cli: CLI) -> None:
    # --ignore-eos: the answer can only end where the window does (--ctx 64 is raised to the least window, 256);
    # a long prompt fills most of it, which costs less than generating it
    r = cli("run", "-p", "Tell me a very long story about " + "rivers and lakes, " * 40, "--ctx", "64", "--json",
            "--temperature", "1", "--seed", "3", "--ignore-eos")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["finish_reason"] == "context" and doc["stats"]["completion_tokens"] > 8, doc["stats"]
    assert doc["stats"]["prompt_tokens"] + doc["stats"]["completion_tokens"] == doc["load"]["n_ctx"]
    assert f"context window ({doc['load']['n_ctx']} tokens) is full" in r.stderr


def test_prompt_longer_than_context_is_refused_before_generating(cli: CLI) -> None:
    r = cli("run", "--ctx", "32", "-p", "word " * 400)
    assert r.returncode == 1
    assert "the prompt is" in r.stderr and "the context window is 256" in r.stderr
    assert r.stdout == ""


def test_pipe_to_head_ends_quietly(cli: CLI, tmp_path: Path) -> None:
    """run.md: `localgen run ... | head -1` ends quietly, with status 0, and stops generating. --stats prints its
    line when a generation ends: none, as this one stopped (decoding on unseen, it ended 306 tokens later with
    `306 generated · ... · stop: eos` on stderr). logs.md: the answer is logged as far as it came (it was not
    logged at all, and `run --continue` went on with the conversation before it)."""
    lg = CLI({**cli.env, "LOCALGEN_HOME": str(tmp_path / "home")})
    # --ignore-eos: on an H200 the answer (23 tokens, another near tie than the CPU's) ended before the reader went
    p = lg.popen("run", "-p", "List fifty animals, one per line.", "-n", "400", "--temperature", "0", "--stats",
                 "--ignore-eos", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    first = p.stdout.readline()
    p.stdout.close()  # what `head -1` does after its line
    try:
        rc = p.wait(timeout=SAFETY_NET_S)
    finally:
        p.kill()
    err = p.stderr.read().decode()
    assert first.strip()
    assert rc == 0, err
    assert "Traceback" not in err and err == "", "the generation went on after the reader had gone"
    [logged] = json.loads(lg("logs", "-n", "1", "--json").stdout)
    assert logged["prompt"] == "List fifty animals, one per line." and logged["finish_reason"] == "cancelled", logged
    assert logged["response"].startswith(first.decode().rstrip("\n")), (first, logged["response"])


def test_ctrl_c_stops_generation_with_130(cli: CLI, tmp_path: Path) -> None:
    """The partial answer is logged, as chat logs one (logs.md: every run and chat exchange is logged)."""
    lg = CLI({**cli.env, "LOCALGEN_HOME": str(tmp_path / "home")})
    p = lg.popen("run", "-p", "Write a long essay about rivers.", "-n", "2000", "--temperature", "0",
                 "--ignore-eos", stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # long enough on a GPU too
    assert p.stdout is not None and p.stderr is not None
    said = p.stdout.read(8)  # generation has started
    p.send_signal(signal.SIGINT)
    rc = p.wait(timeout=30)
    err = p.stderr.read().decode()
    said += p.stdout.read()
    assert rc == 130
    assert "interrupted" in err and "Traceback" not in err
    [logged] = json.loads(lg("logs", "-n", "1", "--json").stdout)
    assert logged["prompt"] == "Write a long essay about rivers." and logged["finish_reason"] == "cancelled", logged
    assert said.decode().rstrip("\n") and logged["response"].startswith(said.decode().rstrip("\n")), \
        (said, logged["response"])
    listed = lg("logs", "-n", "1").stdout  # logs.md: the listing says it was stopped (it looked finished)
    assert "\n## Response (stopped before its end)\n" in listed, listed


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_kill_mid_answer_logs_it_as_far_as_it_came(cli: CLI, tmp_path: Path, sig: signal.Signals) -> None:
    """`timeout 10 localgen run ...`, a kill, the terminal closed: the answer was lost from the log (only Ctrl-C and
    `| head` kept it). It is logged as far as it came, finish reason cancelled, and the process still ends by the
    signal, nothing said on stderr."""
    lg = CLI({**cli.env, "LOCALGEN_HOME": str(tmp_path / "home")})
    p = lg.popen("run", "-p", "Write a long essay about rivers.", "-n", "2000", "--temperature", "0",
                 "--ignore-eos", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    said = p.stdout.read(8)  # generation has started
    p.send_signal(sig)
    rc = p.wait(timeout=30)
    err = p.stderr.read().decode()
    said += p.stdout.read()
    assert (rc, err) == (-sig, ""), (rc, err)
    [logged] = json.loads(lg("logs", "-n", "1", "--json").stdout)
    assert logged["prompt"] == "Write a long essay about rivers." and logged["finish_reason"] == "cancelled", logged
    assert said.decode().rstrip("\n") and logged["response"].startswith(said.decode().rstrip("\n")), \
        (said, logged["response"])


@pytest.mark.skipif(not Path("/proc/self/wchan").exists(), reason="reads where the process waits in /proc")
def test_a_kill_while_the_reader_stalls_ends_it_at_once(cli: CLI, tmp_path: Path) -> None:
    """A SIGTERM while stdout's reader has stalled (a full pipe; a terminal paused by Ctrl-S): the answer was logged,
    then the final newline's write blocked with every later signal ignored, so only SIGKILL ended it (`timeout`
    never did). It ends at once, by the signal, the answer logged."""
    import fcntl

    lg = CLI({**cli.env, "LOCALGEN_HOME": str(tmp_path / "home")})
    r, w = os.pipe()
    try:
        fcntl.fcntl(w, 1031, 4096)  # F_SETPIPE_SZ: the smallest pipe, nearly full
        os.set_blocking(w, False)
        os.write(w, b"x" * (fcntl.fcntl(w, 1032) - 20))  # F_GETPIPE_SZ
        os.set_blocking(w, True)
        p = lg.popen("run", "-p", "Write a long essay about rivers.", "-n", "2000", "--temperature", "0",
                     "--ignore-eos", stdout=w, stderr=subprocess.PIPE)
        os.close(w)
        w = -1
        wchan = Path(f"/proc/{p.pid}/wchan")
        deadline = time.monotonic() + 120
        while "pipe_write" not in wchan.read_text() and time.monotonic() < deadline:  # blocked writing the answer
            time.sleep(0.1)
        assert "pipe_write" in wchan.read_text()
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(timeout=30)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
    assert rc == -signal.SIGTERM, rc
    [logged] = json.loads(lg("logs", "-n", "1", "--json").stdout)
    assert logged["finish_reason"] == "cancelled" and logged["response"], logged


def test_ctrl_c_before_the_first_word_logs_nothing() -> None:
    """Ctrl-C while the prompt was read logged an empty answer (cancelled), which `run --continue` then sent as an
    empty assistant turn; chat takes such a message back. Nothing said, nothing logged; a word said, logged."""
    from types import SimpleNamespace

    from localgen.cli.run.execute import _cut_off

    told: list[str] = []
    gen = SimpleNamespace(finish_reason=None)
    for content, reasoning in (("", ""), ("Hel", ""), ("", "Let me think")):
        answer = SimpleNamespace(content=content, reasoning=reasoning, finish=lambda: "")
        _cut_off(gen, answer, lambda g, text, why: told.append(f"{text}|{why}"))
    assert told == ["Hel|cancelled", "|cancelled"], told


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--top-p", "1.5"], "--top-p"),
        (["--temperature", "-1"], "--temperature"),
        (["--ctx", "8"], "--ctx takes 0 (the model's trained context) or 16 tokens or more, not 8"),
        (["--top-k", "-3"], "--top-k"),
        (["--max-tokens", "-5"], "--max-tokens"),
        (["--seed", "-2"], "--seed"),
        (["--no-such-flag"], "No such option"),
        (["--grammar", "/no/such/file"], "--grammar /no/such/file: no such file, and the text is not GBNF"),
    ],
)
def test_bad_flags_are_one_line_usage_errors(cli_in_process: InProcessCLI, args: list[str], needle: str) -> None:
    r = cli_in_process("run", "-p", "x", *args)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("localgen: error:")
    assert needle in r.stderr
    assert r.stdout == ""


def test_a_chat_template_file_that_never_reads_messages_is_refused(cli_in_process: InProcessCLI,
                                                                   tmp_path: Path) -> None:
    """docs/run.md: a --chat-template-file that never reads `messages` (a Markdown note given by mistake) is
    refused before the load; it was the whole prompt, the user's words dropped, and the model wrote on until the
    window was full (43 s on 2 cores)."""
    notes = tmp_path / "notes.md"
    notes.write_text("# Notes\n\nRivers run to the sea.\n")
    r = cli_in_process("run", "--chat-template-file", str(notes), "-p", "hi")
    assert r.returncode == 2 and "never reads `messages`" in r.stderr and not r.stdout, r.stderr
    # one that does not compile is the file's fault, said so before the load (it was "the model's chat template is
    # broken", after it, with --raw as the way out)
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m.content ")
    r = cli_in_process("run", "--chat-template-file", str(broken), "-p", "hi")
    assert (r.returncode, r.stdout) == (2, "") and r.stderr.startswith(
        f"localgen: error: the chat template file {broken} is broken: ") and r.stderr.endswith(
        "(fix the file, or leave --chat-template-file out)\n"), r.stderr


def test_conflicting_flags(cli_in_process: InProcessCLI, tmp_path: Path) -> None:
    cli = cli_in_process
    r = cli("run", "-p", "x", "--raw", "--system", "be brief")
    assert r.returncode == 2 and "--system" in r.stderr
    r = cli("run", "-p", "x", "--cache-type-v", "q8_0", "--no-flash-attn")
    assert r.returncode == 2 and "flash attention" in r.stderr
    r = cli("run", "-p", "x", "--cache-type-k", "q3_bogus")
    assert r.returncode == 2 and "KV-cache type" in r.stderr


def test_no_prompt_is_a_usage_error(cli_in_process: InProcessCLI) -> None:
    r = cli_in_process("run")
    assert r.returncode == 2
    assert "no prompt" in r.stderr


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("not_gguf", "not a GGUF file"),
        ("empty", "is empty"),
        ("truncated", "truncated"),
        ("hostile_header", "not a usable GGUF file"),
        # llama.cpp's reason, and what to do (it said only "failed to load model from ...", its reason under --verbose)
        ("bad_shape", "has 7 elements per row, not a multiple of block size (32) (the file is likely damaged: "
                      "download it again"),
        ("unknown_arch", "does not know the architecture 'frobnicator'"),
        ("broken_template", "chat template is broken"),
        ("hostile_template", "unsafe"),
        ("endless_template", "did not finish"),
        ("huge_template", "unsafe"),
    ],
)
def test_bad_models_get_one_line_errors(cli: CLI, bad_models: dict[str, Path], name: str, needle: str) -> None:
    r = cli("run", "-m", str(bad_models[name]), "-p", "hello", *QUICK, timeout=60)
    assert r.returncode == 1, r.stderr
    assert r.stderr.startswith("localgen: error:") and r.stderr.count("\n") == 1, r.stderr
    assert needle in r.stderr
    assert "Traceback" not in r.stderr


def test_missing_model(cli_in_process: InProcessCLI) -> None:
    r = cli_in_process("run", "-m", "/no/such/model.gguf", "-p", "x")  # a path: a usage error (test_input_files.py)
    assert r.returncode == 2 and "-m/--model /no/such/model.gguf: no such file" in r.stderr
    r = cli_in_process("run", "-m", "not-a-model-name", "-p", "x")
    assert r.returncode == 1 and "unknown model" in r.stderr


def test_a_model_without_template_answers_the_prompt_as_a_plain_completion(cli: CLI, gemma_path: Path,
                                                                          bad_models: dict[str, Path]) -> None:
    """As Ollama's /api/generate does: a base model (no chat template) gets the prompt as --raw sends it, and
    stderr says so once; what needs the template (--system) is one line naming it."""
    args = ["-p", "The capital of France is", "--temperature", "0", "-n", "8"]
    r = cli("run", "-m", "gemma3:270m", *args)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ("gemma3:270m has no chat template (it may be a base model): the prompt goes to it as a plain "
                        "completion, as with --raw\n")
    raw = cli("run", "-m", "gemma3:270m", "--raw", *args)
    assert raw.returncode == 0 and raw.stderr == "" and r.stdout == raw.stdout and r.stdout.strip()
    r = cli("run", "-m", str(bad_models["no_template"]), "-p", "hello", *QUICK, timeout=60)
    assert r.returncode == 0 and r.stderr.count("as a plain completion") == 1, r.stderr
    r = cli("run", "-m", "gemma3:270m", "--system", "Be brief.", *args)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr  # (a model that cannot do it: a usage error)
    assert "has no chat template (it may be a base model), which --system needs" in r.stderr


def test_broken_template_model_still_runs_raw(cli: CLI, bad_models: dict[str, Path]) -> None:
    r = cli("run", "-m", str(bad_models["broken_template"]), "--raw", "-p", "Once upon a time", *QUICK)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()


def test_version_and_help(cli: CLI) -> None:
    r = cli("--version")
    assert r.returncode == 0 and r.stdout.startswith("localgen ")
    r = cli("run", "--help-all")
    assert r.returncode == 0
    for flag in ("--temperature", "--top-k", "--top-p", "--min-p", "--typical-p", "--repeat-penalty",
                 "--repeat-last-n", "--presence-penalty", "--frequency-penalty", "--seed", "--max-tokens",
                 "--stop", "--system", "--grammar", "--json-schema", "--ctx", "--threads", "--gpu-layers"):
        assert flag in r.stdout, flag


@pytest.mark.parametrize("args", [["-f", "/dev/zero", "Hi"], ["Hi", "-jf", "/dev/zero"],
                                  ["Hi", "--chat-template-file", "/dev/zero"], ["Hi", "<"]])
def test_a_prompt_file_or_stdin_past_64_mib_is_refused_without_reading_it_whole(cli_env: dict[str, str],
                                                                                args: list[str]) -> None:
    """A prompt's text is read only up to one byte past 64 MiB (more than any context window holds): a huge file
    or /dev/zero is one usage error at once; it was read whole, a MemoryError traceback or the machine's memory."""
    import resource
    import sys

    def limited() -> None:  # the old reader stops at this bound instead of at the machine's memory
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    piped = args[-1] == "<"
    argv = args[:-1] if piped else args
    with open("/dev/zero" if piped else "/dev/null", "rb") as stdin:
        r = subprocess.run([sys.executable, "-m", "localgen", "run", *argv, "-n", "2"],
                           stdin=stdin, capture_output=True, text=True, env=cli_env, timeout=120, preexec_fn=limited)
    what = "stdin" if piped else "/dev/zero"
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("localgen: error: ") and what in r.stderr, r.stderr
    assert r.stderr.endswith(" is larger than 64 MiB: more text than any context window holds\n"), r.stderr


def test_a_ctx_past_the_training_context_is_said_once_on_stderr(cli: CLI) -> None:
    """`run -c 100000` loads smollm2's 8,192-token window: one warning says so (it was capped without a word);
    a --ctx within it says nothing, and --help shows --ctx's default."""
    r = cli("run", "-c", "100000", "Hi", "-n", "2", "--temperature", "0")
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    assert r.stderr == ("warning: --ctx 100,000 is past the 8,192 tokens smollm2:135m was trained on: the window is "
                        "8,192 (--rope-scaling linear or yarn stretches it)\n"), r.stderr
    r = cli("run", "-c", "8192", "Hi", "-n", "2", "--temperature", "0", "--json")
    assert r.returncode == 0 and r.stderr == "" and json.loads(r.stdout)["load"]["n_ctx"] == 8192, r.stderr
    assert "[default: 4096]" in " ".join(cli("run", "--help").stdout.split("--ctx", 1)[1].split()[:60])  # its row


def test_ctx_0_is_the_models_training_context(cli: CLI) -> None:
    """docs/run.md: `--ctx 0` (or LOCALGEN_CTX=0, or a preset's num_ctx 0) is the window the model was trained on,
    as llama.cpp's `-c 0`, for run, chat and fit: 8,192 tokens for smollm2, 32,768 for gemma3 (it was a usage
    error)."""
    for model, trained in (("smollm2:135m", 8192), ("gemma3:270m", 32768)):
        r = cli("run", "-m", model, "--ctx", "0", "--raw", "Hi", "-n", "2", "--json")
        assert r.returncode == 0 and r.stderr == "", r.stderr
        assert json.loads(r.stdout)["load"]["n_ctx"] == trained == json.loads(
            cli("show", model, "--json").stdout)["context_length"]
    r = CLI({**cli.env, "LOCALGEN_CTX": "0"})("run", "Hi", "-n", "2", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["load"]["n_ctx"] == 8192, r.stderr
    r = cli("chat", "--ctx", "0", "-n", "2", input="Hi\n/context\n")
    assert r.returncode == 0 and " of 8,192 tokens used" in r.stderr, r.stderr
    assert cli("create", "whole", "-f", "-", input="FROM smollm2:135m\nPARAMETER num_ctx 0\n").returncode == 0
    r = cli("run", "-m", "whole", "Hi", "-n", "2", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["load"]["n_ctx"] == 8192, r.stderr
    r = cli("fit", "--ctx", "0", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["ctx"] == 8192, r.stderr


def _strict(text: str) -> object:
    """JSON as a strict reader (JavaScript's JSON.parse, jq) takes it: NaN and Infinity are refused."""
    def refuse(name: str) -> object:
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_json_writes_a_ban_as_the_string_inf_and_a_file_line_reads_it_back(cli: CLI, tmp_path: Path) -> None:
    """docs/run.md: `--json`'s `sampling` has a ban's bias as "-inf" (it was the -Infinity JSON lacks), and a
    --file line's logit_bias takes that spelling back: the same answer, in valid JSON too."""
    r = cli("run", "-p", "hi", "-n", "4", "--temperature", "0", "--logit-bias", "504-inf", "--logit-bias", "7+1.5",
            "--json")
    assert r.returncode == 0, r.stderr
    doc = _strict(r.stdout)
    assert isinstance(doc, dict) and doc["sampling"]["logit_bias"] == [[504, "-inf"], [7, 1.5]], doc
    lines = tmp_path / "in.jsonl"
    lines.write_text(json.dumps({"prompt": "hi", "max_tokens": 4, "temperature": 0,
                                 "logit_bias": doc["sampling"]["logit_bias"]}) + "\n")
    again = cli("run", "--file", str(lines), "--json")
    assert again.returncode == 0, again.stderr
    line = _strict(again.stdout)
    assert isinstance(line, dict) and line["text"] == doc["text"], (line, doc["text"])


@pytest.mark.parametrize("items", [False, {"type": "string"}])
def test_a_tuples_prefix_items_hold_the_answer_beside_items(cli: CLI, items: Any) -> None:
    """llama.cpp's converter reads `items` before `prefixItems`: a tuple with `items: false` became any JSON array
    (the answer `[{"name": "Ava", ...`), one with an items schema held every position to that alone. The tuple is
    what the answer holds to (api.md: prefixItems); where minItems asks for more than the tuple has, items stays."""
    from localgen.engine.schemaresolve import resolve_schema

    schema = {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "boolean"}], "items": items}
    r = cli("run", "-p", "List three people with their names and ages as JSON objects.", "-j", json.dumps(schema),
            "--temperature", "0", *QUICK)
    assert r.returncode == 0, r.stderr
    answer = json.loads(r.stdout)
    assert isinstance(answer, list) and len(answer) == 2, answer
    assert type(answer[0]) is int and type(answer[1]) is bool, answer
    longer = {**schema, "minItems": 3}
    assert "items" in resolve_schema(longer) and "prefixItems" in resolve_schema(longer)
