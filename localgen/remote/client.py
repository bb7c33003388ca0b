"""The remote implementation of the generation protocol (backend.py): requests go to OpenAI-compatible
servers (vLLM, SGLang, llama-server, Ollama's /v1, LM Studio, `localgen serve`) as streamed
/chat/completions or /completions calls over httpx, and come back as the same Chunks and Stats as a local
run, with time to first token and inter-token gaps measured here, on the client.

The answer is read by remote/stream.py. 429 and 503 before the answer starts are retried with backoff
(Retry-After honoured); a server that refuses stream_options gets the request again without them, a try that
is not one of those. Every other failure is one RemoteError, marked `partial` once text has arrived and `down`
when the endpoint itself is gone (run --file then moves its lines to the other endpoints)."""

from __future__ import annotations

import contextlib
import json
import math
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from localgen.errors import RemoteError
from localgen.proxies import connection_reason, direct_mounts, tls
from localgen.remote.endpoints import Endpoint
from localgen.remote.errortext import error_text
from localgen.remote.stream import URL_HINT, bounded, events, said
from localgen.settings import KNOBS
from localgen.types import Chunk, FinishReason, GenerationRequest, Stats

RETRIES = 4  # after the first try, for 429 and 503
MAX_ERROR_BODY = 2**20  # of an error's body, only this much is read
GET_S = 10.0  # a GET (/models, /props): each wait, and the whole answer
# -n's cap on a server that ignores max_tokens: a piece of the stream is taken for a token (servers send one a
# piece; one that sends more is stopped, at the latest, once the text is this many characters a token long)
TOKEN_CHARS = 64
BACKOFF_S = 0.5  # doubled each time, with jitter; a Retry-After header wins (up to 30 s)
# a bias of ±inf (15043-inf bans a token) as JSON can carry it: llama-server and localgen serve add it to the
# logit, where -1e30 bans as -inf does (vLLM clamps a bias to OpenAI's -100..100, which bans too)
INF_BIAS = 1e30


def request_body(model: str, request: GenerationRequest, seed: int) -> dict[str, Any]:
    """The JSON body for a request: the seed and the other settings sent (sent_sampling) under OpenAI's names,
    else llama-server's (settings.py's table), then the logprobs and the JSON schema asked for."""
    body: dict[str, Any] = {"model": model, "stream": True, "stream_options": {"include_usage": True}}
    if request.raw:
        body["prompt"] = request.prompt
    else:
        body["messages"] = [dict(m) for m in request.messages]
        if request.template_args:  # the thinking switch: llama-server's and vLLM's chat_template_kwargs
            body["chat_template_kwargs"] = dict(request.template_args)
    for name, value in sent_sampling(request, seed).items():
        k = KNOBS[name]
        body[k.openai or k.llamacpp or k.name] = value
    if request.logprobs is not None:
        if request.raw:
            body["logprobs"] = request.logprobs
        else:
            body.update(logprobs=True, top_logprobs=request.logprobs)
    if request.json_schema is not None:
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "output", "schema": json.loads(request.json_schema)}}
    return body


def sent_sampling(request: GenerationRequest, seed: int) -> dict[str, Any]:
    """The sampling settings a request sends, by localgen's names, as sent: the seed (always, so that the answer
    can be made again: run --json reports it), then each setting that was asked for or differs from its default.
    A setting left alone, the temperature included, is not sent: the server's own default applies (vLLM's and
    OpenAI's temperature is 1.0, llama-server's 0.8), which only the server knows."""
    s = request.sampling
    sent: dict[str, Any] = {"seed": seed}
    for k in KNOBS.values():
        value = getattr(s, k.name)
        if k.name == "seed" or (value == k.default and k.name not in s.asked):
            continue
        if k.name == "logit_bias":
            value = {str(tok): math.copysign(INF_BIAS, bias) if math.isinf(bias) else bias for tok, bias in value}
        elif isinstance(value, tuple):
            value = list(value)
        sent[k.name] = value
    if s.mirostat:  # its rate and target go with it, defaults or not
        sent.update({n: getattr(s, n) for n in ("mirostat_lr", "mirostat_ent")})
    return sent


