"""`localgen run`: one prompt in, the streamed answer out; built for shell pipelines."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from localgen.cli import options as o
from localgen.cli.output import ErrWriter, TextWriter
from localgen.errors import UsageError


def run(
    ctx_: typer.Context,
    prompt: Annotated[
        str | None,
        typer.Option("--prompt", "-p", show_default=False,
                     help="The prompt. Text piped on stdin comes first, then this, a blank line between."),
    ] = None,
    model: o.Model = None,
    offline: o.Offline = False,
    raw: Annotated[
        bool, typer.Option("--raw", help="Send the prompt as a plain completion, without the chat template.")
    ] = False,
    file: Annotated[
        Path | None,
        typer.Option("--file", exists=True, dir_okay=False, readable=True, rich_help_panel="Many prompts",
                     show_default=False, help="One prompt per line (or JSONL with \"prompt\" and per-line settings); "
                                              "answers in input order, one per line."),
    ] = None,
    each_line: Annotated[
        bool, typer.Option("--each-line", rich_help_panel="Many prompts",
                           help="Each stdin line is a prompt (with -p as the instruction after it).")
    ] = False,
    parallel: Annotated[
        int, typer.Option("--parallel", "-np", min=1, max=256, rich_help_panel="Many prompts",
                          help="Sequences decoded together in one batch (continuous batching).")
    ] = 1,
    exact: Annotated[
        bool | None, typer.Option("--exact/--no-exact", rich_help_panel="Many prompts", show_default=False,
                                  help="Keep each answer identical to running its prompt alone, batching only "
                                       "through kernels that give a row the same result in any batch. Default: "
                                       "for greedy (temperature 0) prompts. --no-exact batches everything.")
    ] = None,
    json_out: Annotated[
        bool, typer.Option("--json", rich_help_panel=o.OUTPUT_PANEL,
                           help="Print one JSON object at the end: text, finish reason, model, settings, stats.")
    ] = False,
    stats: Annotated[
        bool, typer.Option("--stats", rich_help_panel=o.OUTPUT_PANEL, help="Print timings to stderr at the end.")
    ] = False,
    verbose: o.Verbose = False,
    system: o.System = None,
    document: Annotated[
        list[Path] | None,
        typer.Option("--document", "-f", exists=True, dir_okay=False, readable=True, show_default=False,
                     help="A text file to put before the prompt (repeatable); long ones are cached (--prompt-cache)."),
    ] = None,
    draft: Annotated[
        str | None,
        typer.Option("--draft", rich_help_panel="Speculative decoding", show_default=False,
                     help="A small model with the same vocabulary proposes tokens; the model checks several at once."),
    ] = None,
    lookup: Annotated[
        bool, typer.Option("--lookup", rich_help_panel="Speculative decoding",
                           help="Draft from n-grams already in the context (prompt lookup): fast for summaries, "
                                "code edits, extraction.")
    ] = False,
    draft_max: Annotated[
        int, typer.Option("--draft-max", min=1, max=64, rich_help_panel="Speculative decoding",
                          help="Most tokens drafted per step.")
    ] = 6,
    beams: Annotated[
        int | None, typer.Option("--beams", min=1, max=64, rich_help_panel="Beam search",
                          help="Keep N hypotheses decoded together and print the best (1 = greedy). Sampling "
                               "settings do not apply; --json lists all N with scores.", show_default=False)
    ] = None,
    length_penalty: Annotated[
        float, typer.Option("--length-penalty", min=0.0, max=5.0, rich_help_panel="Beam search",
                            help="Final score = log-probability / length ** this (higher favours longer answers).")
    ] = 1.0,
    prompt_cache: Annotated[
        bool,
        typer.Option("--prompt-cache/--no-prompt-cache", rich_help_panel=o.MODEL_PANEL,
                     help="Keep the KV state of a long shared prefix (documents, piped text, system prompt) on disk "
                          "and load it next time instead of recomputing it."),
    ] = True,
    temperature: o.Temperature = o.DEFAULTS.temperature,
    top_k: o.TopK = o.DEFAULTS.top_k,
    top_p: o.TopP = o.DEFAULTS.top_p,
    min_p: o.MinP = o.DEFAULTS.min_p,
    typical_p: o.TypicalP = o.DEFAULTS.typical_p,
    repeat_penalty: o.RepeatPenalty = o.DEFAULTS.repeat_penalty,
    repeat_last_n: o.RepeatLastN = o.DEFAULTS.repeat_last_n,
    presence_penalty: o.PresencePenalty = o.DEFAULTS.presence_penalty,
    frequency_penalty: o.FrequencyPenalty = o.DEFAULTS.frequency_penalty,
    seed: o.Seed = None,
    max_tokens: o.MaxTokens = o.DEFAULTS.max_tokens,
    stop: o.Stop = None,
    grammar: o.GrammarFile = None,
    json_schema: o.JsonSchemaFile = None,
    ctx: o.Ctx = o.LOAD_DEFAULTS.n_ctx,
    threads: o.Threads = None,
    gpu_layers: o.GpuLayers = None,
    batch_size: o.Batch = o.LOAD_DEFAULTS.n_batch,
    ubatch_size: o.UBatch = o.LOAD_DEFAULTS.n_ubatch,
    flash_attn: o.FlashAttn = o.LOAD_DEFAULTS.flash_attn,
    cache_type_k: o.CacheK = o.LOAD_DEFAULTS.cache_type_k,
    cache_type_v: o.CacheV = o.LOAD_DEFAULTS.cache_type_v,
    repack: o.Repack = o.LOAD_DEFAULTS.repack,
) -> None:
    """Generate from one prompt and stream the answer to stdout.

    stdout carries only the answer; loading messages, warnings and --stats go to stderr.
    Exit codes: 0 done, 1 error, 2 bad usage, 130 interrupted.
    """
    many = file is not None or each_line
    if file is not None and each_line:
        raise UsageError("--file and --each-line cannot be combined")
    if not many and (parallel > 1 or exact is not None):
        raise UsageError(f"{'--parallel' if parallel > 1 else '--exact/--no-exact'} applies to many prompts: "
                         "add --file FILE or --each-line")
    parts = [] if many else [*(_read_document(d) for d in document or []), *_read_prompt(prompt)]
    text = "\n\n".join(parts)
    if grammar and json_schema:
        raise UsageError("--grammar and --json-schema cannot be combined")
    if raw and system:
        raise UsageError("--system needs the chat template; it cannot be combined with --raw")
    gbnf = _grammar(grammar, json_schema)
    if draft or lookup:
        # llama.cpp's flash-attention kernel and its repacked CPU weights compute a batch of tokens with a
        # different rounding than one token; checking drafts in a batch would then drift from plain
        # decoding. Without them the two agree exactly (at temperature 0).
        for flag, name in ((flash_attn, "flash_attn"), (repack, "repack")):
            if flag and o.given(ctx_, name):
                ErrWriter().warn(f"with --{name.replace('_', '-')}, speculative output can differ slightly "
                                 "from plain decoding")
        flash_attn = flash_attn and o.given(ctx_, "flash_attn")
        repack = repack and o.given(ctx_, "repack")
    load = o.load_params(ctx, threads, gpu_layers, batch_size, ubatch_size, flash_attn, cache_type_k,
                         cache_type_v, repack)
    from localgen.cli.progress import make_progress
    from localgen.models.load import open_engine
    from localgen.models.resolve import resolve

    ref = resolve(model, offline=offline, progress=make_progress())
    flags = {**o.sampling_flags(locals()), "grammar": gbnf}
    sampling = o.sampling_params(ctx_, flags, ref.sampling_defaults)
    err = ErrWriter()
    err.status(f"loading {ref.name} ({ref.quantization or 'unknown quantization'}) ...")
    engine: Any = open_engine(ref, load, verbose=verbose, warn=err.warn)
    drafter: Any = None
    if draft and lookup:
        engine.close()
        raise UsageError("--draft and --lookup cannot be combined")
    if beams and (draft or lookup or many or gbnf):
        engine.close()
        raise UsageError("--beams cannot be combined with --draft, --lookup, --file, --each-line or a grammar")
    if draft or lookup:
        from localgen.engine import speculative

        if lookup:
            drafter = speculative.LookupDrafter()
        else:
            err.status(f"loading the draft model {draft} ...")
            try:
                drafter = speculative.ModelDrafter(engine, open_engine(
                    resolve(draft, offline=offline, progress=make_progress()), load, verbose=verbose, warn=err.warn))
            except BaseException:
                engine.close()
                raise
    if many:
        from localgen.cli.batchrun import run_batch

        try:
            if file is not None:
                with open(file, encoding="utf-8", errors="replace") as source:
                    rc = run_batch(engine, source, prompt, system, raw, sampling, parallel, json_out, stats, exact)
            else:
                rc = run_batch(engine, sys.stdin, prompt, system, raw, sampling, parallel, json_out, stats, exact)
        except KeyboardInterrupt:
            err.line("interrupted")
            raise typer.Exit(130) from None
        finally:
            engine.close()
        raise typer.Exit(rc)
    try:
        def prompt_tokens(content: str) -> list[int]:
            if raw:
                return list(engine.raw_tokens(content))
            messages = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": content}
            ]
            return list(engine.chat_tokens(messages))

        started = time.perf_counter()
        tokens = prompt_tokens(text)
        cache_use = "skipped" if prompt_cache else "off"
        if len(parts) > 1 and len(tokens) < engine.n_ctx:
            # The shared prefix: everything before the last part (the question that varies between runs).
            from localgen import promptcache
            from localgen.engine import state
            from localgen.engine.llama import common_prefix

            shared = common_prefix(prompt_tokens("\n\n".join(parts[:-1]) + "\n\n"), tokens)
            if prompt_cache:
                cache_use = promptcache.attach_prefix(engine, tokens[:shared])
            elif shared >= promptcache.MIN_PREFIX:
                # Evaluated in the same two pieces as with the cache: llama.cpp's kernels round a row
                # differently in batches of other sizes, and the text must not depend on the cache.
                state.fill(engine, tokens[:shared])
        if beams:
            _run_beams(engine, ref, tokens, sampling, beams, length_penalty, json_out, stats, err)
            return
        gen = engine.generate(tokens, sampling, started=started, drafter=drafter, draft_max=draft_max)
        out = TextWriter(sys.stdout, enabled=not json_out)
        try:
            for chunk in gen:
                if not out.write(chunk.text):  # the reader went away (`| head -1`): stop quietly
                    gen.close()
                    raise typer.Exit(0)
        except KeyboardInterrupt:
            gen.close()
            out.end()
            err.line("interrupted")
            raise typer.Exit(130) from None
        out.end()
        assert gen.stats is not None
        if gen.finish_reason == "context":
            err.warn(f"stopped: the context window ({engine.n_ctx:,} tokens) is full; raise --ctx for more")
        if stats:
            err.stats(gen.stats)
        if json_out:
            _print_json(engine, gen, sampling, cache_use)
    finally:
        if drafter is not None:
            drafter.close()
        engine.close()


def _run_beams(engine: Any, ref: Any, tokens: list[int], sampling: Any, n: int, length_penalty: float,
               json_out: bool, stats: bool, err: ErrWriter) -> None:
    import json
    from dataclasses import asdict

    from localgen.engine.beams import search
    from localgen.types import Stats

    t0 = time.perf_counter()
    result = search(engine, tokens, n, sampling.max_tokens, length_penalty, sampling.stop)
    best = result.beams[0]
    total = time.perf_counter() - t0
    st = Stats(prompt_tokens=result.prompt_tokens, cached_tokens=0, completion_tokens=len(best.tokens),
               load_s=engine.load_s, ttft_s=total, prefill_tps=result.prompt_tokens / result.prefill_s
               if result.prefill_s else None,
               decode_tps=result.decoded_tokens / result.decode_s if result.decode_s else None, total_s=total,
               finish_reason=best.finish_reason)  # type: ignore[arg-type]
    if stats:
        err.stats(st)
    if json_out:
        doc = {"text": best.text, "finish_reason": best.finish_reason, "model": {"name": ref.name, "file": ref.path},
               "beams": [{"text": h.text, "score": round(h.score, 5), "logprob": round(h.logprob, 5),
                          "tokens": len(h.tokens), "finish_reason": h.finish_reason} for h in result.beams],
               "length_penalty": length_penalty, "load": asdict(engine.params), "stats": st.to_dict()}
        sys.stdout.write(json.dumps(doc, ensure_ascii=False) + "\n")
    else:
        out = TextWriter(sys.stdout)
        out.write(best.text)
        out.end()


def _read_document(path: Path) -> str:
    try:
        return f"{path.name}:\n\n{path.read_text(encoding='utf-8')}"
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not UTF-8 text") from None


def _read_prompt(prompt: str | None) -> list[str]:
    piped = ""
    stdin = sys.stdin
    if stdin is not None and not stdin.closed and not stdin.isatty():
        try:
            piped = stdin.read()
        except (OSError, ValueError):
            piped = ""
        except UnicodeDecodeError:
            raise UsageError("stdin is not UTF-8 text") from None
    parts = [p for p in (piped.strip("\n"), prompt) if p]
    if not parts:
        raise UsageError("no prompt: pass -p/--prompt, or pipe text on stdin")
    return parts


def _grammar(grammar: Path | None, json_schema: Path | None) -> str | None:
    if grammar:
        text = grammar.read_text(encoding="utf-8", errors="replace")
        if not text.strip():
            raise UsageError(f"the grammar file {grammar} is empty")
        return text
    if json_schema:
        from localgen.engine.llama import grammar_from_json_schema

        return grammar_from_json_schema(json_schema.read_text(encoding="utf-8", errors="replace"))
    return None


def _print_json(engine: Any, gen: Any, sampling: Any, cache_use: str) -> None:
    import json
    from dataclasses import asdict

    import localgen

    ref = engine.model
    settings = sampling.to_dict()
    settings["grammar"] = sampling.grammar is not None
    settings["seed"] = gen.seed
    doc = {
        "text": gen.text,
        "finish_reason": gen.finish_reason,
        "model": {
            "name": ref.name,
            "file": ref.path,
            "source": ref.source,
            "quantization": ref.quantization,
            "architecture": ref.summary.architecture,
            "parameters": ref.summary.n_params,
            "file_size": ref.summary.file_size,
        },
        "seed": gen.seed,
        "sampling": settings,
        "load": asdict(engine.params),
        "stats": gen.stats.to_dict(),
        "prompt_cache": cache_use,
        "localgen": localgen.__version__,
    }
    sys.stdout.write(json.dumps(doc, ensure_ascii=False) + "\n")
    sys.stdout.flush()
