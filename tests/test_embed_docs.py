"""Documents into a collection: the chunker's rules (localgen/embeddings/chunk.py, with counters that stand in
for a tokenizer), and `localgen embed --store NAME --docs PATH...` driven with tests/tiny_bert.py's model (and
SmolLM2 for `similar`): folders walked, ids, files stored again, the files skipped and the errors."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
from pathlib import Path

import pytest

from localgen.embeddings.chunk import Chunk, chunks
from tests.conftest import CLI, InProcessCLI


def words(text: str) -> int:
    """A stand-in tokenizer: a token a word, and one special token (as a BOS) on every text."""
    return len(text.split()) + 1


def thirds(text: str) -> int:
    """Another: a token per three characters, rounded up, and two special tokens (as CLS and SEP)."""
    return -(-len(text) // 3) + 2


def _check(text: str, out: list[Chunk], limit: int, overlap: int, count: object) -> None:
    """The rules every cut keeps: each chunk fits, has no whitespace at its ends, is text[start:end]; the chunks
    cover every non-space character in order, each repeating only its overlap with the one before."""
    assert callable(count)
    base = count("")
    covered = 0  # the text up to here is in a chunk already
    for k, c in enumerate(out):
        assert c.text == text[c.start:c.end] and c.text == c.text.strip() and c.text
        assert count(c.text) <= limit, (c, count(c.text))
        assert not text[covered:c.start].strip(), f"text lost before chunk {k + 1}: {text[covered:c.start]!r}"
        if k:
            prev = out[k - 1]
            assert prev.start < c.start <= prev.end + len(text[prev.end:c.start]), "in order, no chunk inside another"
            repeated = text[c.start:prev.end] if c.start < prev.end else ""
            assert not repeated or count(repeated) - base <= overlap, (repeated, overlap)
        covered = max(covered, c.end)
    assert not text[covered:].strip(), f"text lost at the end: {text[covered:]!r}"


def test_chunks_end_at_paragraphs_where_they_fit() -> None:
    paras = [" ".join(f"p{p}w{w}" for w in range(6)) + "." for p in range(5)]
    text = "\n\n".join(paras) + "\n"
    out = chunks(text, 16, 0, words)
    assert [c.text for c in out] == ["\n\n".join(paras[0:2]), "\n\n".join(paras[2:4]), paras[4]], \
        "two paragraphs (13 tokens) a chunk: a third would not fit"
    _check(text, out, 16, 0, words)
    assert [c.text for c in chunks(text, 100, 10, words)] == [text.strip()], "a text that fits is one chunk"


def test_a_long_paragraph_is_cut_at_line_ends_then_sentences_then_words_then_inside_a_word() -> None:
    lines = "alpha beta gamma\ndelta epsilon zeta\neta theta iota"
    assert [c.text for c in chunks(lines, 8, 0, words)] == ["alpha beta gamma\ndelta epsilon zeta", "eta theta iota"]
    sentences = "One two three. Four five six. Seven eight nine."
    assert [c.text for c in chunks(sentences, 8, 0, words)] == ["One two three. Four five six.", "Seven eight nine."]
    long = "a b c d e f g h i j k l m n"  # no sentence end: between words, as many as fit
    assert [c.text for c in chunks(long, 8, 0, words)] == ["a b c d e f g", "h i j k l m n"]
    blob = "x" * 50  # one word longer than a chunk: cut inside it, nothing lost
    out = chunks(blob, 8, 0, thirds)
    assert "".join(c.text for c in out) == blob and all(thirds(c.text) <= 8 for c in out)
    assert [len(c.text) for c in out] == [18, 18, 14]


def test_a_chunk_ends_at_the_best_boundary_that_keeps_half_of_what_fits() -> None:
    # a paragraph end after 6 of the 9 words that fit is taken before the later line and word ends
    text = "a b c d e f\n\ng h i\nj k l m n o p q r s"
    out = chunks(text, 10, 0, words)
    assert out[0].text == "a b c d e f"
    _check(text, out, 10, 0, words)
    # one after 2 of 9 is not: the chunk goes on to the last word that fits
    text = "a b\n\nc d e f g h i j k l m n o p"
    assert chunks(text, 10, 0, words)[0].text == "a b\n\nc d e f g h i"


def test_each_chunk_repeats_the_end_of_the_one_before_from_a_sentence_start_where_one_is_in_reach() -> None:
    text = "One two three four five. Six seven eight nine ten. Eleven twelve thirteen fourteen fifteen sixteen."
    out = chunks(text, 12, 3, words)
    assert [c.text for c in out] == ["One two three four five. Six seven eight nine ten.",
                                     "eight nine ten. Eleven twelve thirteen fourteen fifteen sixteen."]
    out = chunks(text, 12, 5, words)
    assert out[1].text.startswith("Six seven eight nine ten. Eleven"), "a whole sentence fits in 5 tokens"
    _check(text, out, 12, 5, words)
    # 4 tokens reach back to "eight": the overlap starts at the sentence after it
    last = "Twelve thirteen fourteen fifteen sixteen seventeen."
    text = f"One two three four five six. Seven eight nine. Ten eleven. {last}"
    assert [c.text for c in chunks(text, 12, 4, words)][1] == f"Ten eleven. {last}"


def test_blank_and_empty_texts_have_no_chunks_and_bad_limits_are_refused() -> None:
    assert chunks("", 16, 4, words) == [] and chunks(" \n\n\t\n", 16, 4, words) == []
    with pytest.raises(ValueError, match="at least 8"):
        chunks("x", 4, 0, words)
    with pytest.raises(ValueError, match="less than"):
        chunks("x", 16, 16, words)


@pytest.mark.parametrize("seed", range(40))
def test_random_texts_keep_every_rule(seed: int) -> None:
    rnd = random.Random(seed)
    vocab = ["a", "to", "cat", "sat.", "mat!", "rug?", "the", "x" * 40, "über", "日本語。", "(b)", "end.”"]
    seps = [" ", " ", " ", " ", "  ", "\n", "\n\n", "\n \n\n", "\t"]
    text = "".join(rnd.choice(vocab) + rnd.choice(seps) for _ in range(rnd.randint(0, 300)))
    if rnd.random() < 0.5:
        text = "\n" + text
    count = rnd.choice([words, thirds])
    limit = rnd.randint(8, 60)
    overlap = rnd.randint(0, limit - 1)
    _check(text, chunks(text, limit, overlap, count), limit, overlap, count)


# ---- `localgen embed --store NAME --docs PATH...` ----

@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> str:
    from tests.tiny_bert import build

    return str(build(tmp_path_factory.mktemp("tiny") / "tiny-bert.gguf"))


@pytest.fixture
def dcli(cli_env: dict[str, str], tmp_path: Path) -> CLI:
    return CLI({**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")})


def _para(n: int, word: str = "cat") -> str:
    return " ".join([word] * n) + "."


def _notes(root: Path) -> Path:
    """A folder of notes: text, a subfolder, an empty file, a binary, hidden things, a linked folder, a linked
    file and a named pipe."""
    notes = root / "notes"
    (notes / "sub").mkdir(parents=True)
    (notes / "b.md").write_text("the cat sat on the mat.\n")
    (notes / "a.md").write_text("\n\n".join(_para(30, w) for w in ("cat", "dog", "rug")) + "\n")
    (notes / "sub" / "c.txt").write_text("a kitten rested on the rug.\n")
    (notes / "empty.md").write_text("")
    (notes / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    (notes / ".hidden.md").write_text("hidden\n")
    (notes / ".git").mkdir()
    (notes / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "far.md").write_text("far away\n")
    (notes / "linked").symlink_to(elsewhere, target_is_directory=True)
    (notes / "sub" / "link.md").symlink_to(elsewhere / "far.md")
    os.mkfifo(notes / "sub" / "pipe.md")  # not a regular file: never opened (it would wait for a writer)
    return notes


def _ids(cli: CLI, name: str, cwd: Path) -> list[str]:
    r = cli("collections", "show", name, "--json", cwd=cwd)
    assert r.returncode == 0, r.stderr
    return [i["id"] for i in json.loads(r.stdout)["items"]]


def _texts(cli: CLI, name: str, cwd: Path) -> dict[str, str]:
    """Each entry's whole text, as `similar` gives it (every entry: -n past their count)."""
    r = cli("similar", name, "the cat", "-n", "1000", cwd=cwd)
    assert r.returncode == 0, r.stderr
    return {d["id"]: d["content"] for d in map(json.loads, r.stdout.splitlines())}


