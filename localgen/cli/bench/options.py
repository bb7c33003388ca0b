"""bench's option groups (frozen dataclasses whose fields are Typer options; with_knobs() gives bench each
field as an option and the group to the command): how each test is measured and shown, and the serving
sweep against an endpoint."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import typer

from localgen.bench.serving import MAX_PROMPTS
from localgen.bench.sweep import MAX_REPETITIONS
from localgen.cli import options as o
from localgen.cli.options import OptionGroup
from localgen.types import MAX_CTX, MIN_CTX_FLAG

SWEEP = "Sweep (lists 1,2,4 and ranges 1-8, 1-16*2, 0-40+10; flags may repeat)"
Values = list[str] | None  # a sweep flag's values as given: lists and ranges, the flag repeatable


def sweep(*names: str, help: str, panel: str = SWEEP) -> Any:
    """A sweep flag's typer.Option (bench's own and its groups')."""
    return typer.Option(*names, help=help, rich_help_panel=panel, show_default=False)


KLD_BOUND = 0.05  # --quality's verdict: the mean KL divergence it accepts
QUALITY_CTX = 512  # --quality's perplexity window


@dataclass(frozen=True)
class Measuring(OptionGroup):
    """How each test is measured, and how the results are shown."""

    reps: Annotated[int, typer.Option("--repetitions", "-r", min=1, max=MAX_REPETITIONS,
                                      help="Repetitions of each test.")] = 5
    exact: Annotated[
        bool | None, typer.Option("--exact/--no-exact", show_default=False,
                                  help="With -npl: the batching mode of the sequences decoded together. Default: "
                                       "the one `serve` and `run --file` use here (throughput wherever exactness "
                                       "costs more than 10 %). --exact: every answer as if alone, at that price.")
    ] = None
    output: Annotated[
        str | None,
        typer.Option("--output", "-o", help="md, csv, json or jsonl (default: a table on a terminal, else md)."),
    ] = None
    e2e: Annotated[
        bool, typer.Option("--e2e/--no-e2e", help="Also time the real `run` path (template, sampling, detokenizing).")
    ] = True


@dataclass(frozen=True)
class BenchRemote(OptionGroup):
    """The server bench --endpoint measures (run's RemoteOptions, with bench's own help)."""

    endpoint: Annotated[
        list[str] | None,
        typer.Option("--endpoint", envvar="LOCALGEN_ENDPOINT", rich_help_panel=o.REMOTE_PANEL, show_default=False,
                     metavar="URL",
                     help="Measure this OpenAI-compatible server (vLLM, llama-server, Ollama, localgen serve, ...) "
                          "from the client instead of a model loaded here; -m names its model (several -m: each in "
                          "turn). One server a run.")
    ] = None
    api_key_env: o.ApiKeyEnv = None


@dataclass(frozen=True)
class ServingSweep(OptionGroup):
    """With --endpoint: how requests arrive, how many, and whether they share a prompt."""

    request_rate: Annotated[Values, sweep("--request-rate", help="With --endpoint: requests per second arriving as a "
                                                                 "Poisson process; inf sends them at once (default).",
                                          panel=o.REMOTE_PANEL)] = None
    num_prompts: Annotated[
        int | None, typer.Option("--num-prompts", min=1, max=MAX_PROMPTS, rich_help_panel=o.REMOTE_PANEL,
                                 show_default=False,
                                 help="With --endpoint: requests per sweep point (default: twice the concurrency, "
                                      "at least 8).")
    ] = None
    same_prompt: Annotated[
        bool, typer.Option("--same-prompt", rich_help_panel=o.REMOTE_PANEL,
                           help="With --endpoint: send one fixed prompt every time, to measure the server with its "
                                "prefix cache warm. Default: each request begins with a random nonce of its own, so "
                                "no cached prefix shortens its time to first token.")
    ] = False


QUALITY = "Quality (with --quality: each -m file measured against --reference)"


@dataclass(frozen=True)
class Quality(OptionGroup):
    """bench --quality: the ladder's table for files already here (quantizations pulled from the Hub, say)."""

    quality: Annotated[
        str | None, typer.Option("--quality", metavar="TEXT", rich_help_panel=QUALITY, show_default=False,
                                 help="Measure each -m model's PPL and KL divergence on this text against --reference "
                                      "('default': the text localgen ships), beside pp and tg speed and fit.")
    ] = None
    reference: Annotated[
        str | None, typer.Option("--reference", metavar="SOURCE", rich_help_panel=QUALITY, show_default=False,
                                 help="With --quality: the original weights (an F16/BF16 file or a model name).")
    ] = None
    # None where not given: bench without --quality refuses either one given, even at its default value
    kld_bound: Annotated[float | None, typer.Option("--kld-bound", min=0.0, rich_help_panel=QUALITY,
                                                    show_default=False,
                                                    help=f"With --quality: the mean KLD the verdict accepts "
                                                         f"(default {KLD_BOUND}).")] = None
    quality_ctx: Annotated[int | None, typer.Option("--ctx", "-c", min=MIN_CTX_FLAG, max=MAX_CTX,
                                                    rich_help_panel=QUALITY, show_default=False,
                                                    help=f"With --quality: tokens per perplexity window (default "
                                                         f"{QUALITY_CTX}).")] = None
    chunks: Annotated[int | None, typer.Option("--chunks", min=1, rich_help_panel=QUALITY, show_default=False,
                                               help="With --quality: measure only the first N windows.")] = None
