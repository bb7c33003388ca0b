"""One meaning per flag, read from the command objects Typer builds (no command runs): an option is spelled
once in a command; a short option means the same thing in every command; a long option that run, chat,
serve and bench share has the same help, type, range and default in each. An exception needs its reason
written here, and one that no longer applies fails too."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import typer

from localgen.cli import app

SHARED = ("run", "chat", "serve", "bench")

# (short option, command): why it means something else in that command
SHORT_EXCEPTIONS = {
    ("-p", "bench"): "llama-bench's -p/--n-prompt (prompt lengths to test), as bench mirrors llama-bench",
    ("-n", "bench"): "llama-bench's -n/--n-gen (answer lengths to test)",
    ("-r", "bench"): "llama-bench's -r/--repetitions",
    ("-d", "tune"): "the same context depth as bench's -d/--n-depth, spelled --depth",
    ("-n", "tune"): "the measured exchange's answer length (--answer), as bench's -n (llama-bench's -n/--n-gen)",
    ("-p", "rpc-server"): "llama.cpp's rpc-server -p/--port",
    ("-n", "similar"): "how many results, as head -n (there are no tokens to generate)",
    ("-n", "rerank"): "how many results, as head -n (there are no tokens to generate)",
    ("-n", "logs"): "how many entries, as head -n (there are no tokens to generate)",
    ("-f", "create"): "Ollama's `ollama create NAME -f Modelfile`: a file read, as run's -f reads a document",
    ("-p", "quantize"): "the ladder's pp test length, as bench's -p (llama-bench's -p/--n-prompt)",
    ("-n", "quantize"): "the ladder's tg test length, as bench's -n (llama-bench's -n/--n-gen)",
    ("-r", "quantize"): "the ladder's repetitions, as bench's -r (llama-bench's -r/--repetitions)",
    ("-f", "perplexity"): "llama-perplexity's -f: the text measured, a file read as run's -f reads a document",
    ("-q", "create"): "Ollama's `ollama create NAME -q q4_K_M`: the type its FROM is quantized to",
}

# llama-bench's load flags: each takes a list of values to sweep, with llama-bench's help and defaults
_SWEPT = "bench sweeps it: a list of values (llama-bench's), not one setting"
# (long option, command): why that command's option differs from the same option elsewhere
LONG_EXCEPTIONS = {
    **{(flag, "bench"): _SWEPT for flag in (
        "--model", "--threads", "--n-gpu-layers", "--batch-size", "--ubatch-size", "--flash-attn", "--cache-type-k",
        "--cache-type-v", "--parallel", "--n-cpu-moe", "--override-tensor", "--main-gpu")},
    ("--model", "serve"): "serve serves several models at once: repeatable, each one a name requests use",
    ("--ctx", "bench"): "bench --quality's perplexity window (llama-perplexity's -c, 512 by default), not a context "
                        "to generate in",
    ("--exact", "serve"): "the same switch; serve's help speaks of requests, the start-up line and the request "
                          "field, run's of the prompts of --file and --stats",
    ("--no-exact", "serve"): "the other half of --exact/--no-exact (above)",
    ("--exact", "bench"): "the same switch; bench's help speaks of -npl's sequences",
    ("--no-exact", "bench"): "the other half of --exact/--no-exact (above)",
    ("--parallel", "serve"): "the same meaning (sequences decoded together); a server has 4 slots by default, "
                             "run one prompt at a time unless asked",
    ("--stats", "chat"): "a chat on a terminal shows each answer's stats in its footer: --stats is for a scripted "
                         "chat, which prints them to stderr",
    ("--endpoint", "serve"): "serve fronts the endpoint, its models served beside the local ones (a URL or an "
                             "endpoints.toml name; no LOCALGEN_ENDPOINT, which would make every serve front run's "
                             "endpoint); run, chat and bench send their work there instead of loading a model",
    ("--endpoint", "bench"): "the same server, measured from the client: one a run (run spreads --file lines over "
                             "several), so bench's help says what it measures",
    ("--verbose", "serve"): "serve's workers load without llama.cpp's log echo; its --verbose adds uvicorn's info "
                            "lines (the access log is serve's own line per request, unless --quiet)",
}


def _commands() -> dict[str, Any]:
    """Every command and group by its path ("bench", "bench history"), from the root's command object."""
    found: dict[str, Any] = {}

    def walk(command: Any, path: str) -> None:
        found[path] = command
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{path} {name}".strip())

    walk(typer.main.get_command(app.build()), "")
    return found


