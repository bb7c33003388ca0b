"""GET /metrics in Prometheus' text format (#43): requests by route and status and how long each took (counted
by the outermost layer, app.py's FrontDoor), tokens in and out, time to first token and inter-token latency
per model (from each finished generation, reported by its worker's thread), each decoding step's tokens and time
(from the worker's thread too), and at each scrape the queues, the
loaded models and their memory, the budget, loads and evictions (read then from the workers and residency, so
never stale). Each app has its own registry: several apps in one process never share counts."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match

if TYPE_CHECKING:
    from localgen.backend import Completion
    from localgen.serve.batches import Desk
    from localgen.serve.state import ServeState

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# buckets from a millisecond to a minute: a token on a GPU takes a few ms, a first token behind a long prompt on
# a CPU can take tens of seconds
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# a step's tokens: one per decoding stream, up to a whole batch of prompts (n_batch, 2,048 for serve's scheduler)
STEP_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
OTHER = "other"  # the route of a path no route takes: raw paths as labels would grow without bound


class Metrics:
    """One app's metrics: its registry, the counters and histograms it fills, and the gauges read at scrape."""

    def __init__(self, state: ServeState, routes: Sequence[BaseRoute] = (), desk: Desk | None = None) -> None:
        self.routes = routes  # the app's routes (the list itself: a route added later is matched too)
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("localgen_requests", "HTTP requests by route and status", ["route", "status"],
                                registry=r)
        self.request_seconds = Histogram("localgen_request_seconds", "HTTP requests' time, to the response's end",
                                         ["route"], buckets=BUCKETS, registry=r)
        self.prompt_tokens = Counter("localgen_prompt_tokens", "prompt tokens of finished generations", ["model"],
                                     registry=r)
        self.generated_tokens = Counter("localgen_generated_tokens", "tokens generated", ["model"], registry=r)
        self.drafted = Counter("localgen_draft_tokens", "tokens drafted (serve --lookup, --draft)", ["model"],
                               registry=r)
        self.accepted = Counter("localgen_draft_accepted_tokens", "drafted tokens the model kept", ["model"],
                                registry=r)
        self.ttft = Histogram("localgen_time_to_first_token_seconds", "time to each generation's first token",
                              ["model"], buckets=BUCKETS, registry=r)
        self.itl = Histogram("localgen_inter_token_seconds",
                             "each generation's mean time between tokens: (total - TTFT) / (tokens - 1)",
                             ["model"], buckets=BUCKETS, registry=r)
        self.step_tokens = Histogram("localgen_step_tokens", "tokens each decoding step of a model evaluated: prompts' "
                                     "and one per stream decoding", ["model"], buckets=STEP_BUCKETS, registry=r)
        self.step_seconds = Histogram("localgen_step_seconds", "each decoding step's time", ["model"],
                                      buckets=BUCKETS, registry=r)
        r.register(Gauges(state, desk))

    def route(self, scope: dict[str, Any]) -> str:
        """The path template of the route that takes this request (`other` when none does); llama-server's
        spelling of a route without /v1 (serve/routing.py's Alias) counts as that route: one series per route."""
        for route in self.routes:
            match, _ = route.matches(scope)
            if match is not Match.NONE:  # PARTIAL: the path is the route's, the method is not (405)
                return str(getattr(route, "meant", None) or getattr(route, "path", OTHER))
        return OTHER

    def request(self, scope: dict[str, Any], status: int, seconds: float, route: str | None = None) -> None:
        """A request has ended (status 0: no response began); `route`: its route(scope), when known."""
        route = route or self.route(scope)
        self.requests.labels(route, str(status) if status else "none").inc()
        self.request_seconds.labels(route).observe(seconds)

    def observe(self, model: str, c: Completion) -> None:
        """A generation has finished (on its worker's thread): its tokens, TTFT once it made a token, ITL
        once it made two."""
        self.prompt_tokens.labels(model).inc(c.prompt_tokens)
        self.generated_tokens.labels(model).inc(c.completion_tokens)
        if c.drafted:
            self.drafted.labels(model).inc(c.drafted)
            self.accepted.labels(model).inc(c.accepted)
        if c.completion_tokens >= 1:
            self.ttft.labels(model).observe(c.ttft_s)
        if c.completion_tokens >= 2:
            self.itl.labels(model).observe(max(0.0, c.total_s - c.ttft_s) / (c.completion_tokens - 1))

    def stepped(self, model: str, tokens: int, seconds: float) -> None:
        """A model's scheduler has made a step that evaluated `tokens` (on its worker's thread)."""
        self.step_tokens.labels(model).observe(tokens)
        self.step_seconds.labels(model).observe(seconds)

    def remote(self, model: str, prompt_tokens: int | None, completion_tokens: int | None, ttft_s: float | None,
               total_s: float | None) -> None:
        """A remote model's answer has ended (serve --endpoint): its tokens from the usage it carried, its time to
        first content once a stream had some, ITL from those once it made two tokens."""
        self.prompt_tokens.labels(model).inc(prompt_tokens or 0)
        self.generated_tokens.labels(model).inc(completion_tokens or 0)
        if ttft_s is not None:
            self.ttft.labels(model).observe(ttft_s)
            if completion_tokens is not None and completion_tokens >= 2 and total_s is not None:
                self.itl.labels(model).observe(max(0.0, total_s - ttft_s) / (completion_tokens - 1))

    def text(self) -> bytes:
        """The exposition, in Prometheus' text format."""
        return generate_latest(self.registry)

    async def endpoint(self, request: Request) -> Response:
        """GET /metrics, collected in a thread: the prompt cache on disk is measured by listing its folder."""
        import asyncio

        return Response(await asyncio.to_thread(self.text), media_type=CONTENT_TYPE)


