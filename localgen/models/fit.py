"""The planner: where a model's layers and experts go and how large a context it gets, on this machine or on
one described (`localgen fit --gpu-memory 24GB`), from the GGUF header alone (footprint.py's needs per
device). `localgen fit` prints its plan; run, chat and serve load by it; `pull --list` and serve's residency
take its verdicts.

The order, where memory is short: the GPU gets every layer's attention and dense weights first, then as many
layers' experts as it has room for (the rest stay in RAM, as --n-cpu-moe keeps them); then the context
shrinks, never below MIN_CTX (or the one asked, if smaller); only then do whole layers leave the GPU, as few as
the floor needs, and the context grows back to the largest that placement holds (each layer's KV cache where its
layer is, as llama.cpp's offload_kqv keeps it: no layer on the GPU, and it is the context RAM holds). With no GPU,
the context shrinks to fit RAM. A setting given (--gpu-layers, a placement flag) is kept as given: where it puts
more on a GPU than its budget the context shrinks, and at the floor the verdict is "won't fit".

Budgets: RAM_SHARE of the available RAM; on each GPU its free memory less what our own GPU context takes
(GPU_CONTEXT_RESERVE) and llama.cpp --fit's default margin (GPU_MARGIN)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass

from localgen import hardware
from localgen.engine import defaults
from localgen.models.footprint import Footprint, Placement, WeightLayout, cells, estimate
from localgen.monotone import least, most
from localgen.types import MAX_CELLS, TRAINED_CTX, GGUFSummary, LoadParams

FULL_GPU, PARTIAL_GPU, CPU_ONLY, WONT_FIT = "full GPU", "partial GPU", "CPU only", "won't fit"
MIN_CTX = 4096  # the floor a context is shrunk to (llama.cpp's --fit-ctx default)
RAM_SHARE = 0.9
GPU_MARGIN = 1 << 30  # left free on each GPU (llama.cpp's --fit-target default, 1024 MiB)
# What a process's own GPU context takes before any model memory (CUDA: the primary context, cuBLAS
# handles and workspace; its size on an H100: docs/benchmarks.md, Costs noted in the code). nvidia-smi's free
# memory does not count it yet.
GPU_CONTEXT_RESERVE = 640 << 20


@dataclass(frozen=True)
class Machine:
    """What a plan is made for: RAM available and each GPU's free memory, in bytes."""

    ram: int
    gpus: tuple[int, ...] = ()  # free memory per GPU (none: the CPU alone)
    unified: bool = False  # the GPU's memory is the RAM (Apple silicon): one pool
    described: bool = False  # given on the command line (--gpu-memory, --ram), not measured here

    @property
    def ram_budget(self) -> int:
        """What the plan may take of RAM."""
        return int(self.ram * RAM_SHARE)

    def gpu_budget(self, i: int) -> int:
        """What the plan may take of GPU i."""
        return max(0, self.gpus[i] - GPU_CONTEXT_RESERVE - GPU_MARGIN)


def this_machine(offload: bool) -> Machine:
    """This machine's available RAM and, where this build can offload, its GPUs' free memory."""
    g = hardware.gpus() if offload else []
    ram = hardware.available_ram_bytes() or hardware.total_ram_bytes() or 0
    unified = bool(g and g[0].unified)
    if unified:  # what Metal may use of it (hardware.gpus), and no more than is available now: what models
        # loaded already (this process's or another's) hold is not
        metal = min(ram, g[0].total or 0) if ram else g[0].total or 0
        return Machine(ram=metal, gpus=(metal,), unified=True)
    if any(x.free is None for x in g):  # nvidia-smi says [N/A] (MIG, unified-memory chips): ask llama.cpp
        return Machine(ram=ram, gpus=_ggml_gpu_free() or tuple(x.free or 0 for x in g))
    return Machine(ram=ram, gpus=tuple(x.free or 0 for x in g))


