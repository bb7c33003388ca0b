"""`localgen bench --endpoint`: the serving sweep measured against a server from the client's side (bench/serving.py),
its rows shown as they come and kept in the history labelled as client-side figures."""

from __future__ import annotations

import shlex
import sys
from typing import Any

import typer

from localgen.cli.bench.options import Values
from localgen.cli.bench.view import ProgressView, emit_serving
from localgen.errors import RemoteError, UsageError


def is_named_endpoint(model: str) -> bool:
    """Whether -m names an entry of endpoints.toml (NAME or NAME/MODEL; only that entry is read)."""
    from localgen.cli.output import ErrWriter
    from localgen.remote.endpoints import declared

    return not model.endswith(".gguf") and declared(model.partition("/")[0], ErrWriter().warn) is not None


def measure(urls: list[str] | None, key_env: str | None, models: Values, parallel: Values, rates: Values,
                    num_prompts: int | None, n_prompt: Values, n_gen: Values, output: str | None,
                    same_prompt: bool = False) -> None:
    """bench --endpoint: the sweep against a server, kept in the history labelled as client-side figures."""
    from localgen.bench import history, serving, sweep
    from localgen.cli.output import ErrWriter
    from localgen.remote.client import RemoteClient

    concurrencies = sweep.int_values("--parallel/--concurrency", parallel, [1, 4])
    rate_values = _rates(rates)
    prompts = sweep.int_values("--n-prompt", n_prompt, [128])
    gens = sweep.int_values("--n-gen", n_gen, [64])
    # a thread and a prompt's text per request, made before the first is sent
    sweep.in_range("--parallel/--concurrency", concurrencies, 1, serving.MAX_CONCURRENCY)
    sweep.in_range("--n-prompt", prompts, 0, serving.MAX_TOKENS)
    sweep.in_range("--n-gen", gens, 0, serving.MAX_TOKENS)
    words = max(prompts) * (1 if same_prompt else max(num_prompts or max(8, 2 * c) for c in concurrencies))
    if words > serving.MAX_TEXT:
        raise UsageError(f"--n-prompt × --num-prompts: {words:,} words of prompts, made before the first request, "
                         f"is past {serving.MAX_TEXT:,}", hint="give fewer or shorter prompts, or --same-prompt")
    targets = _remote_targets(urls, key_env, models)
    import localgen

    system = {"build_commit": "client-side", "build_number": 0, "cpu_info": "", "cores": 0, "ram": 0, "gpu_info": "",
              "backends": "remote", "features": "", "localgen_version": localgen.__version__}
    recording = history.start(shlex.join(["localgen", "bench", *sys.argv[2:]]), system)
    err = ErrWriter()
    results: list[dict[str, Any]] = []
    points = [(c, r, num_prompts or max(8, 2 * c), g) for _ in targets for _ in prompts for g in gens
              for c in concurrencies for r in rate_values]
    view = ProgressView(f"{len(points)} sweep point{'s' if len(points) > 1 else ''}", len(points), lambda: None,
                         "Ctrl-C keeps the rows measured")
    view.begin(len(points))
    try:
        for ep, model_id in targets:
            client = RemoteClient(ep, model_id)
            try:
                for p in prompts:
                    for g in gens:
                        view.loading(f"{ep.label} {model_id}: prompt {p}, answer {g}")
                        for rec in serving.run(client, ep.url, model_id, concurrencies, rate_values, num_prompts,
                                               p, g, 1234, system, same_prompt):
                            results.append(rec)  # shown even where the history cannot keep it
                            if rec["requests"]:  # a point where every request failed measured nothing: not kept
                                history.add(recording, len(results) - 1, rec)
                            if output == "jsonl":
                                sys.stdout.write(records_jsonl([rec]))
                                sys.stdout.flush()
                            if rec["requests"] == 0:
                                raise RemoteError(f"every request failed: {rec['first_error']}")
                            view.step(f"{ep.label} {model_id}: prompt {p}, answer {g}")
                            if len(results) == 1:  # the first point's latency foresees the rest
                                e2e = (rec["e2e_p50_ms"] or 0.0) / 1000
                                view.estimate(view.elapsed() + serving.seconds(points[1:], e2e, g))
                            view.row(rec, len(results))
            finally:
                client.close()
    except KeyboardInterrupt:
        view.end()
        if not results:
            err.interrupted("interrupted before the first point was measured: nothing saved")
        else:
            err.interrupted("interrupted; the results above were measured and kept")
        raise typer.Exit(130) from None
    finally:
        view.end()
        if results and output != "jsonl":
            _print_results(results, output)
    if recording.id is not None:
        err.line(f"saved as run {recording.id}: localgen bench history {recording.id} (client-side figures)")


def _remote_targets(urls: list[str] | None, key_env: str | None, models: Values) -> list[tuple[Any, str]]:
    """(endpoint, model id) for each model named (the endpoint's own model where none is)."""
    from localgen.cli.output import ErrWriter
    from localgen.remote.backend import pick_model
    from localgen.remote.endpoints import choose

    targets = []
    wanted: list[str | None] = list(models) if models else [None]
    for m in wanted:
        eps, model_id = choose(urls, key_env, m, warn=ErrWriter().warn)
        if not eps:
            raise UsageError("--endpoint URL (or -m NAME/MODEL from endpoints.toml) names the server to measure")
        if len(eps) > 1:  # not spread like run --file's lines: the figures would mix servers
            raise UsageError(f"bench --endpoint measures one server, not {len(eps)}",
                             hint="measure each with a run of its own; bench compare sets them side by side")
        targets.append((eps[0], model_id or pick_model(eps)))
    return targets


def _print_results(results: list[dict[str, Any]], output: str | None) -> None:
    """The sweep's table, or its rows in the --output format."""
    from localgen.bench import records

    if output:
        sys.stdout.write(records.FORMATS[output](results))
    else:
        emit_serving(results)
    sys.stdout.flush()


def _rates(rates: Values) -> list[float]:
    """--request-rate values: positive numbers of at least one request a day (serving.MIN_RATE), or inf."""
    from localgen.bench.serving import MIN_RATE

    out: list[float] = []
    for text in (v for item in (rates or ["inf"]) for v in item.split(",")):
        try:
            rate = float(text)
        except ValueError:
            raise UsageError(f"--request-rate takes numbers or inf, not {text!r}") from None
        if not rate > 0:
            raise UsageError(f"--request-rate must be above 0, not {text!r}")
        if rate < MIN_RATE:
            raise UsageError(f"--request-rate {text} is below one request a day ({MIN_RATE:.7f} a second): "
                             "too slow to measure anything", hint="give a rate of 0.0000116 or more, or inf")
        out.append(rate)
    return out


def records_jsonl(recs: list[dict[str, Any]]) -> str:
    from localgen.bench import records

    return records.FORMATS["jsonl"](recs)
