#!/usr/bin/env python3
"""GGUF header reading: localgen's bounded reader (models/gguf_meta.py) against the same summary built on the
`gguf` package's GGUFReader, side by side (alternating runs, medians), on what `list`, `show`, `pull` and a
`run` with a cold summary cache read: the embedded SmolLM2 and Gemma 3 270M, a Llama-3-sized tokenizer
(128k tokens, 280k merges) and a split model (SmolLM2 in 3 parts). Also what importing gguf (and numpy)
costs a fresh process, and each reader's whole cold `summarize` in a fresh process (wall time, peak RSS).

--baseline REV adds gguf_meta.py as it was at git revision REV (read with `git show`, nothing checked out),
for before/after figures of a change to the reader.

usage: scripts/bench_gguf_meta.py [--runs 5] [--baseline HEAD] [--skip gemma,llama3,split]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

Meta = tuple[dict[str, Any], list[tuple[str, list[int], int, int]], int]


def read_with_gguf(path: str) -> Meta:
    """read_gguf()'s result, taken from gguf.GGUFReader (which parses every field and tensor info up front)."""
    from gguf import GGUFReader, GGUFValueType

    from localgen.models import gguf_meta

    r = GGUFReader(path)
    meta: dict[str, Any] = {}
    for key, field in r.fields.items():
        if key.startswith("GGUF."):
            continue
        keep = gguf_meta.MAX_ARRAY_KEEP if field.types[-1] == GGUFValueType.STRING else gguf_meta.MAX_NUMBERS_KEEP
        if field.types[0] == GGUFValueType.ARRAY and len(field.data) > keep:
            meta[key] = gguf_meta._ArrayLen(len(field.data))
        else:
            meta[key] = field.contents()
    tensors = [(t.name, [int(d) for d in t.shape], int(t.tensor_type), t.data_offset - r.data_offset)
               for t in r.tensors]
    return meta, tensors, r.data_offset


@contextmanager
def patched_reader(module: types.ModuleType, reader: Callable[[str], Meta] | None) -> Any:
    """Run `module.summarize` with `reader` in place of its read_gguf (split parts included)."""
    if reader is None:
        yield
        return
    saved = module.read_gguf  # type: ignore[attr-defined]
    module.read_gguf = reader  # type: ignore[attr-defined]
    try:
        yield
    finally:
        module.read_gguf = saved  # type: ignore[attr-defined]


