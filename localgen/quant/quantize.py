"""Quantize a GGUF through llama.cpp's own llama_model_quantize, as llama-quantize does: the same types and names,
its options, an importance matrix. Everything is checked before a byte is written: the type names, a source already
quantized (unless asked), the importance matrix, what the type needs, and the disk space the result takes (llama.cpp's
own dry run gives its size). The result is written to a hidden temp file beside the target and renamed when whole;
a failure or an interrupt removes it, so nothing partial is ever left."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localgen.errors import LocalgenError, UsageError
from localgen.models.download import Progress, Quiet
from localgen.units import format_amount, format_bytes
from localgen.unnamed import drop_stale, name_it, open_unnamed, rename_new, temp_path

# ggml types that are not quantized (F32, F16, I8, I16, I32, I64, F64, BF16): what llama-quantize quantizes from
UNQUANTIZED = frozenset({0, 1, 24, 25, 26, 27, 28, 30})
SPACE_MARGIN = 16 << 20  # beyond the result's size, for the file system's own needs
_QUANT_SIZE = re.compile(r"quant size\s*=\s*([0-9.]+) MiB")
# a tensor's line in a dry run: "[ 269/ 272] blk.29.ffn_down.weight - [1536, 576, 1, 1], type = f16, ... (iq2_xxs)"
_CONVERTED = re.compile(r"^\[\s*\d+/\s*\d+\]\s+(\S+)\s+-.*->.*\((\w+)\)\s*$")
# llama-quantize's metadata keys for an importance matrix (tools/quantize/quantize.cpp)
KV_IMATRIX_FILE, KV_IMATRIX_DATASET = "quantize.imatrix.file", "quantize.imatrix.dataset"
KV_IMATRIX_ENTRIES, KV_IMATRIX_CHUNKS = "quantize.imatrix.entries_count", "quantize.imatrix.chunks_count"


@dataclass(frozen=True)
class QuantizeJob:
    """One quantization, checked: the source file, the type (llama-quantize's name), where the result goes, and
    llama_model_quantize's settings; `expected` is the result's size by llama.cpp's dry run."""

    source: Path
    type_name: str
    out: Path
    params: Any  # native.quantize.QuantizeParams
    expected: int
    source_type: str | None = None
    made_from: dict[str, Any] = field(default_factory=dict)  # origin()'s record of it
    replace: bool = False  # --force: a result that exists is replaced (else refused, even one made meanwhile)
    out_name: str | None = None  # the result's model name, for messages (None: a file of the user's, -o)


@dataclass(frozen=True)
class Quantized:
    """What a quantization made: the file, its size, bits per weight and the seconds it took."""

    path: Path
    type_name: str
    size: int
    bits_per_weight: float
    seconds: float


@dataclass(frozen=True)
class Options:
    """llama-quantize's options, as the user gave them."""

    threads: int = 0
    allow_requantize: bool = False
    leave_output_tensor: bool = False
    pure: bool = False
    output_tensor_type: str | None = None
    token_embedding_type: str | None = None
    imatrix: Path | None = None
    force: bool = False  # replace an existing result
    extra: dict[str, Any] = field(default_factory=dict)


def type_names() -> list[str]:
    """llama-quantize's type names, in its order."""
    from localgen.native.quantize import FTYPES

    return [name for name, _, _ in FTYPES]


def parse_type(text: str) -> tuple[str, int]:
    """llama-quantize's name and llama_ftype for a type as typed (any case, or its number)."""
    from localgen.native.quantize import file_type

    found = file_type(text)
    if found is None:
        raise UsageError(f"unknown quantization type {text!r}",
                         hint=f"llama-quantize's types: {', '.join(type_names())}")
    return found


def _tensor_type(flag: str, text: str | None) -> int | None:
    if text is None:
        return None
    from localgen.native.quantize import ggml_types

    types = ggml_types()
    found = types.get(text.strip().lower())
    if found is None:
        raise UsageError(f"{flag}: {text!r} is no ggml type a tensor can be quantized to",
                         hint=f"those types: {', '.join(types)}")
    return found


def _check_rows(flag: str, ggml_type: int | None, names: tuple[str, ...], tensors: list[Any]) -> None:
    """A type given for a tensor whose rows it cannot hold in whole blocks: llama.cpp falls back to another type for
    the types it picks, but asserts mid-way on one given by name."""
    if ggml_type is None:
        return
    from localgen.native.quantize import block_size, ggml_types

    block = block_size(ggml_type)
    name = next(n for n, number in ggml_types().items() if number == ggml_type)
    for tensor, shape, _, _ in tensors:
        if tensor in names and shape and shape[0] % block:
            raise UsageError(f"{flag} {name}: {tensor}'s rows hold {shape[0]} values, not a multiple of {name}'s "
                             f"blocks of {block}", hint="pick a type with smaller blocks: q8_0, q4_0, iq4_nl, ...")


def _check_tensor_imatrix(flag: str, text: str | None, tensor: str, imatrix: dict[str, Any]) -> None:
    """A type llama.cpp cannot write without an importance matrix for the tensor (it aborts mid-way otherwise)."""
    from localgen.native.quantize import NEED_IMATRIX

    name = (text or "").strip().lower()
    if name in NEED_IMATRIX and tensor not in imatrix:
        have = "no importance matrix was given" if not imatrix else f"the importance matrix has no {tensor}"
        raise UsageError(f"{flag} {name} needs an importance matrix for {tensor}: {have}",
                         hint="pick another type: q4_k, iq4_xs, q8_0, ...")


def _check_imatrix_sizes(path: Path, imatrix: dict[str, Any], tensors: list[Any], skip: set[str]) -> None:
    """llama-quantize's check, made before a byte is written (llama.cpp fails on it part-way through): an entry
    holds ne[0] × ne[2] values of its tensor (a column's per expert); token_embd.weight's is never used, nor those of
    the tensors named in `skip` (never quantized: output.weight with --leave-output-tensor)."""
    for name, dims, _, _ in tensors:
        if name not in imatrix or name == "token_embd.weight" or name in skip or len(dims) < 2:
            continue
        need = int(dims[0]) * (int(dims[2]) if len(dims) > 2 else 1)
        if len(imatrix[name]) != need:
            raise UsageError(f"the importance matrix {path} has {len(imatrix[name]):,} values for {name}, which "
                             f"takes {need:,}: it was computed for another model")


def plan(source: Path, type_text: str, out: Path, opts: Options, label: str | None = None,
         for_create: bool = False, out_name: str | None = None) -> QuantizeJob:
    """Check everything a quantization needs before it starts (one UsageError or LocalgenError each); `label`
    names the source in them (the model's name, where a server's client asked: never its path there), `out_name`
    the result where it is one of localgen's models (NAME:TYPE, as `list` shows it; not its file's name).
    `for_create`: `create -q` (and /api/create) asks, which has neither --allow-requantize nor --imatrix: the
    hints say what it can do instead."""
    from localgen.models.gguf_meta import read_gguf
    from localgen.native.quantize import QuantizeParams

    type_name, ftype = parse_type(type_text)
    output_type = _tensor_type("--output-tensor-type", opts.output_tensor_type)
    embedding_type = _tensor_type("--token-embedding-type", opts.token_embedding_type)
    meta, tensors, _ = read_gguf(str(source))
    _check_rows("--output-tensor-type", output_type, ("output.weight",), tensors)
    _check_rows("--token-embedding-type", embedding_type, ("token_embd.weight", "per_layer_token_embd.weight"),
                tensors)
    quantized = sorted({t for _, _, t, _ in tensors if t not in UNQUANTIZED})
    source_type = _file_type_name(meta.get("general.file_type"))
    if quantized and not opts.allow_requantize and type_name != "COPY":
        raise LocalgenError(
            f"{label or source} is already quantized ({source_type or 'quantized tensors'}): quantizing it again "
            "loses more than quantizing from the original weights",
            hint="FROM an F16, BF16 or F32 model; or FROM this one without -q" if for_create else
            "quantize from an F16, BF16 or F32 file; --allow-requantize does it anyway")
    if _same_file(out, source):  # the file, not its spelling: MODEL.gguf is model.gguf on APFS and NTFS
        raise UsageError("the output would overwrite the source")
    if out.exists() and out.is_dir():  # before --force's hint: it replaces a file only
        raise UsageError(f"{out} is a directory")
    if out.exists() and not out.is_file():  # /dev/null, a pipe: the result would be renamed over it
        raise UsageError(f"{out} is not a regular file (a device, a pipe or a socket): it is not replaced",
                         hint="give --output a file's path")
    if out.exists() and not opts.force:
        raise UsageError(f"the quantized model {out_name} exists" if out_name else f"{out} exists",
                         hint="--force replaces it")
    if not out.parent.is_dir():
        raise UsageError(f"no such folder: {out.parent}")
    if not os.access(out.parent, os.W_OK | os.X_OK):  # found now, not once llama.cpp has done the work
        raise UsageError(f"cannot write in {out.parent}: permission denied", hint="give --output a folder of yours")
    imatrix: dict[str, Any] = {}
    overrides: list[tuple[str, int | str]] = []
    if opts.imatrix is not None:
        from localgen.quant import imatrix as imx

        im = imx.read(opts.imatrix)
        imatrix = im.entries
        if type_name != "COPY":  # a copy never reads it, as llama.cpp's does not
            _check_imatrix_sizes(opts.imatrix, imatrix, tensors,
                                 {"output.weight"} if opts.leave_output_tensor else set())
        # the metadata llama-quantize writes for it
        overrides.append((KV_IMATRIX_FILE, str(opts.imatrix)))
        if im.datasets:
            overrides.append((KV_IMATRIX_DATASET, im.datasets[0]))
        overrides.append((KV_IMATRIX_ENTRIES, len(imatrix)))
        if im.chunk_count > 0:
            overrides.append((KV_IMATRIX_CHUNKS, im.chunk_count))
    present = {t for t, _, _, _ in tensors}
    if "output.weight" in present:  # tied to the embedding without one: llama.cpp picks a type that fits it
        _check_tensor_imatrix("--output-tensor-type", opts.output_tensor_type, "output.weight", imatrix)
    if "token_embd.weight" in present:
        _check_tensor_imatrix("--token-embedding-type", opts.token_embedding_type, "token_embd.weight", imatrix)
    params = QuantizeParams(
        ftype=ftype, threads=opts.threads, only_copy=type_name == "COPY", allow_requantize=opts.allow_requantize,
        leave_output_tensor=opts.leave_output_tensor, pure=opts.pure, output_tensor_type=output_type,
        token_embedding_type=embedding_type, imatrix=imatrix, kv_overrides=tuple(overrides))
    drop_stale(out)
    expected = _dry_run(source, out, params, type_name, for_create)
    _check_space(out.parent, expected)
    return QuantizeJob(source=source, type_name=type_name, out=out, params=params, expected=expected,
                       source_type=source_type, made_from=origin(source, type_name, opts), replace=opts.force,
                       out_name=out_name)


def origin(source: Path, type_name: str, opts: Options) -> dict[str, Any]:
    """What a result is made from: the source file (its real path, size and modification time), the type, and the
    options that change its bytes (the importance matrix by the same three). Threads and --allow-requantize change
    none."""
    def file(path: Path) -> dict[str, Any]:
        st = path.stat()
        return {"path": os.path.realpath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}

    def ggml(text: str | None) -> str | None:
        return text.strip().lower() if text else None

    return {"source": file(source), "type": type_name, "pure": opts.pure,
            "leave_output_tensor": opts.leave_output_tensor, "output_tensor_type": ggml(opts.output_tensor_type),
            "token_embedding_type": ggml(opts.token_embedding_type),
            "imatrix": file(opts.imatrix) if opts.imatrix is not None else None}


def _identity(path: Path) -> dict[str, int]:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}


