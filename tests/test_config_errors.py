"""docs/configuration.md's promise for the files and variables it lists: bad input is one clear line and a
non-zero exit, never a traceback. A damaged user models.toml, a preset file of bad bytes, serve's API key
from a file or LOCALGEN_API_KEY, and LOCALGEN_DEBUG=0."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import CLI, ROOT
from tests.test_serve import Server


@pytest.fixture
def own(cli_env: dict[str, str], tmp_path: Path) -> CLI:
    """The CLI with a LOCALGEN_HOME of this test's own (its config files stay out of the session's)."""
    (tmp_path / "config").mkdir()
    return CLI({**cli_env, "LOCALGEN_HOME": str(tmp_path)})


def _models(own: CLI, data: bytes) -> Path:
    path = Path(own.env["LOCALGEN_HOME"]) / "config" / "models.toml"
    path.write_bytes(data)
    return path


def _lines(r: subprocess.CompletedProcess[str]) -> list[str]:
    assert "Traceback" not in r.stderr, r.stderr
    return r.stderr.splitlines()


# models.md: `[models."smollm2:135m"]` with `context = 2048` alone changes only the context (it changed only what
# `list --catalogue` showed: the model loaded at --ctx's default all the same); --ctx still wins
def test_a_user_entry_s_context_is_the_window_the_model_loads_with(own: CLI) -> None:
    def window(*args: str) -> int:
        r = own("run", "-m", "smollm2:135m", "-p", "hi", "-n", "1", "--json", *args)
        assert r.returncode == 0, r.stderr
        return int(json.loads(r.stdout)["load"]["n_ctx"])

    assert window() == 4096  # the shipped entry's context (8,192, its training) is no window asked
    _models(own, b'[models."smollm2:135m"]\ncontext = 2048\n')
    assert window() == 2048 and window("--ctx", "1024") == 1024
    env = CLI({**own.env, "LOCALGEN_CTX": "3072"})  # (configuration.md: as --ctx, over the entry's and a preset's)
    assert json.loads(env("run", "-m", "smollm2:135m", "-p", "hi", "-n", "1", "--json").stdout)["load"]["n_ctx"] == 3072
    plan = own("fit", "-m", "smollm2:135m")
    assert "context 2,048 tokens (its models.toml context)" in plan.stdout, plan.stdout
    # fit.md: a preset without num_ctx loads with its base's models.toml context, and fit says so (a red team's:
    # "the preset's num_ctx", and asked_by "preset"); a preset's own num_ctx is the preset's
    for name, modelfile, said, by in (("plain", "", "its models.toml context", "models.toml"),
                                      ("sized", "PARAMETER num_ctx 1024\n", "the preset's num_ctx", "preset")):
        made = own("create", name, "-f", "-", input=f"FROM smollm2:135m\nPARAMETER temperature 0.5\n{modelfile}")
        assert made.returncode == 0, made.stderr
        assert f"tokens ({said})" in own("fit", "-m", name).stdout
        doc = json.loads(own("fit", "-m", name, "--json").stdout)
        assert (doc["asked"], doc["asked_by"]) == (1024 if modelfile else 2048, by), doc
    listed = {e["name"]: e for e in json.loads(own("list", "--catalogue", "--json").stdout)}
    assert listed["smollm2:135m"]["context"] == 2048 and listed["smollm2:135m"]["repo"]  # the rest kept
    # a window past the training is capped, and said whoever asked it (a red team's: the entry's and a preset's were
    # capped unsaid, and LOCALGEN_CTX's was said to be --ctx's)
    _models(own, b'[models."smollm2:135m"]\ncontext = 100000\n')
    past = "100,000 is past the 8,192 tokens smollm2:135m was trained on: the window is 8,192"
    for cli, said in ((own, "its models.toml context"), (CLI({**own.env, "LOCALGEN_CTX": "100000"}), "LOCALGEN_CTX")):
        r = cli("run", "-m", "smollm2:135m", "-p", "hi", "-n", "1", "--json")
        assert r.returncode == 0 and json.loads(r.stdout)["load"]["n_ctx"] == 8192, r.stderr
        assert f"warning: {said} {past} (--rope-scaling linear or yarn stretches it)" in r.stderr.splitlines(), r.stderr


BAD_ENTRIES = [  # (what the entry says, the field named in the error)
    ('repo = 5', "repo"),
    ('repo = "a/b"\nfiles = 3', "files"),
    ('repo = "a/b"\nfiles = ["a"]', "files"),
    ('repo = "a/b"\nfiles = { Q4_K_M = 3 }', "files.Q4_K_M"),
    ('repo = "a/b"\nembedded = "no"', "embedded"),
    ('repo = "a/b"\ncontext = "big"', "context"),
    ('repo = "a/b"\ncontext = true', "context"),
    ('repo = "a/b"\ndefault_quant = 4', "default_quant"),
    ('repo = "a/b"\ndescription = ["x"]', "description"),
    ('embedded = true', "embedded"),  # not a model that ships in a package
]


@pytest.mark.parametrize(("body", "field"), BAD_ENTRIES)
def test_a_bad_models_toml_entry_is_one_line_naming_file_entry_and_field(own: CLI, body: str, field: str) -> None:
    path = _models(own, f'[models."mine:1b"]\n{body}\n'.encode())
    modelfile = path.with_name("Modelfile")
    modelfile.write_text("FROM mine:1b@Q8_0\n")
    for args in (["show", "mine:1b"], ["run", "-m", "mine:1b", "-p", "hi", "-n", "2"], ["pull", "mine:1b"],
                 ["pull", "mine:1b", "--list"], ["cp", "mine:1b", "copy"], ["create", "made", "-f", str(modelfile)]):
        r = own(*args)
        lines = _lines(r)
        assert r.returncode == 2, r.stderr
        assert len(lines) == 1, f"the entry used is one error, not a warning too: {args} {r.stderr}"
        assert lines[0].startswith("localgen: error: ") and str(path) in lines[0], r.stderr
        assert f'[models."mine:1b"] {field} ' in lines[0], r.stderr
        assert "True" not in lines[0], "a TOML value as TOML writes it (a red team's: `not True`)"


def test_the_default_models_bad_entry_is_its_error_alone(own: CLI) -> None:
    """configuration.md: a command that uses a name whose entry is wrong says the entry's line as its error, alone.
    `run PROMPT` with no -m, the default model's entry wrong, said it twice: as a warning first (the look at
    whether the prompt names a model read the file), then as the error."""
    path = _models(own, b'[models."smollm2:135m"]\ncontext = "big"\n')
    r = own("run", "-n", "1", "hi")
    assert r.returncode == 2 and _lines(r) == [
        f'localgen: error: {path}: [models."smollm2:135m"] context must be a whole number of tokens, not \'big\''], \
        r.stderr


def test_a_bad_entry_warns_and_leaves_the_rest_working(own: CLI) -> None:
    path = _models(own, b'[models.broken]\nrepo = 5\n\n[models.fine]\nrepo = "someone/Fine-GGUF"\ncontext = 4096\n')
    r = own("list", "--catalogue")
    assert r.returncode == 0, r.stderr
    assert _lines(r) == [f"warning: {path}: [models.broken] repo must be a Hugging Face repo, e.g. "
                         '"owner/Name-GGUF", not 5 (broken cannot be used until this is fixed)']
    names = [line.split()[0] for line in r.stdout.splitlines()[1:]]
    assert "fine" in names and "smollm2:135m" in names and "broken" not in names
    r = own("run", "-m", "smollm2:135m", "-p", "Say hi.", "-n", "3", "--temperature", "0")
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    assert [line for line in _lines(r) if line.startswith("warning:")] == [
        f"warning: {path}: [models.broken] repo must be a Hugging Face repo, e.g. \"owner/Name-GGUF\", not 5 "
        "(broken cannot be used until this is fixed)"], "said once, however often the catalogue is read"


def test_an_unknown_key_is_one_warning_with_the_likely_key_and_the_entry_works(own: CLI) -> None:
    """docs/models.md and configuration.md: a key an entry does not take is said once per command (the
    catalogue is read several times) with the key it most likely means, and the entry is used without it."""
    path = _models(own, b'[models."smollm2:135m"]\nembedded = true\nquant = "Q8_0"\n\n'
                        b'[models.mine]\nrepo = "someone/Mine-GGUF"\ntemperature = 0.2\nzzz = 1\n')
    r = own("run", "-m", "smollm2:135m", "-p", "Say hi.", "-n", "3", "--temperature", "0")
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    assert _lines(r) == [
        f"warning: {path}: [models.\"smollm2:135m\"] has an unknown key 'quant', which is ignored (did you mean "
        "default_quant?)",
        f"warning: {path}: [models.mine] has an unknown key 'temperature', which is ignored (a sampling setting goes "
        "under [models.mine.sampling])",
        f"warning: {path}: [models.mine] has an unknown key 'zzz', which is ignored (an entry's keys are "
        "description, repo, embedded, default_quant, context, files, sampling)"], r.stderr
    r = own("list", "--catalogue")
    assert r.returncode == 0 and "mine " in r.stdout and len(_lines(r)) == 3, r.stderr


def test_a_typo_is_said_beside_a_fields_error_in_the_same_entry(own: CLI) -> None:
    """configuration.md: each unknown key is said, with the key it likely means. An entry with a field of the
    wrong type and a typo said only the type's error; the typo came out once that was fixed (a newcomer's trial)."""
    path = _models(own, b'[models.both]\nrepo = "someone/Both-GGUF"\ncontext = "big"\nquant = "Q8_0"\n')
    r = own("list", "--catalogue")
    assert r.returncode == 0, r.stderr
    said = [line for line in _lines(r) if line.startswith("warning:")]
    assert said[0] == (f"warning: {path}: [models.both] has an unknown key 'quant', which is ignored (did you mean "
                       "default_quant?)"), said
    assert said[1].startswith(f"warning: {path}: [models.both] context must be a whole number of tokens"), said


def test_the_shipped_catalogue_uses_only_the_keys_an_entry_takes() -> None:
    import tomllib

    from localgen.models import catalogue

    shipped = tomllib.loads(catalogue.SHIPPED.read_text(encoding="utf-8"))["models"]
    assert {key for entry in shipped.values() for key in entry} <= set(catalogue.KEYS)


def test_the_catalogue_table_in_models_md_is_the_shipped_catalogue() -> None:
    """docs/models.md, The catalogue: its table shows every entry of models.toml (repo, default quantization,
    context, recommended sampling, description), and the text before it counts its models, the seven that read
    images or audio, four embedding models and two rerankers, as the shipped catalogue holds."""
    import tomllib

    from localgen.models import catalogue

    shipped = tomllib.loads(catalogue.SHIPPED.read_text(encoding="utf-8"))["models"]
    page = (ROOT / "docs" / "models.md").read_text(encoding="utf-8")
    table = page.split("| name | repo | default quantization | context | recommended sampling | description |")[1]
    rows = [[cell.strip() for cell in line.strip("|").split(" | ")]
            for line in table.split("\n\n")[0].splitlines()[2:]]

    def shown(name: str, e: dict[str, Any]) -> list[str]:
        sampling = ", ".join(f"{k} {v}" for k, v in e.get("sampling", {}).items()) or "—"
        return [f"`{name}`", "(embedded)" if e.get("embedded") else f"`{e['repo']}`", e.get("default_quant", "Q4_K_M"),
                f"{e['context']:,}", sampling, e["description"]]

    assert rows == [shown(name, e) for name, e in shipped.items()]
    kinds = [e["description"] for e in shipped.values()]
    assert (sum(" embeddings" in d for d in kinds), sum("reranker" in d.lower() for d in kinds)) == (4, 2), kinds
    assert "four embedding models and two rerankers" in " ".join(page.split())
    media = sum(": images" in d or ": audio" in d for d in kinds)
    assert (f"{len(shipped)} models: " in page and media == 7
            and "seven that read images or audio" in " ".join(page.split())), (len(shipped), media)


def test_a_bad_override_of_a_shipped_name_is_an_error_not_the_shipped_entry(own: CLI) -> None:
    _models(own, b'[models."smollm2:135m"]\nembedded = "yes"\n')
    r = own("run", "-m", "smollm2:135m", "-p", "hi", "-n", "2")
    assert r.returncode == 2 and "embedded must be true or false, not 'yes'" in _lines(r)[-1], r.stderr


@pytest.mark.parametrize("data", [b"\xff\xfe", b"[models\n", b"models = 5\n"], ids=["not-utf8", "not-toml",
                                                                                      "not-a-table"])
def test_an_unreadable_models_toml_is_a_warning_and_the_shipped_catalogue_works(own: CLI, data: bytes) -> None:
    path = _models(own, data)
    r = own("list")
    assert r.returncode == 0 and "smollm2:135m" in r.stdout, r.stderr
    lines = _lines(r)
    assert len(lines) == 1 and lines[0].startswith("warning: ") and str(path) in lines[0], r.stderr
    assert lines[0].endswith("its models are not used"), r.stderr
    r = own("show", "mine:1b")
    assert r.returncode != 0 and _lines(r)[-1].startswith("localgen: error: unknown model 'mine:1b'")
    assert f"{path} cannot be read" in r.stderr


def test_a_preset_file_of_bad_bytes_is_named_and_list_goes_on(own: CLI) -> None:
    presets = Path(own.env["LOCALGEN_HOME"]) / "data" / "presets"
    presets.mkdir(parents=True)
    (presets / "bin.json").write_bytes(b"\xff")
    r = own("list")  # the others listed, the damaged one named in a warning (never left out without a word)
    assert r.returncode == 0 and "smollm2:135m" in r.stdout, r.stderr
    assert _lines(r) == [f"warning: the preset file {presets / 'bin.json'} is damaged: byte 0xff at offset 0 is not "
                         "UTF-8 (left out; create it again, or remove it with localgen rm bin)"], r.stderr
    r = own("show", "bin")
    lines = _lines(r)
    assert r.returncode == 1 and len(lines) == 1 and f"the preset file {presets / 'bin.json'} is damaged" in lines[0]


@pytest.mark.parametrize(("key", "env", "needle"), [
    (b"\xff\xfe", None, "is not UTF-8 text"),
    (b"k1\nk2\n", None, "line breaks or control characters inside"),
    (b"two words", None, "spaces, line breaks"),
    (b"k\x01", None, "control characters"),
    ("k\u20acy".encode(), None, "a character outside ASCII (U+20AC)"),
    (None, "k\u00e9y", "LOCALGEN_API_KEY: the key has a character outside ASCII (U+00E9)"),
    # a red team's: only ASCII whitespace around the key is stripped, as --print-env's `tr -d '[:space:]'` strips
    # it (a no-break space was stripped here and kept by the shell's line, whose key got a 401)
    ("\u00a0abc\n".encode(), None, "a character outside ASCII (U+00A0)"),
    ("abc\u2003".encode(), None, "a character outside ASCII (U+2003)"),
    (b"\x1cabc", None, "control characters"),
    ("\ufeffabc\r\n".encode(), None, "begins with a byte-order mark (U+FEFF)"),
    (None, " ", "LOCALGEN_API_KEY is blank"),
    (None, "", "LOCALGEN_API_KEY is blank"),  # set to nothing ($UNSET): Click took it as unset, an open API
    (None, "a key", "LOCALGEN_API_KEY: the key has spaces"),
])
def test_serve_refuses_a_key_no_client_could_send(own: CLI, tmp_path: Path, key: bytes | None, env: str | None,
                                                   needle: str) -> None:
    args = ["serve", "--port", "1"]
    if key is not None:
        (tmp_path / "key.txt").write_bytes(key)
        args += ["--api-key-file", str(tmp_path / "key.txt")]
    cli = CLI({**own.env, "LOCALGEN_API_KEY": env}) if env is not None else own
    r = cli(*args, timeout=120)  # a key taken would start a server: the timeout fails the test
    lines = _lines(r)
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("localgen: error: "), r.stderr
    assert needle in lines[0], r.stderr


def test_a_typed_api_key_file_wins_over_the_variable(own: CLI, tmp_path: Path) -> None:
    key = tmp_path / "key.txt"
    key.write_text("from-the-file\n")
    r = own("serve", "--api-key", "typed", "--api-key-file", str(key))
    assert r.returncode == 2 and "--api-key and --api-key-file cannot be combined" in r.stderr
    s = Server({**own.env, "LOCALGEN_API_KEY": "from-the-variable"}, "--api-key-file", str(key), "--no-webui",
               "-np", "1", "--ctx", "512")
    try:
        url = f"{s.url}/v1/models"
        assert httpx.get(url, headers={"Authorization": "Bearer from-the-file"}, timeout=30).status_code == 200
        assert httpx.get(url, headers={"Authorization": "Bearer from-the-variable"}, timeout=30).status_code == 401
    finally:
        assert s.stop() == 0


@pytest.mark.parametrize("value", ["0", "false", "off", "no", "OFF", "disabled", ""])
def test_localgen_debug_off_values_keep_the_one_line_error(own: CLI, value: str) -> None:
    r = CLI({**own.env, "LOCALGEN_DEBUG": value})("show", "no-such-model:1b")
    assert r.returncode == 1 and _lines(r) == [line for line in r.stderr.splitlines()]
    assert len(_lines(r)) == 1 and r.stderr.startswith("localgen: error: unknown model"), r.stderr


def test_localgen_debug_on_gives_the_traceback(own: CLI) -> None:
    r = CLI({**own.env, "LOCALGEN_DEBUG": "true"})("show", "no-such-model:1b")
    assert r.returncode == 1 and "Traceback" in r.stderr and "ModelNotFoundError" in r.stderr
    r = CLI({**own.env, "LOCALGEN_DEBUG": "1"})("run", "--ctx", "abc", "hi")  # configuration.md: the command
    assert r.returncode == 2 and len(_lines(r)) == 1 and "Traceback" not in r.stderr, r.stderr  # line's own: one line
    assert r.stderr.startswith("localgen: error: --ctx: 'abc' is not a valid integer"), r.stderr


@pytest.mark.parametrize(("given", "said"), [
    ("relative/home", "LOCALGEN_HOME must be an absolute path, not 'relative/home'"),
    ("FILE", "which is not a directory (give a folder, or unset it)"),
    ("LOOP", "which cannot be reached: too many levels of symbolic links (give a folder, or unset it)"),
    ("DANGLING", "a symbolic link to nothing (make the folder it names, give another, or unset it)"),
    ("~nosuchuser-lg/home", "LOCALGEN_HOME is '~nosuchuser-lg/home', but there is no user 'nosuchuser-lg' for "
                            "~nosuchuser-lg to name (give an absolute path, or unset it)"),  # was a traceback
])
@pytest.mark.parametrize("args", [["list"], ["run", "-p", "hi", "-n", "1"], ["create", "x", "-f", "-"]])
def test_a_localgen_home_that_cannot_hold_its_folders_is_one_usage_line(own: CLI, tmp_path: Path, given: str,
                                                                       said: str, args: list[str]) -> None:
    """A relative LOCALGEN_HOME would put chats, presets and the log under whichever folder a command starts in; a
    file, a symbolic link loop or a link to nothing can hold none of them (a loop and a dangling link were taken,
    every save then failing): each is refused before anything is written, exit 2."""
    file = tmp_path / "a-file"
    file.write_text("mine\n")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere" / "home")
    value = {"FILE": str(file), "LOOP": str(tmp_path / "loop"),
             "DANGLING": str(tmp_path / "dangling")}.get(given, given)
    r = CLI({**own.env, "LOCALGEN_HOME": value})(*args, input="FROM smollm2:135m\n", cwd=tmp_path)
    assert r.returncode == 2 and len(_lines(r)) == 1 and said in r.stderr and r.stdout == "", r.stderr
    assert file.read_text() == "mine\n" and not (tmp_path / "relative").exists()
    r = CLI({**own.env, "LOCALGEN_HOME": value})("--help")
    assert r.returncode == 0, r.stderr


def test_a_localgen_home_under_tilde_is_made_when_first_needed(cli_env: dict[str, str], tmp_path: Path) -> None:
    """docs/configuration.md: LOCALGEN_HOME is "an absolute path (`~` works), made when first needed": `logs path`
    names the log under it and makes nothing; `create` makes the folders it writes in."""
    home = tmp_path / "user"
    home.mkdir()
    lg = CLI({**cli_env, "HOME": str(home), "LOCALGEN_HOME": "~/lg"})
    r = lg("logs", "path")
    assert (r.returncode, r.stdout) == (0, f"{home}/lg/data/logs/logs.db\n"), r.stderr
    assert not (home / "lg").exists() and not (tmp_path / "~").exists()
    r = lg("create", "mine", "-f", "-", input="FROM smollm2:135m\n")
    assert r.returncode == 0, r.stderr
    assert (home / "lg" / "data" / "presets" / "mine.json").is_file()


def test_with_no_home_folder_a_command_needing_one_says_to_set_home_and_others_go_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """HOME unset and a user with no password entry: platformdirs, a LOCALGEN_HOME under `~` and the Hugging Face
    cache's default each needed the home folder and raised a traceback (`list` with an absolute LOCALGEN_HOME too,
    for Ollama's and LM Studio's stores). Each is one usage line saying to set HOME or a variable; with the
    variables set, `list` goes on, and serve's cleaning of paths from error messages goes on without a home."""
    import pwd

    from localgen.serve.apierror import without_paths
    from tests.conftest import InProcessCLI

    def no_entry(uid: int) -> Any:
        raise KeyError(uid)

    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    gone: dict[str, str | None] = {k: None for k in os.environ if k.startswith(("LOCALGEN_", "HF_", "XDG_"))}
    bare = {**gone, "HOME": None, "NO_COLOR": "1", "HF_HUB_OFFLINE": "1"}
    hint = "HOME is not set and this user has no home folder in the password database (set HOME, or "
    for env, args, said in (
            ({}, ["logs", "path"], "localgen cannot find where to keep its files: " + hint + "LOCALGEN_HOME"),
            ({"LOCALGEN_HOME": "~/lg"}, ["list"], "LOCALGEN_HOME is '~/lg', but ~ names no folder: " + hint),
            ({"LOCALGEN_HOME": str(tmp_path)}, ["list"], "the Hugging Face cache is under ~/.cache: " + hint
             + "HF_HUB_CACHE")):
        r = InProcessCLI({**bare, **env})(*args)
        assert r.returncode == 2 and r.stdout == "", r.stderr
        assert len(_lines(r)) == 1 and r.stderr.startswith("localgen: error: " + said), r.stderr
    r = InProcessCLI({**bare, "LOCALGEN_HOME": str(tmp_path), "HF_HUB_CACHE": str(tmp_path / "hub")})("list")
    assert r.returncode == 0 and "smollm2:135m" in r.stdout and _lines(r) == [], r.stderr
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert without_paths(f"cannot read {tmp_path}/data/x.json") == "cannot read x.json"