def baseline_module(rev: str) -> types.ModuleType:
    """gguf_meta.py as it was at `rev`, loaded under another name."""
    source = subprocess.run(["git", "show", f"{rev}:localgen/models/gguf_meta.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    module = types.ModuleType("gguf_meta_baseline")
    module.__file__ = f"{rev}:localgen/models/gguf_meta.py"
    sys.modules[module.__name__] = module
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


def cases(tmp: Path, skip: set[str]) -> dict[str, str]:
    from localgen.models import embedded

    out = {"smollm2": str(embedded.locate(embedded.EMBEDDED["smollm2:135m"]))}
    if "gemma" not in skip:
        try:
            out["gemma3-270m"] = str(embedded.locate(embedded.EMBEDDED["gemma3:270m"]))
        except Exception as e:  # not installed here: say so and go on
            print(f"(no Gemma 3 270M: {e})", file=sys.stderr)
    if "llama3" not in skip:
        import harness

        out["llama3-vocab"] = str(harness.llama3_header(tmp / "llama3-header.gguf"))
    if "split" not in skip:
        from tests.gguf_split import split_model

        parts = split_model(Path(out["smollm2"]), tmp / "split", "smol-Q4_1", 100)
        out[f"split x{len(parts)}"] = str(parts[0])
    return out


def fresh(code: str, *args: str) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of a fresh Python process running `code`."""
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(done.stderr)
    return wall, float(done.stdout.split()[-1]) / 1024


# Peak RSS (VmHWM, KiB) of the child alone: getrusage's ru_maxrss would start from the parent's at the fork.
RSS = "print(next(line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM')))"
PROCS = {
    "python -c pass": f"{RSS}",
    "import numpy": f"import numpy; {RSS}",
    "import numpy, gguf": f"import numpy, gguf; {RSS}",
    "import gguf_meta": f"import localgen.models.gguf_meta; {RSS}",
}
SUMMARIZE = {
    "localgen summarize": "import sys; from localgen.models.gguf_meta import summarize; summarize(sys.argv[1]); "
                          + RSS,
    "gguf summarize": "import sys; from scripts.bench_gguf_meta import read_with_gguf; "
                      "from localgen.models import gguf_meta; gguf_meta.read_gguf = read_with_gguf; "
                      "gguf_meta.summarize(sys.argv[1]); " + RSS,
}


def main() -> None:
    import harness  # here: a child process imports this module as scripts.bench_gguf_meta

    def median_ms(xs: list[float]) -> str:
        return f"{harness.median(xs) * 1000:9.1f} ms"

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--baseline", metavar="REV", help="also time gguf_meta.py as it was at this git revision")
    ap.add_argument("--skip", default="", help="comma-separated cases to leave out: gemma, llama3, split")
    a = ap.parse_args()
    from localgen.models import gguf_meta

    readers: dict[str, tuple[types.ModuleType, Callable[[str], Meta] | None]] = {
        "localgen": (gguf_meta, None),
        "gguf.GGUFReader": (gguf_meta, read_with_gguf),
    }
    if a.baseline:
        readers[f"localgen@{a.baseline}"] = (baseline_module(a.baseline), None)
    import gguf  # noqa: F401 (imported once here, so the in-process times below are of reading alone)

    def summarize(module: types.ModuleType, reader: Callable[[str], Meta] | None, path: str) -> float:
        with patched_reader(module, reader):
            return harness.timed(partial(module.summarize, path))[0]

    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; "
          f"medians of {a.runs} alternating runs")
    with tempfile.TemporaryDirectory() as tmp:
        paths = cases(Path(tmp), set(filter(None, a.skip.split(","))))
        print("\nsummarize(path), in process (imports done):")
        for case, path in paths.items():
            seen = {}
            for label, (module, reader) in readers.items():  # warm the page cache; check they agree
                with patched_reader(module, reader):
                    seen[label] = module.summarize(path)
            if any(s != seen["localgen"] for s in seen.values()):
                print(f"  ({case}: the readers' summaries differ)")
            times = harness.alternate({label: partial(summarize, *r, path) for label, r in readers.items()}, a.runs,
                                      flip=False)
            mine = harness.median(times["localgen"])
            print(f"  {case:<14} " + "  ".join(
                f"{label} {median_ms(t)} ({harness.ratio(harness.median(t), mine, '5.1f')})"
                for label, t in times.items()))
        print("\nfresh process, wall time and peak RSS:")
        runs = harness.alternate({label: partial(fresh, code) for label, code in PROCS.items()}, a.runs, flip=False)
        for label, got in runs.items():  # the RSS of the last run
            print(f"  {label:<40} {median_ms([w for w, _ in got])}  {got[-1][1]:6.0f} MiB")
        walls = {label: [w for w, _ in got] for label, got in runs.items()}
        extra = harness.median(walls["import numpy, gguf"]) - harness.median(walls["import numpy"])
        print(f"  (gguf over numpy, as on `run`, where llama_cpp imports numpy anyway: {extra * 1000:.1f} ms)")
        for case in ("smollm2", "gemma3-270m"):
            if case not in paths:
                continue
            runs = harness.alternate({label: partial(fresh, code, paths[case]) for label, code in SUMMARIZE.items()},
                                     a.runs, flip=False)
            for label, got in runs.items():
                print(f"  {label + ' ' + case:<40} {median_ms([w for w, _ in got])}  {got[-1][1]:6.0f} MiB")


if __name__ == "__main__":
    main()
