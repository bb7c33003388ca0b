"""The prompt cache on disk (engine/prefixstore.py), in process, with state bytes made up: what is written is
read back whole; a file of another model or settings, of another llama.cpp build, torn, or whose bytes do not
match its checksum is skipped with one log line and removed, never returned; the store stays within its
limit, least recently used first out; a prefix that a longer one extends goes; a file already there is not
written again. (tests/test_serve_service.py stops and starts a real server on it.)"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy
import pytest

from localgen.engine.prefixstore import SUFFIX, PrefixStore, tokens_name

KEY, IDENT = "k" * 24, "model.gguf|123|f16|f16|..."


def _entry(tokens: list[int], size: int = 1000, seed: int = 0) -> tuple[list[int], int, Any, int]:
    data = numpy.random.default_rng(seed).integers(0, 256, size, dtype=numpy.uint8)
    return tokens, len(tokens) - 2, data, size


def _store(root: Path, limit: int = 0, build: str = "b1") -> tuple[PrefixStore, list[str]]:
    said: list[str] = []
    return PrefixStore(root, limit, build, say=said.append), said


def test_what_is_written_is_read_back_whole(tmp_path: Path) -> None:
    store, said = _store(tmp_path)
    tokens, prompt_len, data, size = _entry(list(range(100)))
    assert store.write(KEY, IDENT, [(tokens, prompt_len, data, size)]) == size
    (path,) = (tmp_path / KEY).glob(f"*{SUFFIX}")
    assert path.name == tokens_name(tokens) and path.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / KEY).stat().st_mode & 0o777 == 0o700
    again, _ = _store(tmp_path)  # the next process
    (got,) = again.load(KEY, IDENT, None)
    assert got.tokens == tokens and got.prompt_len == prompt_len and got.size == size
    assert bytes(got.data) == bytes(data) and not said
    assert again.has(KEY, tokens) and not again.has(KEY, tokens[:99])
    assert again.write(KEY, IDENT, [(tokens, prompt_len, data, size)]) == 0  # there already: not written again


@pytest.mark.parametrize("damage", ["identity", "build", "torn", "torn header", "checksum", "a token",
                                    "prompt length", "a token past int64", "nested too deep", "not ours"])
def test_a_bad_file_is_skipped_with_one_line_and_removed(tmp_path: Path, damage: str) -> None:
    store, _ = _store(tmp_path)
    good, bad = _entry(list(range(100)), seed=1), _entry(list(range(200, 300)), seed=2)
    store.write(KEY, IDENT, [good, bad])
    path = tmp_path / KEY / tokens_name(bad[0])
    raw = path.read_bytes()
    identity, build = IDENT, "b1"
    if damage == "identity":
        identity = IDENT + "|another setting"
    elif damage == "build":
        build = "b2"
    elif damage == "torn":
        path.write_bytes(raw[:-10])
    elif damage == "torn header":
        path.write_bytes(raw[:20])
    elif damage == "checksum":
        path.write_bytes(raw[:-1] + bytes([raw[-1] ^ 1]))
    elif damage == "a token":  # one digit of the header's tokens: another prompt's state must not be handed out
        assert raw.count(b"[200, ") == 1
        path.write_bytes(raw.replace(b"[200, ", b"[201, "))
    elif damage == "a token past int64":  # a 33-digit id in place of 7 (the header's length kept), and a prompt
        path.write_bytes(raw.replace(b"[200, 201, 202, 203, 204, 205, 206, ", b"[" + b"9" * 33 + b", ")  # length
                         .replace(b'"prompt_len": 98', b'"prompt_len": 90'))  # within the 94 tokens left
    elif damage == "prompt length":
        assert raw.count(b'"prompt_len": 98') == 1
        path.write_bytes(raw.replace(b'"prompt_len": 98', b'"prompt_len": 97'))
    elif damage == "nested too deep":  # past JSON's reader (a RecursionError): a traceback, and no prefix loaded
        head = b'{"tokens": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        path.write_bytes(raw[:4] + raw[4:8] + len(head).to_bytes(4, "little") + head)
        assert store.has(KEY, good[0])  # the write side's count of it (the folder's headers read) holds too
    else:
        path.write_bytes(b"GGUF" + raw[4:])
    reader, said = _store(tmp_path, build=build)
    got = reader.load(KEY, identity, None)
    if damage in ("identity", "build"):  # every file of another identity or build is refused
        assert got == [] and len(said) == 2 and not list((tmp_path / KEY).glob(f"*{SUFFIX}"))
    else:
        assert [g.tokens for g in got] == [good[0]] and len(said) == 1 and not path.exists()
    assert reader.status()["skipped"] == len(said)
    assert all("skipped a stored prefix" in line and "\n" not in line for line in said), said


def test_the_store_stays_within_its_limit_least_recently_used_first(tmp_path: Path) -> None:
    store, said = _store(tmp_path, limit=4500)  # three files of 1,000 state bytes and a header each
    entries = [_entry([i] * 80 + list(range(i)), seed=i) for i in range(1, 4)]
    store.write(KEY, IDENT, entries)
    old = time.time() - 100
    os.utime(tmp_path / KEY / tokens_name(entries[1][0]), (old, old))  # the second is the least recently used
    store.write("other" * 5, IDENT, [_entry([9] * 90, seed=9)])  # another model's: the limit is the whole store's
    left = {p.name for p in tmp_path.glob(f"*/*{SUFFIX}")}
    assert tokens_name(entries[1][0]) not in left and len(left) == 3, left
    assert store.status()["bytes"] <= 4500 and store.status()["evicted"] == 1
    assert said == ["dropped 1 least recently used stored prefix (1 KiB) to keep the store within 4 KiB"], said
    assert store.write(KEY, IDENT, [_entry([7] * 99, size=5000)]) == 0  # larger than the whole store: not kept


def test_what_a_write_says_it_kept_leaves_out_what_the_limit_took_back_at_once(tmp_path: Path) -> None:
    """serve's stop line (`kept N MiB of prefixes for the next start`) counts what the next start gets: three
    written at once where one fits are one's bytes (it said all three's, beside the line that two were dropped)."""
    store, _ = _store(tmp_path, limit=1500)
    entries = [_entry([i] * 80 + list(range(i)), seed=i) for i in range(1, 4)]
    kept = store.write(KEY, IDENT, entries)
    assert len(list((tmp_path / KEY).glob(f"*{SUFFIX}"))) == 1 and kept == 1000, kept
    assert store.status()["written"] == 3  # the metrics count every write
    again, _ = _store(tmp_path / "again")
    short, longer = _entry(list(range(100)), seed=4), _entry(list(range(150)), seed=5)  # a slot's state extends
    assert again.write(KEY, IDENT, [short, longer]) == 1000  # a host-cache entry written in the same call


def test_a_prefix_that_a_longer_one_extends_goes(tmp_path: Path) -> None:
    store, _ = _store(tmp_path)
    short = _entry(list(range(100)))
    store.write(KEY, IDENT, [short])
    store.write(KEY, IDENT, [_entry(list(range(150)))])  # the conversation went on
    names = {p.name for p in (tmp_path / KEY).glob(f"*{SUFFIX}")}
    assert names == {tokens_name(list(range(150)))}


def test_a_read_room_takes_the_most_recent_first(tmp_path: Path) -> None:
    store, _ = _store(tmp_path)
    a, b = _entry([1] * 70, size=600, seed=1), _entry([2] * 70, size=600, seed=2)
    store.write(KEY, IDENT, [a])
    old = time.time() - 100
    os.utime(tmp_path / KEY / tokens_name(a[0]), (old, old))
    store.write(KEY, IDENT, [b])
    assert [g.tokens for g in store.load(KEY, IDENT, 1000)] == [b[0]]  # room for one: the newer


def test_a_read_room_reads_no_state_that_would_not_fit_and_stops_once_used(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A file whose header states more than the room left is passed over before its state is read (or checked),
    and no file is opened once the room is used up."""
    from localgen.engine import prefixstore

    store, said = _store(tmp_path)
    entries = [_entry([n] * 70, size=size, seed=n) for n, size in ((1, 600), (2, 400), (3, 600), (4, 2000))]
    for age, entry in zip((400, 300, 200, 100), entries, strict=True):  # the last written is the most recent
        store.write(KEY, IDENT, [entry])
        when = time.time() - age
        os.utime(tmp_path / KEY / tokens_name(entry[0]), (when, when))
    opened: list[str] = []
    reads: list[int] = []
    real_open, real_fromfile = prefixstore._open, numpy.fromfile
    monkeypatch.setattr(prefixstore, "_open", lambda path: opened.append(path.name) or real_open(path))
    monkeypatch.setattr(numpy, "fromfile", lambda *a, **k: reads.append(1) or real_fromfile(*a, **k))
    got = store.load(KEY, IDENT, 1000)
    assert [g.tokens for g in got] == [entries[2][0], entries[1][0]] and not said  # 600 + 400: the room used
    assert len(reads) == 2  # the 2,000 bytes' state was never read
    assert opened == [tokens_name(e[0]) for e in (entries[3], entries[2], entries[1])]  # the oldest: not opened