def remember(out: Path, made_from: dict[str, Any]) -> None:
    """Record beside a model quantized into localgen's models what it was made from (`origin`), with the file's
    own size, time and inode, so a record that outlived its file (replaced by other means) matches nothing. A record
    that cannot be written is left out: the ladder then makes that type again rather than keep it."""
    import json

    from localgen.models.quantized import origin_path

    record = origin_path(out)
    with contextlib.suppress(OSError):
        record.unlink(missing_ok=True)
        record.write_text(json.dumps({"origin": made_from, "file": _identity(out)}), encoding="utf-8")


def differs(out: Path, made_from: dict[str, Any]) -> str | None:
    """None where the model at `out` was made from `made_from` (its record says so and is its own); else how it
    differs, in words."""
    import json

    from localgen.models.quantized import origin_path

    try:
        doc = json.loads(origin_path(out).read_text(encoding="utf-8"))
        kept, file = doc["origin"], doc["file"]
        if file != _identity(out):
            raise ValueError("the record is another file's")
    except (OSError, ValueError, KeyError, TypeError):
        return "and what it was made from is not known"
    if kept == made_from:
        return None
    source = kept.get("source") if isinstance(kept, dict) else None
    if isinstance(source, dict) and source != made_from["source"]:
        same = source.get("path") == made_from["source"]["path"]
        return (f"made from {source.get('path')} " + ("as it was before it changed" if same else "")).rstrip()
    return "made with other options"


