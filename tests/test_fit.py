"""Tensor placement (--n-cpu-moe, --cpu-moe, -ot) as llama.cpp spells and applies it, and the planner
(`localgen fit`, and the plan run, chat and serve load by) on shapes we do not have: an 8B dense model and a
30B-A3B mixture of experts, header-only, against small and large hypothetical cards."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from localgen import placement
from localgen.engine import defaults
from localgen.errors import UsageError
from localgen.models import fit, footprint
from localgen.models.gguf_meta import read_summary
from localgen.types import LoadParams, ModelRef
from tests.conftest import CLI, InProcessCLI

GB = 1 << 30


# ---- placement, as llama.cpp spells it -------------------------------------------------------------------


def test_the_patterns_are_llama_cpps() -> None:
    # common/common.h: LLM_FFN_EXPS_REGEX, llm_ffn_exps_cpu_override, llm_add_n_cpu_ffn_overrides
    assert placement.cpu_moe() == (r"\.ffn_(up|down|gate|gate_up)_(ch|)exps", "CPU")
    assert placement.n_cpu_moe(2) == [(r"blk\.0\.ffn_(up|down|gate|gate_up)_(ch|)exps", "CPU"),
                                      (r"blk\.1\.ffn_(up|down|gate|gate_up)_(ch|)exps", "CPU")]
    pairs = placement.overrides(placement.parse(["attn=CUDA0,blk\\.1\\.=CPU", "x=CPU"]), True, 1)
    assert pairs[:3] == (("attn", "CUDA0"), (r"blk\.1\.", "CPU"), ("x", "CPU"))  # -ot first, in order
    assert pairs[3] == placement.cpu_moe() and pairs[4] == placement.n_cpu_moe(1)[0]
    assert placement.buffer_of("blk.1.attn_q.weight", pairs) == "CUDA0"  # the first match wins
    assert placement.buffer_of("blk.10.ffn_up_exps.weight", placement.n_cpu_moe(2)) is None  # blk.1 is not blk.10
    assert placement.buffer_of("blk.1.ffn_gate_up_exps.weight", placement.n_cpu_moe(2)) == "CPU"
    assert placement.is_expert("blk.0.ffn_down_chexps.weight") and not placement.is_expert("blk.0.ffn_down.weight")
    assert [placement.gpu_index(b) for b in ("CPU", "CUDA0", "CUDA1", "Metal", "CUDA_Host")] == [None, 0, 1, 0, None]


@pytest.mark.parametrize("value", ["exps", "=CPU", "exps=", "exps(=CPU", "(?i)exps=CPU", "(?<=blk)x=CPU", r"x\Z=CPU",
                                   "a{99999999999}=CPU", "[[:foo:]]=CPU", "[[:alpha:]]=CPU", "[a--b]=CPU",
                                   r"a\N{LATIN SMALL LETTER A}=CPU", r"\U00000061=CPU", "a*+=CPU", "(?>a)=CPU",
                                   "[]a]=CPU", "[^]x]=CPU"])
def test_a_bad_override_is_a_usage_error(value: str) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing leaks to the user's terminal (Python's FutureWarning for [[)
        with pytest.raises(UsageError):
            placement.parse(value)


def test_fit_takes_the_buffer_types_a_described_gpu_has_and_no_others() -> None:
    for buffer in ("CPU", "CUDA0", "CUDA1", "ROCm0", "Vulkan1", "MTL0", "Metal"):
        placement.described_buffer(buffer, 2)
    for buffer, says in (("FOO", "is not a buffer type"), ("cpu", "is not a buffer type"),
                         ("CPU=CPU", "is not a buffer type"), ("CUDA-1", "is not a buffer type"),
                         ("CUDA0_Host", "is not a buffer type"), ("CUDA2", "names GPU 2, and the plan has 2 GPUs"),
                         ("CUDA00", "is not a buffer type"), ("CUDA\u0661", "is not a buffer type")):
        with pytest.raises(UsageError, match=says):
            placement.described_buffer(buffer, 2)


def test_bad_placement_is_one_line_and_exit_2_before_anything_loads(cli_in_process: InProcessCLI) -> None:
    # the model named does not exist: the flag is refused first, before the name is even resolved
    for args, says in ((["-ot", "exps(=CPU"], "is not a regular expression"),
                       # Python reads these as characters; llama.cpp's std::regex refused them at the load
                       (["-ot", "blk{=CPU"], "a { that is not a repeat such as {2}"),
                       (["-ot", "x{100000}=CPU"], "a repeat count past 1,000"),
                       (["-ot", "{2}exps=CPU"], "follows nothing to repeat"),
                       (["-ot", "exps=NOPE0"], "no buffer type 'NOPE0' here; this build has CPU"),
                       (["--n-cpu-moe", "-1"], "--n-cpu-moe must be at least 0, not -1"),
                       (["-ot", "exps"], "takes PATTERN=BUFFER")):
        for command in ("run", "chat"):
            r = cli_in_process(command, "-m", "no-such-model.gguf", *args, "-p", "hi") if command == "run" else \
                cli_in_process(command, "-m", "no-such-model.gguf", *args)
            assert r.returncode == 2, (command, args, r.stderr)
            assert says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_moe_model_runs_with_each_placement_flag_and_llama_cpp_applies_it(cli: CLI, moe_path: Path) -> None:
    from localgen.native.devices import has_gpu

    s = read_summary(str(moe_path))
    w = footprint.layout(str(moe_path))
    per_layer = 3  # gate, up and down experts
    for flags, tensors in ((["--n-cpu-moe", "2"], 2 * per_layer), (["--cpu-moe"], s.n_layers * per_layer),
                           (["-ot", r"blk\.[13]\.ffn_(up|down)_exps=CPU"], 2 * 2),
                           (["-ot", r"attn_q\.=CPU", "--n-cpu-moe", "1"], s.n_layers + per_layer)):
        r = cli("run", "-m", str(moe_path), "--raw", "-p", "Once upon a time", "-n", "4", "--temperature", "0",
                "--json", "--verbose", *flags)
        assert r.returncode == 0, r.stderr[-2000:]
        load = json.loads(r.stdout)["load"]
        # what llama.cpp's loader logged as it placed each tensor (native/report.py reads its debug line)
        moved = load["moved"]["CPU"]
        assert moved["tensors"] == tensors, (flags, moved)
        # beside a GPU, llama.cpp puts them in its pinned host buffer (CUDA_Host), RAM all the same
        assert len(re.findall(r"buffer type overridden to (?:CPU|CUDA_Host)\b", r.stderr)) == tensors, flags
        experts = tensors - (s.n_layers if "attn_q" in " ".join(flags) else 0)
        assert moved["experts"] == experts
        # their MiB from the tensors' own bytes (llama.cpp's line rounds each tensor's down: 0 for a small one)
        names = re.findall(r"tensor (\S+) \(\d+ MiB \S+\) buffer type overridden to (?:CPU|CUDA_Host)\b", r.stderr)
        sizes = {t.name: t.nbytes for t in w.tensors}
        assert len(names) == tensors and moved["mib"] == round(sum(sizes[n] for n in names) / (1 << 20), 2) > 0
        if has_gpu():  # the weights in RAM and on the GPU (whose buffer pads some tensors' rows a little)
            assert abs(sum(load["weights_mib"].values()) - w.total / (1 << 20)) <= 0.01 * w.total / (1 << 20), load
        else:
            assert load["weights_mib"] == {"CPU_Mapped": round(w.total / (1 << 20), 2)}
        assert json.loads(r.stdout)["stats"]["completion_tokens"] == 4
    plain = json.loads(cli("run", "-m", str(moe_path), "--raw", "-p", "hi", "-n", "1", "--json").stdout)["load"]
    assert plain["moved"] == {} and plain["n_cpu_moe"] is None


def test_a_thousand_ot_patterns_that_miss_are_five_warnings_and_a_count(moe_path: Path) -> None:
    """run.md: each -ot pattern that moves nothing is said, the first five one by one, the rest in one line (a
    thousand patterns that miss were a thousand warning lines)."""
    from types import SimpleNamespace

    from localgen.models import footprint
    from localgen.models.load import unmatched_overrides

    ref: Any = SimpleNamespace(name="tiny-moe.gguf", path=str(moe_path))
    patterns = (*((f"nothing{i}", "CPU") for i in range(1000)), ("ffn_up_exps", "CPU"))
    said = unmatched_overrides(ref, patterns, footprint.layout(str(moe_path)))
    assert len(said) == 6 and said[0].startswith("-ot nothing0=CPU matches no tensor of tiny-moe.gguf"), said
    assert said[-1] == "and 995 more -ot patterns match no tensor of tiny-moe.gguf", said


def test_an_ot_pattern_that_matches_no_tensor_is_a_warning_and_the_run_goes_on(cli: CLI, moe_path: Path,
                                                                               tmp_path: Path) -> None:
    """docs/run.md: llama.cpp says nothing of an -ot pattern that moves nothing (a typo in a regular expression);
    localgen warns before the load, naming one of the model's tensors, and the run goes on."""
    missed = cli("run", "-m", str(moe_path), "--raw", "-p", "Once upon a time", "-n", "2", "--json",
                 "-ot", r"ffn_exps=CPU,blk\.1\.ffn_up_exps=CPU")
    assert missed.returncode == 0, missed.stderr[-2000:]
    warned = [line for line in missed.stderr.splitlines() if "matches no tensor" in line]
    assert warned == [f"warning: -ot ffn_exps=CPU matches no tensor of {moe_path.name}, so it moves "
                      "nothing (its tensors are named like blk.0.ffn_gate_exps.weight)"], missed.stderr
    assert json.loads(missed.stdout)["load"]["moved"]["CPU"]["tensors"] == 1  # the other pattern's tensor moved
    matched = cli("run", "-m", str(moe_path), "--raw", "-p", "Once upon a time", "-n", "2", "-ot", "ffn_up_exps=CPU")
    assert matched.returncode == 0 and "matches no tensor" not in matched.stderr
    # bench and tune measure with the tensors placed so: they say it too (bench once for each -ot of its sweep)
    benched = cli("bench", "-m", str(moe_path), "-ot", "ffn_exps=CPU;ffn_up_exps=CPU", "-p", "8", "-n", "2", "-r", "1")
    assert benched.returncode == 0, benched.stderr[-2000:]
    assert [line for line in benched.stderr.splitlines() if "matches no tensor" in line] == warned, benched.stderr
    copy = tmp_path / moe_path.name  # a file of its own: its tuning record applies to no other test's loads
    shutil.copyfile(moe_path, copy)
    tuned = cli("tune", "-m", str(copy), "-ot", "ffn_exps=CPU", "--prompt", "16", "--answer", "1", "--depth", "0",
                "--json")
    assert tuned.returncode in (0, 1), tuned.stderr[-2000:]  # 1: not kept, where other work kept the CPUs busy
    assert [line for line in tuned.stderr.splitlines() if "matches no tensor" in line] == warned, tuned.stderr