def test_an_empty_home_is_read_as_unset_not_as_the_root_folder(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """`HOME= localgen ...` (set to nothing, as a service manager can leave it): Python's expanduser took it as
    `/`, so a LOCALGEN_HOME of `~/lg` was `/lg` (and the Hugging Face cache `/.cache`). It is read as unset: the
    password database's home folder, as platformdirs reads it; with none there either, one usage line."""
    import pwd

    from tests.conftest import InProcessCLI

    entry = pwd.getpwuid(os.getuid())
    fake = pwd.struct_passwd((*entry[:5], str(tmp_path / "pwhome"), entry[6]))
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: fake)
    gone: dict[str, str | None] = {k: None for k in os.environ if k.startswith(("LOCALGEN_", "HF_", "XDG_"))}
    bare = {**gone, "HOME": "", "NO_COLOR": "1", "HF_HUB_OFFLINE": "1"}
    r = InProcessCLI(bare)("logs", "path")
    assert (r.returncode, r.stdout) == (0, f"{tmp_path}/pwhome/.local/share/localgen/logs/logs.db\n"), r.stderr
    r = InProcessCLI({**bare, "LOCALGEN_HOME": "~/lg"})("logs", "path")
    assert (r.returncode, r.stdout) == (0, f"{tmp_path}/pwhome/lg/data/logs/logs.db\n"), r.stderr

    def no_entry(uid: int) -> Any:
        raise KeyError(uid)

    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    r = InProcessCLI({**bare, "LOCALGEN_HOME": "~/lg"})("logs", "path")
    assert r.returncode == 2 and _lines(r) == [
        "localgen: error: LOCALGEN_HOME is '~/lg', but ~ names no folder: HOME is not set and this user has no "
        "home folder in the password database (set HOME, or LOCALGEN_HOME to a folder for localgen's files)"], r.stderr


