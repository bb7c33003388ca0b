"""The tables of settings (settings.py, loadsettings.py): every sampling knob and load setting is declared once,
and the CLI's options, the HTTP routes' field names, JSONL and `/set` spellings and what a remote endpoint is sent
are derived from them. In process, but for the routes' names, which a running `serve` is asked for."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import typer

from localgen import loadsettings, settings
from localgen.cli import options as o
from localgen.cli.options.knobs import Knobs
from localgen.errors import UsageError
from localgen.loadsettings import LOAD_KNOBS
from localgen.models import modelfile
from localgen.settings import KNOBS
from localgen.types import GenerationRequest, LoadParams, SamplingParams


def _command(command: str) -> Any:
    """A command as click holds it."""
    from localgen.cli.app import build

    return typer.main.get_command(build(command)).commands[command]  # type: ignore[attr-defined]


def _options(command: str) -> dict[str, Any]:
    """A command's click parameters by name."""
    return {p.name: p for p in _command(command).params}


@pytest.mark.parametrize("command", ["run", "chat", "serve"])
def test_every_setting_is_an_option_as_the_table_declares_it(command: str) -> None:
    params = _options(command)
    for k in KNOBS.values():
        p = params[k.name]
        assert p.opts + p.secondary_opts == list(k.cli), k.name
        assert p.help == k.help
        if k.kind in (settings.INT, settings.FLOAT):
            assert (p.min, p.max) == (k.lo, k.hi), k.name
            assert p.default == k.default, k.name
    for lk in LOAD_KNOBS.values():
        p = params[lk.name]
        # a switch's on-spellings, then its off-spellings ("--kv-unified/--no-kv-unified", "-kvu/-no-kvu")
        flags = [spec.split("/")[0] for spec in lk.flags] + [spec.split("/")[1] for spec in lk.flags if "/" in spec]
        assert p.opts + p.secondary_opts == flags, lk.name
        assert p.help == lk.help and p.envvar == lk.envvar, lk.name
        assert p.default == lk.default, lk.name


@pytest.mark.parametrize(("command", "name", "default", "page"), [
    ("run", "tool_steps", 8, "tools.md: at most `--tool-steps` rounds (8)"),
    ("chat", "tool_steps", 8, "tools.md, as run's"),
    ("run", "draft_max", 6, "run.md: `--draft-max N` (default 6)"),
    ("serve", "draft_max", 6, "serve.md, as run's"),
    ("serve", "read_timeout", 30, "serve.md: within `--read-timeout` seconds (30 by default)"),
])
def test_a_default_the_docs_name_is_the_options(command: str, name: str, default: float, page: str) -> None:
    """Defaults the docs state in their text rather than in a table (reaching the cap of --tool-steps takes a model
    that calls a new tool every round, which no small real model does on demand: the default is checked here)."""
    assert _options(command)[name].default == default, page


@pytest.mark.parametrize("command", ["run", "chat"])
def test_system_prompt_and_sys_are_spellings_of_system(command: str) -> None:
    """run.md's table: `--system, --system-prompt, -sys TEXT`, one option (llama.cpp's spellings parse as ours)."""
    import click

    p = _options(command)["system"]
    assert p.opts == ["--system", "--system-prompt", "-sys"]
    cmd = _command(command)
    for flag in p.opts:
        with click.Context(cmd) as ctx:
            cmd.parse_args(ctx, [flag, "Be brief.", "Hi."])
            assert ctx.params["system"] == "Be brief.", flag


def test_defaults_are_the_typed_records_own() -> None:
    """The sampling knobs are SamplingParams' fields (less the grammar and `asked`, which are no knobs), one to
    one; a load setting that names a LoadParams field takes its default from there."""
    fields = {f.name for f in dataclasses.fields(SamplingParams)} - {"grammar", "grammar_lazy", "grammar_triggers",
                                                                     "asked"}
    assert set(KNOBS) == fields
    load_fields = {f.name for f in dataclasses.fields(LoadParams)}
    for lk in LOAD_KNOBS.values():
        if lk.field:
            assert lk.field in load_fields and lk.default == getattr(LoadParams(), lk.field)


