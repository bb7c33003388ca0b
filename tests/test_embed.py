"""Embeddings: `localgen embed` (arguments, stdin, --file, formats, pooling, dimensions, truncation), the
vectors against llama.cpp's own llama-embedding (kept in tests/data/ beside the script that regenerates
them), collections (`embed --store`, `similar`), and serve's /v1/embeddings and /api/embed driven by the
real `openai` and `ollama` clients."""

from __future__ import annotations

import base64
import json
import math
import os
import re
import signal
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localgen.cli.embed import STEP
from localgen.embeddings.store import text_id
from tests.conftest import CLI, NO_GPU, ROOT, reference_kernels
from tests.test_serve import Server

TEXTS = ["The cat sat on the mat.", "A feline rested on the rug.", "Quarterly revenue grew 8 percent."]


def _cos(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


@pytest.fixture
def ecli(cli_env: dict[str, str], tmp_path: Path) -> CLI:
    return CLI({**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")})


def _vectors(r: object) -> list[list[float]]:
    out = r.stdout  # type: ignore[attr-defined]
    return [json.loads(line)["embedding"] for line in out.splitlines()]


def test_embed_prints_one_normalised_vector_per_text(cli: CLI) -> None:
    r = cli("embed", *TEXTS)
    assert r.returncode == 0, r.stderr
    docs = [json.loads(line) for line in r.stdout.splitlines()]
    assert [d["id"] for d in docs] == [text_id(t) for t in TEXTS] and all(d["tokens"] > 3 for d in docs)
    vecs = [d["embedding"] for d in docs]
    assert all(len(v) == 576 and abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-6 for v in vecs)
    assert _cos(vecs[0], vecs[1]) > _cos(vecs[0], vecs[2]), "the two sentences about a cat are nearer"
    alone = _vectors(cli("embed", TEXTS[2]))[0]
    assert _cos(alone, vecs[2]) > 0.99999, "a text batched with others embeds as it does alone"
    piped = cli("embed", input="\n".join(TEXTS) + "\n\n")
    assert _vectors(piped) == vecs, "stdin lines, blank ones skipped"


def test_printed_vectors_stream_a_step_at_a_time(cli: CLI, tmp_path: Path) -> None:
    """The NDJSON lines come out as each step of texts is embedded, not all at the end: Ctrl-C after the first
    leaves those printed (and `| head -1` ends the work). A text too long for the window, wherever it is, is the
    error before any line is printed."""
    f = tmp_path / "many.txt"
    f.write_text("".join(f"line {n} of many\n" for n in range(1, 1001)))
    # (base64 of 2 floats: a step's lines are a few KB, written whole to the pipe)
    p = cli.popen("embed", "--file", str(f), "--dimensions", "2", "--format", "base64", stdout=subprocess.PIPE,
                  stderr=subprocess.PIPE, text=True)
    first = p.stdout.readline()
    p.send_signal(signal.SIGINT)
    rest, err = p.communicate(timeout=120)
    lines = [first, *rest.splitlines(keepends=True)]
    assert p.returncode == 130 and 1 <= len(lines) < 1000, (p.returncode, len(lines), err)
    assert len(lines) % STEP == 0, f"{len(lines)} lines: whole steps printed as each was embedded"
    assert [json.loads(line)["id"] for line in lines] == [str(n) for n in range(1, len(lines) + 1)]
    f.write_text("".join(f"line {n}\n" for n in range(1, 100)) + "word " * 300 + "\n")
    r = cli("embed", "--file", str(f), "--ctx", "128")
    assert r.returncode != 0 and r.stdout == "", r.stdout[:200]
    assert "a text is" in r.stderr and "tokens" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_embed_options(cli: CLI, tmp_path: Path) -> None:
    f = tmp_path / "in.jsonl"
    f.write_text('{"id": "a", "text": "first"}\n{"id": "b", "text": "second"}\n')
    r = cli("embed", "--file", str(f), "--json", "--dimensions", "64")
    doc = json.loads(r.stdout)
    assert doc["model"] == "smollm2:135m" and doc["pooling"] == "mean" and doc["dimensions"] == 64
    assert [d["id"] for d in doc["data"]] == ["a", "b"] and all(len(d["embedding"]) == 64 for d in doc["data"])
    assert abs(math.sqrt(sum(x * x for x in doc["data"][0]["embedding"])) - 1) < 1e-6, "normalised after the cut"
    b64 = json.loads(cli("embed", "first", "--format", "base64").stdout)["embedding"]
    raw = base64.b64decode(b64)
    floats = list(struct.unpack(f"<{len(raw) // 4}f", raw))
    plain = _vectors(cli("embed", "first"))[0]
    assert max(abs(x - y) for x, y in zip(floats, plain, strict=True)) < 1e-6
    unnormed = _vectors(cli("embed", "first", "--no-normalize"))[0]
    assert math.sqrt(sum(x * x for x in unnormed)) > 1.5
    mean, last = (_vectors(cli("embed", TEXTS[0], "--pooling", p))[0] for p in ("mean", "last"))
    assert _cos(last, mean) < 0.999, "another pooling, another vector"
    long = "word " * 300  # past the least window (256): truncated, 256 tokens are embedded
    r = cli("embed", long, "--ctx", "256")
    assert r.returncode == 2 and "the embeddings window is 256" in r.stderr and "--truncate" in r.stderr
    assert cli("embed", long, "--ctx", "256", "--truncate").returncode == 0
    for args, needle in ((["--format", "hex", "x"], "--format takes float or base64"),
                         (["--pooling", "max", "x"], "--pooling takes mean, cls or last"),
                         (["--dimensions", "9999", "x"], "error: --dimensions must be within 1 to 576"),
                         ([], "nothing to embed")):
        r = cli("embed", *args)
        assert r.returncode == 2 and needle in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_a_text_longer_than_the_window_could_hold_is_not_tokenized_whole(cli: CLI) -> None:
    """docs/embeddings.md: a 4 MB line piped to embed was tokenized whole (894,384 tokens, seconds a megabyte) to
    keep its first window; now past a megabyte only the beginning that holds more than the window is."""
    from localgen.quant.text import default_text

    words = " ".join(default_text().split())
    big = words * (2 * 2**20 // len(words) + 1)  # over 2 MB on one line
    r = cli("embed", "--ctx", "256", input=big)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert re.search(r"a text is more than [\d,]+ tokens; the embeddings window is 256", r.stderr), r.stderr
    cut = _vectors(cli("embed", "--ctx", "256", "--truncate", input=big))
    assert cut == _vectors(cli("embed", "--ctx", "256", "--truncate", input=big[:20_000])), "its first 256 tokens"


# 1 - cosine against llama-embedding's stored vectors, as measured: SmolLM2 (Q4_1, Q8_0) 2.5e-13 on the CPU
# that made them, which is float rounding of the same numbers; 3.8e-5 on an AMD EPYC (AVX2, no AVX-512) against
# them, whose kernels sum in another order; Gemma 3 (Q4_K_M) 5.5e-4 on a Xeon without AVX-512 against a
# fixture made on another CPU, whose K-quant kernels round differently. Whether this CPU computes as the one
# that made them: tests/conftest.py's reference_kernels.
EMBEDDING_TOLERANCE = {"smollm2": 1e-9, "gemma3": 1e-3}
ACROSS_CPUS = {"smollm2": 1e-4, "gemma3": 1e-3}
SCORE_GAP, SCORE_GAP_ACROSS_CPUS = 1e-5, 2e-4  # the tiny reranker's scores (7.4e-5 measured across CPUs)


@pytest.mark.parametrize("model", sorted(EMBEDDING_TOLERANCE))
def test_vectors_match_llama_embedding_within_what_each_model_measured(cli: CLI, model: str,
                                                                      gemma_path: Path) -> None:
    """tests/data/llama_embedding_<model>.json holds llama-embedding's vectors (same vendored llama.cpp,
    same texts and pooling); scripts/embeddings_reference.py regenerates them and compares live."""
    ref = json.loads((ROOT / "tests" / "data" / f"llama_embedding_{model}.json").read_text())
    ours = _vectors(cli("embed", "-m", ref["model"], "--pooling", ref["pooling"], *ref["texts"]))
    sims = [_cos(mine, theirs) for mine, theirs in zip(ours, ref["embeddings"], strict=True)]
    tolerance = (EMBEDDING_TOLERANCE if reference_kernels() else ACROSS_CPUS)[model]
    assert max(1 - s for s in sims) < tolerance, sims


def test_similar_refuses_a_query_longer_than_the_window_before_embedding_it(ecli: CLI, tmp_path: Path) -> None:
    """embed.md: a `similar` query longer than the window is an error that says so, exit 2, before any of it is
    embedded (a 100 KB query was cut and embedded for minutes, unasked), or is cut with --truncate, as embed's
    texts are."""
    r = ecli("embed", *TEXTS[:2], "--store", "notes")
    assert r.returncode == 0, r.stderr
    long = "word " * 20_000  # 100 KB, 20,001 tokens with the BOS
    r = ecli("similar", "notes", long)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert "the query is 20,001 tokens; the embeddings window is 4,096 (give a shorter query, or --truncate " \
           "to embed its first 4,096 tokens)" in r.stderr, r.stderr
    # --truncate, where the window is the model's training context (the tiny BERT's 512): filling SmolLM2's 4,096
    # took this test four minutes of one core
    from tests.tiny_bert import build

    bert = build(tmp_path / "tiny-bert.gguf")
    r = ecli("embed", *TEXTS[:2], "--store", "small", "-m", str(bert))
    assert r.returncode == 0, r.stderr
    r = ecli("similar", "small", long[:5_000])
    assert r.returncode == 2 and "; the embeddings window is 512 (give a shorter query, or --truncate to embed its " \
        "first 512 tokens)" in r.stderr, r.stderr
    r = ecli("similar", "small", long[:5_000], "--truncate", "-n", "2")
    assert r.returncode == 0, r.stderr
    assert sorted(json.loads(line)["content"] for line in r.stdout.splitlines()) == sorted(TEXTS[:2])


def test_collections_store_skip_unchanged_and_find_neighbours(ecli: CLI, tmp_path: Path) -> None:
    docs = tmp_path / "docs.txt"
    docs.write_text("\n".join([*TEXTS, "Stocks fell sharply on Monday."]) + "\n")
    r = ecli("embed", "--file", str(docs), "--store", "notes")
    assert r.returncode == 0 and r.stdout == "" and "4 embedded and stored, 0 unchanged" in r.stderr
    docs.write_text("\n".join([*TEXTS, "Stocks rose on Tuesday."]) + "\n")
    r = ecli("embed", "--file", str(docs), "--store", "notes")
    assert "1 embedded and stored, 3 unchanged" in r.stderr, "only the changed text was embedded again"
    r = ecli("similar", "notes", "a kitten on a carpet", "-n", "2")
    assert r.returncode == 0, r.stderr
    hits = [json.loads(line) for line in r.stdout.splitlines()]
    assert {h["id"] for h in hits} == {"1", "2"} and hits[0]["score"] >= hits[1]["score"]
    assert hits[0]["content"] in TEXTS[:2]
    r = ecli("embed", "x", "--store", "notes", "--dimensions", "32")
    assert r.returncode == 2 and "holds smollm2:135m vectors" in r.stderr
    assert "(use --dimensions 576, or another collection name)" in r.stderr, "the hint names what differs"
    r = ecli("embed", "x", "--store", "notes", "--pooling", "cls")
    assert r.returncode == 2 and "(use --pooling mean, or another collection name)" in r.stderr, r.stderr
    r = ecli("embed", "x", "--store", "notes", "-m", "gemma3:270m", "--pooling", "cls")
    assert r.returncode == 2 and "(use -m smollm2:135m, or another collection name)" in r.stderr, r.stderr
    r = ecli("similar", "nope", "x")
    assert r.returncode == 2 and "no collection named 'nope' (there are: notes)" in r.stderr
    # entries are keyed by line number: a line deleted from the file moves the lines below it up (embedded
    # again at their new numbers), and the last number keeps its old text (docs/embed.md says so)
    docs.write_text("\n".join([TEXTS[0], TEXTS[2], "Stocks rose on Tuesday."]) + "\n")
    r = ecli("embed", "--file", str(docs), "--store", "notes")
    assert "2 embedded and stored, 1 unchanged" in r.stderr, r.stderr
    hits = ecli("similar", "notes", "x", "-n", "9").stdout.splitlines()
    held = {h["id"]: h["content"] for h in map(json.loads, hits)}
    assert held == {"1": TEXTS[0], "2": TEXTS[2], "3": "Stocks rose on Tuesday.", "4": "Stocks rose on Tuesday."}
    db = Path(ecli.env["LOCALGEN_HOME"]) / "data" / "embeddings" / "embeddings.db"
    assert oct(db.stat().st_mode & 0o777) == "0o600" and oct(db.parent.stat().st_mode & 0o777) == "0o700"


def test_similar_embeds_the_query_with_the_layouts_the_collection_was_embedded_with(ecli: CLI, tmp_path: Path,
                                                                                   gemma_path: Path) -> None:
    embedded = Path(ecli.env["LOCALGEN_HOME"]) / "data" / "embedded"
    embedded.mkdir(parents=True)
    os.link(gemma_path, embedded / gemma_path.name)  # the session's Gemma, not assembled again
    docs = tmp_path / "docs.txt"
    docs.write_text(f"{TEXTS[0]}\n{TEXTS[2]}\n")
    r = ecli("embed", "-m", "gemma3:270m", "--file", str(docs), "--store", "plain", "--no-repack")
    assert r.returncode == 0, r.stderr

    def best(*flags: str) -> dict[str, Any]:
        r = ecli("similar", "plain", TEXTS[0], "-n", "1", *flags)
        assert r.returncode == 0, r.stderr
        return dict(json.loads(r.stdout))

    alike = best("--no-repack")
    assert alike["content"] == TEXTS[0] and alike["score"] == 1.0, "the query's vector is its stored one"
    # by default similar repacks (as embed does), and Gemma 3's repacked Q4_K matrices round differently
    assert best()["score"] < 1.0


@pytest.fixture(scope="module")
def server(cli_env: dict[str, str]) -> Iterator[Server]:
    s = Server(cli_env, "-np", "2", "--ctx", "512")  # a window-long text is cheap to embed (truncation)
    yield s
    assert s.stop() == 0


def test_serve_embeddings_for_the_openai_and_ollama_clients(server: Server, cli: CLI) -> None:
    import ollama
    import openai

    local = _vectors(cli("embed", *TEXTS))
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x")
    r = client.embeddings.create(model="smollm2:135m", input=TEXTS)
    assert [d.index for d in r.data] == [0, 1, 2] and r.usage.prompt_tokens > 9
    for d, want in zip(r.data, local, strict=True):
        assert _cos(d.embedding, want) > 1 - 1e-5, "the server embeds as `localgen embed` does"
    short = client.embeddings.create(model="smollm2:135m", input="hello", dimensions=32, encoding_format="base64")
    assert len(base64.b64decode(str(short.data[0].embedding))) == 32 * 4, "32 float32s"
    o = ollama.Client(host=server.url)
    e = o.embed(model="smollm2:135m", input=TEXTS)
    assert len(e.embeddings) == 3 and _cos(list(e.embeddings[0]), local[0]) > 1 - 1e-5
    legacy = o.embeddings(model="smollm2:135m", prompt=TEXTS[1])
    assert _cos(list(legacy.embedding), local[1]) > 1 - 1e-5
    import httpx

    bad = httpx.post(f"{server.url}/v1/embeddings", json={"model": "smollm2:135m", "input": [1, 2]})
    assert bad.status_code == 400 and "list of strings" in bad.json()["error"]["message"]
    long = httpx.post(f"{server.url}/v1/embeddings", json={"model": "smollm2:135m", "input": "word " * 700})
    assert long.status_code == 400 and "window is 512" in long.json()["error"]["message"]
    assert long.json()["error"]["code"] == "context_length_exceeded"
    ok = httpx.post(f"{server.url}/api/embed", json={"model": "smollm2:135m", "input": "word " * 700}, timeout=120)
    assert ok.status_code == 200 and ok.json()["prompt_eval_count"] == 512, "Ollama truncates by default"
    # past the characters a window's tokens come from: cut where truncation is on (it was refused unread), and
    # refused before it is tokenized where it is off, naming the input at fault
    huge = "word " * 3400  # 17,000 characters: more than 512 tokens of 32 characters each could hold
    for truncate in ({}, {"truncate": True}):
        ok = httpx.post(f"{server.url}/api/embed", timeout=120,
                        json={"model": "smollm2:135m", "input": ["hi", huge], **truncate})
        assert ok.status_code == 200 and len(ok.json()["embeddings"]) == 2, ok.text
    said = "`input[1]` is 17,000 characters; a slot's window of 512 tokens takes at most 16,384 here"
    bad = httpx.post(f"{server.url}/v1/embeddings", json={"model": "smollm2:135m", "input": ["hi", huge]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input[1]", bad.text
    assert bad.json()["error"]["message"] == said, bad.text
    bad = httpx.post(f"{server.url}/api/embed", json={"model": "smollm2:135m", "input": ["hi", huge],
                                                      "truncate": False})
    assert (bad.status_code, bad.json()["error"]) == (400, said), bad.text  # Ollama's shape
    vast = httpx.post(f"{server.url}/api/embed", json={"model": "smollm2:135m", "input": "w " * (3 << 20)},
                      timeout=120)
    assert vast.status_code == 200 and vast.json()["prompt_eval_count"] == 512, vast.text  # cut, however long
    assert server.health()["alive"]


# ---- a model's own pooling, reranking, and models refusing what they cannot do (tests/tiny_bert.py) ----

@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.tiny_bert import build

    d = tmp_path_factory.mktemp("tiny")
    return {"bert": build(d / "tiny-bert.gguf"), "reranker": build(d / "tiny-bert-reranker.gguf", rank=True)}


def test_an_embedding_model_names_its_own_pooling(cli: CLI, tiny: dict[str, Path]) -> None:
    ref = json.loads((ROOT / "tests" / "data" / "llama_embedding_tiny_bert.json").read_text())
    r = cli("embed", "-m", str(tiny["bert"]), *ref["texts"], "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["pooling"] == "cls" and doc["dimensions"] == 64, "read from the GGUF, not chosen by localgen"
    sims = [_cos(d["embedding"], want) for d, want in zip(doc["data"], ref["embeddings"], strict=True)]
    assert min(sims) > 1 - 1e-4, sims


def test_normalize_and_no_normalize_each_do_what_they_say(cli: CLI, tiny: dict[str, Path]) -> None:
    """embed.md: vectors are L2-normalised unless --no-normalize; the positive form, --normalize, parses and
    normalises."""
    def norms(flag: str) -> list[float]:
        r = cli("embed", "-m", str(tiny["bert"]), flag, *TEXTS)
        assert r.returncode == 0, r.stderr
        return [math.sqrt(sum(x * x for x in v)) for v in _vectors(r)]

    assert all(abs(n - 1) < 1e-6 for n in norms("--normalize"))
    assert all(abs(n - 1) > 1e-3 for n in norms("--no-normalize"))


def test_similar_gives_10_by_default(ecli: CLI, tiny: dict[str, Path], tmp_path: Path) -> None:
    """embed.md: `similar` gives the nearest 10 texts without -n/--count (12 stored)."""
    docs = tmp_path / "docs.txt"
    docs.write_text("".join(f"Note number {i} is about topic {i}.\n" for i in range(12)))
    r = ecli("embed", "-m", str(tiny["bert"]), "--file", str(docs), "--store", "notes")
    assert r.returncode == 0 and "12 embedded and stored" in r.stderr, r.stderr
    r = ecli("similar", "notes", "topic 3")
    assert r.returncode == 0, r.stderr
    hits = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(hits) == 10 and len({h["id"] for h in hits}) == 10, hits
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)


def test_rerank_tokenizes_the_query_once_and_pairs_as_a_whole_text_would(tiny: dict[str, Path]) -> None:
    """#41: a rerank request's query is tokenized once, not once per document, and each pair's tokens are
    still what tokenizing the whole pair gives ([CLS] query [SEP] [SEP] document [SEP]: llama-embedding puts the
    EOS and the SEP text between, both [SEP] in BERT's vocabulary)."""
    from localgen.engine.embed import Embedder
    from localgen.engine.llama import Engine
    from localgen.models.resolve import resolve
    from localgen.types import LoadParams

    eng = Engine(resolve(str(tiny["reranker"])), LoadParams(n_ctx=512))
    emb = Embedder(eng, scores=True)
    query = "what is the capital of france"
    docs = ["paris is the capital of france", "", " a cat sat on the mat", "llamas are native to south america"]
    seen: list[str] = []
    tokenize = eng.tokenize

    def counting(text: str, add_special: bool) -> list[int]:
        seen.append(text)
        return tokenize(text, add_special)

    eng.tokenize = counting  # type: ignore[method-assign]
    try:
        pairs = [emb.pair_tokens(query, d) for d in docs]
        with_query = sum(query in t for t in seen)
        pairs += [emb.pair_tokens(query, d) for d in docs * 25]
        assert sum(query in t for t in seen) == with_query, "100 more documents tokenized the query again"
    finally:
        eng.tokenize = tokenize  # type: ignore[method-assign]
        emb.close()
    cls_, sep = tokenize("[CLS]", False), tokenize("[SEP]", False)
    for d, got in zip(docs, pairs, strict=False):
        assert got == tokenize(query + "[SEP][SEP]" + d, True), d
        assert got[:1] == cls_ and got[-1:] == sep and got.count(sep[0]) == 3, got


def test_rerank_scores_match_llama_cpps(cli: CLI, tiny: dict[str, Path], tmp_path: Path) -> None:
    ref = json.loads((ROOT / "tests" / "data" / "llama_rerank_tiny_bert.json").read_text())
    cli = CLI({**cli.env, **NO_GPU})  # llama.cpp's scores were computed on a CPU (a GPU's differ by 1e-3)
    r = cli("rerank", "-m", str(tiny["reranker"]), ref["query"], *ref["documents"])
    assert r.returncode == 0, r.stderr
    got = [json.loads(line) for line in r.stdout.splitlines()]
    assert [g["score"] for g in got] == sorted((g["score"] for g in got), reverse=True), "best first"
    for g in got:
        i = int(g["id"]) - 1
        gap = SCORE_GAP if reference_kernels() else SCORE_GAP_ACROSS_CPUS
        assert abs(g["score"] - ref["scores"][i]) < gap and g["document"] == ref["documents"][i]
    f = tmp_path / "docs.jsonl"
    f.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(ref["documents"])))
    top = [json.loads(line) for line in cli("rerank", "-m", str(tiny["reranker"]), ref["query"], "--file", str(f),
                                            "--top", "2").stdout.splitlines()]
    assert [t["id"] for t in top] == [f"d{int(g['id']) - 1}" for g in got[:2]]
    # its errors speak of reranking: a document too long for the window with the query, nothing to rerank
    r = cli("rerank", "-m", str(tiny["reranker"]), ref["query"], "the cat sat " * 300)
    assert r.returncode == 2 and re.search(r"a document is [\d,]+ tokens with the query; the reranker's window is "
                                           r"512, the most this model was trained on \(--truncate to score the "
                                           r"pair's first tokens\)",
                                           r.stderr), r.stderr
    assert "embed" not in r.stderr
    r = cli("rerank", "-m", str(tiny["reranker"]), ref["query"], input="\n \n")
    assert r.returncode == 2 and "nothing to rerank: every line of stdin is blank" in r.stderr, r.stderr


def test_models_refuse_what_they_cannot_do(cli: CLI, tiny: dict[str, Path]) -> None:
    for args, needle in ((["run", "-m", str(tiny["bert"]), "-p", "hi"], "is an encoder model"),
                         (["run", "-m", str(tiny["bert"]), "--raw", "-p", "hi"], "is an encoder model"),
                         (["embed", "-m", str(tiny["reranker"]), "x"], "is a reranker"),
                         # an embedding model was called a reranker (`bert.gguf is a reranker`)
                         (["embed", "-m", str(tiny["bert"]), "--pooling", "rank", "x"],
                          "--pooling rank needs a reranker model and gives relevance scores, not embeddings"),
                         (["rerank", "query", "a document"], "smollm2:135m is not a reranker"),
                         (["rerank", "-m", str(tiny["bert"]), "query", "doc"],
                          "is not a reranker (its pooling is cls")):
        r = cli(*args)
        assert r.returncode == 2 and needle in r.stderr and r.stderr.count("\n") == 1, (args, r.stderr)
    r = cli("chat", "-m", str(tiny["bert"]), input="hi\n")
    assert r.returncode == 2 and "is an encoder model" in r.stderr


def test_serve_reranks_and_refuses_chat_on_an_encoder(cli_env: dict[str, str], tiny: dict[str, Path]) -> None:
    import httpx

    ref = json.loads((ROOT / "tests" / "data" / "llama_rerank_tiny_bert.json").read_text())
    s = Server({**cli_env, **NO_GPU}, "-m", str(tiny["bert"]), "-m", str(tiny["reranker"]))  # CPU's scores
    try:
        r = httpx.post(f"{s.url}/v1/rerank", timeout=60, json={
            "model": "tiny-bert-reranker.gguf", "query": ref["query"], "documents": ref["documents"], "top_n": 3,
            "return_documents": True})
        assert r.status_code == 200, r.text
        doc = r.json()
        assert len(doc["results"]) == 3 and doc["usage"]["prompt_tokens"] > 20
        for res in doc["results"]:
            gap = SCORE_GAP if reference_kernels() else SCORE_GAP_ACROSS_CPUS
            assert abs(res["relevance_score"] - ref["scores"][res["index"]]) < gap
            assert res["document"]["text"] == ref["documents"][res["index"]]
        scores = [res["relevance_score"] for res in doc["results"]]
        assert scores == sorted(scores, reverse=True)
        chat = httpx.post(f"{s.url}/v1/chat/completions", timeout=60, json={
            "model": "tiny-bert.gguf", "messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 400 and "is an encoder model" in chat.json()["error"]["message"]
        emb = httpx.post(f"{s.url}/v1/embeddings", timeout=60, json={"model": "tiny-bert-reranker.gguf", "input": "x"})
        assert emb.status_code == 400 and "is a reranker" in emb.json()["error"]["message"]
        scores = httpx.post(f"{s.url}/v1/rerank", timeout=60, json={
            "model": "tiny-bert.gguf", "query": "q", "documents": ["a"]})
        assert scores.status_code == 400 and "is not a reranker" in scores.json()["error"]["message"]
        # a model of the wrong kind is the request's `model` at fault, as OpenAI's errors name it
        assert [x.json()["error"]["param"] for x in (chat, emb, scores)] == ["model"] * 3
        ok = httpx.post(f"{s.url}/v1/embeddings", timeout=60, json={"model": "tiny-bert.gguf", "input": "the cat"})
        assert ok.status_code == 200 and len(ok.json()["data"][0]["embedding"]) == 64
        # nothing to embed loads an encoder as any embedding model, Ollama's and llama-server's ways (a generation
        # job loaded it, then was refused: "is an encoder model", a 400)
        for model in ("tiny-bert.gguf", "tiny-bert-reranker.gguf"):
            assert httpx.post(f"{s.url}/models/unload", json={"model": model}, timeout=60).status_code == 200
            for path, body, answer in (("/api/embed", {"input": []}, {"model": model, "embeddings": []}),
                                       ("/api/embeddings", {}, {"embedding": []}),
                                       ("/models/load", {}, {"success": True})):
                r = httpx.post(f"{s.url}{path}", json={"model": model, **body}, timeout=60)
                assert (r.status_code, r.json()) == (200, answer), (model, path, r.text)
            loaded = httpx.get(f"{s.url}/api/ps", timeout=10).json()["models"]
            assert model in [m["name"] for m in loaded], loaded
        # docs/api.md: documents are cut to fit beside the query, one past the characters the window's tokens
        # come from too (it was refused unread)
        cut = httpx.post(f"{s.url}/v1/rerank", timeout=60, json={
            "model": "tiny-bert-reranker.gguf", "query": "a cat", "documents": ["the cat sat " * 1400, "a dog"]})
        assert cut.status_code == 200 and len(cut.json()["results"]) == 2, cut.text
        # docs/serve.md: no batching mode is said for an encoder, which generates nothing (the generation's
        # throughput line, with its flash-attention reason, was)
        log = s.log()
        assert "tiny-bert.gguf" in log and "batching" not in log and "KV cells" not in log, log
    finally:
        assert s.stop() == 0


def test_lines_end_at_newlines_alone_and_a_blank_argument_is_a_usage_error(cli: CLI, tiny: dict[str, Path],
                                                                           tmp_path: Path) -> None:
    """docs/embed.md, "Input": one text a line, lines ending at "\\n" (or "\\r\\n"), not at the other characters
    str.splitlines() takes (a form feed, U+0085, U+2028), which a JSON line written with ensure_ascii=False holds
    as they are; an empty or blank argument (an empty variable in a script) is exit 2, for embed and rerank."""
    bert, reranker = str(tiny["bert"]), str(tiny["reranker"])
    f = tmp_path / "in.jsonl"
    f.write_text(json.dumps({"id": "a", "text": "one\u2028two\x0cthree\x1c\x85"}, ensure_ascii=False) + "\n"
                 + json.dumps({"id": "b", "text": "next"}) + "\n", encoding="utf-8")
    r = cli("embed", "-m", bert, "--file", str(f))
    assert r.returncode == 0 and [d["id"] for d in map(json.loads, r.stdout.splitlines())] == ["a", "b"], r.stderr
    r = cli("embed", "-m", bert, input="a\x0cb\r\nc\u2028d\u0085e\n")
    assert r.returncode == 0 and [d["id"] for d in map(json.loads, r.stdout.splitlines())] == ["1", "2"], r.stderr
    r = cli("rerank", "-m", reranker, "q", input="a\u2028b\nc\n")
    lines = r.stdout.split("\n")  # (not splitlines: the document holds U+2028 as it is)
    assert r.returncode == 0 and sorted(json.loads(x)["document"] for x in lines if x) == ["a\u2028b", "c"], r.stderr
    for args, error in ((["embed", "-m", bert, "--store", "emp", ""], "text 1 is empty (give the text"),
                        (["embed", "-m", bert, "cat", "   "], "text 2 is empty or only whitespace"),
                        (["rerank", "-m", reranker, "cat", ""], "document 1 is empty (give the document")):
        r = cli(*args)
        assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, (args, r.stderr)
        assert error in r.stderr and "loading" not in r.stderr, (args, r.stderr)


def test_a_window_at_the_models_trained_limit_does_not_suggest_a_larger_ctx(cli: CLI, tiny: dict[str, Path]) -> None:
    """The tiny BERT was trained on 512 tokens: a --ctx past it is capped, and said so once (as run says it);
    a text longer than that window is refused naming the trained limit, with no "raise --ctx" that cannot help.
    Below the limit, a larger --ctx is still the advice."""
    bert, reranker = str(tiny["bert"]), str(tiny["reranker"])
    long = "word " * 600
    r = cli("embed", "-m", bert, long, "--ctx", "4096")
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert r.stderr == ("warning: --ctx 4,096 is past the 512 tokens tiny-bert.gguf was trained on: the window is "
                        "512\n"
                        f"localgen: error: a text is {r.stderr.split('a text is ')[1].split(' ')[0]} tokens; the "
                        "embeddings window is 512, the most this model was trained on (--truncate to embed its "
                        "first tokens)\n"), r.stderr
    r = cli("embed", "-m", bert, long)  # the default --ctx, capped: no warning, the same error
    assert r.returncode == 2 and "window is 512, the most this model was trained on (--truncate" in r.stderr
    assert "warning" not in r.stderr and "--ctx" not in r.stderr, r.stderr
    r = cli("rerank", "-m", reranker, "q", long)
    assert r.returncode == 2 and "the reranker's window is 512, the most this model was trained on (--truncate to " \
                                 "score the pair's first tokens)" in r.stderr, r.stderr
    r = cli("embed", "-m", bert, long, "--ctx", "256")
    assert r.returncode == 2 and "window is 256 (raise --ctx, or --truncate" in r.stderr, r.stderr


def test_a_text_too_long_once_tokenized_is_named_by_its_index(server: Server) -> None:
    """docs/api.md: a text longer than the window is a 400 naming it (param `input[N]`), also where it was found
    too long only once tokenized (it was "a text", with param null)."""
    import httpx

    long = "the cat sat on the mat " * 120  # 2,760 characters: under 512 × 32, some 700 tokens
    r = httpx.post(f"{server.url}/v1/embeddings", timeout=120,
                   json={"model": "smollm2:135m", "input": ["hi", "hello", long]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input[2]", r.text
    assert re.fullmatch(r"`input\[2\]` is \d{3} tokens; the embeddings window is 512", r.json()["error"]["message"])
    assert r.json()["error"]["code"] == "context_length_exceeded"
    one = httpx.post(f"{server.url}/v1/embeddings", timeout=120, json={"model": "smollm2:135m", "input": long * 2})
    assert one.json()["error"]["param"] == "input", one.text
    assert re.fullmatch(r"`input` is 1,\d{3} tokens; the embeddings window is 512", one.json()["error"]["message"])
    ollama = httpx.post(f"{server.url}/api/embed", timeout=120,
                        json={"model": "smollm2:135m", "input": ["hi", long], "truncate": False})
    assert ollama.status_code == 400 and ollama.json()["error"].startswith("`input[1]` is "), ollama.text
