"""The per-device footprint estimate (#43 item 2) against the sizes llama.cpp reports when it loads the model,
and how layers and buffers split between the CPU and a GPU."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from localgen.models import footprint
from localgen.models.gguf_meta import read_summary
from localgen.types import LoadParams
from tests.conftest import CLI

MIB = 1 << 20
TOLERANCE = 0.15  # each part within 15 % of what llama.cpp reports: the promise of docs/benchmarks.md
PARTS = {"weights": "model buffer size", "kv": "KV buffer size", "compute": "compute buffer size",
         "output": "output buffer size"}


def reported(stderr: str) -> tuple[dict[str, int], int, int]:
    """llama.cpp's load log: bytes of each part (all devices together), and layers offloaded of how many."""
    sizes = {part: int(sum(float(x) for x in re.findall(rf"{label} =\s+([\d.]+) MiB", stderr)) * MIB)
             for part, label in PARTS.items()}
    m = re.search(r"offloaded (\d+)/(\d+) layers", stderr)
    assert m, stderr[-2000:]
    return sizes, int(m.group(1)), int(m.group(2))


@pytest.mark.parametrize(("model", "ctx", "flash"), [
    ("smollm2:135m", 2048, "on"), ("smollm2:135m", 8192, "off"),
    ("gemma3:270m", 2048, "off"), ("gemma3:270m", 8192, "on"),
])
def test_the_estimate_is_within_15_percent_of_what_llama_cpp_reports(cli: CLI, model: str, ctx: int,
                                                                      flash: str) -> None:
    from localgen.models.resolve import resolve

    r = cli("run", "--verbose", "--raw", "-m", model, "-p", "hi", "-n", "1", "--ctx", str(ctx), "-fa", flash,
            "-ub", "512")
    assert r.returncode == 0, r.stderr[-2000:]
    sizes, offloaded, layers = reported(r.stderr)
    ref = resolve(model, offline=True)
    load = LoadParams(n_ctx=ctx, n_ubatch=512, flash_attn=flash == "on")
    est = footprint.of_file(ref.path, ref.summary, load, gpu_layers=-1 if offloaded == layers else offloaded)
    for part in PARTS:
        want = sizes[part]
        got = sum(getattr(d, part) for d in est.devices)
        assert abs(got - want) <= TOLERANCE * want, (part, got / MIB, want / MIB)


def test_layers_and_buffers_split_between_the_devices(smollm2_path: Path) -> None:
    s = read_summary(str(smollm2_path))
    w = footprint.layout(str(smollm2_path))
    assert len(w.layers) == s.n_layers and w.tied  # SmolLM2 multiplies its embedding at the end
    assert sum(w.layers) + w.embedding + w.output == s.tensor_bytes
    load = LoadParams(n_ctx=4096, flash_attn=True)
    cpu_only = footprint.estimate(s, w, load)
    assert [d.device for d in cpu_only.devices] == ["CPU"]
    assert cpu_only.on("GPU").total == 0
    assert cpu_only.on("CPU").kv == footprint.kv_bytes(s, 4096)

    part = footprint.estimate(s, w, load, gpu_layers=10)
    gpu, cpu = part.on("GPU"), part.on("CPU")
    assert gpu.weights == sum(w.layers[-10:])  # from the last layer down
    assert gpu.kv == cpu_only.on("CPU").kv * 10 // s.n_layers and gpu.kv + cpu.kv == cpu_only.on("CPU").kv
    assert cpu.compute >= s.vocab_size * 512 * 4  # the logits stay with the output matrix, on the CPU

    full = footprint.estimate(s, w, load, gpu_layers=-1)
    assert full == footprint.estimate(s, w, load, gpu_layers=999)
    assert full.on("GPU").weights == sum(w.layers) + w.output + w.embedding  # the tied matrix, once more
    assert full.on("CPU").weights == w.embedding and full.on("CPU").kv == 0
    assert full.on("GPU").compute >= s.vocab_size * 512 * 4 > full.on("CPU").compute

    # slots share the cells of n_ctx; each holds a row of logits; a smaller micro-batch needs less compute
    two = footprint.estimate(s, w, load, n_seq=2)
    assert two.on("CPU").output == 2 * cpu_only.on("CPU").output and two.on("CPU").kv == cpu_only.on("CPU").kv
    small = footprint.estimate(s, w, LoadParams(n_ctx=4096, n_ubatch=128, flash_attn=True))
    assert small.on("CPU").compute < cpu_only.on("CPU").compute
    q8 = footprint.estimate(s, w, LoadParams(n_ctx=4096, cache_type_k="q8_0", cache_type_v="q8_0"))
    assert q8.on("CPU").kv == cpu_only.on("CPU").kv * 34 // 64
    no_fa = footprint.estimate(s, w, LoadParams(n_ctx=32768, flash_attn=False))
    assert no_fa.on("CPU").compute > footprint.estimate(s, w, LoadParams(n_ctx=32768)).on("CPU").compute
