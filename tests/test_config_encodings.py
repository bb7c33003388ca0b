"""docs/remote.md, configuration.md, models.md, tools.md: a file of settings saved in another encoding than UTF-8.
UTF-8's byte order mark is read past; UTF-16 (Notepad's "Unicode", with or without a byte order mark) is said to
be UTF-16 in one line naming the file (text.config_text, one reader for all of them), never read as something
else, and the file is left as it was: endpoints.toml (it was a warning, then "unknown model 'box/plain'"), the
user's models.toml (a TOML error at "line 1, column 2", or "not UTF-8 text", then "unknown model"), a preset
(said to be damaged, exit 1) and --mcp's JSON file of servers ("not valid JSON at line 1, column 1")."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import CLI, HF_PRIVATE, InProcessCLI, config_file
from tests.fake_openai import FakeServer


def entry(url: str) -> str:
    return f'[box]\r\nurl = "{url}"\r\nmodels = ["plain"]\r\n'  # as Notepad writes it: CRLF


ENCODINGS = {  # what each test writes: the text's bytes
    "utf-16 with a byte order mark (Notepad's Unicode)": lambda t: b"\xff\xfe" + t.encode("utf-16-le"),
    "utf-16 big-endian with a byte order mark": lambda t: b"\xfe\xff" + t.encode("utf-16-be"),
    "utf-16 without a byte order mark": lambda t: t.encode("utf-16-le"),
    "utf-16 big-endian without a byte order mark": lambda t: t.encode("utf-16-be"),
}


@pytest.mark.parametrize("encoding", list(ENCODINGS))
@pytest.mark.parametrize("command", ["run", "bench"])
def test_a_utf16_endpoints_file_is_one_line_that_says_so_for_a_name_it_declares(
        cli: CLI, fake: FakeServer, endpoints_toml: Path, encoding: str, command: str) -> None:
    data = ENCODINGS[encoding](entry(fake.url))
    endpoints_toml.write_bytes(data)
    args = ["-p", "hi"] if command == "run" else ["-p", "4", "-n", "2", "-r", "1"]
    r = cli(command, "-m", "box/plain", *args)
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith(f"localgen: error: {endpoints_toml} is UTF-16 text, not UTF-8 as TOML is "), r.stderr
    assert "save it as UTF-8" in r.stderr and "unknown model" not in r.stderr, r.stderr
    assert endpoints_toml.read_bytes() == data  # the user's file is left as it was


def test_a_utf16_endpoints_file_is_a_warning_that_says_so_for_a_model_here(
        cli: CLI, smollm2_path: Path, endpoints_toml: Path) -> None:
    data = ENCODINGS["utf-16 with a byte order mark (Notepad's Unicode)"](entry("http://127.0.0.1:9/v1"))
    endpoints_toml.write_bytes(data)
    r = cli("run", "-m", "smollm2:135m", "-p", "hi", "-n", "2", "--temp", "0")
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    assert r.stderr.startswith(f"warning: {endpoints_toml} is UTF-16 text, not UTF-8 as TOML is "), r.stderr
    assert "save it as UTF-8" in r.stderr and "its endpoints are not used" in r.stderr, r.stderr
    assert endpoints_toml.read_bytes() == data


def test_a_nul_in_a_utf8_endpoints_file_is_not_taken_for_utf16(cli: CLI, fake: FakeServer,
                                                               endpoints_toml: Path) -> None:
    """One NUL in UTF-8 text is a TOML error at its line and column, not "UTF-16"."""
    endpoints_toml.write_bytes(f'[box]\nurl = "{fake.url}"\nmodels = ["pl\x00ain"]\n'.encode())
    r = cli("run", "-m", "box/plain", "-p", "hi")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"{endpoints_toml}: " in r.stderr and "line 3" in r.stderr and "UTF-16" not in r.stderr, r.stderr


def test_a_file_of_zeros_is_not_taken_for_utf16(cli: CLI, endpoints_toml: Path) -> None:
    """A file that a power cut left full of NULs is no UTF-16 text (its decoded text would be NULs too): it is
    the unreadable file it is, a warning, and a model here runs; no advice to save it as UTF-8."""
    endpoints_toml.write_bytes(b"\x00" * 4096)
    r = cli("run", "-m", "smollm2:135m", "-p", "hi", "-n", "1")  # a name the file could declare: it is read
    assert r.returncode == 0, r.stderr
    assert str(endpoints_toml) in r.stderr and "UTF-16" not in r.stderr, r.stderr
    assert endpoints_toml.read_bytes() == b"\x00" * 4096


SAVE_AS = "(save it as UTF-8: in Notepad, Save As with Encoding UTF-8)"


def one_line(r: object, start: str, code: int = 2) -> None:
    """The failure `start` says, in one line on stderr with the hint to save as UTF-8, nothing on stdout."""
    rc, out, err = r.returncode, r.stdout, r.stderr  # type: ignore[attr-defined]
    assert (rc, out) == (code, ""), err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"localgen: error: {start} {SAVE_AS}"), err


@pytest.fixture
def models_toml(home: Path) -> Iterator[Path]:
    """The home's own catalogue (LOCALGEN_HOME/config/models.toml), removed after the test."""
    yield from config_file(home, "models.toml")


