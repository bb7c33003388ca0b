"""Errors in each API's shape (serve/apierror.py), in process: which shape a path gets, and the extra fields a
request's errors carry (set once per request, in every shape: a whole answer's, a stream's error event, the
gate's refusals). Over HTTP: tests/test_serve.py."""

from __future__ import annotations

import pytest

from localgen.serve.apierror import ANTHROPIC, ERROR_EXTRA, OLLAMA, OPENAI, HTTPError, api_of, error_body


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