def test_a_torn_file_too_big_for_the_room_is_still_found_torn(tmp_path: Path) -> None:
    """Passed over by its header's size, a file is still told torn by its length (no state read) and removed: a
    read room smaller than it used to leave it on disk, unsaid, at every start."""
    store, said = _store(tmp_path)
    entry = _entry([5] * 70, size=5000, seed=5)
    store.write(KEY, IDENT, [entry])
    path = tmp_path / KEY / tokens_name(entry[0])
    os.truncate(path, path.stat().st_size - 4000)
    assert store.load(KEY, IDENT, 100) == []
    assert not path.exists() and any("torn" in line for line in said), said


def test_a_small_limit_bounds_what_its_server_keeps_never_what_others_wrote(tmp_path: Path) -> None:
    """The red team's `serve --cache-disk 1` wiped the whole shared store at start and stop. A server removes
    files only when it has just written one, and never one larger than its own limit: its start (reading),
    its stop (nothing it may keep) and its status remove nothing."""
    big, _ = _store(tmp_path)  # a server without a limit (as a large --cache-disk)
    theirs = [_entry([i] * 80, size=3000, seed=i) for i in range(1, 4)]
    big.write(KEY, IDENT, theirs)
    before = sorted(p.name for p in tmp_path.glob(f"*/*{SUFFIX}"))
    tiny, said = _store(tmp_path, limit=2000)
    assert len(tiny.load(KEY, IDENT, None)) == 3  # its start: read back, nothing removed
    assert tiny.write(KEY, IDENT, [_entry([7] * 90, size=2500, seed=7)]) == 0  # its stop: too large to keep
    tiny.status()
    assert sorted(p.name for p in tmp_path.glob(f"*/*{SUFFIX}")) == before and not said
    mine = _entry([8] * 90, size=500, seed=8)
    assert tiny.write("other" * 5, IDENT, [mine]) == 500  # over its limit now, but only with files it could not keep
    assert sorted(p.name for p in tmp_path.glob(f"*/*{SUFFIX}")) == sorted([*before, tokens_name(mine[0])])
    assert tiny.status()["evicted"] == 0 and not said


