"""serve --endpoint's servers (serve/upstream.py sends their models' requests on): each with the models serve offers
from it, from endpoints.toml's `models` or its GET /models at start; and its key never in what serve says of it (an
upstream's error message reads as run's: remote/errortext.py's error_text)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from localgen import proxies, redact
from localgen.errors import LocalgenError, RemoteError
from localgen.remote.endpoints import Endpoint
from localgen.remote.errortext import error_text

LIST_S = 10.0  # the start's GET /models


@dataclass
class Remote:
    """An upstream server and the models serve offers from it."""

    endpoint: Endpoint
    models: tuple[str, ...]
    listed: bool = False  # the models came from endpoints.toml (the server was not asked at start)

    @property
    def label(self) -> str:
        """Its name in endpoints.toml, else host:port: what errors, the log and the listings call it."""
        return self.endpoint.label


def discover(endpoint: Endpoint) -> Remote:
    """The endpoint with its models: endpoints.toml's `models`, else its GET /models now (one that cannot be
    reached, refuses the key or lists none is an error: serve does not start without knowing what it fronts)."""
    if endpoint.models:
        return Remote(endpoint, endpoint.models, listed=True)
    import httpx

    where = endpoint.label
    headers = {"User-Agent": "localgen", **({"Authorization": f"Bearer {endpoint.key}"} if endpoint.key else {})}
    hint = "name its models in endpoints.toml (models = [...]) to start without asking it" if endpoint.name else \
        "give it a name, its url and its models in endpoints.toml ([NAME] url = \"...\" models = [...]) to start " \
        "without asking it"
    from localgen.remote.stream import bounded  # (here: a serve without --endpoint never imports run's reader)

    try:  # the list bounded as run's is (remote/stream.py): in size, and in time as a whole, not only each wait
        with proxies.client(headers=headers, timeout=LIST_S, follow_redirects=False) as client, \
                client.stream("GET", endpoint.url + "/models") as r:
            status = r.status_code
            body = bounded(r, f"--endpoint {where}'s answer to GET /models", within=LIST_S)
    except httpx.TimeoutException:
        raise LocalgenError(f"--endpoint {where} did not list its models within {LIST_S:g} s", hint=hint) from None
    except httpx.HTTPError as e:
        raise LocalgenError(f"--endpoint: cannot reach {where}: {scrubbed(str(e) or type(e).__name__, endpoint)}",
                            hint=hint) from None
    except RemoteError as e:
        raise LocalgenError(e.message, hint=hint) from None  # too big, or dripping past LIST_S
    if status in (401, 403):
        raise LocalgenError(f"--endpoint {where} refused to list its models ({status}): "
                            f"{scrubbed(error_text(body), endpoint)}",
                            hint="name the variable holding its key with --api-key-env NAME")
    ids: list[str] = []
    if status == 200:
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        data = doc.get("data") if isinstance(doc, dict) else None
        ids = [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str) and m["id"]] \
            if isinstance(data, list) else []
    if not ids:
        raise LocalgenError(f"--endpoint {where} lists no models at {endpoint.url}/models "
                            f"({status if status != 200 else 'an empty or unreadable list'})",
                            hint="check the URL: it is the API base, e.g. http://host:8000/v1; or " + hint)
    return Remote(endpoint, tuple(dict.fromkeys(ids)))


def scrubbed(text: str, endpoint: Endpoint) -> str:
    """The text with the endpoint's key, should the server have echoed it (or its first or last characters),
    replaced by *** (localgen/redact.py)."""
    return redact.scrubbed(text, endpoint.key)