def _file_type_name(ftype: Any) -> str | None:
    from localgen.native.quantize import FTYPES

    if not isinstance(ftype, int):
        return None
    return next((name for name, number, _ in FTYPES if number == ftype and not name.endswith("_K")), None)


def _dry_run(source: Path, out: Path, params: Any, type_name: str, for_create: bool = False) -> int:
    """The result's size in bytes, by llama.cpp's dry run (its log's "quant size"), plus the source's header; a type
    that needs an importance matrix without one is refused here."""
    import dataclasses

    from localgen.native import logs
    from localgen.native.quantize import quantize

    logs.clear()
    with logs.taken() as every:
        ok = quantize(source, out, dataclasses.replace(params, dry_run=True))
    lines = logs.lines(last=60)
    if not ok:
        raise LocalgenError(f"llama.cpp cannot quantize {source} to {type_name}: {_reason(lines)}")
    if any("will require an imatrix" in line for line in lines) and not params.imatrix:
        raise UsageError(f"{type_name} needs an importance matrix", hint=(
            "-q takes none: pick a type that needs none (Q4_K_M, IQ4_XS, ...), or make this one with "
            f"`localgen quantize MODEL {type_name} --imatrix FILE` and FROM the result") if for_create else
            "give one with --imatrix FILE (llama-imatrix makes it)")
    if params.imatrix:
        _check_imatrix_covers(every, params.imatrix, type_name)
    sizes = [float(m.group(1)) for line in lines if (m := _QUANT_SIZE.search(line))]
    from localgen.models.gguf_meta import read_gguf

    _, _, data_offset = read_gguf(str(source))
    tensor_bytes = int(sizes[-1] * (1 << 20)) if sizes else source.stat().st_size
    return tensor_bytes + data_offset