def _ggml_gpu_free() -> tuple[int, ...]:
    """Each local GPU's free memory as llama.cpp's own backends report it (cudaMemGetInfo, which knows a MIG
    slice's memory), in the order a load numbers them; () where they report none. A GPU of unknown memory
    counts 0 here, so nothing is planned onto it."""
    from localgen.native import devices

    found = [d.free for d in devices.devices() if d.kind in (devices.GPU, devices.IGPU)
             and not d.name.startswith("RPC")]
    return tuple(found) if found and all(found) else ()


def described(gpu_memory: tuple[int, ...], ram: int | None = None) -> Machine:
    """A machine described by its GPUs' memory (each card's whole memory) and its RAM (default: this one's
    available RAM)."""
    have = hardware.available_ram_bytes() or hardware.total_ram_bytes() or 0
    return Machine(ram=have if ram is None else ram, gpus=gpu_memory, described=True)


@dataclass(frozen=True)
class Plan:
    """Where everything goes, and at what context."""

    ctx: int  # tokens per sequence
    asked: int  # the context asked for, capped at the training context (that when none was asked)
    parallel: int  # sequences, each with its own ctx cells
    n_layer: int
    gpu_layers: int  # llama.cpp's n_gpu_layers: of n_layer + 1, the output layer counted
    layers: tuple[int, ...]  # repeating layers on each GPU
    n_cpu_moe: int  # layers whose experts stay in RAM (the first ones, as --n-cpu-moe), 0 for a dense model
    moe: bool
    footprint: Footprint
    machine: Machine
    short: tuple[str, ...] = ()  # the devices over their budget where it does not fit (CPU for RAM, GPU0, ...)
    held_on_cpu: int = 0  # weights llama.cpp keeps in RAM with every layer offloaded (the token embedding)
    fixed: tuple[str, ...] = ()  # the settings given, which the plan kept
    capped: bool = False  # the context asked was over the training context, and is capped there as the load caps it
    # the split of the layers between several GPUs the plan chose (layers on each, as -ts takes it); () where the
    # GPUs' budgets (llama.cpp's default, by free memory) or the -ts given split them
    split: tuple[float, ...] = ()

    @property
    def fits(self) -> bool:
        """Whether every device is within its budget (RAM, each GPU)."""
        return not self.short

    @property
    def shrunk(self) -> bool:
        """Whether the context was made smaller than asked to fit."""
        return self.ctx < self.asked

    @property
    def whole(self) -> bool:
        """Whether the plan is the one the shrinking aims at: it fits, with every layer on the GPU where there is
        one (or as many as --gpu-layers gave). Shrunk to the floor and still not whole: memory is short there."""
        return self.fits and (not self.machine.gpus or self.gpu_layers >= self.n_layer + 1
                              or "gpu_layers" in self.fixed)

    @property
    def experts_in_ram(self) -> int:
        """Bytes of expert weights in RAM."""
        return self.footprint.on("CPU").experts

    @property
    def verdict(self) -> str:
        """full GPU / partial GPU / CPU only / won't fit: by where the weights and the KV cache are (a placement
        flag may send weights elsewhere than the layers' device). Full: every weight on a GPU but the token
        embedding, the output matrix included (-ot may keep a tied one in RAM at no cost in bytes); CPU only: no
        weight and no KV cache on a GPU (layers whose weights -ot keeps in RAM still attend there)."""
        if not self.fits:
            return WONT_FIT
        if not self.machine.gpus or not sum(d.weights + d.kv for d in self.footprint.gpus):
            return CPU_ONLY
        if (self.gpu_layers >= self.n_layer + 1 and self.footprint.on("CPU").weights <= self.held_on_cpu
                and self.footprint.output_matrix != "CPU"):
            return FULL_GPU
        return PARTIAL_GPU

    @property
    def short_of(self) -> str:
        """What is short where it does not fit: "RAM", "GPU memory" or "RAM and GPU memory" ("" where it fits)."""
        return " and ".join(what for what, short in (
            ("RAM", "CPU" in self.short), ("GPU memory", any(d != "CPU" for d in self.short))) if short)

    def load(self, load: LoadParams) -> LoadParams:
        """`load` with the plan's context, GPU layers and experts kept in RAM (each where not given)."""
        changes: dict[str, object] = {"n_ctx": self.ctx}
        if "gpu_layers" not in self.fixed and self.machine.gpus:
            changes["n_gpu_layers"] = -1 if self.gpu_layers >= self.n_layer + 1 else self.gpu_layers
        if "placement" not in self.fixed and self.n_cpu_moe:
            changes["n_cpu_moe"] = self.n_cpu_moe
        if self.split and not load.tensor_split:
            changes["tensor_split"] = self.split
        return dataclasses.replace(load, **changes)  # type: ignore[arg-type]


