"""Tensor placement as llama.cpp spells it (common/arg.cpp, common/common.h): `--override-tensor` /
`-ot PATTERN=BUFFER,...`, `--cpu-moe` and `--n-cpu-moe N`, turned into the one ordered list of
(pattern, buffer type) pairs that llama_model_params.tensor_buft_overrides takes, and which buffer a tensor
name gets from it. A pattern is searched in each tensor's name (std::regex_search, ECMAScript); the first
pattern that matches wins. -ot's pairs come first, then --cpu-moe's, then --n-cpu-moe's.

Stdlib only: the planner (models/fit.py) and the load (engine/loading.py) both read it."""

from __future__ import annotations

import re
from collections.abc import Iterable

from localgen.errors import UsageError

# llama.cpp's LLM_FFN_EXPS_REGEX: a MoE layer's expert weights (gate_up fused, and the chunked _chexps)
EXPS = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
CPU = "CPU"
MAX_LAYERS = 512  # llama.cpp's LLAMA_MAX_LAYERS (src/llama-hparams.h): no model has a layer past it
# Python-only: named groups, flags, lookbehind, atomic groups; \A \Z \z \G, \N{NAME} and \U; possessive repeats
_NOT_ECMASCRIPT = re.compile(r"(?<!\\)\(\?[^:=!]|(?<!\\)\\[AZzGNU]|(?<!\\)[*+?}]\+")
# a GPU's buffer type as llama.cpp's backends name it (CUDA0, ROCm1, Vulkan0, SYCL0, MTL0; Metal for one)
GPU_BUFFER = re.compile(r"(CUDA|ROCm|Vulkan|SYCL|MUSA|CANN|MTL|Metal|OpenCL)(0|[1-9][0-9]*)?")  # (no CUDA00)


def cpu_moe() -> tuple[str, str]:
    """--cpu-moe: every layer's experts in RAM (llm_ffn_exps_cpu_override)."""
    return EXPS, CPU


def n_cpu_moe(n: int) -> list[tuple[str, str]]:
    """--n-cpu-moe N: the experts of the first N layers in RAM (llm_add_n_cpu_ffn_overrides). An N past the
    most layers a model can have means every layer, as it does to llama.cpp, without a pattern per layer that
    cannot exist (--n-cpu-moe 99999999999999999999 would otherwise fill the memory)."""
    return [(rf"blk\.{i}{EXPS}", CPU) for i in range(min(n, MAX_LAYERS))]


def parse(text: str | Iterable[str] | None, name: str = "--override-tensor") -> tuple[tuple[str, str], ...]:
    """-ot's value(s): PATTERN=BUFFER pairs, comma-separated, each pattern a regular expression llama.cpp can
    compile; a UsageError (exit 2) names the first bad one, and `name`, where the value came from (the flag, or
    LLAMA_ARG_OVERRIDE_TENSOR). An empty item (`-ot ''`, `exps=CPU,`, `a=CPU,,b=CPU`) is refused, as llama.cpp's
    parser refuses an item without `=`. Buffer names are checked against this build's devices where the load
    happens (native/devices.buffer_types)."""
    items = [text] if isinstance(text, str) else list(text or ())
    out = []
    for item in items:
        if not item:
            raise UsageError(f"{name} is empty: give PATTERN=BUFFER (e.g. 'exps=CPU'), or leave it out")
        for part in item.split(","):
            if not part.strip():
                raise UsageError(f"{name} has an empty item in {item!r}: each comma-separated item is "
                                 "PATTERN=BUFFER (e.g. 'exps=CPU')")
            pattern, sep, buffer = part.partition("=")
            if not sep or not pattern or not buffer.strip():
                raise UsageError(f"{name} takes PATTERN=BUFFER (e.g. 'exps=CPU'), not {part!r}")
            check_pattern(pattern, name)
            out.append((pattern, buffer.strip()))
    return tuple(out)


def check_pattern(pattern: str, name: str = "--override-tensor") -> None:
    """A UsageError where llama.cpp's std::regex (ECMAScript) could not compile `pattern`, as far as Python's
    re and the constructs only Python has tell, or where Python would read it otherwise than llama.cpp; `name`:
    where the pattern came from."""
    otherwise = _read_otherwise(pattern)
    if otherwise is not None:  # before re.compile, which warns of it (FutureWarning) on the user's terminal
        raise UsageError(f"{name}: {pattern!r} has {otherwise}, which Python reads otherwise than "
                         "llama.cpp; escape the [ or write the characters out")
    braces = _bad_braces(pattern)
    if braces is not None:  # Python takes these as the characters; llama.cpp's std::regex refuses them at load
        raise UsageError(f"{name}: {pattern!r} is not a regular expression llama.cpp can compile: "
                         f"{braces}")
    try:
        re.compile(pattern)
    except (re.error, OverflowError, RecursionError) as e:  # a repeat count past C's int overflows
        raise UsageError(f"{name}: {pattern!r} is not a regular expression: {e}") from None
    if _NOT_ECMASCRIPT.search(pattern):
        raise UsageError(f"{name}: {pattern!r} uses a construct llama.cpp's regular expressions lack "
                         "((?P<..>), (?i), lookbehind, \\A, \\Z, \\N{..}, \\U, a*+)")