def test_the_experts_flags_on_a_dense_model_are_a_warning_and_the_run_goes_on(cli: CLI, cli_env: dict[str, str],
                                                                             smollm2_path: Path) -> None:
    from tests.test_serve import Server

    def says(flag: str) -> str:
        return f"{flag}: {smollm2_path.name} is not a mixture of experts (it has no experts to keep in RAM), so it " \
               "moves nothing"

    for flags, said in ((["--cpu-moe"], "--cpu-moe"), (["--n-cpu-moe", "4"], "--n-cpu-moe 4")):
        r = cli("run", "-m", str(smollm2_path), "-p", "hi", "-n", "1", *flags)
        assert r.returncode == 0, r.stderr[-2000:]
        assert f"warning: {says(said)}" in r.stderr.splitlines(), r.stderr
    planned = cli("fit", "-m", str(smollm2_path), "--n-cpu-moe", "4")  # fit said nothing (a newcomer's trial)
    assert planned.returncode == 0 and f"warning: {says('--n-cpu-moe 4')}" in planned.stderr.splitlines(), planned
    chat = cli("chat", "-m", str(smollm2_path), "--cpu-moe", "-n", "1", input="hi\n")
    assert chat.returncode == 0 and says("--cpu-moe") in chat.stdout + chat.stderr, chat.stdout + chat.stderr
    s = Server(cli_env, "-m", str(smollm2_path), "--n-cpu-moe", "2", "--ctx", "512", "-np", "1")
    try:
        assert says("--n-cpu-moe 2") in s.log()
    finally:
        assert s.stop() == 0


def test_fits_flags_are_the_settings_run_loads_with(cli: CLI, cli_in_process: InProcessCLI, moe_path: Path) -> None:
    """docs/fit.md: `flags` are the settings run, chat and serve would load with, placement and load settings
    given included: run with fit's flags loads what run with the flags given loads."""
    import shlex

    m = str(moe_path)
    for given in (["--n-cpu-moe", "2"], ["--cpu-moe"],
                  ["-ot", r"blk\.[13]\.ffn_(up|down)_exps=CPU", "--n-cpu-moe", "1"],
                  ["-ctk", "q8_0", "-fa", "on", "-ub", "256", "--no-repack"]):
        r = cli_in_process("fit", "-m", m, "--ctx", "2048", "--json", *given)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        flags = shlex.split(doc["flags"])
        assert flags[:2] == ["--ctx", "2048"] and all(x in flags for x in given), (given, flags)
        if "--n-cpu-moe" in given:  # the one given, as `flags` says (it read 0: the planner chose none itself)
            assert doc["n_cpu_moe"] == int(given[given.index("--n-cpu-moe") + 1]), doc["n_cpu_moe"]

        def loaded(args: list[str]) -> dict[str, Any]:
            out = cli("run", "-m", m, "--raw", "-p", "hi", "-n", "1", "--json", *args)
            assert out.returncode == 0, out.stderr[-2000:]
            return {k: v for k, v in json.loads(out.stdout)["load"].items() if k != "origins"}

        assert loaded(flags) == loaded(["--ctx", "2048", *given]), given


# ---- the planner on shapes we do not have ----------------------------------------------------------------


def _plan(path: Path, gpus: tuple[int, ...], ram: int = 64 * GB, ctx: int | None = None, shrink: bool = True,
          **load: Any) -> fit.Plan:
    s, w = read_summary(str(path)), footprint.layout(str(path))
    return fit.plan(s, w, fit.Machine(ram=ram, gpus=gpus, described=True), LoadParams(**load), ctx=ctx,
                    shrink=shrink)


def _within_budgets(p: fit.Plan) -> bool:
    gpus = p.footprint.gpus
    return p.footprint.on("CPU").total <= p.machine.ram_budget and all(
        d.total <= p.machine.gpu_budget(i) for i, d in enumerate(gpus))


def test_plans_for_an_8b_dense_model_on_small_and_large_cards(shape_path: Callable[[str], Path]) -> None:
    path = shape_path("dense-8b")
    s, w = read_summary(str(path)), footprint.layout(str(path))
    assert s.n_layers == 32 and s.context_length == 131072 and not w.moe and 4.5 * GB < w.total < 5.5 * GB

    big = _plan(path, (80 * GB,))  # the whole model, and its whole training context
    assert big.verdict == fit.FULL_GPU and big.ctx == 131072 and big.gpu_layers == 33 and _within_budgets(big)
    card = _plan(path, (24 * GB,))
    assert card.verdict == fit.FULL_GPU and card.ctx > 65536 and _within_budgets(card)
    small = _plan(path, (8 * GB,))  # every layer stays on the GPU: the context shrinks instead
    assert small.verdict == fit.FULL_GPU and fit.MIN_CTX < small.ctx < card.ctx and small.shrunk
    assert _within_budgets(small)  # and 256 tokens more would push a layer off the card:
    assert _plan(path, (8 * GB,), ctx=small.ctx + 256, shrink=False).gpu_layers == 32
    tiny = _plan(path, (4 * GB,))  # not even at the floor: layers leave the GPU, from the first
    at_floor = _plan(path, (4 * GB,), ctx=fit.MIN_CTX)
    assert tiny.verdict == fit.PARTIAL_GPU and 0 < tiny.gpu_layers == at_floor.gpu_layers < 33
    # then the context grows back to the largest those layers hold: each layer's KV cache goes with its layer
    assert fit.MIN_CTX < tiny.ctx < 131072 and tiny.shrunk and not tiny.whole and _within_budgets(tiny)
    assert tiny.footprint.on("GPU").kv == footprint.kv_bytes(s, tiny.ctx, layers=tiny.gpu_layers - 1)
    assert tiny.footprint.on("CPU").kv == footprint.kv_bytes(s, tiny.ctx, layers=33 - tiny.gpu_layers)
    more = footprint.estimate(s, w, LoadParams(n_ctx=tiny.ctx + 256), gpu_layers=tiny.gpu_layers)
    assert more.on("GPU").total > tiny.machine.gpu_budget(0)
    # a card too small for any layer: everything in RAM, at the context RAM holds, as with no GPU at all
    for ram in (64 * GB, 8 * GB):
        none = _plan(path, (int(1.7 * GB),), ram=ram)
        assert none.verdict == fit.CPU_ONLY and none.gpu_layers == 0 and none.footprint.gpus == ()
        assert none.ctx == _plan(path, (), ram=ram).ctx > fit.MIN_CTX
    two = _plan(path, (12 * GB, 12 * GB))
    assert two.layers[0] + two.layers[1] == 32 and abs(two.layers[0] - two.layers[1]) <= 2 and _within_budgets(two)
    cpu = _plan(path, ())
    assert cpu.verdict == fit.CPU_ONLY and cpu.ctx == 131072 and cpu.footprint.gpus == ()
    cramped = _plan(path, (), ram=8 * GB)  # RAM for the weights, not for 128k tokens of KV cache
    assert cramped.verdict == fit.CPU_ONLY and fit.MIN_CTX < cramped.ctx < 32768 and _within_budgets(cramped)
    assert _plan(path, (), ram=4 * GB).verdict == fit.WONT_FIT
    asked = _plan(path, (24 * GB,), ctx=8192)
    assert asked.ctx == 8192 and not asked.shrunk
    # a setting given is kept: 10 layers asked for stay 10; the context shrinks as far as the card needs for them
    kept = _plan(path, (8 * GB,), n_gpu_layers=10)
    assert kept.gpu_layers == 10 and kept.load(LoadParams(n_gpu_layers=10)).n_gpu_layers == 10
    assert kept.fits and kept.shrunk and small.ctx < kept.ctx < 131072 and _within_budgets(kept)
    assert not _plan(path, (8 * GB,), ctx=kept.ctx + 256, n_gpu_layers=10, shrink=False).fits
    # every layer asked for on a card that holds them at no context: it does not fit, and says the GPU is short
    full = _plan(path, (4 * GB,), n_gpu_layers=99)
    assert full.verdict == fit.WONT_FIT and full.gpu_layers == 33 and full.ctx == fit.MIN_CTX
    assert full.short == ("GPU",) and full.short_of == "GPU memory"
    # a GPU of unknown memory (0: llama.cpp could not say) takes nothing by the plan, and layers given stay unjudged
    unknown = fit.plan(s, w, fit.Machine(ram=64 * GB, gpus=(0,)), LoadParams(n_gpu_layers=99))
    assert unknown.fits and unknown.ctx == 131072 and unknown.gpu_layers == 33
    assert fit.plan(s, w, fit.Machine(ram=64 * GB, gpus=(0,)), LoadParams()).gpu_layers == 0
    # nor do layers go there behind a placement given that it cannot judge (-ot blk=CUDA0 put all 33 there)
    pinned = fit.plan(s, w, fit.Machine(ram=64 * GB, gpus=(0,)), LoadParams(override_tensor=(("blk", "CUDA0"),)))
    assert pinned.gpu_layers == 0 and pinned.verdict != fit.FULL_GPU
    moe = shape_path("moe-30b-a3b")  # nor does it send a MoE's experts to RAM behind the layers given
    placed = fit.plan(read_summary(str(moe)), footprint.layout(str(moe)), fit.Machine(ram=64 * GB, gpus=(0,)),
                      LoadParams(n_gpu_layers=99))
    assert placed.fits and placed.gpu_layers == 49 and placed.n_cpu_moe == 0
    # weights sent elsewhere than their layers' device: the verdict follows the weights
    assert _plan(path, (24 * GB,), override_tensor=(("attn", "CPU"),)).verdict == fit.PARTIAL_GPU
    # every weight in RAM, each layer's KV cache still on the GPU: not CPU only
    assert _plan(path, (24 * GB,), override_tensor=((".", "CPU"),)).verdict == fit.PARTIAL_GPU
    on_gpu = _plan(path, (4 * GB,), n_gpu_layers=0, override_tensor=(("blk", "CUDA0"),))
    assert on_gpu.verdict == fit.WONT_FIT and on_gpu.footprint.on("GPU").weights > on_gpu.machine.gpu_budget(0)