def _check_imatrix_covers(lines: list[str], imatrix: dict[str, Any], type_name: str) -> None:
    """An importance matrix that lacks a tensor the dry run writes as a type needing one: llama.cpp would stop
    there, part-way through the file (a ladder's earlier types made by then)."""
    from localgen.native.quantize import requires_imatrix

    lacking = [m.group(1) for line in lines if (m := _CONVERTED.match(line))
               and requires_imatrix(m.group(1), m.group(2), type_name) and m.group(1) not in imatrix]
    if lacking:
        more = f" (and {len(lacking) - 1} more)" if len(lacking) > 1 else ""
        raise UsageError(f"{type_name} needs an importance matrix for {lacking[0]}{more}: the importance matrix "
                         "given has none for it", hint="give one made on this model with llama-imatrix, or "
                                                       "pick a type that needs none: Q4_K_M, IQ4_XS, Q8_0, ...")


def _reason(lines: list[str]) -> str:
    """llama.cpp's reason from its log: the line after "failed to quantize:", else its last error."""
    for line in reversed(lines):
        if "failed to quantize:" in line:
            return line.split("failed to quantize:", 1)[1].strip()
    from localgen.native import logs

    return logs.first_error() or "see --verbose"


def _check_space(folder: Path, need: int, what: str = "the result needs") -> None:
    free = shutil.disk_usage(folder).free
    if free < need + SPACE_MARGIN:
        raise LocalgenError(f"not enough disk space in {folder}: {what} {format_bytes(need)}, "
                            f"{format_amount(free)} is free", hint="free some space, or write elsewhere with -o")