def test_each_front_end_reaches_every_knob() -> None:
    """OpenAI's names (llama-server's for what OpenAI lacks) and Ollama's (llama-server's for what Ollama lacks)
    each reach every knob; JSONL and /set take all of them and ours with dashes."""
    for api in ("openai", "ollama", "llamacpp", "any"):
        assert set(settings.spellings(api).values()) == set(KNOBS), api
    openai = settings.spellings("openai")
    assert openai["max_completion_tokens"] == openai["n_predict"] == openai["max_tokens"] == "max_tokens"
    assert openai["mirostat_tau"] == "mirostat_ent" and openai["dry_sequence_breakers"] == "dry_sequence_breaker"
    ollama = settings.spellings("ollama")
    assert ollama["num_predict"] == "max_tokens" and ollama["mirostat_eta"] == "mirostat_lr"
    assert "max_tokens" not in ollama  # Ollama spells it num_predict
    for name in ("temp", "typical", "n_predict", "num_predict", "max-tokens", "dry_sequence_breakers"):
        assert settings.field_name(name) is not None, name
    assert "num_ctx" in loadsettings.OLLAMA_LOAD_OPTIONS and "num_thread" in loadsettings.OLLAMA_LOAD_OPTIONS


def test_the_server_routes_take_the_tables_names(cli_env: dict[str, str]) -> None:
    """A running `serve` reads each setting by the name the table gives it for its API: a value no setting
    takes, sent under that name, is a 400 that names it as sent (a route that did not read the name would
    answer 200); Ollama's load-time options are taken and ignored (the model is loaded already)."""
    import httpx

    from tests.test_serve import Server

    bad = {"bad": 1}  # no setting takes an object with this key: a number, text, list, flag or bias map
    server = Server(cli_env, "-np", "1", "--ctx", "512")
    try:
        ask = {"model": "smollm2:135m", "messages": [{"role": "user", "content": "hi"}], "stream": False}
        for theirs in settings.spellings("openai"):
            for route, body in (("/v1/chat/completions", {**ask, theirs: bad}),
                                ("/v1/responses", {"model": "smollm2:135m", "input": "hi", theirs: bad})):
                r = httpx.post(server.url + route, json=body, timeout=60)
                err = r.json()["error"]  # named as the request spelled it
                assert r.status_code == 400 and err["message"].startswith(theirs) and err["param"] == theirs, (
                    route, theirs, r.text)
        for theirs, ours in settings.spellings("ollama").items():
            r = httpx.post(server.url + "/api/chat", json={**ask, "options": {theirs: bad}}, timeout=60)
            assert r.status_code == 400 and r.json()["error"].startswith(f"options.{theirs}"), (theirs, ours, r.text)
        from localgen.serve.ollama import LOAD_KINDS  # each of the kind Ollama's FromMap checks (a flag is a bool)

        load = {k: True if LOAD_KINDS.get(k) == "true or false" else 1 for k in loadsettings.OLLAMA_LOAD_OPTIONS}
        r = httpx.post(server.url + "/api/chat", json={**ask, "options": {**load, "num_predict": 1}}, timeout=60)
        assert r.status_code == 200, r.text
        r = httpx.post(server.url + "/api/chat", json={**ask, "options": {"num_ctxx": 1}}, timeout=60)
        assert r.status_code == 400 and "unknown options: num_ctxx" in r.json()["error"], r.text
    finally:
        assert server.stop() == 0


def _parsers(tmp: Path) -> list[tuple[str, Any, dict[str, Any], str | None]]:
    """Each generation route's parser: the spellings it reads (settings.spellings), the parser, a body it takes,
    and where its sampling fields go (None: the body; Ollama: `options`); the Responses store in a test's folder."""
    from localgen.serve import anthropic, ollama, openai, responses
    from localgen.serve.responsestore import ResponseStore
    from localgen.serve.state import ServeState

    chat = [{"role": "user", "content": "hi"}]
    return [("openai", openai.CHAT, {"messages": chat}, None), ("openai", openai.COMPLETIONS, {"prompt": "hi"}, None),
            ("anthropic", anthropic.MESSAGES, {"max_tokens": 5, "messages": chat}, None),
            ("responses", responses.Responses(ResponseStore(tmp / "responses.db"), ServeState(workers={})),
             {"input": "hi"}, None),
            ("ollama", ollama.CHAT, {"messages": chat}, "options"), ("ollama", ollama.GENERATE, {"prompt": "hi"},
                                                                    "options")]