def count(value: Any) -> int:
    """A token count a server sent: a whole number of at least 0, else 0 (unknown: a count that is a string, a
    list or negative is ignored, as a missing one is; the answer's text is what matters)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def rate(value: Any) -> float | None:
    """A rate a server sent (tokens per second): a finite number of at least 0, else None (unknown)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


def _percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p * (len(ordered) - 1))))]


T = TypeVar("T")


def first_that_answers(clients: Sequence[RemoteClient], ask: Callable[[RemoteClient], T],
                       passed_over: Callable[[RemoteClient, RemoteError], None] | None = None,
                       ) -> tuple[RemoteClient, T]:
    """`ask` of each client in turn, to the first that answers: the client and its answer. One that is down
    (unreachable, refusing the key) is passed over for the next (`passed_over` hears of it); another error, or the
    last one's, is raised, with that endpoint's key scrubbed from it."""
    *tried, last = clients
    for client in tried:
        try:
            return client, ask(client)
        except RemoteError as e:
            if not e.down:
                raise client.scrubbed(e) from None
            if passed_over is not None:
                passed_over(client, e)
    try:
        return last, ask(last)
    except RemoteError as e:
        raise last.scrubbed(e) from None


class RemoteGeneration:
    """One streamed answer from an endpoint (iterate for Chunks; the rest is final once it ends). `fallbacks`: the
    endpoints to ask, in turn, where `client`'s is down before it answers (`passed_over` hears of each passed)."""

    prompt_cache = "off"

    def __init__(self, client: RemoteClient, request: GenerationRequest, started: float,
                 fallbacks: Sequence[RemoteClient] = (),
                 passed_over: Callable[[RemoteClient, RemoteError], None] | None = None) -> None:
        self.client = client  # the endpoint that answers, once one has
        self._fallbacks = fallbacks
        self._passed_over = passed_over
        self.request = request
        self.started = started
        self.seed = request.sampling.seed if request.sampling.seed is not None else random.getrandbits(31)
        self.sent_sampling = sent_sampling(request, self.seed)  # run --json's `sampling`: the server's defaults
        # apply to the rest, and it does not say them
        self.text = ""
        self.finish_reason: FinishReason | None = None
        self.stats: Stats | None = None
        self.logprobs: list[Any] = []
        self.server_timings: dict[str, Any] | None = None
        self.usage: dict[str, Any] | None = None
        self.n = 0  # content pieces received
        self.counted = False  # once it ends: whether the server counted the tokens (a usable usage or timings)
        self.arrivals: list[float] = []
        self._response: Any = None
        self._stop = threading.Event()

    def cancel(self) -> None:
        """Stop at the next piece, or now where the stream is waiting for one (a server gone silent mid-answer:
        the read is ended); closing the stream tells the server to stop generating."""
        self._stop.set()
        stream = self._response.extensions.get("network_stream") if self._response is not None else None
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):  # a read waiting on it (this thread's, under a signal handler,
                sock.shutdown(socket.SHUT_RD)  # or another's) sees the stream end; the socket stays open

    @property
    def opening(self) -> bool:
        """Whether it is still waiting for an endpoint to start answering (no stream yet to end: see cancel)."""
        return self._response is None and self.stats is None  # (stats: set as it ends, or as its request fails)

    @property
    def stopped(self) -> bool:
        """Whether it was cancelled or closed (a stream that ends then is not cut short)."""
        return self._stop.is_set()

    def close(self) -> None:
        """Close the stream now (Ctrl-C, a reader that went away)."""
        self._stop.set()
        if self._response is not None:
            self._response.close()

    def __iter__(self) -> Iterator[Chunk]:
        """The answer's pieces with the endpoint's key, should the server's text repeat it, as *** (as serve
        --endpoint passes an answer on: localgen/redact.py): the last len(key) - 1 characters are held back until
        more come or the answer ends, where a key cut between two pieces would pass unseen."""
        from localgen.redact import scrubbed

        carry = ""
        try:
            for chunk in self._pieces():
                key = self.client.endpoint.key  # the endpoint that answered
                held = len(key) - 1 if key else 0
                text = scrubbed(carry + chunk.text, key)
                cut = max(0, len(text) - held)
                carry = text[cut:]
                if cut:
                    self.text += text[:cut]
                    yield Chunk(text[:cut], chunk.n_tokens)
        except RemoteError as e:  # a server's text may repeat the key it was sent
            if carry:  # the part that came stays, all of it
                self.text += carry
                yield Chunk(carry, self.n)
            raise self.client.scrubbed(e) from None
        if carry:
            self.text += carry
            yield Chunk(carry, self.n)

    def _pieces(self) -> Iterator[Chunk]:
        cap = self.request.sampling.max_tokens  # -n: -1 is none
        size = 0  # of the text so far
        try:
            self._response = self._open()
            for piece, finish in events(self._response, self.client.endpoint.label, self):
                if piece and cap >= 0 and (self.n >= cap or size >= cap * TOKEN_CHARS):
                    # a server that ignores max_tokens: -n caps the answer, as it does here (the piece past the cap
                    # is not shown; closing the stream stops the server)
                    self.finish_reason = "length"
                    del self.logprobs[cap:]  # the piece past the cap brought its own
                    break
                if piece:
                    if cap >= 0:
                        piece = piece[:cap * TOKEN_CHARS - size]
                    now = time.perf_counter()
                    self.arrivals.append(now)
                    size += len(piece)
                    self.n += 1
                    yield Chunk(piece, self.n)
                if finish is not None:
                    self.finish_reason = finish
                if self._stop.is_set():
                    self.finish_reason = "cancelled"
                    break
            else:  # it ended (with [DONE]) without a finish reason: finished all the same, unless cancel() ended it
                self.finish_reason = self.finish_reason or ("cancelled" if self._stop.is_set() else "stop")
        finally:
            if self._response is not None:
                self._response.close()
            self._finish()

    def _open(self) -> Any:
        """The stream of the first endpoint that answers (first_that_answers)."""
        self.client, response = first_that_answers([self.client, *self._fallbacks],
                                                   lambda c: c.open(self.request, self.seed), self._passed_over)
        return response

    def _finish(self) -> None:
        end = time.perf_counter()
        u = self.usage or {}
        t = self.server_timings or {}
        details = u.get("prompt_tokens_details")
        told = count(u.get("completion_tokens")) or count(t.get("predicted_n"))
        self.counted = bool(told or count(u.get("prompt_tokens")) or count(t.get("prompt_n")))
        completion = told or self.n
        cached = count(t.get("cache_n")) or count(details.get("cached_tokens") if isinstance(details, dict) else None)
        prompt = count(u.get("prompt_tokens")) or (count(t.get("prompt_n")) + count(t.get("cache_n")))
        gaps = [b - a for a, b in zip(self.arrivals, self.arrivals[1:], strict=False)]
        decode = None
        if len(self.arrivals) > 1:
            decode = (completion - 1) / (self.arrivals[-1] - self.arrivals[0]) if completion > 1 else None
        p50, p99 = _percentile(gaps, 0.5), _percentile(gaps, 0.99)
        self.stats = Stats(
            prompt_tokens=prompt, cached_tokens=cached, completion_tokens=completion, load_s=0.0,
            ttft_s=self.arrivals[0] - self.started if self.arrivals else None,
            prefill_tps=rate(t.get("prompt_per_second")), decode_tps=decode, total_s=end - self.started,
            finish_reason=self.finish_reason or "cancelled",
            itl_p50_ms=round(p50 * 1000, 3) if p50 is not None else None,
            itl_p99_ms=round(p99 * 1000, 3) if p99 is not None else None)


