"""models.md: `show --sha256` computes a file's SHA-256 when it is not known, and keeps it: the next `show` of that
file shows it, until the file is written again (the next `show` said `not known yet` again)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from tests.conftest import CLI


def _sha_line(stdout: str) -> str:
    return next(line for line in stdout.splitlines() if line.startswith("sha256 "))


def test_a_computed_sha256_is_shown_by_the_next_show(cli: CLI, tmp_path: Path, smollm2_path: Path) -> None:
    c = CLI({**cli.env, "LOCALGEN_HOME": str(tmp_path / "home")})
    want = hashlib.sha256(smollm2_path.read_bytes()).hexdigest()
    before = c("show", "smollm2:135m")
    assert before.returncode == 0, before.stderr
    assert _sha_line(before.stdout).split(None, 1)[1] == "not known yet (--sha256 computes it)"
    computed = c("show", "smollm2:135m", "--sha256")
    assert computed.returncode == 0, computed.stderr
    assert _sha_line(computed.stdout).split() == ["sha256", want]
    again = c("show", "smollm2:135m")
    assert again.returncode == 0 and _sha_line(again.stdout).split() == ["sha256", want], again.stdout
    shown = c("show", "smollm2:135m", "--json")
    assert json.loads(shown.stdout)["sha256"] == want
    page = " ".join((Path(__file__).parent.parent / "docs" / "models.md").read_text().split())
    assert "so a later `show` of that file shows it, until the file is written again" in page


def test_a_file_written_again_is_not_given_its_old_sha256(cli: CLI, tmp_path: Path, smollm2_path: Path) -> None:
    c = CLI({**cli.env, "LOCALGEN_HOME": str(tmp_path / "home")})
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(smollm2_path, copy)
    first = c("show", str(copy), "--sha256")
    assert first.returncode == 0, first.stderr
    assert _sha_line(first.stdout).split()[1] == hashlib.sha256(copy.read_bytes()).hexdigest()
    link = tmp_path / "link.gguf"
    link.symlink_to(copy)
    by_link = c("show", str(link))  # the same file by another name: known by its real path
    assert _sha_line(by_link.stdout).split()[1] == _sha_line(first.stdout).split()[1], by_link.stdout
    with copy.open("ab") as f:  # written again: another file, whatever its name
        f.write(b"\0" * 32)
    after = c("show", str(copy))
    assert after.returncode == 0, after.stderr
    assert _sha_line(after.stdout).split(None, 1)[1] == "not known yet (--sha256 computes it)", after.stdout


def test_bytes_changed_with_the_size_and_modification_time_set_back_are_not_given_the_old_sha256(
        cli: CLI, tmp_path: Path, smollm2_path: Path) -> None:
    """A byte changed in place and the modification time set back (`touch -d`, as `cp -p` or `rsync -t` keep
    one): show said the old SHA-256, and --sha256 kept saying it. The inode's change time tells them apart; and
    --sha256 computes a remembered one again."""
    import os

    c = CLI({**cli.env, "LOCALGEN_HOME": str(tmp_path / "home")})
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(smollm2_path, copy)
    assert c("show", str(copy), "--sha256").returncode == 0
    st = copy.stat()
    with copy.open("r+b") as f:  # one byte of the weights, near the end
        f.seek(st.st_size - 10)
        f.write(bytes([f.read(1)[0] ^ 0xFF]))
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (copy.stat().st_size, copy.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    want = hashlib.sha256(copy.read_bytes()).hexdigest()
    after = c("show", str(copy))
    assert _sha_line(after.stdout).split(None, 1)[1] == "not known yet (--sha256 computes it)", after.stdout
    assert _sha_line(c("show", str(copy), "--sha256").stdout).split() == ["sha256", want]


def test_a_record_nested_past_the_recursion_limit_is_read_as_none(cli: CLI, tmp_path: Path) -> None:
    """A damaged file-sha256.json (JSON nested 100,000 deep) gave a traceback on every show."""
    home = tmp_path / "home"
    c = CLI({**cli.env, "LOCALGEN_HOME": str(home)})
    assert c("show", "smollm2:135m", "--sha256").returncode == 0
    record = next(home.rglob("file-sha256.json"))
    record.write_text("[" * 100_000 + "]" * 100_000)
    r = c("show", "smollm2:135m")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert _sha_line(r.stdout).split(None, 1)[1] == "not known yet (--sha256 computes it)", r.stdout
