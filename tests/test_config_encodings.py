"""docs/remote.md: an endpoints.toml saved in another encoding than UTF-8. UTF-8's byte order mark is read past;
UTF-16 (Notepad's "Unicode", with or without a byte order mark) is said to be UTF-16 in one line naming the file,
never read as something else (it was a warning, then "unknown model 'box/plain'"), and the file is left as it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import CLI
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