def test_a_link_is_never_followed(tmp_path: Path) -> None:
    """A `.prefix` that is a symbolic link, or a model's folder that is one, is neither read, counted nor
    removed (the file it points at stays), and a folder that is a link is not written through."""
    elsewhere = tmp_path / "elsewhere"
    other, _ = _store(elsewhere)
    entry = _entry(list(range(100)))
    other.write(KEY, IDENT, [entry])
    (target,) = (elsewhere / KEY).glob(f"*{SUFFIX}")
    root = tmp_path / "store"
    store, said = _store(root, limit=10)
    (root / KEY).mkdir(parents=True)
    (root / KEY / target.name).symlink_to(target)
    (root / "linked").symlink_to(elsewhere / KEY, target_is_directory=True)
    assert store.load(KEY, IDENT, None) == [] and not store.has(KEY, entry[0])
    assert store.load("linked", IDENT, None) == [] and not store.has("linked", entry[0])
    assert store.write("linked", IDENT, [_entry(list(range(300)), size=5)]) == 0
    assert store.status()["files"] == 0
    store.write(KEY, IDENT, [_entry(list(range(200)), size=5)])  # a write, then a trim: the link is not its to drop
    assert target.exists() and (root / KEY / target.name).is_symlink()
    assert [p.name for p in (elsewhere / KEY).iterdir()] == [target.name]
    assert len(said) == 2 and all("its folder is a link" in line for line in said), said


def test_a_folder_that_cannot_be_made_is_said_once_and_costs_only_the_prefixes(tmp_path: Path) -> None:
    """A model's folder that cannot be made (here a file in its place; also no permission or a read-only disk):
    reading finds nothing and writing keeps nothing, said in one line, once. It was an OSError out of load and
    write, which serve logged as an internal error with a traceback at each load, idle write and stop."""
    store, said = _store(tmp_path)
    (tmp_path / KEY).write_bytes(b"not a folder")
    for _ in range(2):
        assert store.load(KEY, IDENT, None) == []
        assert store.write(KEY, IDENT, [_entry(list(range(100)))]) == 0
        assert not store.has(KEY, list(range(100)))
    assert len(said) == 1 and "cannot use" in said[0] and "\n" not in said[0], said
    assert (tmp_path / KEY).read_bytes() == b"not a folder"
    other = _entry(list(range(300)))  # another model's folder is not the worse for it
    assert store.write("o" * 24, IDENT, [other]) == other[3] and len(store.load("o" * 24, IDENT, None)) == 1


@pytest.mark.parametrize(("free", "limit"), [(100 << 30, 8 << 30), (4 << 30, 1 << 30)])
def test_cache_disk_auto_is_8_gib_or_a_quarter_of_the_free_space(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 free: int, limit: int) -> None:
    """docs/configuration.md: `--cache-disk` (auto by default) is "8 GiB or a quarter of the free space" of the
    disk the cache dir is on (made or not yet)."""
    import shutil
    from collections import namedtuple

    from localgen.cli.serve import checks
    from localgen.cli.serve.options import SlotOptions

    assert SlotOptions.__dataclass_fields__["cache_disk"].default == "auto"
    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path / "not-yet"))
    asked: list[Path] = []
    usage = namedtuple("usage", "total used free")

    def disk_usage(path: Path) -> Any:
        asked.append(Path(path))
        return usage(free * 2, free, free)

    monkeypatch.setattr(shutil, "disk_usage", disk_usage)
    assert checks._cache_disk("auto") == limit and asked == [tmp_path]