MAX_REPEAT = 1000  # a {n} llama.cpp's std::regex builds n copies of its atom's states, 100,000 states at most


def _bad_braces(pattern: str) -> str | None:
    """What about a { outside brackets ECMAScript refuses where Python reads the characters (`blk{`, `{2}` first,
    `a{,3}`), or a repeat count past MAX_REPEAT (std::regex's states run out), in a few words; None if nothing."""
    i, inside, before = 0, False, ""
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i, before = i + 2, "x"
            continue
        if inside:
            inside = c != "]"
        elif c == "[":
            inside = True
            i += 1 + pattern.startswith("^", i + 1) + pattern.startswith("]", i + 1 + pattern.startswith("^", i + 1))
            before = "x"
            continue
        elif c == "{":
            m = re.match(r"\{(\d+)(?:,(\d*))?\}", pattern[i:])
            if m is None:
                return "a { that is not a repeat such as {2} or {1,3} (write \\{ for the character)"
            if before in ("", "(", "|") or pattern[:i].endswith(("(?:", "(?=", "(?!")):
                return f"the repeat {m.group(0)} follows nothing to repeat"
            if max(int(m.group(1)[:9]), int((m.group(2) or "0")[:9])) > MAX_REPEAT:
                return f"a repeat count past {MAX_REPEAT:,} ({m.group(0)[:40]})"
            i, before = i + m.end(), "}"
            continue
        i, before = i + 1, c
    return None


def _read_otherwise(pattern: str) -> str | None:
    """What in a bracket expression Python reads otherwise than ECMAScript, or may: a [ inside it ([[:alpha:]], a
    POSIX class to llama.cpp), a doubled - & ~ | (a set operation to come in Python), a ] first."""
    i, inside = 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if not inside and c == "[":
            inside = True
            i += 1
            i += pattern.startswith("^", i)
            if pattern.startswith("]", i):  # Python: a ] as a character; ECMAScript: [] matches nothing, [^] all
                return "a ] first inside brackets"
            continue
        if inside:
            if c == "]":
                inside = False
            elif c == "[":
                return "a [ inside brackets"
            elif c in "-&~|" and pattern.startswith(c, i + 1):
                return f"{c}{c} inside brackets"
        i += 1
    return None


def overrides(override_tensor: tuple[tuple[str, str], ...], cpu_moe_all: bool,
              n_cpu_moe_layers: int) -> tuple[tuple[str, str], ...]:
    """The ordered list llama.cpp gets: -ot's pairs, then --cpu-moe's, then --n-cpu-moe's."""
    out = list(override_tensor)
    if cpu_moe_all:
        out.append(cpu_moe())
    out += n_cpu_moe(n_cpu_moe_layers)
    return tuple(out)


def buffer_of(tensor: str, pairs: tuple[tuple[str, str], ...]) -> str | None:
    """The buffer type the first matching pattern names for a tensor, or None (its layer's device)."""
    for pattern, buffer in pairs:
        if re.search(pattern, tensor):
            return buffer
    return None


def is_expert(tensor: str) -> bool:
    """Whether a tensor holds a MoE layer's experts (what --cpu-moe moves)."""
    return re.search(EXPS, tensor) is not None


def described_buffer(buffer: str, n_gpus: int, name: str = "--override-tensor") -> None:
    """A UsageError where `buffer` is not one a plan for `n_gpus` described GPUs has (`localgen fit`): CPU, or a
    GPU's below their count; `name`: where the buffer came from, as parse's."""
    if buffer == CPU:
        return
    m = GPU_BUFFER.fullmatch(buffer)
    if m is None:
        raise UsageError(f"{name}: {buffer!r} is not a buffer type: CPU, or a GPU's as llama.cpp names it (CUDA0, "
                         "ROCm0, Vulkan0, SYCL0, MTL0)")
    gpu = int(m.group(2) or 0)
    if gpu >= n_gpus:
        raise UsageError(f"{name}: {buffer} names GPU {gpu}, and the plan has "
                         f"{n_gpus or 'no'} GPU{'s' if n_gpus != 1 else ''}")


def gpu_index(buffer: str) -> int | None:
    """The GPU a buffer type names (CUDA0, ROCm1, Vulkan0, SYCL0, Metal: 0), None for the CPU's and host
    buffers."""
    if buffer.upper().startswith("CPU") or buffer.endswith("_Host"):
        return None
    m = re.search(r"(\d+)$", buffer)
    return int(m.group(1)) if m else 0


def flags_text(override_tensor: tuple[tuple[str, str], ...], cpu_moe_all: bool, n_cpu_moe_layers: int | None) -> str:
    """A placement as the flags that make it ("-ot exps=CPU --n-cpu-moe 4"; "" for none): what a tuning record
    is kept for, and says."""
    parts = [f"-ot {','.join(f'{p}={b}' for p, b in override_tensor)}"] if override_tensor else []
    if cpu_moe_all:
        parts.append("--cpu-moe")
    if n_cpu_moe_layers:
        parts.append(f"--n-cpu-moe {n_cpu_moe_layers}")
    return " ".join(parts)
