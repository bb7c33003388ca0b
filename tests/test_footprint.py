"""The plan's memory per device (models/footprint.py through models/fit.py) against the sizes llama.cpp reports
when it loads the model, for a dense llama (SmolLM2), a sliding-window model (Gemma 3) and a mixture of
experts (a random qwen3moe): weights and KV cache to the byte (as llama.cpp prints them, in MiB to two
places), compute within COMPUTE_TOLERANCE; and how layers, buffers and experts split between devices."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from localgen.models import fit, footprint
from localgen.models.gguf_meta import read_summary
from localgen.types import LoadParams
from tests.conftest import CLI, NO_GPU

MIB = 1 << 20
COMPUTE_TOLERANCE = 0.05  # the compute buffers within 5 % of what llama.cpp reports: stated here, not imported
PARTS = {"weights": "model buffer size", "kv": "KV buffer size", "compute": "compute buffer size",
         "output": "output buffer size"}


def reported(stderr: str) -> tuple[dict[str, float], int, int]:
    """llama.cpp's load log: MiB of each part (all buffers together), and layers offloaded of how many."""
    sizes = {part: sum(float(x) for x in re.findall(rf"{label} =\s+([\d.]+) MiB", stderr))
             for part, label in PARTS.items()}
    m = re.search(r"offloaded (\d+)/(\d+) layers", stderr)
    assert m, stderr[-2000:]
    return sizes, int(m.group(1)), int(m.group(2))


CASES = [
    ("smollm2:135m", ["--ctx", "2048", "-fa", "on"]),  # the allocator's worst case here: 4.2 % over the estimate
    ("smollm2:135m", ["--ctx", "8192", "-fa", "off"]),
    ("gemma3:270m", ["--ctx", "2048", "-fa", "off", "--repack"]),  # a second, repacked copy of some weights
    ("gemma3:270m", ["--ctx", "8192", "-fa", "on"]),  # sliding-window layers: two KV buffers
    ("moe", ["--ctx", "4096", "-ub", "256"]),
    ("moe", ["--ctx", "2048", "-fa", "off", "--n-cpu-moe", "2", "-ot", r"blk\.3\.ffn_up_exps=CPU"]),
    # Q4_K_M: the experts (3-D, MUL_MAT_ID) and the tied embedding as the output matrix get repacked copies too
    ("moe-q4", ["--ctx", "2048", "--repack"]),
]