def check_space_together(jobs: list[QuantizeJob], logits: tuple[Path, int] | None = None) -> None:
    """Room for several planned results kept side by side (a ladder's, made one after another into one folder:
    each job checked its own size alone), and for the source's logits the ladder keeps while it measures the
    types against them (`logits`: their folder and size), together where both are on one filesystem."""
    needs: list[tuple[Path, int, str]] = []  # (folder, bytes, what needs them)
    if jobs:
        what = "the result needs" if len(jobs) == 1 else f"the {len(jobs)} results need"
        needs.append((jobs[0].out.parent, sum(job.expected for job in jobs), what))
    if logits is not None:
        needs.append((logits[0], logits[1], "the source's logits (the types are measured against them) take"))
    devices: dict[int, list[tuple[Path, int, str]]] = {}
    for need in needs:
        devices.setdefault(need[0].stat().st_dev, []).append(need)
    for group in devices.values():
        folder, free = group[0][0], shutil.disk_usage(group[0][0]).free
        if free < sum(n for _, n, _ in group) + (SPACE_MARGIN if jobs else 0):
            whats = " and ".join(f"{what} {format_bytes(n)}" for _, n, what in group)
            raise LocalgenError(f"not enough disk space in {folder}: {whats}, {format_amount(free)} is free",
                                hint="free some space, or measure fewer windows (--chunks N)" if logits else
                                "free some space")