def test_a_folder_is_walked_into_chunks_with_path_ids(dcli: CLI, bert: str, tmp_path: Path) -> None:
    _notes(tmp_path)
    r = dcli("embed", "-m", bert, "--store", "n", "--docs", "notes", "--chunk-tokens", "40", "--chunk-overlap", "0",
             cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "skipped 1 file that is not UTF-8 text: notes/logo.png" in r.stderr
    assert "n: 5 files in 6 chunks: 6 embedded and stored, 0 unchanged" in r.stderr
    # sorted, hidden files and folders skipped, the linked folder not followed (a linked file read), the empty
    # file without chunks
    assert _ids(dcli, "n", tmp_path) == ["notes/a.md#1", "notes/a.md#2", "notes/a.md#3", "notes/b.md#1",
                                         "notes/sub/c.txt#1", "notes/sub/link.md#1"]
    texts = _texts(dcli, "n", tmp_path)
    assert texts["notes/a.md#2"] == _para(30, "dog"), "each paragraph a chunk: two would not fit in 40 tokens"
    assert texts["notes/sub/c.txt#1"] == "a kitten rested on the rug."
    show = dcli("collections", "show", "n", cwd=tmp_path).stdout
    assert re.search(r"^notes/a\.md#3 +rug rug", show, re.M), show
    # a file as typed, normalised; given twice (and inside a folder given too), stored once
    r = dcli("embed", "-m", bert, "--store", "m", "--docs", "./notes/../notes/b.md", "notes/sub/", "notes/b.md",
             cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert _ids(dcli, "m", tmp_path) == ["notes/b.md#1", "notes/sub/c.txt#1", "notes/sub/link.md#1"]
    assert "skipped" not in r.stderr
    # a file with another's text: a chunk of its own (as a text argument held already would not be), its vector
    # the other's, not embedded again
    (tmp_path / "twin.md").write_text("the cat sat on the mat.\n")
    r = dcli("embed", "-m", bert, "--store", "m", "--docs", "twin.md", cwd=tmp_path)
    assert "m: 1 file in 1 chunk: 0 embedded and stored, 1 unchanged" in r.stderr
    assert _ids(dcli, "m", tmp_path)[-1] == "twin.md#1"
    # ... which is what the same file stored by another path looks like, so stderr says so
    assert r.stderr.splitlines()[-1] == (
        "warning: m: twin.md holds the same text as notes/b.md, stored already: the same file by another path? The "
        "collection now has both; remove one with `localgen collections rm m --id ID`, or store the folder again "
        "with --replace"), r.stderr
    r = dcli("embed", "-m", bert, "--store", "m", "--docs", "b.md", cwd=tmp_path / "notes")
    assert "b.md holds the same text as notes/b.md" in r.stderr or "as twin.md" in r.stderr, r.stderr
    r = dcli("collections", "rm", "m", "--id", "twin.md#1", "--id", "notes/b.md#1", "--id", "b.md#1", cwd=tmp_path)
    assert r.returncode == 0 and "m: removed 3 entries, 2 left" in r.stderr, r.stderr


def test_files_of_equal_text_in_one_walk_are_not_called_the_same_file(dcli: CLI, bert: str, tmp_path: Path) -> None:
    """Thirteen copies in one folder are thirteen files: no warning that each is "the same file by another path"
    (one line a copy, 301 for 300). The folder stored again by other paths is that case: three named, the rest
    counted in one line."""
    (tmp_path / "dup").mkdir()
    for i in range(12):
        (tmp_path / "dup" / f"s{i:02}.md").write_text("the cat sat on the mat.\n")
    r = dcli("embed", "-m", bert, "--store", "d", "--docs", "dup", cwd=tmp_path)
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
    (tmp_path / "dup" / "s12.md").write_text("the cat sat on the mat.\n")  # one more copy: its vector reused
    r = dcli("embed", "-m", bert, "--store", "d", "--docs", "dup", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "d: 13 files in 13 chunks: 0 embedded and stored, 13 unchanged\n", r.stderr
    r = dcli("embed", "-m", bert, "--store", "d", "--docs", ".", cwd=tmp_path / "dup")
    assert r.returncode == 0, r.stderr
    warned = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert warned[0].startswith("warning: d: s00.md holds the same text as dup/s00.md, stored already: the same file "
                                "by another path?"), r.stderr
    assert len(warned) == 4 and warned[3] == "warning: d: 10 more files hold texts stored already under other paths"


def test_chunks_hold_at_most_chunk_tokens_of_the_models_own(dcli: CLI, bert: str, tmp_path: Path) -> None:
    doc = tmp_path / "long.md"
    text = "\n".join(f"the cat sat on the mat {i}. a dog rested on the rug and the kitten sat." for i in range(40))
    doc.write_text(text)
    r = dcli("embed", "-m", bert, "--store", "n", "--docs", "long.md", "--chunk-tokens", "64", "--chunk-overlap", "8",
             cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    texts = list(_texts(dcli, "n", tmp_path).items())
    assert len(texts) > 5
    measured = dcli("embed", "-m", bert, *[t for _, t in texts])
    tokens = [json.loads(line)["tokens"] for line in measured.stdout.splitlines()]
    assert max(tokens) <= 64 and max(tokens) > 48, tokens
    for (_, t) in texts:
        assert t.startswith("the cat sat") or re.match(r"(a dog|\w+)", t), "a chunk starts at a sentence or a word"
    joined = " ".join(t for _, t in sorted(texts, key=lambda x: int(x[0].rsplit("#", 1)[1])))
    assert all(f"mat {i}." in joined for i in range(40)), "no line lost"
    # the defaults: 256 tokens, and an overlap of 32, or a quarter of --chunk-tokens where less
    r = dcli("embed", "-m", bert, "--store", "w", "--docs", "long.md", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    wide = list(_texts(dcli, "w", tmp_path).values())
    tokens = [json.loads(line)["tokens"] for line in dcli("embed", "-m", bert, *wide).stdout.splitlines()]
    assert max(tokens) <= 256 and max(tokens) > 200, tokens
    assert dcli("embed", "-m", bert, "--store", "q", "--docs", "long.md", "--chunk-tokens", "64",
                cwd=tmp_path).returncode == 0
    assert dcli("embed", "-m", bert, "--store", "q16", "--docs", "long.md", "--chunk-tokens", "64",
                "--chunk-overlap", "16", cwd=tmp_path).returncode == 0
    assert _texts(dcli, "q", tmp_path) == _texts(dcli, "q16", tmp_path) != dict(texts)
    r = dcli("embed", "-m", bert, "--store", "w", "--docs", "long.md", "--ctx", "256", "--chunk-tokens", "300",
             cwd=tmp_path)
    assert r.returncode == 2 and "--chunk-tokens 300 is more than the embeddings window (256 tokens)" in r.stderr
    # the model's trained window (the tiny BERT's 512) is the limit: no larger --ctx is suggested
    r = dcli("embed", "-m", bert, "--store", "w", "--docs", "long.md", "--ctx", "4096", "--chunk-tokens", "600",
             cwd=tmp_path)
    assert r.returncode == 2 and "localgen: error: --chunk-tokens 600 is more than the embeddings window (512 " \
                                 "tokens, the most this model was trained on) (give at most 512)\n" in r.stderr, \
        r.stderr


def test_storing_a_file_again_replaces_its_chunks(dcli: CLI, bert: str, tmp_path: Path) -> None:
    notes = _notes(tmp_path)
    args = ("embed", "-m", bert, "--store", "n", "--docs", "--chunk-tokens", "40", "--chunk-overlap", "0")
    assert dcli(*args, "notes", cwd=tmp_path).returncode == 0
    (notes / "a.md").write_text(_para(30, "cat") + "\n\n" + _para(20, "mat") + "\n")  # #2 changed, #3 gone
    r = dcli(*args, "notes/a.md", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "n: 1 file in 2 chunks: 1 embedded and stored, 1 unchanged, 1 removed" in r.stderr
    assert "warning" not in r.stderr, "a file's own chunks taking their stored vectors are no copy"
    texts = _texts(dcli, "n", tmp_path)
    assert sorted(texts) == ["notes/a.md#1", "notes/a.md#2", "notes/b.md#1", "notes/sub/c.txt#1",
                             "notes/sub/link.md#1"], \
        "no stale #3; the other files' entries stay"
    assert texts["notes/a.md#2"] == _para(20, "mat")
    # a run that fails (another size than the collection's) stores and removes nothing
    (notes / "a.md").write_text("the cat.\n")
    r = dcli(*args, "notes/a.md", "--dimensions", "32", cwd=tmp_path)
    assert r.returncode == 2 and "--dimensions" in r.stderr
    assert _texts(dcli, "n", tmp_path) == texts
    # --replace: only the chunks of the files given stay
    r = dcli(*args, "notes/sub/c.txt", "--replace", cwd=tmp_path)
    assert "n: 1 file in 1 chunk: 0 embedded and stored, 1 unchanged, 4 removed" in r.stderr
    assert _ids(dcli, "n", tmp_path) == ["notes/sub/c.txt#1"]
    # an emptied file: its chunks go
    (notes / "sub" / "c.txt").write_text("\n\n")
    r = dcli(*args, "notes/sub/c.txt", cwd=tmp_path)
    assert r.returncode == 0 and "0 embedded and stored, 0 unchanged, 1 removed" in r.stderr, r.stderr
    assert _ids(dcli, "n", tmp_path) == []


def test_a_docs_collection_is_searched_by_similar(dcli: CLI, tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "pets.md").write_text("The cat sat on the mat.\n\nA kitten slept on the rug.\n")
    (notes / "money.md").write_text("Quarterly revenue grew 8 percent.\n")
    r = dcli("embed", "--store", "n", "--docs", "notes", "--chunk-tokens", "12", "--chunk-overlap", "0",
             cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "n: 2 files in 3 chunks" in r.stderr
    best = [json.loads(line) for line in dcli("similar", "n", "a feline on a carpet", "-n", "3").stdout.splitlines()]
    assert [b["id"] for b in best][2] == "notes/money.md#1", best
    assert {b["id"] for b in best[:2]} == {"notes/pets.md#1", "notes/pets.md#2"}
    assert best[0]["content"] in ("The cat sat on the mat.", "A kitten slept on the rug.")


def test_docs_refuses_what_it_cannot_store(dcli: CLI, cli_in_process: InProcessCLI, tmp_path: Path) -> None:
    notes = _notes(tmp_path)
    jl = tmp_path / "in.jsonl"
    jl.write_text('{"id": "a", "text": "x"}\n')
    n = str(notes)
    for args, needle in (
        (["--docs", n], "--docs needs --store NAME"),
        (["--store", "s", "--docs", "--file", str(jl)], "--docs takes files and folders as arguments, not --file"),
        (["--store", "s", "--docs"], "--docs needs files or folders as arguments (it does not read stdin)"),
        (["--store", "s", "--docs", f"{n}/nothing.md"], f"--docs {n}/nothing.md: no such file or folder"),
        (["--store", "s", "--docs", "/dev/null"], "--docs /dev/null: not a file or a folder"),
        (["--store", "s", "--docs", f"{n}/logo.png"], f"{n}/logo.png is not UTF-8 text: byte 0x89 on line 1"),
        (["--store", "s", "--chunk-tokens", "64", "x"], "--chunk-tokens needs --docs"),
        (["--store", "s", "--chunk-overlap", "4", "x"], "--chunk-overlap needs --docs"),
        (["--store", "s", "--docs", n, "--chunk-tokens", "64", "--chunk-overlap", "64"],
         "--chunk-overlap 64 must be less than --chunk-tokens (64)"),
        (["--store", "s", "--docs", n, "--chunk-overlap", "300"], "--chunk-overlap 300 must be less than"),
        (["--store", "s", "--docs", n, "--chunk-tokens", "4"], "--chunk-tokens must be at least 8, not 4"),
    ):
        r = cli_in_process("embed", *args, input="a line\n")
        assert r.returncode == 2 and needle in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr
    # stdin is left unread, as embed.md says: a shell loop that feeds --docs its file names on stdin
    # (`... | while read -r f; do localgen embed --docs "$f" ...; done`) keeps every name (a check that read a
    # byte of stdin to see whether lines were piped took the first byte of the next name)
    names = f"{notes / 'a.md'}\n{notes / 'b.md'}\n"
    loop = subprocess.run(["sh", "-c", 'while read -r f; do "$@" embed --store s --docs "$f" || exit 9; done', "sh",
                           *dcli.argv()], input=names, capture_output=True, text=True, env=dcli.env, timeout=300)
    assert loop.returncode == 0, loop.stderr
    listed = dcli("collections", "show", "s", "--json")
    stored = {e["id"].split("#")[0] for e in json.loads(listed.stdout)["items"]}
    assert stored == {p.strip() for p in names.splitlines()}, (stored, loop.stderr)
    binary = tmp_path / "bin"
    binary.mkdir()
    for k in range(5):
        (binary / f"{k}.bin").write_bytes(b"text, then a NUL: \0")
    r = cli_in_process("embed", "--store", "s", "--docs", str(binary))
    assert r.returncode == 2 and "nothing to embed: no UTF-8 text files in" in r.stderr
    assert f"skipped 5 files that are not UTF-8 text: {binary}/0.bin, {binary}/1.bin, {binary}/2.bin and 2 more\n" \
        in r.stderr
    # too much text is refused from the files' sizes, before any is read whole and before the model loads
    big = tmp_path / "big"
    big.mkdir()
    for k in range(2):
        with (big / f"{k}.md").open("w") as f:
            f.write("the cat sat on the mat.\n" * 1000)
            f.truncate(150 * 2**20)  # sparse: past its start, NULs nobody reads
    r = dcli("embed", "-m", "/nonexistent.gguf", "--store", "s", "--docs", "big", cwd=tmp_path)
    assert r.returncode == 2 and "the documents are 300 MiB, more than 256 MiB: store them in parts" in r.stderr
    assert os.path.getsize(big / "0.md") == 150 * 2**20


def test_a_mismatched_collection_is_refused_before_anything_is_embedded(dcli: CLI, bert: str, tmp_path: Path) -> None:
    assert dcli("embed", "-m", bert, "--store", "m", "the cat sat.").returncode == 0
    # the collection is checked once the model has loaded, before any text is embedded or any file chunked: the
    # mismatch is the error, not what embedding the texts would have met (a text past the window, a chunk size
    # past it)
    long = "the cat sat on the mat. " * 200
    r = dcli("embed", "-m", bert, "--store", "m", "a kitten.", long, "--dimensions", "8")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "collection 'm' holds tiny-bert.gguf vectors (cls pooling, 64 dimensions), not tiny-bert.gguf (cls, 8) " \
           "(use --dimensions 64, or another collection name)" in r.stderr, r.stderr
    notes = _notes(tmp_path)
    r = dcli("embed", "-m", bert, "--store", "m", "--docs", str(notes), "--pooling", "last", "--chunk-tokens", "100000")
    assert r.returncode == 2 and r.stderr.count("\n") == 2, "the skip notice, then the error: " + r.stderr
    assert "(use --pooling cls, or another collection name)" in r.stderr and "--chunk-tokens" not in r.stderr
    assert len(_ids(dcli, "m", tmp_path)) == 1, "nothing stored"


def test_a_line_added_at_the_top_embeds_only_the_new_chunk(dcli: CLI, bert: str, tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    paras = [_para(30, w) for w in ("cat", "dog", "rug")]  # a chunk each at 40 tokens
    (notes / "a.md").write_text("\n\n".join(paras) + "\n")
    args = ("embed", "-m", bert, "--store", "n", "--docs", "notes", "--chunk-tokens", "40", "--chunk-overlap", "0")
    r = dcli(*args, cwd=tmp_path)
    assert "n: 1 file in 3 chunks: 3 embedded and stored, 0 unchanged" in r.stderr, r.stderr
    before = {d["id"]: d for d in map(json.loads, dcli("similar", "n", "a dog", "-n", "9").stdout.splitlines())}
    (notes / "a.md").write_text(_para(30, "mat") + "\n\n" + "\n\n".join(paras) + "\n")  # every chunk's id moves
    r = dcli(*args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "n: 1 file in 4 chunks: 1 embedded and stored, 3 unchanged" in r.stderr, r.stderr
    after = {d["id"]: d for d in map(json.loads, dcli("similar", "n", "a dog", "-n", "9").stdout.splitlines())}
    assert [after[f"notes/a.md#{k}"]["content"] for k in range(1, 5)] == [_para(30, "mat"), *paras]
    for k in range(1, 4):  # each moved chunk keeps its vector: the same score under its new id
        assert after[f"notes/a.md#{k + 1}"]["score"] == before[f"notes/a.md#{k}"]["score"]
    r = dcli(*args, cwd=tmp_path)
    assert "n: 1 file in 4 chunks: 0 embedded and stored, 4 unchanged" in r.stderr, r.stderr


def test_a_byte_order_mark_is_not_text(dcli: CLI, bert: str, tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "bom.md").write_bytes("\ufeffThe cat sat.\n".encode())
    jl = tmp_path / "in.jsonl"
    jl.write_bytes('\ufeff{"id": "j", "text": "A dog ran."}\n'.encode())
    r = dcli("embed", "-m", bert, "--store", "b", "--docs", "notes", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = dcli("embed", "-m", bert, "--store", "b", "--file", str(jl))
    assert r.returncode == 0, r.stderr
    assert _texts(dcli, "b", tmp_path) == {"notes/bom.md#1": "The cat sat.", "j": "A dog ran."}


def test_a_path_with_control_characters_is_skipped_in_a_folder_and_refused_when_named(
        dcli: CLI, bert: str, tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "ok.md").write_text("The cat sat.\n")
    (notes / "two\nlines.md").write_text("A dog ran.\n")
    r = dcli("embed", "-m", bert, "--store", "c", "--docs", "notes", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "skipped 1 file whose path holds control characters (a newline, a tab) or bytes that are not UTF-8, " \
           "which an id cannot: 'notes/two\\nlines.md'\n" in r.stderr, r.stderr
    assert _ids(dcli, "c", tmp_path) == ["notes/ok.md#1"]
    r = dcli("embed", "-m", bert, "--store", "c", "--docs", "notes/two\nlines.md", cwd=tmp_path)
    assert r.returncode == 2 and "the file 'notes/two\\nlines.md': a path with control characters" in r.stderr
    assert r.stderr.count("\n") == 1 and "loading" not in r.stderr, r.stderr


@pytest.mark.parametrize(("flags", "error"), [
    (["--json"], "--json shapes the printed vectors; --store prints none (it stores them)"),
    (["--format", "base64"], "--format shapes the printed vectors; --store prints none (it stores them)"),
    (["--format", "float", "--json"], "--json and --format shape the printed vectors; --store prints none"),
])
def test_output_flags_with_store_are_usage_errors(cli_in_process: InProcessCLI, flags: list[str], error: str) -> None:
    for more in ([], ["--docs", "."]):
        r = cli_in_process("embed", "--store", "s", "hi", *more, *flags)
        assert r.returncode == 2 and error in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_a_file_deleted_from_a_folder_keeps_its_chunks_unless_replace(dcli: CLI, bert: str, tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.md").write_text("The cat sat.\n")
    (notes / "b.md").write_text("A dog ran.\n")
    args = ("embed", "-m", bert, "--store", "d", "--docs", "notes")
    assert dcli(*args, cwd=tmp_path).returncode == 0
    (notes / "b.md").unlink()
    r = dcli(*args, cwd=tmp_path)
    assert "d: 1 file in 1 chunk: 0 embedded and stored, 1 unchanged\n" in r.stderr, r.stderr
    assert _ids(dcli, "d", tmp_path) == ["notes/a.md#1", "notes/b.md#1"]
    r = dcli(*args, "--replace", cwd=tmp_path)
    assert "d: 1 file in 1 chunk: 0 embedded and stored, 1 unchanged, 1 removed\n" in r.stderr, r.stderr
    assert _ids(dcli, "d", tmp_path) == ["notes/a.md#1"]


def test_documents_that_are_all_empty_are_refused_and_nothing_is_created(dcli: CLI, bert: str,
                                                                          tmp_path: Path) -> None:
    """Files with no text (empty, or only whitespace) made an empty collection and exited 0: now one usage error
    naming them, and no collection. One empty file among others is stored as before (it has no chunks), and so
    are emptied files into a collection that is there (their chunks go)."""
    blank = tmp_path / "blank"
    blank.mkdir()
    (blank / "a.md").write_text("")
    (blank / "b.txt").write_text(" \n\n\t\n")
    r = dcli("embed", "-m", bert, "--store", "e", "--docs", "blank", cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stderr)
    assert r.stderr == "localgen: error: nothing to embed: blank/a.md, blank/b.txt are empty or only whitespace\n"
    r = dcli("embed", "-m", bert, "--store", "e", "--docs", "blank/a.md", cwd=tmp_path)
    assert r.returncode == 2 and "nothing to embed: blank/a.md is empty or only whitespace" in r.stderr, r.stderr
    r = dcli("collections", "--json", cwd=tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout) == [], r.stdout
    (blank / "c.md").write_text("the cat sat on the mat.\n")
    r = dcli("embed", "-m", bert, "--store", "e", "--docs", "blank", cwd=tmp_path)
    assert r.returncode == 0 and _ids(dcli, "e", tmp_path) == ["blank/c.md#1"], r.stderr
    # into a collection that is there, an emptied file is stored again as before: its chunks are removed
    (blank / "c.md").write_text("\n")
    r = dcli("embed", "-m", bert, "--store", "e", "--docs", "blank", cwd=tmp_path)
    assert r.returncode == 0 and "1 removed" in r.stderr and _ids(dcli, "e", tmp_path) == [], r.stderr


def test_a_path_that_is_not_utf8_is_skipped_in_a_folder_and_refused_when_named(
        dcli: CLI, bert: str, tmp_path: Path) -> None:
    """A file name whose bytes are not UTF-8 cannot be an id (no database or JSON holds it): in a folder it is
    skipped with a line on stderr and the rest is stored; named, or an empty argument, is exit 2 before the model
    loads."""
    notes = tmp_path / "lat"
    notes.mkdir()
    (notes / "ok.md").write_text("the dog\n")
    with open(os.path.join(os.fsencode(notes), b"caf\xe9.md"), "w") as fh:
        fh.write("the cat\n")
    r = dcli("embed", "-m", bert, "--store", "lat", "--docs", "lat/", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "skipped 1 file whose path holds control characters (a newline, a tab) or bytes that are not UTF-8, " \
           "which an id cannot: 'lat/caf\\xe9.md'\n" in r.stderr, r.stderr
    assert _ids(dcli, "lat", tmp_path) == ["lat/ok.md#1"]
    for arg, error in (("lat/caf\udce9.md", "the file 'lat/caf\\xe9.md': a path with control characters (a "
                                            "newline, a tab) or bytes that are not UTF-8 cannot be an id"),
                       ("", "--docs: argument 1 is empty: give a file or a folder (. for this one)")):
        r = dcli("embed", "-m", bert, "--store", "lat", "--docs", arg, cwd=tmp_path)
        assert r.returncode == 2 and error in r.stderr, (arg, r.stderr)
        assert r.stderr.count("\n") == 1 and "loading" not in r.stderr, r.stderr
