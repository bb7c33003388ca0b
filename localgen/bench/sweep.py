"""Benchmark plans: llama-bench's value lists and ranges, and every combination of them.

  1,2,4      a list          1-8        first to last, step 1
  1-16*2     1, 2, 4, 8, 16 (multiply)  0-40+10    0, 10, 20, 30, 40 (add)
Flags may also repeat (-t 1 -t 2); values add up in order, duplicates dropped.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from localgen.errors import UsageError
from localgen.types import KV_CACHE_TYPES

_RANGE = re.compile(r"^(-?\d+)-(-?\d+)(?:([*+])(\d+))?$")
MAX_VALUES = 1000
MAX_REPETITIONS = 1000  # -r: a thousand of each test is a day at the default sizes on a small CPU
MAX_PARALLEL = 256  # -npl: llama.cpp's most sequences in one context (LLAMA_MAX_SEQ)
MAX_CONFIGS = MAX_TESTS = 10_000  # load configurations (each a model load) and tests of one sweep: counted first
C_INT = 2**31 - 1  # llama.cpp takes each size as a C int


def int_values(flag: str, items: list[str] | None, default: list[int]) -> list[int]:
    """Parse repeated, comma-separated integer lists and ranges."""
    if not items:
        return list(default)
    out: list[int] = []
    for item in items:
        for part in item.split(","):
            part = part.strip()
            if not part:
                continue
            out.extend(_expand(flag, part))
    seen: list[int] = []
    for v in out:
        if v not in seen:
            seen.append(v)
    return seen


def _expand(flag: str, part: str) -> list[int]:
    if re.fullmatch(r"-?\d+", part):
        return [int(part)]
    m = _RANGE.match(part)
    if not m:
        raise UsageError(f"{flag}: {part!r} is not a number, list or range (like 1-8, 1-16*2, 0-40+10)")
    first, last, op, step_s = int(m.group(1)), int(m.group(2)), m.group(3), m.group(4)
    step = int(step_s) if step_s else 1
    if last < first:
        raise UsageError(f"{flag}: range {part!r} ends before it starts")
    if op == "*" and (step < 2 or first <= 0):
        raise UsageError(f"{flag}: range {part!r} needs a factor of 2 or more and a positive start")
    if op != "*" and step < 1:
        raise UsageError(f"{flag}: range {part!r} needs a step of 1 or more")
    values = []
    v = first
    while v <= last:
        values.append(v)
        v = v * step if op == "*" else v + step
        if len(values) > MAX_VALUES:
            raise UsageError(f"{flag}: range {part!r} has more than {MAX_VALUES} values")
    return values


def bool_values(flag: str, items: list[str] | None, default: list[bool]) -> list[bool]:
    """0/1, on/off, true/false lists."""
    if not items:
        return list(default)
    out: list[bool] = []
    for part in ",".join(items).split(","):
        p = part.strip().lower()
        if p in ("1", "on", "true", "yes"):
            v = True
        elif p in ("0", "off", "false", "no"):
            v = False
        else:
            raise UsageError(f"{flag}: {part!r} is not 0/1 or on/off")
        if v not in out:
            out.append(v)
    return out


def str_values(flag: str, items: list[str] | None, default: list[str], allowed: list[str] | None = None) -> list[str]:
    """Comma lists of words, checked against the allowed ones."""
    if not items:
        return list(default)
    out: list[str] = []
    for part in ",".join(items).split(","):
        p = part.strip()
        if not p:
            continue
        if allowed is not None and p.lower() not in allowed:
            raise UsageError(f"{flag}: {p!r} is not one of {', '.join(allowed)}")
        if p not in out:
            out.append(p.lower() if allowed is not None else p)
    if not out:  # given, and empty: a mistake, not the default
        raise UsageError(f"{flag} is empty: give a value, or leave it out")
    return out


def placements(flag: str, items: list[str] | None) -> list[tuple[tuple[str, str], ...]]:
    """llama-bench's -ot: placements separated by ',' (each one configuration; an empty one: none), each of
    PATTERN=BUFFER pairs separated by ';'; the flag may repeat. Patterns are checked as run's -ot checks them."""
    from localgen import placement

    out: list[tuple[tuple[str, str], ...]] = []
    for item in items or []:
        for group in item.split(","):
            pairs_ = tuple(p for part in group.split(";") if part.strip() for p in placement.parse(part))
            if not pairs_ and group.strip():
                raise UsageError(f"{flag}: {group!r} has no PATTERN=BUFFER pair")
            if pairs_ not in out:
                out.append(pairs_)
    return out or [()]