class _Unwritten:
    """Where llama.cpp writes a result until it is whole. Where the system allows (Linux's O_TMPFILE, on most of
    its filesystems), a file with no name in `out`'s folder, which llama.cpp opens as /proc/self/fd/N: however
    the process ends before the result is whole (a crash other than llama.cpp's abort, SIGKILL, the OOM
    killer), the kernel frees it and nothing is left behind. Else the hidden named file (temp_path): a failure
    removes it, and one a crash left is removed by the next quantization to `out` (drop_stale)."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.fd = open_unnamed(out.parent)
        self.path = Path(f"/proc/self/fd/{self.fd}") if self.fd is not None else temp_path(out)

    def size(self) -> int:
        """Bytes written so far."""
        return _size(self.path)

    def keep(self, replace: bool) -> bool:
        """The result is whole: it becomes `out` in one step, replacing any file of that name only with `replace`
        (--force). Without it, a file there (another quantization's, made since the plan) is kept, this result
        dropped, and the answer is False."""
        try:
            if self.fd is not None:
                name_it(self.fd, self.out, replace)
            elif replace:
                os.replace(self.path, self.out)
            else:
                rename_new(self.path, self.out)
        except FileExistsError:
            self.discard()
            return False
        if self.fd is not None:
            self.discard()
        return True

    def discard(self) -> None:
        """Drop what was written (an unnamed file is freed once llama.cpp, too, has closed it)."""
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None
        else:
            self.path.unlink(missing_ok=True)


def run(job: QuantizeJob, progress: Progress | None = None, poll_s: float = 0.25,
        label: str | None = None) -> Quantized:
    """Quantize: llama_model_quantize in a thread into the temp file (_Unwritten), progress by the bytes it has
    written against the expected size, then the rename. A failure removes the temp file and raises; so does a
    KeyboardInterrupt in the waiting thread, but the call it interrupts cannot be stopped: it goes on writing into
    the removed file until it returns (the CLI exits at once instead; `abandon`)."""
    from localgen.native import logs
    from localgen.native.quantize import quantize

    progress = progress or Quiet()
    tmp = _Unwritten(job.out)
    result: dict[str, bool] = {}
    logs.clear()

    def work() -> None:
        result["ok"] = quantize(job.source, tmp.path, job.params)

    t0 = time.perf_counter()
    thread = threading.Thread(target=work, name="quantize", daemon=True)
    progress.start(f"{job.type_name} {label or job.out.name}", job.expected, 0)
    done = 0
    try:
        thread.start()
        while thread.is_alive():
            thread.join(poll_s)
            now = tmp.size()
            if now > done:
                progress.advance(min(now, job.expected) - min(done, job.expected))
                done = now
    except BaseException:
        if tmp.fd is None or not thread.is_alive():  # (a named one: llama.cpp goes on writing into it, removed)
            tmp.discard()
        # else the unnamed file stays open, freed as the process ends: closed now, its number could name
        # another file before llama.cpp opens it by that number
        raise
    finally:
        progress.finish()
    seconds = time.perf_counter() - t0
    if not result.get("ok"):
        tmp.discard()
        why = _reason(logs.lines(last=60))
        free = shutil.disk_usage(job.out.parent).free
        if free < SPACE_MARGIN or "iostream" in why or "basic_ios" in why:
            raise LocalgenError(f"llama.cpp could not write {job.out}: the disk is full or the file too large "
                                f"({format_amount(free)} free; {why}); nothing was kept")
        raise LocalgenError(f"llama.cpp could not quantize {job.source} to {job.type_name}: {why}")
    if not tmp.keep(job.replace):
        raise UsageError(f"the quantized model {job.out_name} exists" if job.out_name else f"{job.out} exists",
                         hint="another quantization made it while this one ran; it is kept and this result "
                         "dropped: --force replaces it")
    size = job.out.stat().st_size
    from localgen.models.gguf_meta import read_summary

    summary = read_summary(str(job.out), use_cache=False)
    bpw = summary.tensor_bytes * 8 / summary.n_params if summary.n_params else 0.0
    return Quantized(job.out, job.type_name, size, round(bpw, 2), seconds)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def abandon(job: QuantizeJob) -> None:
    """Remove what an interrupted quantization has written (its temp file)."""
    temp_path(job.out).unlink(missing_ok=True)


def for_preset(name: str, text: str, type_text: str, lookup: Any, where: str = "Modelfile",
               opts: Options | None = None, progress: Progress | None = None, force: bool = False,
               folder: Path | None = None, known: Callable[[str], bool] | None = None) -> tuple[str, str]:
    """`create NAME -q TYPE` (and /api/create's `quantize`), as Ollama's: the Modelfile's FROM (an F16, BF16 or F32
    model here, through `lookup`) quantized into localgen's models as BASE:TYPE (BASE from NAME), and the Modelfile
    given back FROM that. Returns (the quantized model's name, the Modelfile text). Every refusal comes before the
    quantization: the type, the preset's checks (against the source), a preset of that name and a quantized model of
    that name (both replaced only with `force`), the source and the disk (plan's). `folder`: the Modelfile's;
    `known`: modelfile.parse's."""
    import dataclasses

    from localgen import paths
    from localgen.models import modelfile, presets, quantized

    presets.check_name(name)
    type_name, _ = parse_type(type_text)
    presets.refuse_existing(name, force)
    presets.check_writable(name)
    # the preset's own checks, on the source: its place. FROM a preset, the settings are that preset's under the
    # Modelfile's (what create without -q keeps), and the model quantized is that preset's base
    spec = presets.made(name, text, lookup, where, folder, known).spec
    named = modelfile.parse(text, where, folder, known).base  # FROM: a preset, or the model spec.base is
    base = quantized.base_for(name)
    made = quantized.name_of(base, type_name)
    if made == name.lower():
        raise UsageError(f"{name!r} would name both the preset and its quantized model",
                         hint=f"name the preset without the type, e.g. {base}")
    presets.check_quantized_name(made)
    out = quantized.path_for(made)
    if out.exists() and not force:
        raise UsageError(f"the quantized model {made} exists", hint=f"--force makes it again and replaces the "
                         f"preset; or FROM {made} without -q")
    ref = presets.base_ref(spec.base, f"{where}: FROM {named}", lookup, named)
    paths.make_dirs(out.parent)
    job = plan(Path(ref.path), type_name, out, dataclasses.replace(opts or Options(), force=force), spec.base,
               for_create=True, out_name=made)
    try:
        run(job, progress)
    except BaseException:
        abandon(job)
        raise
    remember(out, job.made_from)
    return made, modelfile.write(dataclasses.replace(spec, base=made))


def _same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file (os.path.samefile: the same device and inode, so another case of the name
    on a case-insensitive disk, a hard link or a symbolic link all count); where either cannot be read, whether they
    resolve to one path."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        try:
            return a.resolve() == b.resolve()
        except (OSError, RuntimeError):  # RuntimeError: a link loop, on Python 3.11 and 3.12
            return False