def plan(s: GGUFSummary, weights: WeightLayout, machine: Machine, load: LoadParams, ctx: int | None = None,
         parallel: int = 1, shrink: bool = True) -> Plan:
    """The plan for `load`'s settings at `ctx` tokens per sequence (None: the largest that fits, up to the
    training context; TRAINED_CTX, 0: the training context), or smaller where it does not fit (`shrink`), never
    below MIN_CTX."""
    load = load.for_model(s.context_length)
    if ctx == TRAINED_CTX:
        ctx = load.n_ctx
    n_layer = weights.n_layer or s.n_layers or 0
    train = s.context_length or MIN_CTX
    stretched = defaults.stretched(load)
    top = min(cells(ctx if ctx is not None else train), MAX_CELLS)  # --ctx 2147483647 padded up passes a C int
    # a GGUF that names no training context has nothing to cap at: the load takes what is asked
    capped = bool(s.context_length) and not stretched and top > cells(train)
    if capped:
        top = cells(train)  # the load caps it there too (engine/defaults.py)
    asked = top
    floor = min(top, MIN_CTX)
    fixed = tuple(name for name, given in (
        ("gpu_layers", load.n_gpu_layers is not None),
        ("placement", bool(load.override_tensor or load.cpu_moe or load.n_cpu_moe is not None))) if given)

    def at(c: int) -> Plan:
        p = _place(s, weights, machine, dataclasses.replace(load, n_ctx=c), c, asked, parallel, n_layer, fixed)
        return dataclasses.replace(p, capped=capped)

    best = at(top)
    if best.whole or not shrink or top <= floor:
        return best
    # the largest context (a multiple of 256) at which the plan is whole: every layer stays on the GPU (with a
    # GPU) or the model fits (without), between the floor and the top
    low = at(floor)
    if low.whole:
        return at(_largest(floor, top, lambda c: at(c).whole))
    if not low.fits:
        return low  # RAM is short even at the floor: it does not fit at all
    # layers leave the GPU even at the floor: the placement found there is kept (each layer's KV cache goes with
    # its layer, as llama.cpp's offload_kqv puts it), and the context grows back to the largest that placement
    # holds, on the GPU for its layers and in RAM for the rest
    def held(c: int) -> Plan:
        return at(c) if c == floor else dataclasses.replace(
            _place(s, weights, machine, dataclasses.replace(load, n_ctx=c), c, asked, parallel, n_layer, fixed,
                   keep=(low.gpu_layers, low.n_cpu_moe, low.split)), capped=capped)

    return held(_largest(floor, top, lambda c: held(c).fits))


def _largest(floor: int, top: int, ok: Callable[[int], bool]) -> int:
    """The largest context, a multiple of 256 between floor and top, with ok(context) (monotone: true at the floor,
    then false); top itself where ok(top)."""
    if ok(top):
        return top
    lo, hi = floor // 256, top // 256  # ok at lo, not at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid * 256):
            lo = mid
        else:
            hi = mid
    return lo * 256