def _parsed(parser: Any, body: dict[str, Any], where: str | None, fields: dict[str, Any]) -> dict[str, Any]:
    import asyncio

    ask = asyncio.run(parser.parse({**body, **({where: fields} if where else fields)}))
    return dict(ask.values)


def test_every_knob_reaches_every_apis_parser(tmp_path: Path) -> None:
    """Every knob, in each of an API's spellings, reaches the knob through that API's parser (OpenAI's chat and
    completions, Anthropic's Messages, the Responses API, Ollama's chat and generate), with the value sent; the
    values read back are the settings sent."""
    from localgen.remote.client import request_body

    s = _far_from_default()
    sent = request_body("m", GenerationRequest(messages=({"role": "user", "content": "hi"},), sampling=s), seed=7)
    json_value = {settings.spellings("openai")[k]: v for k, v in sent.items() if k in settings.spellings("openai")}
    assert set(json_value) == set(KNOBS)
    for api, parser, body, where in _parsers(tmp_path):
        names = settings.spellings(api)
        assert set(names.values()) == set(KNOBS), api
        for theirs, ours in names.items():
            assert _parsed(parser, body, where, {theirs: json_value[ours]})[ours] == json_value[ours], (api, theirs)
        values = _parsed(parser, body, where, {theirs: json_value[ours] for theirs, ours in names.items()})
        assert settings.apply(SamplingParams(), values) == s, api