def test_an_entry_of_a_shipped_name_is_laid_over_the_shipped_entry(own: CLI) -> None:
    """A user's `[models."smollm2:135m"]` with only `context` (and one sampling key) changes those and keeps the
    rest of the shipped entry (embedded, its quantization, its other sampling), where it replaced the entry
    whole and failed "needs a repo"; `list --catalogue` shows what is used. A `repo` of the user's is another
    model: the shipped entry's `embedded` is not kept."""
    import json

    _models(own, b'[models."smollm2:135m"]\ncontext = 2048\nsampling = { temperature = 0.5 }\n')
    r = own("list", "--catalogue", "--json")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    entry = next(e for e in json.loads(r.stdout) if e["name"] == "smollm2:135m")
    assert (entry["context"], entry["repo"], entry["default_quant"]) == (2048, "(embedded)", "Q4_1"), entry
    assert entry["sampling"] == {"temperature": 0.5, "top_p": 0.9}, entry  # the sampling it is used with
    r = own("run", "-m", "smollm2:135m", "-p", "hi", "-n", "2", "--json")
    assert r.returncode == 0, r.stderr
    used = json.loads(r.stdout)["sampling"]
    assert (used["temperature"], used["top_p"]) == (0.5, 0.9), used  # the user's, and the shipped entry's
    _models(own, b'[models."smollm2:135m"]\nrepo = "someone/Other-GGUF"\n')
    r = own("list", "--catalogue", "--json")
    entry = next(e for e in json.loads(r.stdout) if e["name"] == "smollm2:135m")
    assert (entry["repo"], entry["context"]) == ("someone/Other-GGUF", 8192), entry