def _place(s: GGUFSummary, weights: WeightLayout, machine: Machine, load: LoadParams, ctx: int, asked: int,
           parallel: int, n_layer: int, fixed: tuple[str, ...],
           keep: tuple[int, int, tuple[float, ...]] | None = None) -> Plan:
    """At one context: the GPU layers and experts in RAM, by the order in the module's docstring; `keep`: those
    (GPU layers, layers with experts in RAM, the split between GPUs) as they are, the plan fitting where the GPUs
    and RAM both hold them."""
    from localgen import placement

    gpus = machine.gpus
    patterns = placement.overrides(load.override_tensor, load.cpu_moe, load.n_cpu_moe or 0)
    shares, given_split = _shares(machine, load)
    moe = weights.moe and "placement" not in fixed
    # with the first layers' experts in RAM, the first GPU's layers weigh less than the others': a split by budget
    # leaves it half empty while the last overflows, so the plan fills each GPU in turn instead (as -ts would)
    fill = moe and len(gpus) > 1 and not given_split and not machine.unified

    def fp(ngl: int, ncm: int, sh: tuple[float, ...] = shares) -> Footprint:
        return estimate(s, weights, load, parallel, where=Placement(ngl, sh or shares, patterns, ncm),
                        repack=_repack(s, load, ngl))

    @functools.cache
    def filled(ngl: int, ncm: int) -> tuple[float, ...]:
        return _fill_in_turn(lambda sh, i: fp(ngl, ncm, sh).on(gpu_name(i, len(gpus))).total,
                             tuple(machine.gpu_budget(i) for i in range(len(gpus))), ngl)

    def over(f: Footprint, unknown: bool = True) -> tuple[str, ...]:
        """The devices over their budget (unified memory: one pool, RAM's); without `unknown`, not the GPUs of
        unknown memory (0), which take nothing by the plan and do not judge what a setting given put there."""
        if machine.unified:
            return ("CPU",) if f.total > machine.ram_budget else ()
        return tuple(name for name, budget in (("CPU", machine.ram_budget), *(
            (gpu_name(i, len(gpus)), machine.gpu_budget(i)) for i in range(len(gpus)) if unknown or gpus[i]))
            if f.on(name).total > budget)

    def gpus_fit(f: Footprint) -> bool:
        """Whether every GPU holds its part (unified memory: the whole, within RAM's budget)."""
        return not over(f) if machine.unified else all(d == "CPU" for d in over(f))

    def result(ngl: int, ncm: int, f: Footprint, sh: tuple[float, ...] = ()) -> Plan:
        # a setting given (--gpu-layers, -ot) may hold more than a GPU's budget: it does not fit
        return Plan(ctx=ctx, asked=asked, parallel=parallel, n_layer=n_layer, gpu_layers=ngl,
                    layers=_layers_per_gpu(ngl, n_layer, sh or shares), n_cpu_moe=ncm, moe=weights.moe, footprint=f,
                    short=over(f, unknown=False), machine=machine, fixed=fixed, split=sh,
                    held_on_cpu=weights.embedding)

    def experts_out(ngl: int, default: int) -> Plan | None:
        """The fewest layers' experts in RAM with `ngl` layers on the GPUs, split by budget or filled in turn,
        whichever keeps fewer there (None where none fits and `default` is -1)."""
        ncm = least(0, n_layer, lambda k: gpus_fit(fp(ngl, k)), default=default)
        if fill:
            best = least(0, n_layer, lambda k: gpus_fit(fp(ngl, k, filled(ngl, k))), default=-1)
            if best >= 0 and (ncm < 0 or best < ncm):
                sh = filled(ngl, best)
                return result(ngl, best, fp(ngl, best, sh), sh)
        return result(ngl, ncm, fp(ngl, ncm)) if ncm >= 0 else None

    if not gpus:
        return result(0, 0, fp(0, 0))
    if keep is not None:
        ngl, ncm, sh = keep
        return result(ngl, ncm, fp(ngl, ncm, sh), sh)
    given = load.n_gpu_layers
    every = n_layer + 1
    if given is not None:
        ngl = every if given < 0 or given > n_layer else given
        if moe and all(gpus):  # a GPU of unknown memory (0) cannot say which experts it holds: none leave it
            placed = experts_out(ngl, n_layer)  # some number of layers' experts always: n_layer at worst
            assert placed is not None
            return placed
        return result(ngl, 0, fp(ngl, 0))
    full = fp(every, 0)
    if gpus_fit(full):
        return result(every, 0, full)
    if moe:  # every layer's attention and dense weights on the GPU, the first layers' experts in RAM
        placed = experts_out(every, -1)
        if placed is not None:
            return placed
    ncm = n_layer if moe else 0  # fewer layers on the GPU, with no experts there
    if "placement" in fixed and all(gpus) and not machine.unified and not gpus_fit(fp(0, ncm)):
        # a placement given puts more on a GPU than it holds with no layer at all: taking layers off frees nothing
        # it needs, so the layers stay as they were (a GPU of unknown memory takes nothing by the plan: not here)
        return result(every, 0, full)
    ngl = most(0, n_layer, lambda k: gpus_fit(fp(k, ncm)))
    return result(ngl, ncm if ngl else 0, fp(ngl, ncm if ngl else 0))