@pytest.fixture(scope="module")
def moe_q4_path(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Path:
    """The suite's small MoE (tests/model_shapes.py, tiny-moe) in Q4_K_M, which this CPU repacks."""
    import dataclasses

    from tests.model_shapes import SHAPES, build

    return build(dataclasses.replace(SHAPES["tiny-moe"], quant="q4_k_m"),
                 tmp_path_factory.mktemp("moe-q4") / "tiny-moe-q4.gguf", tokenizer=smollm2_path)


@pytest.mark.parametrize(("model", "args"), CASES)
def test_the_plan_matches_what_llama_cpp_reports(cli: CLI, moe_path: Path, request: pytest.FixtureRequest, model: str,
                                                 args: list[str]) -> None:
    from localgen.cli.fit import fit as _  # noqa: F401 (the command the user asks; its plan is this one)
    from localgen.models.resolve import resolve

    name = {"moe": str(moe_path), "moe-q4": str(request.getfixturevalue("moe_q4_path"))}.get(model, model)
    # the CPU's plan, on any machine: with a GPU, scripts/gpu_check's fit stage checks the plan against the load
    cli = CLI({**cli.env, **NO_GPU})
    r = cli("run", "--verbose", "--raw", "-m", name, "-p", "hi", "-n", "1", *args)
    assert r.returncode == 0, r.stderr[-2000:]
    sizes, offloaded, _layers = reported(r.stderr)
    # the plan `localgen fit` prints for the same settings, on this machine (no GPU: everything in RAM)
    plan = cli("fit", "-m", name, "--json", *[a for a in args if a not in ("-n", "1")])
    assert plan.returncode == 0, plan.stderr
    import json

    doc = json.loads(plan.stdout)
    want = {part: sum(d[part] for d in doc["devices"]) / MIB for part in PARTS}
    assert offloaded == doc["gpu_layers"]
    for part in ("weights", "kv", "output"):
        assert round(want[part], 2) == sizes[part], (part, want[part], sizes[part])
    # everything on the CPU here: its buffer lines (CPU_Mapped, and CPU_REPACK with --repack) are `mapped` too
    cpu = next(d for d in doc["devices"] if d["device"] == "CPU")
    assert round(cpu["mapped"] / MIB, 2) == sizes["weights"], (cpu, sizes)
    assert abs(want["compute"] - sizes["compute"]) <= COMPUTE_TOLERANCE * sizes["compute"], \
        (want["compute"], sizes["compute"])
    assert resolve(name).summary.n_layers == doc["model"]["layers"]


def test_layers_and_buffers_split_between_the_devices(smollm2_path: Path) -> None:
    s = read_summary(str(smollm2_path))
    w = footprint.layout(str(smollm2_path))
    assert len(w.layers) == s.n_layers and w.tied  # SmolLM2 multiplies its embedding at the end
    assert w.total == sum(w.layers) + w.embedding + w.output == s.tensor_bytes
    load = LoadParams(n_ctx=4096, flash_attn=True)
    cpu_only = footprint.estimate(s, w, load)
    assert [d.device for d in cpu_only.devices] == ["CPU"]
    assert cpu_only.on("GPU").total == 0
    assert cpu_only.on("CPU").kv == fit.kv_bytes(s, 4096)

    # llama.cpp counts n_layer + 1 layers, the output layer last: 10 are the output layer and 9 repeating ones
    part = footprint.estimate(s, w, load, gpu_layers=10)
    gpu, cpu = part.on("GPU"), part.on("CPU")
    # the tied matrix, once more; and what CUDA's buffer adds to each of its tensors (576-wide rows)
    pad = sum(t.gpu_pad for t in w.tensors if (t.layer is not None and t.layer >= s.n_layers - 9) or t.output)
    assert pad > 0 and gpu.weights == sum(w.layers[-9:]) + w.output + w.embedding + pad + w.embedding_gpu_pad
    assert gpu.kv == cpu_only.on("CPU").kv * 9 // s.n_layers and gpu.kv + cpu.kv == cpu_only.on("CPU").kv
    assert gpu.compute >= s.vocab_size * 512 * 4  # the logits go with the output layer

    full = footprint.estimate(s, w, load, gpu_layers=-1)
    assert full == footprint.estimate(s, w, load, gpu_layers=999)
    assert full.on("GPU").weights == sum(w.layers) + w.output + w.embedding + sum(t.gpu_pad for t in w.tensors)
    assert full.on("CPU").weights == w.embedding and full.on("CPU").kv == 0
    assert full.on("GPU").compute >= s.vocab_size * 512 * 4 > full.on("CPU").compute

    # each sequence has its own cells and a row of logits; a smaller micro-batch needs less compute
    two = footprint.estimate(s, w, load, n_seq=2)
    assert two.on("CPU").output == 2 * cpu_only.on("CPU").output and two.on("CPU").kv == 2 * cpu_only.on("CPU").kv
    small = footprint.estimate(s, w, LoadParams(n_ctx=4096, n_ubatch=128, flash_attn=True))
    assert small.on("CPU").compute < cpu_only.on("CPU").compute
    q8 = footprint.estimate(s, w, LoadParams(n_ctx=4096, cache_type_k="q8_0", cache_type_v="q8_0"))
    assert q8.on("CPU").kv == cpu_only.on("CPU").kv * 34 // 64
    no_fa = footprint.estimate(s, w, LoadParams(n_ctx=32768, flash_attn=False))
    assert no_fa.on("CPU").compute > footprint.estimate(s, w, LoadParams(n_ctx=32768)).on("CPU").compute


def test_experts_follow_the_placement_patterns(moe_path: Path) -> None:
    s = read_summary(str(moe_path))
    w = footprint.layout(str(moe_path))
    assert w.moe and all(w.experts) and sum(w.experts) > w.total // 3 and w.tied
    load = LoadParams(n_ctx=4096)
    everything = footprint.estimate(s, w, load, gpu_layers=-1)
    assert everything.on("GPU").experts == sum(w.experts) and everything.on("CPU").experts == 0
    for flags, kept in ((LoadParams(n_ctx=4096, n_cpu_moe=2), sum(w.experts[:2])),
                        (LoadParams(n_ctx=4096, cpu_moe=True), sum(w.experts)),
                        (LoadParams(n_ctx=4096, override_tensor=((r"blk\.[13]\.ffn_.*_exps", "CPU"),)),
                         w.experts[1] + w.experts[3])):
        f = footprint.estimate(s, w, flags, gpu_layers=-1)
        assert f.on("CPU").experts == kept and f.on("GPU").experts == sum(w.experts) - kept
        assert f.on("CPU").weights == w.embedding + kept  # the tied embedding's lookup copy stays there
        assert f.on("GPU").kv == everything.on("GPU").kv  # the KV cache stays with its layer
        # llama.cpp copies those experts' weights to the GPU for a micro-batch and computes them there (an H200's
        # host buffer stayed the same with --n-cpu-moe and --cpu-moe: test_the_gpu_split_is_the_one_an_h200_reported)
        assert f.on("CPU").compute == everything.on("CPU").compute


def test_the_mapped_span_is_each_files_and_without_mmap_the_weights(moe_path: Path) -> None:
    """`mapped` (llama.cpp's CPU_Mapped line): one span per file of a split model, from the first of the CPU's
    tensors to the end of its last, summed; without mmap llama.cpp allocates the CPU's tensors alone."""
    s = read_summary(str(moe_path))
    from localgen.models.gguf_meta import read_gguf

    table = read_gguf(str(moe_path))[1]
    one = footprint.layout_of(table)
    # the same tensors as two files: blk.0 and the rest in the second, its offsets counted from that file's data
    second = [row for row in table if row[0].startswith(("blk.1.", "blk.2.", "blk.3."))]
    first = [row for row in table if row not in second]
    base = min(row[3] for row in second)
    split = footprint.layout_of([(*row, 0) for row in first] + [(n, d, t, o - base, 1) for n, d, t, o in second])
    load = LoadParams(n_ctx=4096, n_cpu_moe=2)
    whole = footprint.estimate(s, one, load, gpu_layers=-1).on("CPU")
    parts = footprint.estimate(s, split, load, gpu_layers=-1).on("CPU")
    assert parts.weights == whole.weights and whole.weights < whole.mapped
    # the first file's span ends with blk.0's experts; the second's runs from blk.1's first expert to its last
    exps = [t for t in split.tensors if t.expert and t.layer in (0, 1)]
    ends = {p: max(t.offset + t.nbytes for t in exps if t.part == p) for p in (0, 1)}
    starts = {0: 0, 1: min(t.offset for t in exps if t.part == 1)}
    assert parts.mapped == sum(ends[p] - starts[p] for p in (0, 1)) < whole.mapped
    plain = footprint.estimate(s, one, LoadParams(n_ctx=4096, n_cpu_moe=2, use_mmap=False), gpu_layers=-1).on("CPU")
    assert plain.mapped == plain.weights == whole.weights


# llama.cpp's compute buffers (MiB: the GPU's, the host's) and its CPU_Mapped line (MiB) with every layer on an H200,
# for the GPU check's random models (scripts/gpu_check, 2026-11-30: docs/benchmarks.md), by the flags they were loaded
# with. With experts in RAM the CPU_Mapped line is the file's span from the token embedding to the last expert kept
H200_SHAPES = {
    "dense": ("llama", 32, 4096, 32, 8, 128, {"ff": 14336, "ctx": 8192}),
    "moe": ("qwen3moe", 24, 2048, 16, 4, 128, {"experts": 64, "used": 8, "ff_exp": 768, "ctx": 4096}),
}
H200 = [
    ("dense", {"n_ctx": 4096}, 112.01, 20.01, 108.00),
    ("dense", {"n_ctx": 8192}, 116.01, 24.01, 108.00),
    ("dense", {"n_ctx": 4096, "n_ubatch": 256}, 56.01, 10.01, 108.00),
    # the -ub 128 and -ub 1024 rows: measured after the rule
    ("dense", {"n_ctx": 3072, "n_ubatch": 128}, 27.75, 4.75, 108.00),
    ("dense", {"n_ctx": 2048, "n_batch": 1024, "n_ubatch": 1024}, 220.02, 36.03, 108.00),
    ("moe", {"n_ctx": 4096}, 140.41, 12.01, 54.00),
    ("moe", {"n_ctx": 4096, "n_ubatch": 256}, 70.21, 6.01, 54.00),
    ("moe", {"n_ctx": 3072, "n_ubatch": 128}, 35.75, 2.75, 54.00),
    ("moe", {"n_ctx": 2048, "n_batch": 1024, "n_ubatch": 1024}, 284.02, 20.03, 54.00),
    ("moe", {"n_ctx": 4096, "n_cpu_moe": 12}, 140.41, 12.01, 2300.50),
    ("moe", {"n_ctx": 4096, "cpu_moe": True}, 138.76, 12.01, 4468.25),
]


@pytest.fixture(scope="module")
def h200_moe(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Path:
    """The header of the GPU check's MoE (scripts/make_random_moe.py with its flags, --header-only): its tensor table
    as the check wrote it, offsets and all, the data a hole."""
    import contextlib
    import io
    import runpy

    from tests.conftest import ROOT

    out = tmp_path_factory.mktemp("h200") / "qwen3moe-q4km.gguf"
    mp = pytest.MonkeyPatch()
    try:  # in this process, as the script runs (scripts/ first on its path)
        mp.syspath_prepend(str(ROOT / "scripts"))
        mp.setattr("sys.argv", ["make_random_moe.py", str(smollm2_path), str(out), "--type", "q4_k_m", "--embd", "2048",
                                "--layers", "24", "--heads", "16", "--kv-heads", "4", "--experts", "64", "--used", "8",
                                "--ff-exp", "768", "--header-only"])
        with contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(str(ROOT / "scripts" / "make_random_moe.py"), run_name="__main__")
    finally:
        mp.undo()
    return out


@pytest.mark.parametrize(("shape", "flags", "gpu", "host", "mapped"), H200)
def test_the_gpu_split_is_the_one_an_h200_reported(tmp_path: Path, request: pytest.FixtureRequest, shape: str,
                                                   flags: dict[str, object], gpu: float, host: float,
                                                   mapped: float) -> None:
    from tests.model_shapes import Shape, build

    arch, layers, embd, heads, kv_heads, head_dim, extra = H200_SHAPES[shape]
    if shape == "moe":
        path = request.getfixturevalue("h200_moe")
    else:
        path = build(Shape(arch, layers, embd, heads, kv_heads, head_dim, vocab=49152, quant="q4_k_m", **extra),  # type: ignore[arg-type]
                     tmp_path / f"{shape}.gguf", header_only=True)
    s, w = read_summary(str(path)), footprint.layout(str(path))
    plan = footprint.estimate(s, w, LoadParams(flash_attn=True, **flags), gpu_layers=-1)  # type: ignore[arg-type]
    assert plan.on("GPU").compute / MIB == pytest.approx(gpu, rel=COMPUTE_TOLERANCE)
    assert plan.on("CPU").compute / MIB == pytest.approx(host, rel=COMPUTE_TOLERANCE)
    assert round(plan.on("CPU").mapped / MIB, 2) == mapped, "the CPU's weights as llama.cpp's line counts them"


@pytest.mark.parametrize(("flags", "gpu", "cpu"), [
    ({}, 4414.26, 54.00), ({"n_cpu_moe": 12}, 2321.75, None), ({"cpu_moe": True}, 229.25, None)])
def test_the_gpu_weights_are_the_ones_an_h200_reported(h200_moe: Path, flags: dict[str, object], gpu: float,
                                                       cpu: float | None) -> None:
    """The H200's `CUDA0 model buffer size` lines (2026-12-04): the qwen3moe's down experts have 768-wide rows, to
    which CUDA's buffer adds room (the plan without it said 4,414.25); SmolLM2's 576-wide rows, every tensor."""
    from localgen.models.resolve import resolve

    s, w = read_summary(str(h200_moe)), footprint.layout(str(h200_moe))
    plan = footprint.estimate(s, w, LoadParams(n_ctx=4096, **flags), gpu_layers=-1)  # type: ignore[arg-type]
    assert round(plan.on("GPU").weights / MIB, 2) == gpu
    assert cpu is None or round(plan.on("CPU").weights / MIB, 2) == cpu
    smol = resolve("smollm2:135m").path
    plan = footprint.estimate(read_summary(smol), footprint.layout(smol), LoadParams(n_ctx=2048), gpu_layers=-1)
    assert (round(plan.on("CPU").weights / MIB, 2), round(plan.on("GPU").weights / MIB, 2)) == (28.69, 92.17)
    # a 4096-wide Q4_K matrix: nothing added; a 576-wide Q4_1 one: 448 values' row (280 bytes), then 128-aligned
    assert footprint.gpu_padding(4096 * 4096 // 256 * 144, 4096, (256, 144)) == 0
    assert footprint.gpu_padding(576 * 576 // 32 * 20, 576, (32, 20)) == 280 + 104
    assert footprint.gpu_padding(576 * 4, 576, (1, 4)) == 0  # F32: not quantized, and 2,304 bytes


@pytest.fixture(scope="module")
def bert_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/tiny_bert.py's BERT at the sizes of a small real one (384 wide, 12 heads, a 4,096-token window)."""
    from tests import tiny_bert

    mp = pytest.MonkeyPatch()
    try:
        for name, value in (("N_EMBD", 384), ("N_FF", 1536), ("N_HEAD", 12), ("N_CTX", 4096)):
            mp.setattr(tiny_bert, name, value)
        return tiny_bert.build(tmp_path_factory.mktemp("bert") / "bert-384.gguf")
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def small_bert_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/tiny_bert.py's BERT as it is: 64 wide, its feed-forward layer only twice that (the attention's
    activations are the larger)."""
    from tests import tiny_bert

    return tiny_bert.build(tmp_path_factory.mktemp("bert64") / "bert-64.gguf")


@pytest.fixture(scope="module")
def nomic_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/tiny_bert.py's nomic-bert: 384 wide, a gated feed-forward layer 1,536 wide, a 2,048-token window."""
    from tests import tiny_bert

    return tiny_bert.build_nomic(tmp_path_factory.mktemp("nomic") / "nomic-384.gguf")


@pytest.mark.parametrize(("model", "ctx"), [("bert64", 512), ("bert", 512), ("bert", 2048), ("nomic", 512),
                                            ("nomic", 2048)])
def test_an_encoders_plan_has_no_kv_cache_and_the_compute_llama_cpp_reports(
        cli: CLI, bert_path: Path, small_bert_path: Path, nomic_path: Path, model: str, ctx: int) -> None:
    """serve.md: an encoder (BERT) has no KV cache; fit planned one (64 MiB at -np 256), and a compute buffer of
    a causal model's, a third short of llama.cpp's (a nomic-bert's gated feed-forward layer: half). Checked
    against the model's own context as embed loads it (the first in its log; the embeddings context follows)."""
    import json

    name = str({"bert": bert_path, "bert64": small_bert_path, "nomic": nomic_path}[model])
    cli = CLI({**cli.env, **NO_GPU})  # the CPU's one device, on any machine
    r = cli("embed", "-m", name, "--ctx", str(ctx), "--verbose", "the cat sat")
    assert r.returncode == 0, r.stderr[-2000:]
    first = r.stderr.split("constructing llama_context")[1]
    assert "KV buffer size" not in first, first
    got = float(re.findall(r"compute buffer size =\s+([\d.]+) MiB", first)[-1]) * MIB
    plan = cli("fit", "-m", name, "--ctx", str(ctx), "-np", "256", "--json")
    assert plan.returncode == 0, plan.stderr
    (cpu,) = json.loads(plan.stdout)["devices"]
    assert cpu["kv"] == 0, cpu
    assert abs(cpu["compute"] - got) <= COMPUTE_TOLERANCE * got, (cpu["compute"], got)


@pytest.mark.parametrize(("model", "ctx"), [("smollm2:135m", 512), ("smollm2:135m", 2048), ("bert", 512),
                                            ("bert", 4096), ("bert64", 512)])
def test_the_embeddings_context_matches_what_llama_cpp_reports(cli: CLI, bert_path: Path, small_bert_path: Path,
                                                               model: str, ctx: int) -> None:
    """An embeddings context (engine/embed.py: the window's tokens in one micro-batch) beside the weights, as
    serve's residency counts it (footprint.embeddings_bytes): llama.cpp's KV, output and compute buffers for it,
    within COMPUTE_TOLERANCE, for a chat model (logits for every token) and an encoder (none)."""
    from localgen.models.resolve import resolve

    name = {"bert": str(bert_path), "bert64": str(small_bert_path)}.get(model, model)
    r = cli("embed", "-m", name, "--ctx", str(ctx), "--verbose", "the cat sat")
    assert r.returncode == 0, r.stderr[-2000:]
    log = r.stderr[r.stderr.rindex("n_ctx "):]  # the last context made: a chat model's is made again, mean-pooled
    got = sum(float(x) for x in re.findall(r"(?:KV|output|compute) buffer size =\s+([\d.]+) MiB", log)) * MIB
    want = footprint.embeddings_bytes(resolve(name).summary, ctx)
    assert abs(want - got) <= COMPUTE_TOLERANCE * got, (want, got)
