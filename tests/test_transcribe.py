"""OpenAI's speech-to-text routes on an audio model (docs/media.md, "Transcription"): SmolLM2 with the seeded
Ultravox-kind projector (scripts/make_mmproj.py) hears the test clip, and with llama-mtmd-cli's prompt its
transcription is llama-mtmd-cli's own answer (tests/data/llama_mtmd_cli.json), whole through OpenAI's client,
streamed as transcript.text.delta events, or as plain text; what it cannot honour is a 4xx naming the field."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import NO_GPU, ROOT
from tests.test_serve import Server

sys.path.insert(0, str(ROOT / "scripts"))
from make_mmproj import png, write_audio_mmproj
from mtmd_reference import write_media

REFERENCE = json.loads((ROOT / "tests" / "data" / "llama_mtmd_cli.json").read_text())
CASE = next(c for c in REFERENCE["cases"] if c["media"] == ["1.5s"])
# llama-mtmd-cli's run: its prompt, its length, every token kept (ignore_eos), and the answer alone (exact)
AS_THE_REFERENCE = {"prompt": CASE["prompt"], "max_tokens": CASE["max_tokens"], "ignore_eos": True, "exact": True}


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(write_media(tmp_path_factory.mktemp("clip"), "1.5s"))


@pytest.fixture(scope="module")
def server(cli_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    projector = write_audio_mmproj(tmp_path_factory.mktemp("proj") / "audio.gguf")
    # on the CPU, on any machine: the words are compared with llama-mtmd-cli's on a CPU (a random-weight model's
    # words, which a GPU's kernels change)
    s = Server({**cli_env, **NO_GPU}, "--mmproj", str(projector), "--ctx", "1024", "--threads",
               str(REFERENCE["threads"]), "--max-body", "256k")
    yield s
    assert s.stop() == 0


def _client(server: Server) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none")


def _post(server: Server, clip: Path, path: str = "transcriptions", **fields: str) -> httpx.Response:
    with clip.open("rb") as f:
        return httpx.post(f"{server.url}/v1/audio/{path}", files={"file": (clip.name, f, "audio/wav")},
                          data=fields, timeout=120)


def test_the_openai_client_transcribes_as_llama_mtmd_cli_answers(server: Server, clip: Path) -> None:
    client = _client(server)
    with clip.open("rb") as f:
        out = client.audio.transcriptions.create(model="smollm2:135m", file=f, prompt=CASE["prompt"],
                                                 extra_body={k: v for k, v in AS_THE_REFERENCE.items()
                                                             if k != "prompt"})
    assert out.text == CASE["text"]
    assert out.usage is not None and out.usage.output_tokens == CASE["max_tokens"]
    assert out.usage.input_tokens > 375  # the clip's 375 tokens, and the prompt's


def test_a_stream_gives_the_same_words_as_deltas_then_done(server: Server, clip: Path) -> None:
    client = _client(server)
    with clip.open("rb") as f:
        events = list(client.audio.transcriptions.create(
            model="smollm2:135m", file=f, stream=True, prompt=CASE["prompt"],
            extra_body={k: v for k, v in AS_THE_REFERENCE.items() if k != "prompt"}))
    kinds = [e.type for e in events]
    assert kinds[-1] == "transcript.text.done" and set(kinds[:-1]) == {"transcript.text.delta"}
    assert "".join(e.delta for e in events[:-1]) == events[-1].text == CASE["text"]
    assert events[-1].usage.output_tokens == CASE["max_tokens"]


def test_text_translations_and_a_language(server: Server, clip: Path) -> None:
    r = _post(server, clip, response_format="text",
              **{k: json.dumps(v) if not isinstance(v, str) else v for k, v in AS_THE_REFERENCE.items()})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert r.text == CASE["text"] + "\n"
    bounded = {"max_tokens": "4", "ignore_eos": "true"}
    plain = _post(server, clip, **bounded).json()
    # OpenAI's model names (Open WebUI sends whisper-1 unless told) mean the default model
    assert _post(server, clip, model="whisper-1", **bounded).json() == plain
    german = _post(server, clip, language="de", **bounded).json()
    translated = _post(server, clip, "translations", **bounded).json()
    for doc in (plain, german, translated):
        assert isinstance(doc["text"], str) and doc["usage"]["output_tokens"] == 4
    # the spoken language is told to the model: a longer instruction than the plain one
    assert german["usage"]["input_tokens"] > plain["usage"]["input_tokens"]


@pytest.mark.parametrize(("fields", "status", "param", "said"), [
    ({"response_format": "srt"}, 400, "response_format", "has timestamps"),
    ({"response_format": "verbose_json"}, 400, "response_format", "has timestamps"),
    ({"response_format": "xml"}, 400, "response_format", "must be json or text"),
    ({"timestamp_granularities[]": "word"}, 400, "timestamp_granularities", "gives no timestamps"),
    ({"bogus": "1"}, 400, "bogus", "unknown field `bogus`"),
    ({"stream": "maybe"}, 400, "stream", "stream must be true or false"),
    ({"temperature": "9"}, 400, "temperature", "temperature"),
    ({"model": "gemma3:270m"}, 400, "file", "reads text only"),
])
def test_what_cannot_be_honoured_is_refused(server: Server, clip: Path, fields: dict[str, str], status: int,
                                            param: str, said: str) -> None:
    r = _post(server, clip, **fields)
    assert r.status_code == status and r.json()["error"]["param"] == param, r.text
    assert said in r.json()["error"]["message"], r.text


def test_bad_uploads_name_the_file(server: Server, tmp_path: Path) -> None:
    url = f"{server.url}/v1/audio/transcriptions"
    picture = tmp_path / "cat.png"
    picture.write_bytes(png(8, 8))
    for path, said in ((picture, "is a PNG image, not audio"), (Path(__file__), "not an image, audio or video file")):
        r = httpx.post(url, files={"file": (path.name, path.read_bytes())}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "file" and said in r.text, r.text
    r = httpx.post(url, json={"file": "clip.wav"}, timeout=30)
    assert r.status_code == 415 and "multipart/form-data" in r.text
    r = httpx.post(url, files={"model": (None, "smollm2:135m")}, timeout=30)  # a form of text fields only
    assert r.status_code == 400 and "the form has no file" in r.text
    # a bad part of the form says what is wrong with it (it said "Invalid multipart data")
    r = httpx.post(url, files={"file": ("a" * 5000 + ".wav", b"RIFF")}, timeout=30)
    assert r.status_code == 400 and "the file name is too long" in r.text and "255 characters" in r.text, r.text
    r = httpx.post(url, files=[("file", ("a.wav", b"RIFF")), ("file", ("b.wav", b"RIFF"))], timeout=30)
    assert r.status_code == 400 and "the form has more than one file" in r.text, r.text
    r = httpx.post(url, files={"file": ("big.wav", b"\0" * 300_000)}, timeout=30)  # over --max-body 256k
    assert r.status_code == 413 and "serve --max-body" in r.text
    # a web page of another origin cannot send a form here
    r = httpx.post(url, files={"file": ("a.wav", b"RIFF")}, headers={"Origin": "https://evil.example"}, timeout=30)
    assert r.status_code == 403