def test_tensor_split_takes_one_proportion_per_gpu_as_llama_cpp_reads_it(shape_path: Callable[[str], Path]) -> None:
    """fit.md: -ts as run takes it, and run hands it to llama.cpp, which reads one proportion per GPU (a missing one
    0, one beyond the GPUs not read; all 0: its own split by free memory). A list of another length than the
    cards was once ignored, and the plan split by the budgets instead."""
    path = shape_path("dense-8b")
    cards = (24 * GB, 12 * GB)
    even = _plan(path, cards, tensor_split=(1.0, 1.0))
    assert even.layers == (17, 15) and _within_budgets(even)  # llama.cpp counts the output layer in: 33 halves
    assert _plan(path, cards, tensor_split=(1.0, 1.0, 1.0)).layers == even.layers  # the third not read
    first = _plan(path, cards, tensor_split=(3.0,))  # (3, 0): every layer on the first card
    assert first.layers == (32, 0) and [d.device for d in first.footprint.gpus] == ["GPU0"]
    assert _plan(path, cards, tensor_split=(0.0, 0.0, 1.0)).layers == _plan(path, cards).layers  # all 0 read
    page = " ".join((Path(__file__).parent.parent / "docs" / "fit.md").read_text(encoding="utf-8").split())
    assert "`-ts` gives the proportions instead, one per GPU as llama.cpp reads them (a missing one is 0, one beyond " \
           "the GPUs is not read)" in page


def test_a_gpu_with_no_memory_to_give_takes_no_layer_and_the_next_takes_them(
        shape_path: Callable[[str], Path]) -> None:
    """A first GPU the plan may take nothing of (an [N/A] card that llama.cpp reports no memory for) gets no
    layer, as llama.cpp's split by free memory gives it none: the second card takes them (it was all on the CPU)."""
    path = shape_path("dense-8b")
    plan = _plan(path, (0, 24 * GB))
    assert plan.verdict == fit.FULL_GPU and plan.layers == (0, 32), plan.layers
    assert plan.footprint.on("GPU0").total == 0 < plan.footprint.on("GPU1").total <= plan.machine.gpu_budget(1)


def test_plans_for_a_30b_moe_put_attention_on_the_gpu_and_experts_in_ram(shape_path: Callable[[str], Path]) -> None:
    path = shape_path("moe-30b-a3b")
    s, w = read_summary(str(path)), footprint.layout(str(path))
    assert s.n_layers == 48 and w.moe and 17 * GB < w.total < 20 * GB and sum(w.experts) > 0.9 * w.total
    dense = w.total - sum(w.experts) - w.embedding  # attention, norms, routers, the output layer

    big = _plan(path, (80 * GB,))
    assert big.verdict == fit.FULL_GPU and big.n_cpu_moe == 0 and big.ctx == 40960
    for size in (24, 16, 8):  # every layer's attention on the card, the first layers' experts in RAM
        p = _plan(path, (size * GB,))
        gpu = p.footprint.on("GPU")
        assert p.verdict == fit.PARTIAL_GPU and p.gpu_layers == 49 and p.ctx == 40960, size
        pad = sum(t.gpu_pad for t in w.tensors  # what CUDA's buffer adds to the GPU's tensors (footprint.gpu_padding)
                  if (t.layer is not None or t.output) and not (t.expert and t.layer < p.n_cpu_moe))
        assert gpu.weights - gpu.experts == dense + pad and gpu.kv == footprint.kv_bytes(s, 40960)
        assert p.experts_in_ram == sum(w.experts[: p.n_cpu_moe]) and 0 < p.n_cpu_moe < 48
        assert _within_budgets(p)
        # one layer's experts fewer in RAM would be over the card's budget
        more = footprint.estimate(s, w, LoadParams(n_ctx=40960, n_cpu_moe=p.n_cpu_moe - 1), gpu_layers=-1)
        assert more.on("GPU").total > p.machine.gpu_budget(0) >= gpu.total
        flags = p.load(LoadParams())
        assert flags.n_cpu_moe == p.n_cpu_moe and flags.n_gpu_layers == -1 and flags.n_ctx == 40960
    assert _plan(path, (24 * GB,)).n_cpu_moe < _plan(path, (8 * GB,)).n_cpu_moe
    # a card too small for the attention and dense weights at the floor: fewer layers, their experts in RAM
    small = _plan(path, (3 * GB,))
    assert small.verdict == fit.PARTIAL_GPU and small.ctx == fit.MIN_CTX and 0 < small.gpu_layers < 49
    assert small.footprint.on("GPU").experts == 0 and _within_budgets(small)
    # --cpu-moe given: kept; the planner moves no expert back
    given = _plan(path, (80 * GB,), cpu_moe=True)
    assert given.footprint.on("GPU").experts == 0 and given.experts_in_ram == sum(w.experts)
    assert _plan(path, (), ram=16 * GB).verdict == fit.WONT_FIT


@pytest.mark.parametrize("cards", [(12, 12), (8, 16), (16, 8), (12, 12, 12)])
def test_a_moe_on_several_cards_fills_each_in_turn(shape_path: Callable[[str], Path], cards: tuple[int, ...]) -> None:
    """docs/fit.md: with the first layers' experts in RAM a split by budget left the first card half empty (two
    12 GB cards: 27 layers' experts in RAM); each card now takes in turn as many layers as it holds, and the split
    is the plan's `-ts`."""
    path = shape_path("moe-30b-a3b")
    s, w = read_summary(str(path)), footprint.layout(str(path))
    p = _plan(path, tuple(c * GB for c in cards))
    assert p.gpu_layers == 49 and p.ctx == 40960 and _within_budgets(p)
    by_budget = footprint.estimate(s, w, LoadParams(n_ctx=40960, n_cpu_moe=p.n_cpu_moe), where=footprint.Placement(
        49, tuple(float(p.machine.gpu_budget(i)) for i in range(len(cards))), cpu_moe_layers=p.n_cpu_moe))
    if not p.experts_in_ram:  # (three cards hold it all: the split by budget, none chosen)
        assert p.split == () and p.load(LoadParams()).tensor_split == ()
        return
    assert p.split and sum(p.split) == 49 and p.layers == (*(int(x) for x in p.split[:-1]), p.split[-1] - 1)
    assert any(by_budget.on(f"GPU{i}").total > p.machine.gpu_budget(i) for i in range(len(cards))), \
        "the same experts in RAM, split by budget, overflow a card"
    # every card but the last is full: one layer more would not fit it
    for i in range(len(cards) - 1):
        more = list(p.split)
        more[i] += 1
        more[-1] -= 1
        f = footprint.estimate(s, w, LoadParams(n_ctx=40960), where=footprint.Placement(
            49, tuple(more), cpu_moe_layers=p.n_cpu_moe))
        assert f.on(f"GPU{i}").total > p.machine.gpu_budget(i)
    # fewer experts in RAM than a split by budget needs (two 12 GB cards: 27 layers')
    budgets = tuple(float(p.machine.gpu_budget(i)) for i in range(len(cards)))

    def by_budget_fits(k: int) -> bool:
        f = footprint.estimate(s, w, LoadParams(n_ctx=40960), where=footprint.Placement(49, budgets, cpu_moe_layers=k))
        return all(f.on(f"GPU{i}").total <= budgets[i] for i in range(len(cards)))

    old = next(k for k in range(49) if by_budget_fits(k))
    assert p.n_cpu_moe < old
    if cards == (12, 12):
        assert old == 27 and p.n_cpu_moe == 6  # as docs/fit.md says
    flags = p.load(LoadParams())
    assert flags.tensor_split == p.split and flags.n_cpu_moe == p.n_cpu_moe