def test_a_knob_added_to_the_table_reaches_every_api(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """One entry in settings.KNOBS is all a new sampling field needs to be read by every API's parser, in
    OpenAI's spelling (chat completions, Anthropic, Responses) and Ollama's option."""
    knob = settings._k("warmth", settings.FLOAT, 0.0, 1.0, "A knob made up for this test.", openai=True,
                       ollama="num_warmth")
    monkeypatch.setitem(KNOBS, "warmth", knob)
    for api, parser, body, where in _parsers(tmp_path):
        name = "num_warmth" if api == "ollama" else "warmth"
        assert _parsed(parser, body, where, {name: 0.25}).get("warmth") == 0.25, api


@pytest.mark.parametrize(("name", "value", "said"), [
    ("top_k", -5, "top_k must be at least 0, not -5"),  # 2**31 - 1 is only a C int's top: not said
    ("max_tokens", -5, "max_tokens must be at least -1, not -5"),
    ("top_k", 2**31, "top_k must be at most 2,147,483,647 (llama.cpp takes it as a C int), not 2147483648"),
    ("seed", 2**32, "seed must be within -1 to 4,294,967,295, not 4294967296"),
    ("seed", -2, "seed must be within -1 to 4,294,967,295, not -2"),
    ("temperature", 9, "temperature must be within 0 to 5, not 9.0"),
])
def test_a_value_out_of_range_is_told_the_range_in_plain_numbers(name: str, value: Any, said: str) -> None:
    with pytest.raises(UsageError) as e:
        settings.check(name, value)
    assert e.value.message == said and "e+" not in said
    with pytest.raises(UsageError) as e:
        settings.parse_text(name, str(value))  # chat's /set: the value as typed (`-1`, not `-1.0`)
    assert e.value.message == f"{said.rpartition(' not ')[0]} not {value}"


def test_a_huge_whole_number_is_told_in_exponent_form() -> None:
    """A red team's: `PARAMETER top_k 1e300` (a whole float, made an int) was told as its 301 digits; 10**400 (no
    float holds it) says what it is past."""
    from localgen.errors import UsageError

    for value, shown in ((10**300, "1e+300"), (-(10**25), "-1e+25"), (10**400, "a number past 1e+308")):
        with pytest.raises(UsageError) as e:
            settings.check("top_k", value)
        assert e.value.message.endswith(f", not {shown}") and len(e.value.message) < 120, e.value.message
    assert settings.shown_value(10**20) == "100000000000000000000" and settings.shown_value(True) == "true"


def test_seed_minus_one_is_a_random_seed_as_none_given() -> None:
    """llama.cpp's and Ollama's "random" seed (-1, Ollama's default) is taken wherever a seed is (a flag, /set,
    a JSONL line, a preset, a Modelfile's PARAMETER, every API's field), as no seed: a fresh one each time."""
    assert settings.check("seed", -1) is None
    assert settings.parse_text("seed", "-1") == ("seed", None)
    assert settings.validate({"seed": -1}) == {"seed": None}
    assert modelfile.parse("FROM smollm2:135m\nPARAMETER seed -1\n").parameters["seed"] is None


def test_a_misspelt_setting_is_given_its_likely_name() -> None:
    """A name one slip from a setting's (any spelling of it) says which was likely meant; one far from all
    is refused as before, /set's and parse_text's listing what they take."""
    for bad, meant in [("max_token", "max_tokens"), ("temprature", "temperature"), ("Top-KK", "top_k"),
                       ("num_predic", "num_predict")]:
        with pytest.raises(UsageError, match=f"unknown setting '{bad}'; did you mean {meant}\\?$"):
            settings.validate({bad: 1}, "line 3: ")
        with pytest.raises(UsageError, match=f"; did you mean {meant}\\?$"):
            settings.parse_text(bad, "1")
    with pytest.raises(UsageError, match=r"^line 3: unknown setting 'warmth'$"):
        settings.validate({"warmth": 1}, "line 3: ")
    with pytest.raises(UsageError, match="unknown setting 'warmth'; settable: dry_allowed_length, "):
        settings.parse_text("warmth", "1")


def test_a_bad_value_is_named_as_the_client_spelled_it(tmp_path: Path) -> None:
    """Ollama's num_predict is not called max_tokens, nor Anthropic's stop_sequences stop; the 400 names the field
    (`param`) as each API's parser read it."""
    from localgen.serve.apierror import HTTPError

    bad = {"max_tokens": -5, "stop": 7}
    for api, parser, body, where in _parsers(tmp_path):
        for theirs, ours in settings.spellings(api).items():
            if ours not in bad:
                continue
            with pytest.raises(HTTPError) as e:
                _parsed(parser, body, where, {theirs: bad[ours]})
            field = f"{where}.{theirs}" if where else theirs  # Ollama's sit in options
            assert e.value.status == 400 and e.value.message.startswith(f"{field} must be "), (api, theirs, e.value)
            assert e.value.param == field


def _far_from_default() -> SamplingParams:
    """Every knob set to a valid value other than its default."""
    values: dict[str, Any] = {}
    for k in KNOBS.values():
        if k.kind == settings.BOOL:
            values[k.name] = not k.default
        elif k.kind == settings.TEXTS:
            values[k.name] = ("END", "###")
        elif k.kind == settings.BIAS:
            values[k.name] = ((15043, -2.5),)
        elif k.name == "mirostat":
            values[k.name] = 2
        elif k.name == "seed":
            values[k.name] = 7
        elif k.name == "temperature":  # within Anthropic's 0 to 1, which every API takes
            values[k.name] = 0.7
        else:
            lo, hi = k.lo if k.lo is not None else -1.0, k.hi if k.hi is not None else 100.0
            mid = (max(lo, -2.0) + min(hi, 3.0)) / 2
            if mid == k.default:
                mid = min(hi, mid + 1)
            values[k.name] = int(mid) if k.kind == settings.INT else mid
    return SamplingParams(**settings.validate(values))


def test_what_a_remote_endpoint_is_sent_our_server_reads_back_whole() -> None:
    """A request sent to an endpoint (remote/client.py) names every setting that differs from its default as
    the table spells it; our own /v1 route's mapping reads each one back to the same value."""
    import asyncio

    from localgen.remote.client import request_body
    from localgen.serve import openai

    s = _far_from_default()
    body = request_body("m", GenerationRequest(messages=({"role": "user", "content": "hi"},), sampling=s), seed=7)
    values = dict(asyncio.run(openai.CHAT.parse(body)).values)
    assert set(values) == set(KNOBS)
    assert settings.apply(SamplingParams(), values) == s


def test_a_default_is_not_sent_to_a_remote_endpoint() -> None:
    from localgen.remote.client import request_body

    body = request_body("m", GenerationRequest(messages=({"role": "user", "content": "hi"},),
                                               sampling=SamplingParams()), seed=3)
    sent = {k for k in body if k in settings.spellings("openai")}
    assert sent == {"seed"}, "the temperature at its default too: the server applies its own (docs/remote.md)"


def test_knobs_layer_flags_over_model_defaults_over_built_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """A flag the user gave wins over a layer (a model's recommended settings, a chat's /set); a layer wins over
    a flag's default; `--dry-sequence-breaker none` is none; the load settings build LoadParams."""
    values = {k.name: (None if k.kind in (settings.TEXTS, settings.BIAS) else k.default) for k in KNOBS.values()}
    values |= {lk.name: lk.default for lk in LOAD_KNOBS.values()}
    values |= {"temperature": 0.3, "dry_sequence_breaker": ["none"], "ctx": 1024, "tensor_split": "3,1",
               "no_mmap": True, "flash_attn": "auto"}
    knobs = Knobs(values, frozenset({"temperature", "dry_sequence_breaker", "ctx"}))
    s = knobs.sampling({"temperature": 0.9, "top_k": 5, "stop": ["X"]})
    assert (s.temperature, s.top_k, s.stop, s.dry_sequence_breaker) == (0.3, 5, ("X",), ())
    load = knobs.load()
    assert (load.n_ctx, load.tensor_split, load.use_mmap, load.flash_attn) == (1024, (3.0, 1.0), False, "auto")
    assert knobs.remote_conflicts() == []  # the context is not a load-only flag: it trims history here
    given = Knobs(values, frozenset({"no_mmap", "flash_attn"}))
    assert given.remote_conflicts() == ["--flash-attn", "--no-mmap"]


def test_a_new_knob_is_one_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Add an entry to the table and every front end knows it: an option of run (with its help), a field of
    OpenAI's requests and of Ollama's options, a JSONL/`/set` name."""
    knob = settings._k("top_a", settings.FLOAT, 0.0, 1.0, "Top-A sampling; 0 off.", ollama=True)
    monkeypatch.setitem(KNOBS, "top_a", knob)
    # ... and its field in SamplingParams, with its default, which the sampler chain reads
    with_top_a = dataclasses.make_dataclass("P", [("top_a", float, 0.0)], bases=(SamplingParams,), frozen=True)
    monkeypatch.setattr(settings, "_DEFAULTS", with_top_a())
    assert settings.spellings("openai")["top_a"] == settings.spellings("ollama")["top_a"] == "top_a"
    monkeypatch.setattr(settings, "ALIASES", settings.spellings("any"))
    assert settings.field_name("top-a") == "top_a"

    def cmd(ctx_: typer.Context, *, knobs: Knobs) -> None:
        raise AssertionError

    wrapped = o.with_knobs(load=())(cmd)
    import inspect

    p = inspect.signature(wrapped).parameters["top_a"]
    assert p.annotation.__metadata__[0].help == "Top-A sampling; 0 off."


def test_option_groups_reach_the_command_typed() -> None:
    """A command that declares `tools: o.ToolOptions` takes each of the group's fields as an option, and receives
    the group, typed, with what the user gave (run and chat take the tool, output and remote groups)."""
    from typer.testing import CliRunner

    got: list[Any] = []

    def cmd(ctx_: typer.Context, *, tools: o.ToolOptions, output: o.OutputFormat, knobs: Knobs) -> None:
        got.append((tools, output, knobs))

    app = typer.Typer()
    app.command()(o.with_knobs(load=())(cmd))
    r = CliRunner().invoke(app, ["--tool-choice", "required", "--yes", "-j", "{}", "--top-k", "5"])
    assert r.exit_code == 0, r.output
    tools, output, knobs = got[0]
    assert tools == o.ToolOptions(tool_choice="required", yes=True) and not tools.any
    assert output == o.OutputFormat(json_schema="{}") and knobs.given("top_k") and knobs.get("top_k") == 5
    for command in ("run", "chat"):
        params = _options(command)
        for group in (o.ToolOptions, o.OutputFormat, o.RemoteOptions):
            assert {f.name for f in dataclasses.fields(group)} <= set(params), (command, group)