def _shares(machine: Machine, load: LoadParams) -> tuple[tuple[float, ...], bool]:
    """Each GPU's part of the layers, and whether -ts gave them: by default by what the plan may take of each
    (llama.cpp splits by free memory), so one with nothing to give takes no layer and the others take them."""
    n = len(machine.gpus)
    split = tuple(load.tensor_split or ())[:n]  # llama.cpp reads one proportion per GPU, a missing one 0
    if any(split):  # (all 0: its default, by free memory)
        return split + (0.0,) * (n - len(split)), True
    return tuple(float(machine.gpu_budget(i)) for i in range(n)) or (1.0,), False


def _fill_in_turn(gpu_total: Callable[[tuple[float, ...], int], int], budgets: tuple[int, ...],
                  ngl: int) -> tuple[float, ...]:
    """Layers on each GPU (as -ts takes them): each in turn takes as many of the `ngl` layers as its budget holds,
    the last the rest. `gpu_total(shares, i)`: GPU i's bytes with the layers split by `shares`."""
    counts: list[float] = []
    left, n = ngl, len(budgets)
    for i in range(n - 1):
        def holds(c: int, i: int = i, left: int = left) -> bool:
            rest = (left - c) / (n - i - 1)
            return gpu_total((*counts, float(c), *([rest] * (n - i - 1))), i) <= budgets[i]

        c = most(0, left, holds)
        counts.append(float(c))
        left -= c
    return (*counts, float(left))


def gpu_name(i: int, n: int) -> str:
    """The plan's name for GPU `i` of `n`: GPU with one, GPU0, GPU1, ... with several."""
    return "GPU" if n == 1 else f"GPU{i}"


def _layers_per_gpu(ngl: int, n_layer: int, shares: tuple[float, ...]) -> tuple[int, ...]:
    where = Placement(ngl, shares)
    counts = [0] * len(shares)
    for il in range(n_layer):
        g = where.device_of_layer(il, n_layer)
        if g is not None:
            counts[g] += 1
    return tuple(counts)


def _repack(s: GGUFSummary, load: LoadParams, ngl: int) -> bool:
    """Whether the CPU weights get repacked: as given, else localgen's rule (engine/defaults.default_repack:
    on where half the weights are of a repackable type, off with layers on a GPU)."""
    if load.repack is not None:
        return load.repack
    if ngl:
        return False
    return s.repackable_share is None or s.repackable_share >= 0.5


def kv_bytes(s: GGUFSummary, n_ctx: int, cache_k: str = "f16", cache_v: str = "f16") -> int:
    """The whole KV cache of one sequence of n_ctx tokens (footprint.kv_bytes over its cells)."""
    from localgen.models.footprint import kv_bytes as kv

    return kv(s, cells(n_ctx), cache_k, cache_v)
