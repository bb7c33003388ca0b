"""Benchmark results as llama-bench records (its field names, so its tooling reads them) plus ours,
and the md / csv / json / jsonl writers."""

from __future__ import annotations

import csv
import io
import json
import platform
from typing import Any

from localgen.bench.runner import Result

# llama-bench's fields, in its order; ours follow.
LLAMA_BENCH_FIELDS = [
    "build_commit", "build_number", "cpu_info", "gpu_info", "backends", "model_filename", "model_type",
    "model_size", "model_n_params", "n_batch", "n_ubatch", "n_threads", "cpu_mask", "cpu_strict", "poll",
    "type_k", "type_v", "n_gpu_layers", "n_cpu_moe", "split_mode", "main_gpu", "no_kv_offload", "flash_attn",
    "tensor_split", "tensor_buft_overrides", "use_mmap", "embeddings", "n_prompt", "n_gen", "n_depth", "test_time",
    "avg_ns", "stddev_ns", "avg_ts", "stddev_ts",
]
OUR_FIELDS = [
    "test", "n_parallel", "model_name", "load_s", "ttft_ms", "itl_p50_ms", "itl_p90_ms", "itl_p99_ms", "peak_rss_bytes",
    "peak_gpu_bytes", "limit_ts", "limit_share", "batching", "kv_unified", "repetitions", "repetitions_planned",
    "localgen_version",
]


def system_info() -> dict[str, Any]:
    """The machine and build, for the header and every record."""
    import localgen
    from localgen import hardware
    from localgen.native.devices import backend_info

    b = backend_info()
    gpus = hardware.gpus()
    features = b["system_info"]
    backends = "CPU"
    if b["gpu_offload"]:
        backends = "Metal" if platform.system() == "Darwin" else "CUDA" if gpus else "GPU"
    return {
        "cpu_info": hardware.cpu_name(), "cores": hardware.usable_cores(), "ram": hardware.total_ram_bytes(),
        "gpu_info": ", ".join(f"{g.name} ({'memory [N/A]' if g.total is None else f'{g.total >> 20} MiB'})"
                              for g in gpus), "backends": backends,
        "build_commit": f"llama-cpp-python {b['llama_cpp_python']}", "build_number": 0,
        "features": features, "localgen_version": localgen.__version__,
    }


def record(r: Result, system: dict[str, Any]) -> dict[str, Any]:
    """One result as a flat dict."""
    import statistics

    c, t = r.config, r.test
    avg_ns = int(statistics.fmean(r.samples_ns))
    rec: dict[str, Any] = {
        "build_commit": system["build_commit"], "build_number": system["build_number"],
        "cpu_info": system["cpu_info"], "gpu_info": system["gpu_info"], "backends": system["backends"],
        "model_filename": r.model["filename"], "model_type": r.model["type"], "model_size": r.model["size"],
        "model_n_params": r.model["n_params"], "n_batch": c.n_batch, "n_ubatch": c.n_ubatch,
        "n_threads": c.n_threads, "cpu_mask": "0x0", "cpu_strict": False, "poll": 50, "type_k": c.type_k,
        "type_v": c.type_v, "n_gpu_layers": c.n_gpu_layers, "n_cpu_moe": c.n_cpu_moe,
        "split_mode": "layer", "main_gpu": c.main_gpu,
        "no_kv_offload": False, "flash_attn": c.flash_attn, "tensor_split": "0.00",
        "tensor_buft_overrides": overrides_text(c.placement), "use_mmap": True,
        "embeddings": False, "n_prompt": t.n_prompt, "n_gen": t.n_gen, "n_depth": t.n_depth,
        "test_time": r.test_time, "avg_ns": avg_ns,
        "stddev_ns": int(statistics.stdev(r.samples_ns)) if len(r.samples_ns) > 1 else 0,
        "avg_ts": round(r.avg_ts, 6), "stddev_ts": round(r.stddev_ts, 6),
        "test": t.label, "n_parallel": t.n_parallel, "model_name": r.model["name"], "load_s": round(r.load_s, 4),
        "ttft_ms": round(r.ttft_ms, 3) if r.ttft_ms is not None else None,
        "itl_p50_ms": r.itl_ms.get("p50"), "itl_p90_ms": r.itl_ms.get("p90"), "itl_p99_ms": r.itl_ms.get("p99"),
        "peak_rss_bytes": r.peak_rss, "peak_gpu_bytes": r.peak_gpu,
        "limit_ts": round(r.limit_ts, 2) if r.limit_ts else None,
        "limit_share": round(r.avg_ts / r.limit_ts, 4) if r.limit_ts else None,
        "batching": r.batching,
        "kv_unified": r.kv_unified,
        # the repetitions the row holds, of those asked (-r): fewer where the run was stopped inside this test
        "repetitions": r.repetitions, "repetitions_planned": r.planned,
        "moved": r.model.get("moved", {}),  # what the placement moved, from llama.cpp's load log (native/report.py)
        "localgen_version": system["localgen_version"],
        "samples_ns": r.samples_ns, "samples_ts": [round(x, 6) for x in r.samples_ts],
    }
    return rec


# the settings' values where a record does not say (the defaults; history from before a field was kept)
DEFAULTS = {"n_batch": 2048, "n_ubatch": 512, "flash_attn": True, "type_k": "f16", "type_v": "f16", "n_cpu_moe": 0,
            "main_gpu": 0, "tensor_buft_overrides": "none"}