def _options(command: Any) -> list[Any]:
    return [p for p in command.params if p.param_type_name == "option"]


def _names(option: Any) -> list[str]:
    return [*option.opts, *option.secondary_opts]


def _meaning(option: Any) -> tuple[Any, ...]:
    """What a user can tell of an option: its help, value type (and range), whether it repeats or is a switch,
    default, environment variable, and every spelling."""
    kind = getattr(getattr(option, "type_descriptor", None), "annotation", None) or getattr(option, "type", None)
    return (option.help, str(kind), getattr(option, "min", None), getattr(option, "max", None), option.multiple,
            option.is_flag, repr(option.default), option.envvar, tuple(sorted(_names(option))))


def test_no_option_is_spelled_twice_in_one_command() -> None:
    twice = {path: [name for name, n in Counter(n for p in _options(c) for n in _names(p)).items() if n > 1]
             for path, c in _commands().items()}
    assert not {path: names for path, names in twice.items() if names}


def _short_uses() -> dict[str, dict[str, frozenset[str]]]:
    """short option → command → the long options it stands for there."""
    uses: dict[str, dict[str, frozenset[str]]] = defaultdict(dict)
    for path, command in _commands().items():
        for p in _options(command):
            longs = frozenset(n for n in _names(p) if n.startswith("--"))
            for short in (n for n in _names(p) if not n.startswith("--")):
                uses[short][path] = longs
    return uses


def test_a_short_option_means_one_thing_in_every_command() -> None:
    clashes = {}
    for short, per in _short_uses().items():
        kept = {path: longs for path, longs in per.items() if (short, path) not in SHORT_EXCEPTIONS}
        groups = list(kept.values())
        # two uses agree when they share a long spelling (-ngl: --gpu-layers/--n-gpu-layers and --n-gpu-layers)
        if any(not (a & b) for a in groups for b in groups):
            clashes[short] = {path: sorted(longs) for path, longs in kept.items()}
    assert not clashes


def _long_meanings() -> dict[str, dict[str, tuple[Any, ...]]]:
    """long option → command of SHARED → its meaning there."""
    commands = _commands()
    out: dict[str, dict[str, tuple[Any, ...]]] = defaultdict(dict)
    for path in SHARED:
        for p in _options(commands[path]):
            for name in (n for n in _names(p) if n.startswith("--")):
                out[name][path] = _meaning(p)
    return out


def test_a_long_option_means_the_same_in_run_chat_serve_and_bench() -> None:
    differ = {}
    for name, per in _long_meanings().items():
        kept = {path: m for path, m in per.items() if (name, path) not in LONG_EXCEPTIONS}
        if len(set(kept.values())) > 1:
            differ[name] = kept
    assert not differ


def test_every_exception_is_still_one() -> None:
    """An exception whose option now agrees, or is gone, is taken out of the lists above."""
    shorts = _short_uses()
    stale = []
    for short, path in SHORT_EXCEPTIONS:
        agreed = [longs for p, longs in shorts.get(short, {}).items() if (short, p) not in SHORT_EXCEPTIONS]
        mine = shorts.get(short, {}).get(path)
        if mine is None or all(mine & longs for longs in agreed):
            stale.append((short, path))
    longs = _long_meanings()
    for name, path in LONG_EXCEPTIONS:
        per = longs.get(name, {})
        others = {m for p, m in per.items() if (name, p) not in LONG_EXCEPTIONS}
        if path not in per or not others or others == {per[path]}:
            stale.append((name, path))
    assert not stale
