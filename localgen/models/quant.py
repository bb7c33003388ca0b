"""Quantization tags in GGUF file names, split files, and which GGUFs in a repo are models."""

from __future__ import annotations

import re
from dataclasses import dataclass

QUANT_RE = re.compile(
    r"(?i)(?<![A-Za-z0-9])((?:UD-)?(?:I?Q\d(?:_[A-Z0-9]+)*|BF16|F16|FP16|F32|MXFP4(?:_MOE)?))(?![A-Za-z0-9])"
)
SPLIT_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
NOT_MODELS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")

# Rough quality order (higher is better), for picking "the best that fits".
ORDER = [
    "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "Q2_K_S", "Q2_K", "IQ3_XXS", "IQ3_XS", "IQ3_S",
    "Q3_K_S", "IQ3_M", "Q3_K_M", "Q3_K_L", "IQ4_XS", "IQ4_NL", "Q4_0", "Q4_K_S", "Q4_1", "Q4_K_M", "Q4_K_L",
    "Q5_0", "Q5_K_S", "Q5_1", "Q5_K_M", "Q5_K_L", "Q6_K", "Q6_K_L", "Q8_0", "BF16", "F16", "FP16", "F32",
]


@dataclass(frozen=True)
class RemoteFile:
    """A file the Hub lists: name, size, and the SHA-256 of its bytes (the LFS oid)."""

    name: str
    size: int
    sha256: str | None


@dataclass(frozen=True)
class QuantOption:
    """One quantization of a repo: its tag and file(s) (several for a split GGUF, in order)."""

    tag: str
    files: tuple[RemoteFile, ...]

    @property
    def size(self) -> int:
        """Bytes to download."""
        return sum(f.size for f in self.files)

    @property
    def first(self) -> RemoteFile:
        """The file llama.cpp loads (part 1 of a split model)."""
        return self.files[0]


def quant_tag(filename: str) -> str | None:
    """The quantization named in a file name, upper-cased (e.g. Q4_K_M), or None."""
    base = filename.rsplit("/", 1)[-1]
    base = SPLIT_RE.sub(".gguf", base)
    matches = QUANT_RE.findall(base)
    return matches[-1].upper() if matches else None


def is_model_gguf(filename: str) -> bool:
    """A .gguf that is a model (not a projector or an importance matrix)."""
    base = filename.rsplit("/", 1)[-1].lower()
    return base.endswith(".gguf") and not any(x in base for x in NOT_MODELS)


def group_options(files: list[RemoteFile]) -> list[QuantOption]:
    """Group a repo's model GGUFs into quantization options; split parts are kept together, in order."""
    groups: dict[str, list[RemoteFile]] = {}
    for f in files:
        if not is_model_gguf(f.name):
            continue
        key = SPLIT_RE.sub("", f.name)
        groups.setdefault(key, []).append(f)
    options = []
    for key, parts in groups.items():
        parts.sort(key=lambda f: f.name)
        m = SPLIT_RE.search(parts[0].name)
        if m and (m.group(1) != "00001" or len(parts) != int(m.group(2))):
            continue  # an incomplete split set is not loadable
        tag = quant_tag(parts[0].name) or key.rsplit("/", 1)[-1].removesuffix(".gguf")
        options.append(QuantOption(tag=tag, files=tuple(parts)))
    return sorted(options, key=lambda o: (rank(o.tag), o.first.name))


def rank(tag: str) -> int:
    """Position in the quality order (unknown tags sort first)."""
    t = tag.upper().removeprefix("UD-")
    return ORDER.index(t) if t in ORDER else -1


def best_that_fits(options: list[QuantOption]) -> QuantOption:
    """The best quantization whose files, and a third more, fit the memory available; else the first (the
    smallest: options are in quality order). A name without a tag takes it where its default is not there (a Hub
    repo's as `pull` picks it, an LM Studio folder's)."""
    from localgen import hardware

    ram = hardware.available_ram_bytes() or hardware.total_ram_bytes() or 0
    fitting = [o for o in options if o.size * 1.3 < ram] or options[:1]
    return max(fitting, key=lambda o: rank(o.tag))


def same_tag(options: list[QuantOption], tag: str) -> list[QuantOption]:
    """The options a tag names (case-insensitive; those with UD- before it only where none is the tag itself, so
    Q4_K_M is M-Q4_K_M.gguf beside M-UD-Q4_K_M.gguf): more than one where a repo has two files of one quantization
    (a-Q4_K_M.gguf, b-Q4_K_M.gguf), which only a file name tells apart."""
    want = tag.upper()
    exact = [o for o in options if o.tag.upper() == want]
    return exact or [o for o in options if o.tag.upper().removeprefix("UD-") == want]


def shared_tags(options: list[QuantOption]) -> set[str]:
    """The tags (upper-cased) that more than one option has."""
    seen: dict[str, int] = {}
    for o in options:
        seen[o.tag.upper()] = seen.get(o.tag.upper(), 0) + 1
    return {t for t, n in seen.items() if n > 1}


def pick(options: list[QuantOption], tag: str | None) -> QuantOption | None:
    """The option for a tag (case-insensitive; also a full file name), or None."""
    if tag is None:
        return None
    named = same_tag(options, tag)
    if named:
        return named[0]
    for o in options:
        if any(f.name == tag or f.name.rsplit("/", 1)[-1] == tag for f in o.files):
            return o
    return None