def overrides_text(pairs: tuple[tuple[str, str], ...]) -> str:
    """llama-bench's tensor_buft_overrides: PATTERN=BUFFER pairs joined by ';', or "none"."""
    return ";".join(f"{p}={b}" for p, b in pairs) or "none"


def swept(records: list[dict[str, Any]]) -> list[str]:
    """Settings that vary between records, or differ from the defaults: they get their own column."""
    keys = ["n_threads", "n_gpu_layers", "main_gpu", "n_cpu_moe", "n_batch", "n_ubatch", "flash_attn", "type_k",
            "type_v", "tensor_buft_overrides"]
    cols = []
    for k in keys:
        values = {r.get(k, DEFAULTS.get(k)) for r in records}  # history from before a field was kept
        if len(values) > 1 or k in ("n_threads", "n_gpu_layers") or any(v != DEFAULTS.get(k, v) for v in values):
            cols.append(k)
    return cols


SHORT = {"n_threads": "threads", "n_gpu_layers": "ngl", "main_gpu": "main_gpu", "n_cpu_moe": "n_cpu_moe",
         "n_batch": "n_batch", "n_ubatch": "n_ubatch", "flash_attn": "fa", "type_k": "type_k", "type_v": "type_v",
         "tensor_buft_overrides": "ot"}


def size_gib(n: int) -> str:
    """llama-bench's size column: MiB below a GiB ("303.54 MiB"), else GiB ("4.58 GiB"), as that tool prints
    them (units.format_bytes' llama-bench style turns to GiB at 256 MiB: "0.30 GiB")."""
    if not n:
        return "-"
    return f"{n / (1 << 20):.2f} MiB" if n < 1 << 30 else f"{n / (1 << 30):.2f} GiB"


def params_b(n: int) -> str:
    """llama-bench's params column: millions below a billion ("134.52 M"), else billions ("7.24 B")."""
    return f"{n / 1e6:.2f} M" if n < 1_000_000_000 else f"{n / 1e9:.2f} B"


def rows(records: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Headers and cells of the llama-bench style table, with our extra columns after t/s."""
    cols = swept(records)
    headers = ["model", "size", "params", "backend", *[SHORT[c] for c in cols], "test", "t/s",
               "ttft ms", "itl p50/p99 ms", "load s", "peak RSS", "of BW limit"]
    cells = []
    for r in records:
        cells.append([
            r["model_type"], size_gib(r["model_size"]), params_b(r["model_n_params"]), r["backends"],
            *[_cell(r.get(c, DEFAULTS.get(c, 0))) for c in cols],
            shown_test(r),
            f"{r['avg_ts']:.2f} ± {r['stddev_ts']:.2f}",
            f"{r['ttft_ms']:.1f}" if r["ttft_ms"] is not None else "",
            f"{r['itl_p50_ms']:.2f}/{r['itl_p99_ms']:.2f}" if r["itl_p50_ms"] is not None else "",
            f"{r['load_s']:.2f}", size_gib(r["peak_rss_bytes"]) if r["peak_rss_bytes"] else "",
            f"{r['limit_share'] * 100:.0f} %" if r["limit_share"] else "",
        ])
    return headers, cells


def shown_test(r: dict[str, Any]) -> str:
    """The test as a table shows it: its -npl scheduling, and a row stopped before all its repetitions marked so."""
    batching = f" ({r['batching']}{', one pool' if r.get('kv_unified') else ''})" if r.get("batching") else ""
    return f"{r['test']}{batching}{stopped_note(r)}"


def stopped_note(r: dict[str, Any]) -> str:
    """` (18 of 200 reps)` for a row stopped before all its repetitions (Ctrl-C inside its test), else ""."""
    done, planned = r.get("repetitions"), r.get("repetitions_planned")  # (history from before they were kept)
    if type(done) is int and type(planned) is int and done < planned:
        return f" ({done:,} of {planned:,} reps)"
    return ""


def _cell(value: Any) -> str:
    return str(int(value) if isinstance(value, bool) else value)


def markdown(records: list[dict[str, Any]]) -> str:
    """A Markdown table shaped like llama-bench's -o md."""
    headers, cells = rows(records)
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    right = {"size", "params", "t/s", "ttft ms", "itl p50/p99 ms", "load s", "peak RSS", "of BW limit"}

    def line(values: list[str]) -> str:
        return "| " + " | ".join(v.rjust(w) if h in right else v.ljust(w)
                                 for v, w, h in zip(values, widths, headers, strict=True)) + " |"

    sep = "| " + " | ".join(("-" * (w - 1) + ":") if h in right else "-" * w
                            for w, h in zip(widths, headers, strict=True)) + " |"
    return "\n".join([line(headers), sep, *(line(c) for c in cells)]) + "\n"


def to_csv(records: list[dict[str, Any]]) -> str:
    """CSV with llama-bench's columns first (samples left out, as llama-bench does)."""
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=LLAMA_BENCH_FIELDS + OUR_FIELDS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in records:
        w.writerow(r)
    return out.getvalue()


def to_json(records: list[dict[str, Any]]) -> str:
    """A JSON array, as llama-bench -o json."""
    return json.dumps(records, indent=2) + "\n"


def to_jsonl(records: list[dict[str, Any]]) -> str:
    """One JSON object per line, as llama-bench -o jsonl."""
    return "".join(json.dumps(r) + "\n" for r in records)


FORMATS = {"md": markdown, "csv": to_csv, "json": to_json, "jsonl": to_jsonl}