def pairs(flag: str, items: list[str] | None) -> list[tuple[int, int]]:
    """-pg 512,128 (repeatable): prompt and generation lengths."""
    out = []
    for item in items or []:
        parts = [p.strip() for p in item.split(",")]
        if len(parts) != 2 or not all(re.fullmatch(r"-?\d+", p) for p in parts):  # a negative: build()'s range
            raise UsageError(f"{flag}: {item!r} must be two numbers, PROMPT,GEN (like 512,128)")
        out.append((int(parts[0]), int(parts[1])))
    return out


@dataclass(frozen=True)
class LoadConfig:
    """What needs a model (re)load: the model and its load settings."""

    model: str
    n_threads: int | None  # None: the load's default (the model's tuning record, else the rule)
    n_gpu_layers: int
    n_batch: int
    n_ubatch: int | None  # None: likewise
    flash_attn: bool | None  # None: likewise
    type_k: str
    type_v: str
    n_cpu_moe: int = 0  # the first N layers' experts in RAM (llama-bench's -ncmoe)
    override_tensor: tuple[tuple[str, str], ...] = ()  # -ot's (pattern, buffer type) pairs, as llama-bench's
    cpu_moe: bool = False  # every layer's experts in RAM (run's --cpu-moe)
    main_gpu: int = 0  # llama-bench's -mg: passed to the load (llama.cpp's layer split does not use it)

    @property
    def placement(self) -> tuple[tuple[str, str], ...]:
        """The pairs llama.cpp gets but --n-cpu-moe's (llama-bench's tensor_buft_overrides): -ot's, then
        --cpu-moe's pattern."""
        from localgen import placement

        return (*self.override_tensor, *((placement.cpu_moe(),) if self.cpu_moe else ()))


@dataclass(frozen=True)
class Test:
    """One measurement: prompt tokens, generated tokens, depth; kind pp, tg, pg or e2e."""

    kind: str
    n_prompt: int
    n_gen: int
    n_depth: int
    n_parallel: int = 1

    @property
    def label(self) -> str:
        """llama-bench's test name: pp512, tg128, pp512+tg128, with ' @ d4096' at a depth."""
        base = {"pp": f"pp{self.n_prompt}", "tg": f"tg{self.n_gen}",
                "pg": f"pp{self.n_prompt}+tg{self.n_gen}", "e2e": f"e2e{self.n_gen}"}[self.kind]
        if self.n_parallel > 1:
            base = f"{base} x{self.n_parallel}"
        return f"{base} @ d{self.n_depth}" if self.n_depth else base

    @property
    def ctx_needed(self) -> int:
        """Context this test fills."""
        return self.n_depth + self.n_prompt + self.n_gen


@dataclass(frozen=True)
class Rates:
    """A first quick measurement on the first configuration, to foresee how long a plan takes."""

    prompt_s: float  # seconds per prompt token
    gen_s: float  # seconds per generated token
    load_s: float  # seconds to load the model and warm it up


DEPTH_ALLOWANCE = 2048  # attention over the context: each this many tokens of it add a token's cost, roughly


def _deep(tokens: int) -> float:
    return 1.0 + tokens / DEPTH_ALLOWANCE