class Gauges(Collector):
    """What holds now, read at each scrape: each model's queue, running requests, whether it is loaded and
    the memory it holds by its estimate; the budget, loads and evictions; the batches (serve/batches.py)."""

    def __init__(self, state: ServeState, desk: Desk | None = None) -> None:
        self.state = state
        self.desk = desk

    def collect(self) -> Iterator[Metric]:
        """The gauges as they are now (prometheus_client calls this at each scrape)."""
        queued = GaugeMetricFamily("localgen_queue_depth", "requests waiting for a slot", labels=["model"])
        running = GaugeMetricFamily("localgen_running_requests", "requests in a slot", labels=["model"])
        loaded = GaugeMetricFamily("localgen_model_loaded", "1 while the model is loaded", labels=["model"])
        memory = GaugeMetricFamily("localgen_model_memory_bytes", "a loaded model's memory, by its estimate "
                                   "(weights, KV cache and buffers)", labels=["model"])
        drafting = GaugeMetricFamily("localgen_drafting", "1 while a loaded model drafts (serve --lookup, --draft), "
                                     "0 once its draft model failed and drafting is off", labels=["model"])
        for name, w in list(self.state.workers.items()):
            pc = getattr(w.residence, "pc", None)  # its ParallelContext while loaded
            if pc is not None and (pc.draft_max or pc.draft_off):
                drafting.add_metric([name], 1 if pc.draft_max else 0)
            in_slots = min(w.outstanding, w.running)
            queued.add_metric([name], max(0, w.outstanding - in_slots))
            running.add_metric([name], in_slots)
            on = w.loaded
            loaded.add_metric([name], 1 if on else 0)
            memory.add_metric([name], w.residence.need if on else 0)
        if self.state.upstreams is not None:  # serve --endpoint: a remote model's requests sent on, and waiting
            for name, sent, waiting in self.state.upstreams.lines():
                queued.add_metric([name], waiting)
                running.add_metric([name], sent)
        yield from (queued, running, loaded, memory, drafting)
        residency = self.state.residency
        if residency is not None:
            s = residency.status()
            yield GaugeMetricFamily("localgen_memory_budget_bytes", "memory for the loaded models together "
                                    "(--max-memory)", value=s["budget_bytes"])
            yield CounterMetricFamily("localgen_loads", "models loaded", value=s["loads"])
            yield CounterMetricFamily("localgen_evictions", "models unloaded to make room for another",
                                      value=s["evictions"])
            yield CounterMetricFamily("localgen_swaps_waited", "loads that waited for a busy model to yield its "
                                      "room (fair swaps)", value=s["swaps_waited"])
        yield from self._prefixes()
        yield from self._batches()

    def _batches(self) -> Iterator[Metric]:
        """The Batch API's batches by status and their requests: answered, failed, and still to run."""
        if self.desk is None:
            return
        by_status, lines = self.desk.tally()
        batches = GaugeMetricFamily("localgen_batches", "batches by status (the Batch API)", labels=["status"])
        for status, n in by_status.items():
            batches.add_metric([status], n)
        yield batches
        requests = CounterMetricFamily("localgen_batch_requests", "batches' requests answered, by result",
                                       labels=["result"])
        requests.add_metric(["completed"], lines["completed"])
        requests.add_metric(["failed"], lines["failed"])
        yield requests
        yield GaugeMetricFamily("localgen_batch_requests_pending", "requests of running batches not answered yet",
                                value=lines["pending"])

    def _prefixes(self) -> Iterator[Metric]:
        """The prompt cache on disk (--cache-disk): its bytes and files, what was written and read back, and
        the prompt tokens its prefixes spared (each model's prompt cache counts those it loaded from disk)."""
        store = self.state.store
        if store is None:
            return
        s = store.status()
        yield GaugeMetricFamily("localgen_prefix_store_bytes", "bytes of prefixes on disk", value=s["bytes"])
        yield GaugeMetricFamily("localgen_prefix_store_files", "prefixes on disk", value=s["files"])
        yield CounterMetricFamily("localgen_prefix_store_written_bytes", "bytes of prefixes written",
                                  value=s["written_bytes"])
        yield CounterMetricFamily("localgen_prefix_store_read_bytes", "bytes of prefixes read back",
                                  value=s["read_bytes"])
        yield CounterMetricFamily("localgen_prefix_store_skipped", "stored prefixes refused (another model, "
                                  "settings or llama.cpp build; a torn or damaged file)", value=s["skipped"])
        hits = CounterMetricFamily("localgen_prefix_store_hits", "requests that started from a prefix read back "
                                   "from disk", labels=["model"])
        tokens = CounterMetricFamily("localgen_prefix_store_hit_tokens", "prompt tokens those prefixes spared",
                                     labels=["model"])
        for name, w in list(self.state.workers.items()):
            n, spared = w.residence.disk_hits()
            hits.add_metric([name], n)
            tokens.add_metric([name], spared)
        yield from (hits, tokens)