class RemoteClient:
    """One endpoint over httpx: opening streams with retries, reading them into pieces."""

    def __init__(self, endpoint: Endpoint, model: str, timeout: float = 600.0) -> None:
        import httpx

        self.endpoint = endpoint
        self.model = model
        headers = {"Accept": "text/event-stream", "User-Agent": "localgen"}
        if endpoint.key:
            headers["Authorization"] = f"Bearer {endpoint.key}"
        # no redirects: the key goes only to the URL the user named
        self.http = httpx.Client(base_url=endpoint.url, headers=headers, follow_redirects=False,
                                 timeout=httpx.Timeout(timeout, connect=10.0),
                                 verify=tls(), mounts=direct_mounts(lambda: httpx.HTTPTransport(verify=tls())))
        self.dead: RemoteError | None = None
        # the server refused stream_options (a 400 or 422 naming it): its requests go without, for this run
        self.no_stream_options = False

    def scrubbed(self, e: RemoteError) -> RemoteError:
        """The error with the endpoint's key (or a prefix of it), should the server's text repeat it, as ***."""
        from localgen.redact import scrubbed

        e.message = scrubbed(e.message, self.endpoint.key)
        e.args = (e.message,)
        return e

    def close(self) -> None:
        """Close the connections."""
        self.http.close()

    def get(self, path: str, refused: bool = False, needed: bool = False) -> Any:
        """A GET as JSON (for /models and friends), or None when the server has no such route; with `refused`,
        a 401 or 403 is the error a request would get (a key is missing or wrong), not "nothing listed"; with
        `needed`, anything but JSON is a RemoteError saying what came instead (a 404, a redirect, a web page)."""
        import httpx

        where = self.endpoint.label
        asked = f"GET {self.endpoint.url}{path}"
        try:
            with self.http.stream("GET", path, timeout=GET_S) as r:
                refusal = (refused or needed) and r.status_code in (401, 403)
                if refusal or (needed and r.is_redirect):
                    raise self.scrubbed(_status_error(self.endpoint, r, _head(r), self.model))
                if r.status_code != 200:
                    if needed:
                        raise self.scrubbed(RemoteError(
                            f"{where} answered {r.status_code} to {asked}: {error_text(_head(r)) or r.reason_phrase}",
                            hint=URL_HINT if r.status_code == 404 else "name the model with -m"))
                    return None
                body = bounded(r, f"{where}'s answer to GET {path}", within=GET_S)
                kind = r.headers.get("content-type", "").split(";")[0].strip()
        except httpx.ConnectError as e:
            raise RemoteError(_connect_message(where, e), down=True) from None
        except httpx.HTTPError as e:
            if needed:
                raise RemoteError(f"{where} did not answer {asked} ({said(e)})", down=True,
                                  hint="name the model with -m") from None
            return None
        try:
            return json.loads(body)
        except ValueError:
            if needed:
                raise RemoteError(f"{where} answered {asked} with {kind or 'something'} that is not JSON",
                                  hint=URL_HINT) from None
            return None

    def open(self, request: GenerationRequest, seed: int) -> Any:
        """POST the request and return the streaming response once it is 200, retrying 429 and 503 (RETRIES
        times); a server that refuses stream_options gets the request again without them, not counted as a try."""
        import httpx

        path = "/completions" if request.raw else "/chat/completions"
        body = request_body(self.model, request, seed)
        if self.no_stream_options:
            del body["stream_options"]
        where = self.endpoint.label
        attempt = 0  # the tries that met 429 or 503 so far
        while True:
            try:
                r = self.http.send(self.http.build_request("POST", path, json=body), stream=True)
            except httpx.ConnectTimeout:
                raise RemoteError(f"{where} did not accept the connection within 10 s", down=True) from None
            except httpx.ConnectError as e:
                raise RemoteError(_connect_message(where, e), down=True) from None
            except httpx.TimeoutException:
                raise RemoteError(f"{where} did not answer in time", down=True) from None
            except httpx.HTTPError as e:
                raise RemoteError(f"{where} closed the connection without answering ({said(e)})",
                                  down=True) from None
            if r.status_code == 200:
                kind = r.headers.get("content-type", "")
                if "text/event-stream" not in kind and "json" not in kind:
                    r.close()  # for good: a fan-out drops the endpoint (down) and its lines go to the others
                    raise RemoteError(f"{where} answered with {kind or 'no content type'}, not an OpenAI stream",
                                      hint=URL_HINT, down=True)
                return r
            told = _head(r)
            if r.status_code in (400, 422) and "stream_options" in body and "stream_options" in told:
                # some OpenAI-compatible servers refuse a field they do not know: sent again without it, the
                # tokens then counted from the pieces that came (no usage)
                self.no_stream_options = True
                del body["stream_options"]
                continue
            if r.status_code in (429, 503) and attempt < RETRIES:
                time.sleep(_backoff(attempt, r.headers.get("retry-after")))
                attempt += 1
                continue
            raise _status_error(self.endpoint, r, told, self.model)