@pytest.mark.parametrize("kind", ["fifo", "folder", "huge", "loop"])
def test_a_models_toml_that_is_no_regular_file_or_too_large_is_one_warning_never_opened(own: CLI, kind: str) -> None:
    """A FIFO where models.toml belongs hung `list`, `run` and `doctor` (it was opened and read); it is said, like a
    folder, in one warning and left out, and a file past the bound is refused by its size, before it is read. One
    that cannot be opened says the reason plainly (it was Python's "[Errno 40] ...: 'PATH'", the path twice)."""
    path = Path(own.env["LOCALGEN_HOME"]) / "config" / "models.toml"
    if kind == "loop":
        path.symlink_to(path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        with path.open("wb") as f:
            f.truncate((4 << 20) + 1)  # sparse: nothing is written
    said = {"fifo": "it is a FIFO", "folder": "it is a folder", "loop": "Too many levels of symbolic links",
            "huge": f"it is {(4 << 20) + 1:,} bytes, more than the 4 MiB a catalogue is read to"}[kind]
    for args in (["list"], ["run", "-p", "hi", "-n", "1"]):
        r = own(*args, timeout=60)
        assert r.returncode == 0 and r.stdout, r.stderr
        assert _lines(r) == [f"warning: cannot read the model catalogue {path}: {said}: its models are not used"]


@pytest.mark.parametrize("kind", ["fifo", "huge"])
def test_a_preset_file_that_is_no_regular_file_or_too_large_is_named_never_opened(own: CLI, kind: str) -> None:
    """A FIFO where a preset file belongs hung `list` and `run -m`; a 1 GB one was read whole (2 GB of memory)
    before it was called not JSON. Either is left out of `list` with one warning saying why, and is `run`'s error."""
    presets = Path(own.env["LOCALGEN_HOME"]) / "data" / "presets"
    presets.mkdir(parents=True)
    path = presets / "p6.json"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        with path.open("wb") as f:
            f.truncate(1 << 30)  # sparse: nothing is written
    said = "it is a FIFO" if kind == "fifo" else "it is 1,073,741,824 bytes, more than the 16 MiB a preset is read to"
    r = own("list", timeout=60)
    assert r.returncode == 0 and "smollm2:135m" in r.stdout, r.stderr
    assert _lines(r) == [f"warning: cannot read the preset {path}: {said} (left out)"]
    r = own("run", "-m", "p6", "-p", "hi", "-n", "1", timeout=60)
    assert r.returncode == 1 and _lines(r) == [f"localgen: error: cannot read the preset {path}: {said}"]


def test_rm_of_a_preset_that_is_a_folder_removes_an_empty_one_and_keeps_one_with_files(own: CLI) -> None:
    """models.md: anything in the presets folder that is not a regular file is left out of `list`, and `rm` removes
    it. A folder was "cannot use PATH: Is a directory"; an empty one goes, one holding files stays, said so."""
    presets = Path(own.env["LOCALGEN_HOME"]) / "data" / "presets"
    (presets / "empty.json").mkdir(parents=True)
    (presets / "full.json").mkdir()
    (presets / "full.json" / "notes.txt").write_text("mine\n")
    r = own("rm", "empty", "--yes")
    assert r.returncode == 0 and r.stdout == "removed the preset empty\n" and not (presets / "empty.json").exists()
    r = own("rm", "full", "--yes")
    assert r.returncode == 1 and _lines(r) == [f"localgen: error: {presets / 'full.json'} is a folder that holds "
                                               "files, not a preset: it was left as it is (remove it yourself if it "
                                               "is not needed)"], r.stderr
    assert (presets / "full.json" / "notes.txt").read_text() == "mine\n"


def test_a_file_where_a_folder_of_localgens_goes_is_named(own: CLI) -> None:
    """A file where the presets folder (or the config folder) goes: `cp` said the preset `xx.json` itself
    "file exists", `show` Python's "[Errno 20] Not a directory: '...'", `logs off` "File exists". Each names the
    file in the way now."""
    home = Path(own.env["LOCALGEN_HOME"])
    (home / "data").mkdir(parents=True)
    (home / "data" / "presets").write_text("")
    said = f"{home / 'data' / 'presets'} is a file, not a folder"
    from localgen.paths import os_cause

    mixed = NotADirectoryError(20, "/Users/Alice/Library is a file, not a folder", "x")  # its case kept
    assert os_cause(mixed) == "/Users/Alice/Library is a file, not a folder"
    assert os_cause(OSError(28, "No space left on device")) == "no space left on device"
    r = own("cp", "smollm2:135m", "xx")
    assert r.returncode == 1 and _lines(r) == [f"localgen: error: cannot write the preset "
                                               f"{home / 'data' / 'presets' / 'xx.json'}: {said}"], r.stderr
    r = own("show", "xx")
    assert r.returncode == 1 and _lines(r) == [f"localgen: error: cannot read the preset "
                                               f"{home / 'data' / 'presets' / 'xx.json'}: {said}"], r.stderr
    (home / "config").rmdir()
    (home / "config").write_text("")
    r = own("logs", "off")
    assert r.returncode == 1 and _lines(r) == [f"localgen: error: {home / 'config'} is a file, not a folder"]
    r = own("logs", "on")  # no folder, so no logs-off file in it: logging is on (it was "cannot use ...: Not a
    assert r.returncode == 0 and _lines(r) == ["logging is on"], r.stderr  # directory", exit 1)
    r = own("list")
    assert r.returncode == 0 and _lines(r) == [f"warning: cannot read the model catalogue "
                                               f"{home / 'config' / 'models.toml'}: {home / 'config'} is a file, not "
                                               "a folder: its models are not used"], r.stderr


def test_a_context_past_a_modelfiles_bound_and_a_table_beside_models_are_warnings(own: CLI) -> None:
    """configuration.md: an entry's `context` is held to a Modelfile's num_ctx bound (16 to 2,147,483,647: one past it
    was listed by `list --catalogue`), a warning as other bad entries; a top-level table or key other than
    [models] (a typo such as [model.mine]) was ignored in silence, and is a warning as an unknown key is."""
    path = _models(own, b'[other]\nx = 1\n\n[model.typo]\nrepo = "a/b"\n\n[models.big]\nrepo = "a/b"\n'
                        b'context = 99999999999999999999999\n\n[models.small]\nrepo = "a/b"\ncontext = 8\n\n'
                        b'[models.fine]\nrepo = "a/b"\ncontext = 16\n')
    r = own("list", "--catalogue")
    assert r.returncode == 0, r.stderr
    names = [line.split()[0] for line in r.stdout.splitlines()[1:]]
    assert "fine" in names and "big" not in names and "small" not in names, r.stdout
    assert _lines(r) == [
        f"warning: {path}: 'other' at the top level is ignored (localgen reads only [models.NAME] tables)",
        f"warning: {path}: 'model' at the top level is ignored (localgen reads only [models.NAME] tables)",
        f"warning: {path}: [models.big] context must be a whole number of tokens within 16 to 2,147,483,647, not "
        "99999999999999999999999 (big cannot be used until this is fixed)",
        f"warning: {path}: [models.small] context must be a whole number of tokens within 16 to 2,147,483,647, not 8 "
        "(small cannot be used until this is fixed)"], r.stderr


def test_the_largest_preset_create_makes_is_read_under_the_bound(own: CLI) -> None:
    """A preset file is read to 16 MiB: the largest `create` makes (a Modelfile of 1 MiB, in 4-byte characters JSON
    writes as two \\u escapes, 12 bytes each) is listed and used, never called too large."""
    text = 'FROM smollm2:135m\nSYSTEM """' + "\U0001F600" * (((1 << 20) - 40) // 4) + '"""\n'
    r = own("create", "bigsys", "-f", "-", input=text)
    assert r.returncode == 0, r.stderr
    path = Path(own.env["LOCALGEN_HOME"]) / "data" / "presets" / "bigsys.json"
    assert 2 << 20 < path.stat().st_size < 16 << 20
    r = own("list")
    assert r.returncode == 0 and "bigsys" in r.stdout and r.stderr == "", r.stderr


def test_a_unicode_digit_as_a_logit_bias_token_is_a_broken_entry_not_a_traceback(own: CLI) -> None:
    """A logit_bias key "²" is a digit to str.isdigit() that int() refuses: list, doctor and run were a
    traceback. It is a broken entry now, a warning where the entry is not used and the error where it is."""
    path = _models(own, '[models.sup]\nrepo = "a/b"\n[models.sup.sampling]\nlogit_bias = { "²" = 1.0 }\n'
                   .encode())
    said = (f"{path}: [models.sup] sampling: logit_bias: a token id must be a non-negative integer, not '²'")
    r = own("list", timeout=60)
    assert r.returncode == 0 and "smollm2:135m" in r.stdout, r.stderr
    assert _lines(r) == [f"warning: {said} (sup cannot be used until this is fixed)"]
    r = own("run", "-m", "sup", "-p", "hi", "-n", "1", timeout=60)
    assert r.returncode == 2 and _lines(r) == [f"localgen: error: {said}"], r.stderr
    r = own("run", "-m", "smollm2:135m", "-p", "hi", "-n", "1", "--logit-bias", "٣+1", timeout=60)
    assert r.returncode == 2 and "bad logit bias '٣+1'" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_models_toml_and_a_saved_chat_an_editor_wrote_with_a_byte_order_mark_are_read(own: CLI) -> None:
    """Windows' Notepad begins a UTF-8 file with a byte order mark: models.toml was then "not TOML" (a warning, its
    entries ignored) and a saved chat "not JSON"; both are read as without it, as embed's files and Modelfiles are."""
    _models(own, b'\xef\xbb\xbf[models."bommed:1b"]\nrepo = "acme/Bommed-GGUF"\ncontext = 8192\n'
                 b'description = "a catalogue entry an editor saved"\n')
    r = own("list", "--catalogue")
    assert r.returncode == 0 and "bommed:1b" in r.stdout, (r.stdout, r.stderr)
    assert "warning" not in r.stderr, r.stderr
    chats = Path(own.env["LOCALGEN_HOME"]) / "data" / "chats"
    chats.mkdir(parents=True)
    doc = {"model": "smollm2:135m", "messages": [{"role": "user", "content": "Hi"},
                                                 {"role": "assistant", "content": "Hello"}]}
    (chats / "bommed.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(doc).encode())
    r = own("chat", "--list")
    assert r.returncode == 0 and "bommed" in r.stdout and "warning" not in r.stderr, (r.stdout, r.stderr)
    r = own("chat", "--resume", "bommed", "-n", "2", input="/show\n")
    assert r.returncode == 0 and "conversation bommed · 2 messages" in r.stderr, r.stderr


def test_an_empty_stop_string_in_models_toml_is_a_broken_entry_as_run_stop_is_refused(own: CLI) -> None:
    """docs/api.md's one rule for an empty stop string: localgen's own inputs refuse it (`--stop ''`, a --file line,
    and models.toml, where `stop = ""` was quietly dropped), naming the setting."""
    path = _models(own, b'[models.nostop]\nrepo = "a/b"\n[models.nostop.sampling]\nstop = ["END", ""]\n')
    said = f"{path}: [models.nostop] sampling: stop holds an empty string: give the text, or leave it out"
    r = own("list", timeout=60)
    assert r.returncode == 0 and _lines(r) == [f"warning: {said} (nostop cannot be used until this is fixed)"]
    r = own("run", "-m", "nostop", "-p", "hi", "-n", "1", timeout=60)
    assert r.returncode == 2 and _lines(r) == [f"localgen: error: {said}"], r.stderr