@pytest.fixture
def own(tmp_path: Path, smollm2_path: Path) -> InProcessCLI:
    """The CLI in process with a home of this test's own (its presets), the session's Hugging Face cache."""
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("LOCALGEN_") or k in HF_PRIVATE}
    env.update(LOCALGEN_HOME=str(tmp_path / "home"), NO_COLOR="1", HF_HUB_OFFLINE="1")
    return InProcessCLI(env)


MINE = '[models."mine:1b"]\r\nrepo = "someone/Mine-1B-GGUF"\r\n'


@pytest.mark.parametrize("encoding", list(ENCODINGS))
def test_a_utf16_models_toml_is_one_line_that_says_so_for_a_name_it_declares(
        cli_in_process: InProcessCLI, models_toml: Path, encoding: str) -> None:
    data = ENCODINGS[encoding](MINE)
    models_toml.write_bytes(data)
    one_line(cli_in_process("run", "-m", "mine:1b", "-p", "hi"), f"{models_toml} is UTF-16 text, not UTF-8 as TOML is")
    assert models_toml.read_bytes() == data


def test_a_utf16_models_toml_that_is_not_toml_either_is_the_same_line_for_a_name_it_appears_to_declare(
        cli_in_process: InProcessCLI, models_toml: Path) -> None:
    data = ENCODINGS["utf-16 with a byte order mark (Notepad's Unicode)"](MINE + "context = \r\n")
    models_toml.write_bytes(data)
    one_line(cli_in_process("show", "mine:1b"), f"{models_toml} is UTF-16 text, not UTF-8 as TOML is")
    assert models_toml.read_bytes() == data


def test_a_utf16_models_toml_is_a_warning_that_says_so_where_no_name_of_it_is_used(
        cli_in_process: InProcessCLI, models_toml: Path) -> None:
    data = ENCODINGS["utf-16 without a byte order mark"](MINE)
    models_toml.write_bytes(data)
    r = cli_in_process("list", "--catalogue")
    assert r.returncode == 0 and "smollm2:135m" in r.stdout, r.stderr
    assert r.stderr == (f"warning: {models_toml} is UTF-16 text, not UTF-8 as TOML is (save it as UTF-8): its "
                        "models are not used\n"), r.stderr
    assert models_toml.read_bytes() == data


@pytest.mark.parametrize("encoding", list(ENCODINGS))
def test_a_utf16_preset_is_one_line_that_says_so(own: InProcessCLI, tmp_path: Path, encoding: str) -> None:
    """A preset edited by hand and saved as Notepad's "Unicode": not "damaged: byte 0xff at offset 0 is not
    UTF-8" (or "not JSON (Expecting value: line 1, column 1)"), exit 1; `list` leaves it out with the same words."""
    assert own("create", "bot", "-f", "-", input="FROM smollm2:135m\nSYSTEM hi\n").returncode == 0
    path = tmp_path / "home" / "data" / "presets" / "bot.json"
    data = ENCODINGS[encoding](path.read_text(encoding="utf-8"))
    path.write_bytes(data)
    one_line(own("run", "-m", "bot", "-p", "hi"), f"{path} is UTF-16 text, not UTF-8 as JSON is")
    r = own("list", "--json")
    assert r.returncode == 0 and "bot" not in [m["name"] for m in json.loads(r.stdout)], r.stderr
    assert r.stderr == f"warning: {path} is UTF-16 text, not UTF-8 as JSON is (left out; {SAVE_AS[1:]}\n", r.stderr
    assert path.read_bytes() == data
    assert own("rm", "bot", "--yes").returncode == 0 and not path.exists()  # and it can be removed


@pytest.mark.parametrize("encoding", list(ENCODINGS))
def test_a_utf16_mcp_file_is_one_line_that_says_so(cli_in_process: InProcessCLI, tmp_path: Path,
                                                   encoding: str) -> None:
    path = tmp_path / "mcp.json"
    data = ENCODINGS[encoding](json.dumps({"mcpServers": {"calc": {"command": "true"}}}, indent=2))
    path.write_bytes(data)
    r = cli_in_process("run", "-m", "smollm2:135m", "--mcp", str(path), "--yes", "-p", "hi", "-n", "1")
    one_line(r, f"--mcp {path} is UTF-16 text, not UTF-8 as JSON is")
    assert path.read_bytes() == data


def test_a_utf8_mcp_file_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    """What an editor's UTF-8 byte order mark was before the shared reader, it is still: read past."""
    from localgen.tools.mcpconfig import targets

    path = tmp_path / "mcp.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"mcpServers": {"calc": {"command": "true"}}}).encode())
    assert [t.label for t in targets([str(path)])] == ["calc"]