def test_fit_prints_the_plan_for_a_described_card(cli_in_process: InProcessCLI,
                                                  shape_path: Callable[[str], Path]) -> None:
    path = str(shape_path("moe-30b-a3b"))
    r = cli_in_process("fit", "-m", path, "--gpu-memory", "24GB", "--ram", "64G", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["machine"] == {"ram": 64 * GB, "gpus": [24 * GB], "unified": False, "gpus_described": True,
                              "ram_described": True}
    assert doc["verdict"] == "partial GPU" and doc["gpu_layers"] == 49 and doc["ctx"] == 40960 and doc["largest"]
    assert doc["flags"] == f"--ctx 40960 --gpu-layers -1 --n-cpu-moe {doc['n_cpu_moe']}" and doc["n_cpu_moe"] > 0
    gpu = next(d for d in doc["devices"] if d["device"] == "GPU")
    assert gpu["total"] == gpu["weights"] + gpu["kv"] + gpu["compute"] <= gpu["budget"]
    text = cli_in_process("fit", "-m", path, "--gpu-memory", "24GB", "--ram", "64G")
    assert text.returncode == 0, text.stderr
    assert "partial GPU · context 40,960 tokens (the training context)" in text.stdout
    assert "experts   the first" in text.stdout and "--n-cpu-moe" in text.stdout
    # two described cards; a context asked; sequences in parallel
    two = json.loads(cli_in_process("fit", "-m", path, "--gpu-memory", "24G,24G", "--ctx", "8192", "-np", "4",
                                    "--json").stdout)
    assert two["verdict"] == "full GPU" and two["ctx"] == 8192 and not two["largest"]
    assert two["flags"].startswith("--ctx 8192 --parallel 4 ")  # the plan holds 4 sequences' KV cache
    assert [d["device"] for d in two["devices"]] == ["CPU", "GPU0", "GPU1"] and sum(two["layers_per_gpu"]) == 48
    assert sum(d["kv"] for d in two["devices"]) == 4 * footprint.kv_bytes(read_summary(path), 8192)
    for args, says in ((["--gpu-memory", "lots"], "--gpu-memory takes sizes"),
                       (["--gpu-memory", "24G", "-ot", "exps=CUDA1"], "names GPU 1, and the plan has 1 GPU"),
                       (["--gpu-memory", "24G", "-ot", "exps=FOO"], "'FOO' is not a buffer type"),
                       (["--gpu-memory", "24G", "-ot", "a{99999999999}=CPU"], "is not a regular expression")):
        bad = cli_in_process("fit", "-m", path, *args)
        assert bad.returncode == 2 and says in bad.stderr, bad.stderr


def test_the_pages_example_is_what_fit_prints_for_that_shape(cli_in_process: InProcessCLI,
                                                               shape_path: Callable[[str], Path],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/fit.md's Output block, every figure: the command it shows, run on the 30B-A3B shape under the name
    the page gives it."""
    from tests.conftest import ROOT

    page = (ROOT / "docs" / "fit.md").read_text(encoding="utf-8")
    block = re.search(r"```console\n\$ localgen ([^\n]+)\n(.*?)```", page, re.S)
    assert block, "fit.md's console block"
    args = block.group(1).split()
    folder = shape_path("moe-30b-a3b").parent / "as-the-page-names-it"
    folder.mkdir(exist_ok=True)
    named = folder / "qwen3-30b-a3b.gguf"
    if not named.exists():
        named.symlink_to(shape_path("moe-30b-a3b"))
    monkeypatch.chdir(folder)
    r = cli_in_process(*args)
    assert r.returncode == 0, r.stderr
    assert r.stdout == block.group(2)


def test_the_json_has_the_keys_the_page_lists(cli_in_process: InProcessCLI, smollm2_path: Path) -> None:
    """fit.md's `--json` paragraph names every key of the object, of `model` and of each device: no more, no fewer
    (the page once left `model` out)."""
    from tests.conftest import ROOT

    page = (ROOT / "docs" / "fit.md").read_text(encoding="utf-8")
    said = page[page.index("`--json` prints the same as one"):page.index("A plan is an answer")]
    named = set(re.findall(r"`([a-z_]+)`", said))
    doc = json.loads(cli_in_process("fit", "-m", str(smollm2_path), "--json").stdout)
    assert set(doc) <= named and set(doc["model"]) <= named
    assert set(doc["devices"][0]) - {"device"} <= named
    values = {"preset"}  # named there as a value (asked_by's), not a key
    assert named - values == set(doc) | set(doc["model"]) | (set(doc["devices"][0]) - {"device"})


def test_an_encoders_plan_holds_no_kv_cache_and_its_flags_are_not_for_run(cli: CLI, cli_in_process: InProcessCLI,
                                                                          tmp_path: Path) -> None:
    """fit.md: an encoder (BERT) has no KV cache, and the flags are for embed and serve, which load it (run and
    chat refuse an encoder): fit planned a KV cache (64 MiB at -np 256) and offered the flags as run's."""
    from tests import tiny_bert

    bert = str(tiny_bert.build(tmp_path / "bert.gguf"))
    r = cli_in_process("fit", "-m", bert, "-np", "256")
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines()]
    cpu = rows[rows.index(["DEVICE", "WEIGHTS", "KV", "CACHE", "COMPUTE", "OUTPUT", "TOTAL", "BUDGET"]) + 1]
    assert cpu[0] == "CPU" and cpu[3] == "-", r.stdout  # the KV CACHE column
    assert _as_on_cpu(r.stdout.splitlines()[-1]) == "flags     --ctx 512 --parallel 256  (for embed and serve: an " \
        "encoder does not generate)", r.stdout
    doc = json.loads(cli_in_process("fit", "-m", bert, "--json").stdout)
    assert doc["model"]["encoder"] is True and doc["devices"][0]["kv"] == 0
    embedded = cli("embed", "-m", bert, *doc["flags"].split(), "the cat")  # the flags load it
    assert embedded.returncode == 0 and embedded.stdout.strip(), embedded.stderr
    assert cli_in_process("run", "-m", bert, "-p", "hi").returncode != 0  # what the note says


# ---- what fit says of the context, the sizes it takes, a model that is not here -------------------------


def _as_on_cpu(flags: str) -> str:
    """fit's flags as a machine without a GPU gets them: a GPU's plan of every layer on it adds `--gpu-layers -1`
    (an H200's run failed three tests that expected a CPU machine's flags)."""
    from localgen.native.devices import has_gpu

    return flags.replace(" --gpu-layers -1", "") if has_gpu() else flags


def _plan_line(stdout: str) -> str:
    return next(line for line in stdout.splitlines() if line.startswith("plan "))


def test_a_ctx_over_the_training_context_is_capped_as_run_caps_it(cli: CLI, cli_in_process: InProcessCLI,
                                                                   smollm2_path: Path) -> None:
    m = str(smollm2_path)  # trained to 8,192 tokens
    zero = json.loads(cli_in_process("fit", "-m", m, "--ctx", "0", "--json").stdout)  # the training context asked
    assert (zero["asked"], zero["asked_by"], zero["ctx"]) == (8192, "--ctx", 8192)
    doc = json.loads(cli_in_process("fit", "-m", m, "--ctx", "100000", "--json").stdout)
    assert (doc["asked"], doc["asked_by"], doc["ctx"], doc["capped"], doc["shrunk"], doc["largest"]) == (
        100000, "--ctx", 8192, True, False, False)
    assert _as_on_cpu(doc["flags"]) == "--ctx 8192"
    r = cli_in_process("fit", "-m", m, "--ctx", "100000")
    assert r.returncode == 0, r.stderr
    assert _plan_line(r.stdout).endswith("context 8,192 tokens (100,000 asked, capped at the training context)")
    # --rope-scaling none turns scaling off: the cap stays (it lifted it, as linear and yarn do)
    off = json.loads(cli_in_process("fit", "-m", m, "--ctx", "100000", "--rope-scaling", "none", "--ram", "1P",
                                    "--json").stdout)
    assert (off["ctx"], off["capped"]) == (8192, True), off
    on = json.loads(cli_in_process("fit", "-m", m, "--ctx", "100000", "--rope-scaling", "linear", "--ram", "1P",
                                   "--json").stdout)
    assert on["ctx"] == 100096 and not on["capped"], on
    # run loads what fit planned: the training context, not the 100,000 asked (and not an error)
    ran = cli("run", "-m", m, "--ctx", "100000", "-p", "hi", "-n", "1", "--json")
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert json.loads(ran.stdout)["load"]["n_ctx"] == doc["ctx"]
    # rounded up as llama.cpp rounds it; RoPE scaling lifts the cap; a context as asked says so
    for args, ctx, says in ((["--ctx", "5000"], 5120, "(5,000 asked, rounded up to a multiple of 256)"),
                            (["--ctx", "100000", "--rope-scaling", "yarn", "--rope-freq-scale", "0.25"], 100096,
                             "(100,000 asked, rounded up to a multiple of 256)"),
                            (["--ctx", "4096"], 4096, "(as asked)"),
                            (["--ctx", "0"], 8192, "(the training context)")):  # docs/fit.md: --ctx 0
        r = cli_in_process("fit", "-m", m, *args)
        assert r.returncode == 0 and _plan_line(r.stdout).endswith(f"context {ctx:,} tokens {says}"), r.stdout
        assert not json.loads(cli_in_process("fit", "-m", m, *args, "--json").stdout)["capped"]


def test_a_model_naming_no_training_context_is_planned_uncapped_as_the_load_takes_it(smollm2_path: Path) -> None:
    s = dataclasses.replace(read_summary(str(smollm2_path)), context_length=None)
    w = footprint.layout(str(smollm2_path))
    p = fit.plan(s, w, fit.Machine(ram=64 * GB, gpus=(), described=True), LoadParams(), ctx=10000)
    ref = ModelRef(name="x", path=str(smollm2_path), source="path", summary=s)
    loaded, _ = defaults.resolve(ref, LoadParams(n_ctx=10000), cpu_only=True, use_records=False)
    assert (p.ctx, p.capped) == (loaded.n_ctx, False) == (10240, False)


def test_a_plan_that_fits_nothing_says_so_and_exits_0_as_pull_list_does(
        cli_in_process: InProcessCLI, smollm2_path: Path, shape_path: Callable[[str], Path]) -> None:
    m = str(smollm2_path)
    for args, says in (([], "(shrunk to the floor, still short of RAM)"),
                       (["--ctx", "8192"], "(8,192 asked, shrunk to the floor, still short of RAM)"),
                       (["--ctx", "2048"], "(2,048 asked, short of RAM)")):  # under the floor: it said "as asked"
        r = cli_in_process("fit", "-m", m, "--ram", "50M", *args)
        assert r.returncode == 0, r.stderr  # a verdict, as pull --list gives one for each quantization
        line = _plan_line(r.stdout)
        assert line.startswith("plan      won't fit · context ") and line.endswith(says), line
        assert "the largest that fits" not in r.stdout
        doc = json.loads(cli_in_process("fit", "-m", m, "--ram", "50M", *args, "--json").stdout)
        assert doc["verdict"] == "won't fit" and not doc["fits"]
    # layers leave a card too small even at the floor, and the context grows back to what the rest hold: that is
    # not "the largest that fits" (with every layer on the card) either
    r = cli_in_process("fit", "-m", str(shape_path("dense-8b")), "--gpu-memory", "4G", "--ram", "64G")
    line = _plan_line(r.stdout)
    assert line.startswith("plan      partial GPU · context 5,632 tokens") and line.endswith(
        "(shrunk to fit, with layers off the GPU)"), line
    # the layers left on a card fill it at the floor: the context stays there (it said "still short of GPU memory"
    # of a plan that fits, which read as a failure: a newcomer's trial)
    r = cli_in_process("fit", "-m", m, "--gpu-memory", "1.85G", "--ram", "8G", "--ctx", "8192")
    assert _plan_line(r.stdout) == ("plan      partial GPU · context 4,096 tokens (8,192 asked, shrunk to the floor, "
                                    "with layers off the GPU)"), r.stdout
    # no layer fits the card even at the floor: the plan of no GPU, the context asked in RAM (docs/fit.md)
    r = cli_in_process("fit", "-m", m, "--gpu-memory", "1G", "--ctx", "8192")
    assert _plan_line(r.stdout) == "plan      CPU only · context 8,192 tokens (as asked)", r.stdout
    assert "0 of 31 on the GPU" in r.stdout
    # a card with room for every layer at a smaller context: that one is the largest that fits
    r = cli_in_process("fit", "-m", str(shape_path("dense-8b")), "--gpu-memory", "8G", "--ram", "64G")
    assert _plan_line(r.stdout).endswith("(the largest that fits)"), r.stdout
    # every layer asked for (-ngl) on a card too small for them even at the floor (docs/fit.md)
    r = cli_in_process("fit", "-m", str(shape_path("dense-8b")), "--gpu-memory", "4G", "-ngl", "99")
    assert _plan_line(r.stdout) == ("plan      won't fit · context 4,096 tokens (shrunk to the floor, still short of "
                                    "GPU memory)"), r.stdout
    assert not json.loads(cli_in_process("fit", "-m", str(shape_path("dense-8b")), "--gpu-memory", "4G", "-ngl", "99",
                                         "--json").stdout)["fits"]


def _recording_loads() -> tuple[list[LoadParams], list[str], Any]:
    """What open_engine would load (each LoadParams), what it says, and the factory that records the loads instead
    of making them."""
    made: list[LoadParams] = []

    def factory(ref: Any, params: LoadParams, **kw: Any) -> object:
        made.append(params)
        return object()

    return made, [], factory


def test_run_says_when_the_model_does_not_fit_even_at_the_floor(smollm2_path: Path) -> None:
    from localgen.models.load import open_engine
    from localgen.models.resolve import resolve

    ref = resolve(str(smollm2_path))
    made, said, factory = _recording_loads()

    tiny = fit.Machine(ram=50 << 20)
    open_engine(ref, LoadParams(n_ctx=8192), warn=said.append, factory=factory, machine=tiny)
    hint = f"(`localgen fit -m {ref.name}` shows the plan)"
    assert made[0].n_ctx == fit.MIN_CTX  # it loads anyway, at the floor
    assert said == [f"context {fit.MIN_CTX:,} tokens, not 8,192, and the model does not fit RAM even there: "
                    f"loading it anyway {hint}"]
    said.clear()
    open_engine(ref, LoadParams(n_ctx=2048), warn=said.append, factory=factory, machine=tiny)
    assert made[1].n_ctx == 2048 and said == [f"the model does not fit RAM at 2,048 tokens: loading it anyway {hint}"]
    # every layer asked for on a card too small for them at the floor: the GPU is what is short
    said.clear()
    small = fit.Machine(ram=64 * GB, gpus=(fit.GPU_CONTEXT_RESERVE + fit.GPU_MARGIN + (50 << 20),), described=True)
    open_engine(ref, LoadParams(n_ctx=8192, n_gpu_layers=99), warn=said.append, factory=factory, machine=small)
    assert made[2].n_ctx == fit.MIN_CTX and made[2].n_gpu_layers == 99
    assert said == [f"context {fit.MIN_CTX:,} tokens, not 8,192, and the model does not fit the GPU's memory even "
                    f"there: loading it anyway {hint}"]


def test_fit_plans_with_a_presets_context_and_load_settings_as_run_loads_them(cli_env: dict[str, str],
                                                                              tmp_path: Path) -> None:
    lg = CLI({**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")})
    text = "FROM smollm2:135m\nPARAMETER num_ctx 2048\nPARAMETER cache_type_k q8_0\n"
    assert lg("create", "audit-ctx", "-f", "-", input=text).returncode == 0
    r = lg("fit", "-m", "audit-ctx", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["ctx"], doc["asked"], doc["asked_by"], doc["largest"], _as_on_cpu(doc["flags"])) == (
        2048, 2048, "preset", False, "--ctx 2048 -ctk q8_0")  # the preset's load settings are the load's too
    s = read_summary(doc["model"]["file"])
    # the preset's K cache type (on whichever devices hold the layers)
    assert sum(d["kv"] for d in doc["devices"]) == footprint.kv_bytes(s, 2048, "q8_0", "f16")
    assert _plan_line(lg("fit", "-m", "audit-ctx").stdout).endswith("context 2,048 tokens (the preset's num_ctx)")
    ran = lg("run", "-m", "audit-ctx", "-p", "hi", "-n", "1", "--json")
    assert ran.returncode == 0, ran.stderr[-2000:]
    load = json.loads(ran.stdout)["load"]
    assert (load["n_ctx"], load["cache_type_k"]) == (doc["ctx"], "q8_0")
    flag = json.loads(lg("fit", "-m", "audit-ctx", "--ctx", "4096", "--json").stdout)  # --ctx wins, as for run
    assert (flag["ctx"], flag["asked_by"]) == (4096, "--ctx")


@pytest.mark.parametrize(("args", "says"), [
    (["--ram", "24G,12G"], "--ram takes one size, such as 64G, not '24G,12G'"),
    (["--ram", "0"], "--ram must be above 0, not '0'"),
    (["--ram", "lots"], "--ram takes one size, such as 64G, not 'lots'"),
    (["--ram", ""], "--ram takes one size, such as 64G, not ''"),
    (["--gpu-memory", "24G,,12G"], "--gpu-memory has an empty item in '24G,,12G'"),
    (["--gpu-memory", "24G,"], "--gpu-memory has an empty item in '24G,'"),
    (["--gpu-memory", ""], "--gpu-memory has an empty item in ''"),
    (["--gpu-memory", "0,24G"], "--gpu-memory: each GPU's size must be above 0 (a lone 0 means no GPU), not '0,24G'"),
    (["--gpu-memory", "24G,0"], "--gpu-memory: each GPU's size must be above 0 (a lone 0 means no GPU), not '24G,0'"),
    (["--gpu-memory", "lots"], "--gpu-memory takes sizes such as 24GB or 24G,12G, not 'lots'"),
    (["--gpu-memory", "\u0662\u0664G"], "--gpu-memory takes sizes such as 24GB or 24G,12G, not '\u0662\u0664G'"),
    (["--ram", "\uff16\uff14G"], "--ram takes one size, such as 64G, not '\uff16\uff14G'"),  # (full-width digits)
    (["--gpu-memory", "24"], "--gpu-memory: '24' is 24 bytes; give a unit, such as 24G"),
    (["--gpu-memory", "24G,1"], "--gpu-memory: '1' is 1 byte; give a unit, such as 24G"),
    (["--gpu-memory", "99999999999999999999999G"],
     "--gpu-memory: '99999999999999999999999G' is over 1 PiB, more memory than a machine has"),
    (["--gpu-memory", ",".join(["1G"] * 5000)], "--gpu-memory describes at most 16 GPUs (llama.cpp's most devices), "
                                              "not 5,000"),
    (["--ram", "64"], "--ram: '64' is 64 bytes; give a unit, such as 24G"),
    (["--ram", "2P"], "--ram: '2P' is over 1 PiB, more memory than a machine has"),
    (["--gpu-memory", "0.0000001G"], "--gpu-memory: '0.0000001G' is 107 bytes, under 1 MiB: less memory than a "
                                     "machine has"),
    (["--ram", "0.5k"], "--ram: '0.5k' is 512 bytes, under 1 MiB: less memory than a machine has"),
    (["-ts", "nan,1"], "--tensor-split takes finite proportions, 0 or more and not all 0, e.g. 3,1"),
    (["-ts", "inf,1"], "--tensor-split takes finite proportions, 0 or more and not all 0, e.g. 3,1"),
    # each finite, their sum not: said so, not called infinite
    (["-ts", "1e308,1e308"], "--tensor-split 1e+308,1e+308: the proportions are too large (their sum overflows); "
                             "give smaller ones, e.g. 3,1"),
    (["-ts", ",".join(["1"] * 17)], "--tensor-split takes at most 16 proportions (llama.cpp's most devices)"),
])
def test_a_bad_size_is_one_line_and_exit_2(cli_in_process: InProcessCLI, smollm2_path: Path, args: list[str],
                                          says: str) -> None:
    r = cli_in_process("fit", "-m", str(smollm2_path), *args)
    assert r.returncode == 2 and r.stdout == "", (r.stdout, r.stderr)
    assert r.stderr.strip() == f"localgen: error: {says}", r.stderr
    if args[0] == "--ram":  # RAM is one size: no list form suggested (beyond the input echoed)
        assert not re.search(r"\d\w*,\s*\d", r.stderr.replace(repr(args[1]), "")), r.stderr


def test_a_lone_zero_gpu_memory_means_no_gpu(cli_in_process: InProcessCLI, smollm2_path: Path) -> None:
    doc = json.loads(cli_in_process("fit", "-m", str(smollm2_path), "--gpu-memory", "0", "--json").stdout)
    assert doc["machine"]["gpus"] == [] and doc["machine"]["gpus_described"] and doc["verdict"] == "CPU only"
    two = json.loads(cli_in_process("fit", "-m", str(smollm2_path), "--gpu-memory", " 24G , 12G ", "--json").stdout)
    assert two["machine"]["gpus"] == [24 * GB, 12 * GB]


def test_sizes_take_tebibytes_up_to_a_pebibyte(cli_in_process: InProcessCLI, smollm2_path: Path) -> None:
    """fit.md: a size is from 1 MiB to 1 PiB, so T (TB, TiB) and P are units too (`--gpu-memory 1T` was refused
    as no size at all)."""
    doc = json.loads(cli_in_process("fit", "-m", str(smollm2_path), "--gpu-memory", "1T,2TiB", "--ram", "1.5TB",
                                    "--json").stdout)
    assert doc["machine"]["gpus"] == [1 << 40, 2 << 40] and doc["machine"]["ram"] == 3 << 39
    r = cli_in_process("fit", "-m", str(smollm2_path), "--ram", "1P")
    assert r.returncode == 0, r.stderr


def _claims_layers(path: Path, block_count: int | None, tensor: str = "token_embd.weight") -> Path:
    return _header_with(path, block_count=block_count, tensor=tensor, name=None, context_length=None)


@pytest.mark.parametrize(("block_count", "tensor", "claim"), [
    (100_000_000, "token_embd.weight", "its header claims 100,000,000 layers"),
    (4294967295, "token_embd.weight", "its header claims 4,294,967,295 layers"),
    (None, "blk.99999999.attn_norm.weight", "its tensors name 100,000,000 layers")])
def test_a_header_claiming_more_layers_than_llama_cpp_takes_is_refused_at_once(
        cli: CLI, tmp_path: Path, block_count: int | None, tensor: str, claim: str) -> None:
    """llama.cpp loads at most 512 layers (LLAMA_MAX_LAYERS); every plan walks the layers, so a hostile count hung
    fit and run while memory grew."""
    bad = _claims_layers(tmp_path / "big.gguf", block_count, tensor)
    bench = [["bench", "-m", str(bad), "-p", "8", "-n", "2", "-r", "1"]] if block_count else []  # plans by the header
    for args in [["fit", "-m", str(bad)], ["run", "-m", str(bad), "-p", "hi", "-n", "2"], *bench]:
        r = cli(*args, timeout=120)
        assert r.returncode == 1 and r.stdout == "", (args, r.stderr)
        assert r.stderr.startswith(f"localgen: error: {bad} is not a usable GGUF file: {claim}, more than "
                                   "llama.cpp's 512") and r.stderr.count("\n") == 1, (args, r.stderr)


def test_an_unknown_model_is_exit_1_as_for_run_and_show(cli_in_process: InProcessCLI) -> None:
    codes = {}
    for args in (["fit", "-m", "nosuch"], ["run", "-m", "nosuch", "-p", "hi"], ["show", "nosuch"]):
        r = cli_in_process(*args)
        assert r.stdout == "" and r.stderr.strip().splitlines() == [
            "localgen: error: unknown model 'nosuch' (see `localgen list --catalogue`; or give owner/repo or a "
            ".gguf path)"], r.stderr
        codes[args[0]] = r.returncode
    assert codes == {"fit": 1, "run": 1, "show": 1}


def test_fit_loads_nothing(shape_path: Callable[[str], Path], cli_env: dict[str, str]) -> None:
    """Nothing of llama.cpp or numpy is imported to plan (a header read is all): it answers at once."""
    argv = ["fit", "-m", str(shape_path("dense-8b")), "--gpu-memory", "24GB"]
    code = ("import sys\nfrom localgen.cli.main import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "heavy = [m for m in ('llama_cpp', 'numpy', 'gguf') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=cli_env,
                       timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    assert "full GPU" in r.stdout


def test_a_card_too_small_for_any_layer_loads_the_context_asked_in_ram(cli_env: dict[str, str],
                                                                      smollm2_path: Path) -> None:
    """On a 1 GB card (described) no layer fits even at the floor: everything goes to RAM, and RAM holds the 8192
    tokens asked, so run loads them (not the floor), with the KV cache llama.cpp's load log reports."""
    from tests.test_footprint import reported

    code = ("import sys\nfrom localgen.models import fit, footprint\nfrom localgen.models.load import open_engine\n"
            "from localgen.models.resolve import resolve\nfrom localgen.types import LoadParams\n"
            "ref = resolve(sys.argv[1])\nmachine = fit.described((1 << 30,), 8 << 30)\n"
            "p = fit.plan(ref.summary, footprint.layout(ref.path), machine, LoadParams(n_ctx=8192), ctx=8192)\n"
            "said = []\n"
            "eng = open_engine(ref, LoadParams(n_ctx=8192), verbose=True, warn=said.append, machine=machine)\n"
            "print(p.ctx, p.gpu_layers, p.footprint.on('CPU').kv, eng.params.n_ctx, len(said), flush=True)\n")
    r = subprocess.run([sys.executable, "-c", code, str(smollm2_path)], capture_output=True, text=True, env=cli_env,
                       timeout=120, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    ctx, gpu_layers, kv, loaded, warned = (int(x) for x in r.stdout.split())
    sizes, offloaded, _ = reported(r.stderr)
    assert (ctx, gpu_layers, loaded, warned, offloaded) == (8192, 0, 8192, 0, 0)
    assert round(kv / (1 << 20), 2) == sizes["kv"] == 180.0


def test_run_loads_by_the_plan_and_says_when_it_shrinks_the_context(smollm2_path: Path) -> None:
    """open_engine with a machine whose RAM holds the model but not its KV cache at the context asked."""
    from localgen.models.load import open_engine
    from localgen.models.resolve import resolve

    ref = resolve(str(smollm2_path))
    made, said, factory = _recording_loads()

    w = footprint.layout(ref.path)
    need_8k = fit.plan(ref.summary, w, fit.Machine(ram=64 * GB), LoadParams(n_ctx=8192), ctx=8192).footprint.total
    ram = int((need_8k - 1) / fit.RAM_SHARE)  # one byte short of the 8192-token plan
    open_engine(ref, LoadParams(n_ctx=8192), warn=said.append, factory=factory, machine=fit.Machine(ram=ram))
    assert fit.MIN_CTX <= made[0].n_ctx < 8192 and made[0].n_ctx % 256 == 0
    assert said == [f"context {made[0].n_ctx:,} tokens, not 8,192: at 8,192 the model does not fit RAM "
                    f"(`localgen fit -m {ref.name}` shows the plan)"]
    made.clear()
    said.clear()
    open_engine(ref, LoadParams(n_ctx=8192), warn=said.append, factory=factory, machine=fit.Machine(ram=64 * GB))
    assert made[0].n_ctx == 8192 and said == []
    # on a (described) GPU too small for every layer: all of them on it at a smaller context
    on_gpu = fit.plan(ref.summary, w, fit.Machine(ram=64 * GB, gpus=(64 * GB,)), LoadParams(n_ctx=8192), ctx=8192)
    gpu = fit.GPU_CONTEXT_RESERVE + fit.GPU_MARGIN + on_gpu.footprint.on("GPU").total - 1
    open_engine(ref, LoadParams(n_ctx=8192), warn=said.append, factory=factory,
                machine=fit.Machine(ram=64 * GB, gpus=(gpu,)))
    assert made[1].n_gpu_layers == -1 and made[1].n_ctx < 8192 and "does not fit the GPU" in said[0]


def test_serve_and_chat_take_the_placement_flags(cli: CLI, cli_env: dict[str, str], moe_path: Path) -> None:
    import httpx

    from localgen.native.devices import has_gpu
    from tests.test_serve import Server

    s = Server(cli_env, "-m", str(moe_path), "--n-cpu-moe", "3", "--ctx", "512", "-np", "1")
    try:
        ps = httpx.get(f"{s.url}/api/ps", timeout=30).json()["models"]
        entry = next(m for m in ps if m["name"].endswith("tiny-moe.gguf"))
        placed = entry["placement"]
        assert placed["moved"]["CPU"]["experts"] == 3 * 3, placed  # the first 3 layers' experts stay in RAM
        offloaded = re.fullmatch(r"offloaded (\d+)/(\d+) layers to GPU", placed["offloaded"])
        assert offloaded and (offloaded[1] == "0" or has_gpu()), placed  # the layers go to a GPU where there is one
        assert placed["weights_mib"]
        r = httpx.post(f"{s.url}/v1/completions", json={"model": entry["name"], "prompt": "Once",
                                                        "max_tokens": 3, "temperature": 0}, timeout=120)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        # a preset whose buffer type this server lacks, asked for on demand: a 400 naming it, one line in the log
        made = cli("create", "moe-on-foo", "-f", "-", input=f"FROM {moe_path}\nPARAMETER override_tensor exps=FOO\n")
        assert made.returncode == 0, made.stderr
        for route, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                            ("/api/generate", {"prompt": "hi", "stream": False})):
            r = httpx.post(f"{s.url}{route}", json={"model": "moe-on-foo", **body}, timeout=120)
            assert r.status_code == 400 and "no buffer type 'FOO' here" in r.text, (route, r.status_code, r.text)
        assert "Traceback" not in s.log() and "cannot be loaded here" in s.log()
    finally:
        assert s.stop() == 0
    r = cli("chat", "-m", str(moe_path), "--cpu-moe", "--verbose", "-n", "2", input="Hello\n")
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(re.findall(r"buffer type overridden to (?:CPU|CUDA_Host)\b", r.stderr)) == 4 * 3


def test_llama_cpps_environment_variables_set_the_placement(cli: CLI, moe_path: Path) -> None:
    for env, experts in (({"LLAMA_ARG_N_CPU_MOE": "1"}, 3), ({"LLAMA_ARG_CPU_MOE": "1"}, 12),
                         ({"LLAMA_ARG_OVERRIDE_TENSOR": r"blk\.0\.ffn_up_exps=CPU"}, 1)):
        r = subprocess.run(cli.argv("run", "-m", str(moe_path), "--raw", "-p", "hi", "-n", "1", "--json"),
                           capture_output=True, text=True, env={**cli.env, **env}, timeout=120, check=False)
        assert r.returncode == 0, r.stderr[-2000:]
        assert json.loads(r.stdout)["load"]["moved"]["CPU"]["experts"] == experts, env
    r = subprocess.run(cli.argv("run", "-m", str(moe_path), "-p", "hi"), capture_output=True, text=True,
                       env={**cli.env, "LLAMA_ARG_OVERRIDE_TENSOR": "exps=NOPE"}, timeout=120, check=False)
    assert r.returncode == 2 and "no buffer type 'NOPE' here" in r.stderr


def test_bench_sweeps_n_cpu_moe_as_llama_bench(cli: CLI, moe_path: Path) -> None:
    r = cli("bench", "-m", str(moe_path), "-p", "8", "-n", "2", "-r", "1", "--no-e2e", "-ncmoe", "0,4", "-o", "json")
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads(r.stdout)
    assert [(x["n_cpu_moe"], x["test"]) for x in rows] == [(0, "pp8"), (0, "tg2"), (4, "pp8"), (4, "tg2")]
    table = cli("bench", "-m", str(moe_path), "-p", "8", "-n", "0", "-r", "1", "--no-e2e", "-ncmoe", "1,2")
    header = next(line for line in table.stdout.splitlines() if line.startswith("| model"))
    assert table.returncode == 0 and "n_cpu_moe" in [c.strip() for c in header.split("|")]
    bad = cli("bench", "-m", str(moe_path), "-ncmoe", "-1")
    # worded as run's and fit's: one wording for one flag
    assert bad.returncode == 2 and "--n-cpu-moe must be at least 0, not -1" in bad.stderr


def test_doctor_checks_a_moe_models_placement(cli: CLI, moe_path: Path) -> None:
    """doctor -m loads that model as run would, the placement flags (and a preset's) applied, and its placement
    line says which experts llama.cpp put in RAM."""
    r = cli("doctor", "-m", str(moe_path), "--n-cpu-moe", "2")
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    check = next(line for line in r.stdout.splitlines() if line.startswith("check "))
    assert "tiny-moe.gguf loaded" in check and check.endswith(": ok")
    placed = next(line for line in r.stdout.splitlines() if line.startswith("placement "))
    assert "6 tensors (6 of experts, 12.0 MiB) moved to CPU" in placed, placed  # 2 layers' gate, up and down
    r = cli("doctor", "-m", str(moe_path), "--cpu-moe", "-ot", r"attn_q\.=CPU")
    assert "16 tensors (12 of experts, 24.5 MiB) moved to CPU" in r.stdout, r.stdout
    plain = cli("doctor", "-m", str(moe_path))
    assert "moved to" not in plain.stdout and "tiny-moe.gguf loaded" in plain.stdout
    for args, says, code in ((["--no-check", "-m", str(moe_path)], "-m says what --check loads", 2),
                             (["-ot", "exps"], "takes PATTERN=BUFFER", 2),
                             (["-m", "no-such-model"], "unknown model 'no-such-model'", 1)):
        bad = cli("doctor", *args)
        assert bad.returncode == code and says in bad.stderr and bad.stdout == "", (args, bad.stderr)


def test_bench_takes_ot_as_llama_bench_and_cmoe(cli: CLI, moe_path: Path) -> None:
    """-ot as llama-bench takes it: placements by ',' (an empty one: none), pairs by ';'; each a configuration,
    recorded in llama-bench's tensor_buft_overrides (column `ot`); -cmoe in every configuration; what llama.cpp
    moved, in our `moved`."""
    two = r"blk\.0\.ffn_up_exps=CPU;blk\.1\.ffn_up_exps=CPU"
    r = cli("bench", "-m", str(moe_path), "-p", "8", "-n", "0", "-r", "1", "--no-e2e", "-ot", f"{two},",
            "-ncmoe", "0,1", "-o", "json")
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [(x["n_cpu_moe"], x["tensor_buft_overrides"], x["moved"].get("CPU", {}).get("experts", 0))
            for x in json.loads(r.stdout)]
    assert rows == [(0, two, 2), (0, "none", 0), (1, two, 3 + 1), (1, "none", 3)]  # blk.0's up is -ot's, first
    r = cli("bench", "-m", str(moe_path), "-p", "8", "-n", "0", "-r", "1", "--no-e2e", "-cmoe", "-o", "csv")
    assert r.returncode == 0, r.stderr[-2000:]
    import csv
    import io

    (row,) = list(csv.DictReader(io.StringIO(r.stdout)))
    assert row["tensor_buft_overrides"] == placement.EXPS + "=CPU"  # what llama-bench -ot '...exps=CPU' records
    table = cli("bench", "-m", str(moe_path), "-p", "8", "-n", "0", "-r", "1", "--no-e2e", "-ot", r"attn_q\.=CPU")
    header = next(line for line in table.stdout.splitlines() if line.startswith("| model"))
    assert "ot" in [c.strip() for c in header.split("|")] and r"| attn_q\.=CPU " in table.stdout
    for flags, says in ((["-ot", "exps"], "takes PATTERN=BUFFER"), (["-ot", "exps=NOPE0"], "no buffer type 'NOPE0'"),
                        (["-ot", ";"], "has no PATTERN=BUFFER pair")):
        bad = cli("bench", "-m", str(moe_path), *flags)
        assert bad.returncode == 2 and says in bad.stderr, (flags, bad.stderr)


def test_the_docs_gemma_example_of_layers_asked_for_on_a_small_card(cli_in_process: InProcessCLI) -> None:
    """docs/fit.md: `localgen fit -m gemma3:270m --gpu-memory 2G -ngl 99`: every layer on the card is over its budget
    even at the floor."""
    r = cli_in_process("fit", "-m", "gemma3:270m", "--gpu-memory", "2G", "-ngl", "99")
    assert r.returncode == 0, r.stderr
    assert _plan_line(r.stdout) == ("plan      won't fit · context 4,096 tokens (shrunk to the floor, still short of "
                                    "GPU memory)"), r.stdout


# fit.md: a tensor of a ggml type llama.cpp does not know (255) is a damaged file, as llama.cpp's gguf reader has it;
# fit planned the file without that tensor's bytes
def test_a_tensor_of_an_unknown_ggml_type_is_one_line_for_fit_and_run(cli_in_process: InProcessCLI,
                                                                      smollm2_path: Path, tmp_path: Path) -> None:
    from tests.gguf_edit import retype_tensor

    bad = retype_tensor(smollm2_path, tmp_path / "t255.gguf", 255)
    for args in (["fit", "-m", str(bad)], ["run", "-m", str(bad), "-p", "hi", "-n", "1"]):
        r = cli_in_process(*args)
        assert (r.returncode, r.stdout) == (1, "") and len(r.stderr.splitlines()) == 1, (args, r.stderr)
        assert f"{bad} is not a usable GGUF file: its tensor " in r.stderr, r.stderr
        assert "has the ggml type 255, which llama.cpp does not know" in r.stderr, r.stderr
    # a type llama.cpp removed (Q4_0_4_4, published in 2024) is named as that, not as damage to download again
    old = retype_tensor(smollm2_path, tmp_path / "t31.gguf", 31)
    for args in (["fit", "-m", str(old)], ["run", "-m", str(old), "-p", "hi", "-n", "1"]):
        r = cli_in_process(*args)
        assert (r.returncode, r.stdout) == (1, "") and len(r.stderr.splitlines()) == 1, (args, r.stderr)
        assert f"{old} is quantized as Q4_0_4_4 (its tensor " in r.stderr, r.stderr
        assert "a type llama.cpp no longer reads (get its Q4_0" in r.stderr, r.stderr


# fit.md: fit plans nothing for a header llama.cpp's load refuses (it planned each; run said llama.cpp stopped, by
# an assert of its hyperparameters, or could not load it)
@pytest.mark.parametrize(("edit", "why"), [
    ({"qwen3moe.expert_used_count": 9, "qwen3moe.expert_count": 4},
     "its header says qwen3moe.expert_used_count is 9, more than its 4 experts"),
    ({"qwen3moe.expert_count": 0}, "its header says qwen3moe.expert_used_count is 2, and it names no experts"),
    ({"qwen3moe.expert_count": 100_000},
     "its header says qwen3moe.expert_count is 100,000, more than llama.cpp's 1,024"),
    ({"qwen3moe.expert_used_count": 0}, "its header names 16 experts and no qwen3moe.expert_used_count"),
    ({"qwen3moe.block_count": 0}, "its header says qwen3moe.block_count is 0"),
    ({"qwen3moe.context_length": None}, "its header has no qwen3moe.context_length, which llama.cpp needs"),
    ({"qwen3moe.block_count": None}, "its header has no qwen3moe.block_count, which llama.cpp needs"),
    ({"qwen3moe.attention.head_count": None}, "its header has no qwen3moe.attention.head_count, which its attention"),
    # a red team's, each refused by llama.cpp's load (a list of another length, a 0 where a layer has attention)
    ({"qwen3moe.attention.head_count": [4, 4, 4, 4, 4]},
     "its header lists 5 values of qwen3moe.attention.head_count for its 4 layers"),
    ({"qwen3moe.attention.head_count": 0}, "its header says qwen3moe.attention.head_count is 0 for layer 0"),
    ({"qwen3moe.attention.head_count": [0, 4, 4, 4]}, "its header says qwen3moe.attention.head_count is 0 for layer 0"),
    ({"qwen3moe.attention.head_count_kv": [0, 2, 2, 2]},
     "its header says qwen3moe.attention.head_count_kv is 0 for layer 0"),
])
def test_fit_refuses_a_header_llama_cpp_refuses_as_run_does(cli: CLI, cli_in_process: InProcessCLI, moe_path: Path,
                                                            tmp_path: Path, edit: dict[str, Any], why: str) -> None:
    from tests.gguf_edit import rewrite_strings

    bad = rewrite_strings(moe_path, tmp_path / "bad.gguf", edit)
    for args in (["fit", "-m", str(bad)], ["fit", "-m", str(bad), "--json"], ["run", "-m", str(bad), "-p", "hi"]):
        r = (cli if args[0] == "run" else cli_in_process)(*args)  # (llama.cpp's assert ends the process it is in)
        assert r.returncode == 1 and r.stdout == "" and len(r.stderr.splitlines()) == 1, (args, r.stderr)
        if args[0] == "fit":
            assert r.stderr.startswith(f"localgen: error: llama.cpp would not load bad.gguf: {why}"), r.stderr


def test_a_later_layers_zero_head_count_is_no_refusal(cli_in_process: InProcessCLI, moe_path: Path,
                                                     tmp_path: Path) -> None:
    """qwen3moe shapes every layer's attention by the first layer's head count: llama.cpp loads [4, 4, 4, 0] (and
    run answers), so fit plans it: no refusal of a file llama.cpp loads."""
    from tests.gguf_edit import rewrite_strings

    odd = rewrite_strings(moe_path, tmp_path / "odd.gguf", {"qwen3moe.attention.head_count": [4, 4, 4, 0]})
    r = cli_in_process("fit", "-m", str(odd))
    assert r.returncode == 0 and r.stdout.startswith("model"), r.stderr


def test_a_draft_model_loads_without_the_models_placement_flags(cli: CLI, moe_path: Path, smollm2_path: Path) -> None:
    """docs/run.md: the draft model takes the model's load settings but its placement flags (they name the model's
    tensors): a dense draft for a MoE run with --cpu-moe is not warned of, nor placed by them."""
    r = cli("run", "-m", str(moe_path), "--draft", str(smollm2_path), "--cpu-moe", "--raw", "-p", "Once", "-n", "3",
            "--temperature", "0", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "not a mixture of experts" not in r.stderr, r.stderr
    assert json.loads(r.stdout)["load"]["moved"]["CPU"]["experts"] == read_summary(str(moe_path)).n_layers * 3


def _header_with(path: Path, arch: str = "llama", name: str | None = "tiny", template: str | None = None,
                 head_count_kv: float | None = None, block_count: int | None = 1, context_length: int | None = 2048,
                 tensor: str = "blk.0.attn_q.weight") -> Path:
    """A model GGUF of one F32 tensor, its header as given (the keys given None left out)."""
    import numpy as np
    from gguf import GGUFValueType, GGUFWriter

    w = GGUFWriter(str(path), arch)
    if name is not None:
        w.add_name(name)
    for key, value in (("block_count", block_count), ("context_length", context_length), ("embedding_length", 8),
                       ("attention.head_count", 1)):
        if value is not None:
            w.add_uint32(f"{arch}.{key}", value)
    if head_count_kv is not None:
        w.add_key_value(f"{arch}.attention.head_count_kv", head_count_kv, GGUFValueType.FLOAT64)
    if template is not None:
        w.add_chat_template(template)
    w.add_tensor(tensor, np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_count_no_model_has_is_one_line_for_fit_show_and_run(cli_in_process: InProcessCLI, tmp_path: Path) -> None:
    """A header's 1e300 KV heads: `fit` ended in a traceback (an OverflowError printing the plan), and serve's
    completions in a 500. Now the file is a damaged one, said in one line naming the key and the file."""
    bad = _header_with(tmp_path / "kvf.gguf", head_count_kv=1e300)
    for args in (["fit", "-m", str(bad)], ["show", str(bad)], ["run", "-m", str(bad), "-p", "hi", "-n", "1"]):
        r = cli_in_process(*args)
        assert (r.returncode, r.stdout) == (1, ""), (args, r.stderr)
        assert r.stderr.startswith(f"localgen: error: {bad} is not a usable GGUF file: its header says "
                                   "llama.attention.head_count_kv is 1e+300, not a whole number from 0 to "
                                   "4,294,967,295") \
            and r.stderr.count("\n") == 1, (args, r.stderr)


def test_show_and_fit_escape_a_headers_control_characters_on_a_terminal(cli_env: dict[str, str], tmp_path: Path,
                                                                         cli_in_process: InProcessCLI) -> None:
    """A model's name, architecture and chat template are the file's text: on a terminal their ESC and BEL show
    escaped (they cleared the screen and wrote the clipboard by OSC 52), a bidi override (U+202E, which showed the rest
    of the name reversed) too, and a line break in a field shows as \\n;
    `show --template` into a pipe is the template as written, as run's answers are."""
    import pexpect

    from tests import terminal

    template = "\x1b]52;c;ZWNobw==\x07{{ messages[0].content }}"
    bad = _header_with(tmp_path / "esc.gguf", arch="llama\x1b[31m", name="\x1b[2JEVIL\x07\r\nnext\u202efdp.exe",
                       template=template)
    seen = {}
    for args in (["show", str(bad)], ["show", str(bad), "--template"], ["fit", "-m", str(bad), "--gpu-memory", "0"]):
        child = terminal.spawn({**cli_env, "TERM": "xterm"}, args)
        try:
            child.expect(pexpect.EOF)
            seen[args[-1]] = str(child.before)
        finally:
            child.close()
        assert child.exitstatus == 0, (args, seen)
    assert not any("\x1b" in out or "\x07" in out or "\u202e" in out for out in seen.values()), seen
    assert "model           \\x1b[2JEVIL\\x07\\r\\nnext\\u202efdp.exe\r\n" in seen[str(bad)], seen
    assert "architecture    llama\\x1b[31m\r\n" in seen[str(bad)], seen
    assert seen["--template"] == "\\x1b]52;c;ZWNobw==\\x07{{ messages[0].content }}\r\n", seen
    assert seen["0"].startswith("model     esc.gguf · llama\\x1b[31m · 1 layers"), seen
    assert cli_in_process("show", str(bad), "--template").stdout == template + "\n"
    from localgen.cli.output import visible

    # a template with Windows line ends showed \x0d at each line's end on a terminal: a CRLF is a line break
    assert visible("{{ a }}\r\n{{ b }}\r") == "{{ a }}\r\n{{ b }}\\x0d"


def test_a_huge_size_reads_with_separators() -> None:
    """A plan of 2^31 KV heads × 2^31 key length printed `70368744177664.0 GiB`; sizes step up to TiB, PiB and EiB
    (`--gpu-memory 1P` printed `1,048,576.0 GiB`), with thousands separators past EiB as MiB, KiB and bytes have."""
    from localgen.units import format_bytes

    assert format_bytes(70368744177664 << 30) == "65,536.0 EiB"
    assert format_bytes(1536 << 30) == "1.5 TiB"
    assert format_bytes(3 << 29) == "1.5 GiB"
    # serve --cache-ram 1.5 (MiB, as llama-server's) said "up to 2 MiB": under 10 MiB a tenth shows
    assert [format_bytes(n) for n in (3 << 19, 1 << 20, 92 << 20, int(9.96 * (1 << 20)))] == [
        "1.5 MiB", "1 MiB", "92 MiB", "10 MiB"]
    from localgen.cli.serve.checks import _cache_ram
    from localgen.errors import UsageError

    assert _cache_ram("1.5") == 3 << 19
    with pytest.raises(UsageError, match="is not a size"):
        _cache_ram("\u0661\u0665")  # Arabic-Indic digits: no size (they were 15 MiB)


def test_the_experts_line_says_what_is_in_ram(cli_in_process: InProcessCLI, moe_path: Path) -> None:
    """A newcomer's trial: with no GPU, `--n-cpu-moe 1` said `the first layer's in RAM (24 MiB)`, every layer's
    bytes; `--n-cpu-moe 99` on a 4-layer model said `the first 99 layers'`."""
    def experts(*args: str) -> str:
        r = cli_in_process("fit", "-m", str(moe_path), *args)
        assert r.returncode == 0, r.stderr
        return next(line for line in r.stdout.splitlines() if line.startswith("experts"))

    from localgen.units import format_bytes

    w = footprint.layout(str(moe_path))
    every = sum(t.nbytes for t in w.tensors if t.expert)
    assert experts("--n-cpu-moe", "1") == f"experts   all in RAM ({format_bytes(every)}): no layer is on a GPU"
    assert experts("--n-cpu-moe", "99", "--gpu-memory", "24G") == \
        f"experts   every layer's in RAM ({format_bytes(every)})"
    assert experts("--n-cpu-moe", "1", "--gpu-memory", "24G") == \
        f"experts   the first layer's in RAM ({format_bytes(every // w.n_layer)})"
    # a second trial: --cpu-moe beside --n-cpu-moe 3 said `the first 3 layers'` of every layer's bytes, and layers
    # kept on the CPU (llama.cpp offloads the last) counted in the bytes and not in the words
    assert experts("--cpu-moe", "--n-cpu-moe", "1", "--gpu-memory", "24G") == \
        f"experts   every layer's in RAM ({format_bytes(every)})"
    two = format_bytes(2 * (every // w.n_layer))
    assert experts("--n-cpu-moe", "1", "--gpu-layers", "3", "--gpu-memory", "24G") == \
        f"experts   the first 2 layers' in RAM ({two}), as those layers are on the CPU"
    assert experts("-ot", "exps=CUDA0", "--gpu-layers", "0", "--gpu-memory", "24G") == "experts   none in RAM"


def test_a_bare_fa_is_on_in_fit_as_in_run(cli_in_process: InProcessCLI, moe_path: Path) -> None:
    """fit --help says `A bare -fa means on`, as run's does: `fit -fa` was 'requires an argument', and `-fa -ub 256`
    took -ub as -fa's value (a newcomer's trial)."""
    for args in (["-fa"], ["-fa", "-ub", "256"], ["-fa", "off", "-ub", "256"]):
        r = cli_in_process("fit", "-m", str(moe_path), *args, "--json")
        assert r.returncode == 0, (args, r.stderr)
        flags = json.loads(r.stdout)["flags"]
        assert ("-fa off" if "off" in args else "-fa on") in flags, (args, flags)
        assert ("-ub 256" in flags) == ("-ub" in args), (args, flags)


def test_a_described_gpu_given_no_layer_keeps_its_row(cli_in_process: InProcessCLI, smollm2_path: Path) -> None:
    """A newcomer's trial: a GPU the plan gives nothing was left out of the table and of `devices`, though the
    machine line named it; it shows with nothing on it and its budget."""
    args = ("fit", "-m", str(smollm2_path), "--gpu-memory", "24G,12G", "-ts", "1")
    doc = json.loads(cli_in_process(*args, "--json").stdout)
    assert [d["device"] for d in doc["devices"]] == ["CPU", "GPU0", "GPU1"]
    assert doc["devices"][2]["total"] == 0 and doc["devices"][2]["budget"] > 0
    assert doc["layers_per_gpu"] == [30, 0] and doc["gpu_layers"] == 31  # repeating layers; the output's in the count
    none = json.loads(cli_in_process("fit", "-m", str(smollm2_path), "--gpu-memory", "0", "--json").stdout)
    assert none["layers_per_gpu"] == [] and none["gpu_layers"] == 0  # one entry a GPU: it said [0] with none
    row = next(line for line in cli_in_process(*args).stdout.splitlines() if line.startswith("GPU1"))
    assert row.split()[1:6] == ["-"] * 5, row


def test_the_verdict_follows_the_output_matrix_and_the_kv_cache_where_the_flags_send_them(
        cli_in_process: InProcessCLI, shape_path: Callable[[str], Path]) -> None:
    """fit.md's verdicts: `-ot token_embd.weight=CPU` keeps SmolLM2's tied output matrix in RAM (no bytes more there:
    it was `full GPU`); `-ot '.=CPU'` leaves the layers' KV cache on the GPU (it was `CPU only` beside `31 of 31 on
    the GPU`); --gpu-layers 0 is `CPU only`; and `-ot exps=CUDA0` on a card too small for the experts keeps every
    layer on the GPU (every layer was taken off it, which freed nothing the experts need)."""
    def verdict(*args: str, card: str = "24G") -> dict[str, Any]:
        r = cli_in_process("fit", "--gpu-memory", card, "--json", *args)
        assert r.returncode == 0, (args, r.stderr)
        return json.loads(r.stdout)

    assert verdict("-m", "smollm2:135m")["verdict"] == "full GPU"
    tied = verdict("-m", "smollm2:135m", "-ot", "token_embd.weight=CPU")
    assert tied["verdict"] == "partial GPU" and tied["gpu_layers"] == 31
    every = verdict("-m", "smollm2:135m", "-ot", ".=CPU")
    assert every["verdict"] == "partial GPU" and every["devices"][1]["weights"] == 0 and every["devices"][1]["kv"]
    assert verdict("-m", "smollm2:135m", "--gpu-layers", "0")["verdict"] == "CPU only"
    moe = verdict("-m", str(shape_path("moe-30b-a3b")), "-ot", "exps=CUDA0", card="8G")
    assert moe["verdict"] == "won't fit" and moe["gpu_layers"] == moe["model"]["layers"] + 1, moe
    assert moe["flags"].startswith("--ctx 4096 --gpu-layers -1 ")