def _backoff(attempt: int, retry_after: str | None) -> float:
    if retry_after:
        try:
            return min(30.0, max(0.0, float(retry_after)))
        except ValueError:
            pass
    return float(BACKOFF_S * 2.0 ** attempt * (0.75 + random.random() / 2))


def _connect_message(where: str, e: Exception) -> str:
    text = str(e)
    if "SSL" in text or "CERTIFICATE" in text.upper() or "TLS" in text:
        return f"TLS failed with {where}: {text}"
    return f"cannot reach {where}: {connection_reason(e)}"  # in words: "connection refused", not "[Errno 111] ..."


def _head(r: Any) -> str:
    """The start of an error's body (MAX_ERROR_BODY bytes at most; the rest is not read)."""
    import httpx

    body = bytearray()
    try:
        for piece in r.iter_bytes():
            body += piece
            if len(body) >= MAX_ERROR_BODY:
                break
    except httpx.HTTPError:  # a body cut short still says what it said
        pass
    r.close()
    return bytes(body[:MAX_ERROR_BODY]).decode("utf-8", "replace")


def _status_error(endpoint: Endpoint, r: Any, body: str, model: str) -> RemoteError:
    where = endpoint.label
    message = error_text(body) or r.reason_phrase
    status = r.status_code
    if status in (301, 302, 303, 307, 308):
        return RemoteError(f"{where} redirects to {r.headers.get('location')}; localgen does not follow redirects "
                           "(the key stays with the URL you named)", hint="give the final URL with --endpoint")
    if status in (401, 403):  # for good: a fan-out drops the endpoint (down) and its lines go to the others
        if endpoint.key:
            given = f"the key in {endpoint.key_env}" if endpoint.key_env else "the key"
            hint = f"{where} refused {given}: check it"
        else:
            hint = "name the variable holding the key with --api-key-env NAME"
        return RemoteError(f"{where} refused the request ({status}): {message}", hint=hint, down=True)
    if status == 404:
        return RemoteError(f"{where} has no model {model!r} or no such route (404): {message}",
                           hint=f"see its models with: curl {endpoint.url}/models"
                                + (" and its key in an Authorization header" if endpoint.key else ""), down=True)
    if status in (405, 501):  # a web server that is not the API (a static one answers a POST so): for good, as a 404
        return RemoteError(f"{where} does not take this request ({status}): {message}", hint=URL_HINT, down=True)
    if status in (429, 503):
        return RemoteError(f"{where} is busy ({status}) after {RETRIES + 1} tries: {message}", down=status == 503)
    if status >= 500:
        return RemoteError(f"{where} failed ({status}): {message}", down=status in (502, 504))
    return RemoteError(f"{where} rejected the request ({status}): {message}")