@dataclass(frozen=True)
class Plan:
    """Every load configuration, and the tests each runs."""

    configs: list[LoadConfig]
    tests: list[Test]
    repetitions: int
    exact: bool | None = None  # -npl tests' batching mode: --exact (True), --no-exact (False), else serve's
    kv_unified: bool | None = None  # -npl tests' KV cells: one pool (True), a stream each (False), else kv_pool's

    @property
    def size(self) -> int:
        """Measurements to make."""
        return len(self.configs) * len(self.tests)

    def seconds(self, rates: Rates) -> float:
        """About how long the plan takes at the first configuration's rates: a rough figure (other
        configurations, depth and batching are allowances), for a line before the sweep starts."""
        per_config = rates.load_s
        for t in self.tests:
            prompt = (t.n_depth + t.n_prompt) * rates.prompt_s * _deep(t.n_depth + t.n_prompt // 2)
            gen = t.n_gen * rates.gen_s * _deep(t.n_depth + t.n_prompt + t.n_gen // 2)
            if t.kind == "e2e":  # a chat-templated prompt of some 40 tokens, then the answer
                rep = 40 * rates.prompt_s + gen
            elif t.n_parallel > 1:  # every sequence's prompt; a step of several costs more than one
                rep = t.n_parallel * prompt + gen * (1 + (t.n_parallel - 1) / 4)
            else:
                rep = prompt + gen
            per_config += rep * (self.repetitions + (t.n_parallel > 1))  # -npl tests have their own warm-up
        return len(self.configs) * per_config


def build(models: list[str], threads: Sequence[int | None], ngl: list[int], batch: list[int],
          ubatch: Sequence[int | None], fa: Sequence[bool | None], ctk: list[str], ctv: list[str],
          prompts: list[int], gens: list[int], pg: list[tuple[int, int]], depths: list[int], reps: int, e2e: bool,
          parallel: list[int] | None = None, exact: bool | None = None, ncmoe: list[int] | None = None,
          ot: list[tuple[tuple[str, str], ...]] | None = None, cmoe: bool = False,
          kv_unified: bool | None = None, mg: list[int] | None = None) -> Plan:
    """Every combination, in llama-bench's order (models outermost)."""
    c_int = C_INT  # --threads as run takes it
    pairs_given = [v for pair in pg for v in pair]
    for name, values, low, high in (("--threads", threads, 1, 1024), ("--batch-size", batch, 1, c_int),
                                    ("--ubatch-size", ubatch, 1, c_int), ("--n-prompt", prompts, 0, c_int),
                                    ("--n-gen", gens, 0, c_int), ("--prompt-gen", pairs_given, 0, c_int),
                                    ("--n-depth", depths, 0, c_int), ("--n-gpu-layers", ngl, -1, c_int),
                                    ("--main-gpu", mg or [], 0, c_int),
                                    ("--n-cpu-moe", ncmoe or [], 0, c_int), ("--parallel", parallel or [], 1,
                                                                            MAX_PARALLEL)):
        in_range(name, values, low, high)  # 99999999999999999999 threads: llama.cpp's std::bad_alloc, an abort
    in_range("--repetitions", [reps], 1, MAX_REPETITIONS)
    for v in ctv:
        if v not in ("f16", "f32", "bf16") and False in fa:
            raise UsageError(f"a quantized V cache ({v}) needs flash attention; drop -fa 0 or that type")
    lists = (models, threads, ngl, mg or [0], batch, ubatch, fa, ctk, ctv, ncmoe or [0], ot or [()])
    n_configs = math.prod(len(v) for v in lists)
    if n_configs > MAX_CONFIGS:  # -t 1-1000 -b 1-1000 -ub 1-100 made 100 million of them, minutes before anything
        sizes = " × ".join(str(len(v)) for v in lists if len(v) > 1)
        raise UsageError(f"the sweep is {n_configs:,} configurations ({sizes} values): at most {MAX_CONFIGS:,}",
                         hint="give fewer values of -m, -t, -ngl, -mg, -b, -ub, -fa, -ctk, -ctv, -ncmoe or -ot")
    configs = [LoadConfig(m, t, n, *c, override_tensor=o, cpu_moe=cmoe, main_gpu=g)
               for m, t, n, g in itertools.product(models, threads, ngl, mg or [0])
               for c in itertools.product(batch, ubatch, fa, ctk, ctv, ncmoe or [0])
               for o in ot or [()]]
    pg = [(p, n) for p, n in pg if p or n]  # 0,0 measures nothing: left out, as llama-bench does
    n_tests = len(depths) * (sum(p > 0 for p in prompts) + sum(n > 0 for n in gens) + len(pg))
    if n_tests > MAX_TESTS:  # -p 1-1000 -n 1-1000 -d 1-1000: two million tests
        raise UsageError(f"the sweep is {n_tests:,} tests (-p and -n sizes, -pg pairs, at each -d depth): at most "
                         f"{MAX_TESTS:,}", hint="give fewer sizes or depths")
    tests: list[Test] = []
    for d in depths:
        tests += [Test("pp", p, 0, d) for p in prompts if p > 0]
        tests += [Test("tg", 0, n, d) for n in gens if n > 0]
        tests += [Test("pg", p, n, d) for p, n in pg]
    for b in parallel or []:
        if b == 1:
            continue  # the plain pp/tg tests above are the single-sequence baseline
        p, n = (prompts[0] if prompts else 0), (gens[0] if gens else 0)
        tests += [Test("pp", p, 0, 0, b)] if p else []
        tests += [Test("tg", p, n, 0, b)] if n else []
    if e2e and gens and gens[0] > 0:
        tests.append(Test("e2e", 0, gens[0], 0))  # the chat path: template, sampling, detokenizing
    if not tests:
        raise UsageError("nothing to measure: give -p, -n or -pg sizes above 0")
    if exact is not None and not any(t.n_parallel > 1 for t in tests):
        flag = "--exact" if exact else "--no-exact"
        raise UsageError(f"{flag} sets how -npl sequences are batched: add --parallel N (N above 1)")
    if kv_unified is not None and not any(t.n_parallel > 1 for t in tests):
        flag = "--kv-unified" if kv_unified else "--no-kv-unified"
        raise UsageError(f"{flag} sets the KV cells of -npl sequences: add --parallel N (N above 1)")
    return Plan(configs, tests, reps, exact, kv_unified)


def in_range(flag: str, values: Sequence[int | None], low: int, high: int) -> None:
    """A UsageError naming the flag and the range it takes, for the first value outside it, worded as run's and
    fit's (settings.out_of_range): `bench --n-cpu-moe -1` and `run --n-cpu-moe -1` say the same."""
    from localgen.settings import out_of_range

    for v in values:
        if v is not None and not low <= v <= high:
            raise UsageError(out_of_range(flag, low, high, v))


def check_context(plan: Plan, trained: dict[str, int | None]) -> None:
    """Refuse, before any load, a test longer than its model's training context (`trained`, by model name): the
    load caps the window there (engine/defaults.py), so the test could only fail once measuring, after the
    load and the estimate (the e2e test's chat template counts for some 64 tokens)."""
    for cfg in plan.configs:
        limit = trained.get(cfg.model)
        for t in plan.tests if limit else []:
            need = t.ctx_needed + (64 if t.kind == "e2e" else 0)
            if limit is not None and need > limit:
                flags = {"pp": "-p", "tg": "-n", "pg": "-pg", "e2e": "-n"}[t.kind]
                flags = "-p + -n" if t.kind == "tg" and t.n_prompt else flags  # an -npl test's prompt, then answer
                raise UsageError(f"{t.label} needs a context of {need:,} tokens ({flags}{' + -d' if t.n_depth else ''})"
                                 f": past the {limit:,} {cfg.model} was trained on, the most its load here gives it",
                                 hint="give smaller sizes")


KV_TYPES = list(KV_CACHE_TYPES)
