"""`localgen run --file F` / `--each-line`: many prompts, answers in input order, one per line (or JSONL).

Input lines are prompts; a line that is a JSON object takes "prompt" and optional per-line "system",
"id" and sampling settings. With -p, each prompt is the line, a blank line, then the -p text. A blank
input line gives a blank output line. A failed line is reported (stderr, or an "error" in JSONL) and the
rest go on; the exit status is then 1.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Iterator
from typing import Any, TextIO

from localgen.errors import LocalgenError, UsageError
from localgen.types import SamplingParams


@dataclasses.dataclass
class _Line:
    number: int
    prompt: str | None
    system: str | None
    sampling: SamplingParams
    ident: Any = None
    error: str | None = None


def _parse(source: TextIO, instruction: str | None, system: str | None, base: SamplingParams) -> Iterator[_Line]:
    fields = {f.name for f in dataclasses.fields(SamplingParams)} - {"grammar"}
    for number, raw in enumerate(source, 1):
        line = raw.rstrip("\n")
        if not line.strip():
            yield _Line(number, None, system, base)
            continue
        if line.lstrip().startswith("{"):
            try:
                obj = json.loads(line)
                if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
                    raise ValueError('needs a "prompt" string')
                settings = {k: obj[k] for k in obj if k in fields}
                unknown = set(obj) - fields - {"prompt", "system", "id"}
                if unknown:
                    raise ValueError(f"unknown keys {sorted(unknown)}")
                if "stop" in settings:
                    settings["stop"] = tuple(settings["stop"])
                sampling = dataclasses.replace(base, **settings)
                _check(sampling)
                text = "\n\n".join(p for p in (obj["prompt"], instruction) if p)
                yield _Line(number, text, obj.get("system", system), sampling, obj.get("id"))
            except (ValueError, TypeError, UsageError) as e:
                msg = e.message if isinstance(e, UsageError) else str(e)
                yield _Line(number, None, system, base, error=f"bad JSON line: {msg}")
            continue
        yield _Line(number, "\n\n".join(p for p in (line, instruction) if p), system, base)


def _check(s: SamplingParams) -> None:
    from localgen.types import SAMPLING_RANGES, in_range

    for key in SAMPLING_RANGES:
        v = getattr(s, key)
        if v is not None and not in_range(key, v):
            raise UsageError(f"{key}={v!r} is out of range")


def run_batch(engine: Any, source: TextIO, instruction: str | None, system: str | None, raw: bool,
              base: SamplingParams, parallel: int, json_out: bool, stats: bool, exact: bool | None = None) -> int:
    """Complete every line; returns the exit status (1 if any line failed)."""
    from localgen.engine.batch import Completion, ParallelContext, Request, new_seed

    if raw and system:
        raise UsageError("--system needs the chat template; it cannot be combined with --raw")
    lines: dict[int, _Line] = {}
    ready: dict[int, tuple[_Line, Completion | None]] = {}
    next_out = [1]
    failed = [0]
    totals = {"tokens": 0, "prompts": 0}

    def requests() -> Iterator[Request]:
        for ln in _parse(source, instruction, system, base):
            lines[ln.number] = ln
            if ln.prompt is None:
                ready[ln.number] = (ln, None)
                flush()
                continue
            try:
                if raw:
                    tokens = engine.raw_tokens(ln.prompt)
                else:
                    msgs = ([{"role": "system", "content": ln.system}] if ln.system else [])
                    tokens = engine.chat_tokens([*msgs, {"role": "user", "content": ln.prompt}])
            except LocalgenError as e:
                ln.error = e.message
                ready[ln.number] = (ln, None)
                flush()
                continue
            seed = ln.sampling.seed if ln.sampling.seed is not None else (
                base.seed + ln.number - 1 if base.seed is not None else new_seed())
            yield Request(ln.number, tokens, ln.sampling, seed)

    def done(c: Completion) -> None:
        ln = lines[c.index]
        if c.finish_reason.startswith("error: "):
            ln.error = c.finish_reason[len("error: "):]
        ready[c.index] = (ln, c)
        flush()

    def flush() -> None:
        while next_out[0] in ready:
            ln, c = ready.pop(next_out[0])
            _emit(ln, c, json_out)
            if ln.error:
                failed[0] += 1
            elif c is not None:
                totals["tokens"] += c.completion_tokens
                totals["prompts"] += 1
            next_out[0] += 1

    n_ctx = engine.params.n_ctx
    pc = ParallelContext(engine, parallel, n_ctx)
    t0 = time.perf_counter()
    try:
        pc.run(requests(), done, exact=exact)
        flush()
    except BrokenPipeError:  # the reader went away (`| head -1`): stop quietly, as `run -p` does
        return 0
    finally:
        pc.close()
    if stats:
        secs = time.perf_counter() - t0
        print(f"{totals['prompts']} prompts · {totals['tokens']} tokens generated in {secs:.2f} s · "
              f"{totals['tokens'] / secs if secs else 0:.1f} tok/s aggregate · --parallel {parallel} · "
              f"{pc.rows / pc.steps if pc.steps else 0:.1f} sequences per decode call"
              + (f" · {failed[0]} failed" if failed[0] else ""), file=sys.stderr)
    return 1 if failed[0] else 0


def _emit(ln: _Line, c: Any, json_out: bool) -> None:
    if json_out:
        doc: dict[str, Any] = {"line": ln.number}
        if ln.ident is not None:
            doc["id"] = ln.ident
        if ln.error:
            doc["error"] = ln.error
        elif c is not None:
            doc.update(text=c.text, finish_reason=c.finish_reason, seed=c.seed, prompt_tokens=c.prompt_tokens,
                       completion_tokens=c.completion_tokens, ttft_s=round(c.ttft_s, 4), total_s=round(c.total_s, 4))
        out = json.dumps(doc, ensure_ascii=False)
    else:
        if ln.error:
            print(f"localgen: line {ln.number}: {ln.error}", file=sys.stderr, flush=True)
        out = " ".join(c.text.split()) if c is not None and not ln.error else ""
    try:
        sys.stdout.write(out + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        from localgen.cli.output import silence_stdout

        silence_stdout()
        raise
