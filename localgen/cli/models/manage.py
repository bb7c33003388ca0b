"""`localgen pull | list | rm`: get models, see what is here, remove one (a preset too: list and rm take presets,
see presets.py; `show`, which looks inside one, is show.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from localgen.cli import options as o
from localgen.cli.fit import GpuMemory, Ram, machine_for
from localgen.cli.output import aligned
from localgen.errors import LocalgenError, UsageError
from localgen.units import format_amount, format_bytes

Json = Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")]


def shown_params(n: int | None) -> str:
    if not n:
        return "-"
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def _table(headers: list[str], rows: list[list[str]]) -> None:
    print("\n".join(aligned([headers, *rows])))


# ---- pull ---------------------------------------------------------------------------------------------


def pull(
    name: Annotated[
        str, typer.Argument(metavar="NAME",
                            help="Catalogue name (qwen2.5:7b@Q8_0), owner/repo[:QUANT], owner/repo/file.gguf, or "
                                 "ollama:NAME[:TAG] from Ollama's library (ollama:HOST/NAMESPACE/NAME[:TAG] from "
                                 "another registry), or oci:[HOST/]REPO[:TAG|@sha256:DIGEST] from an OCI registry "
                                 "as Docker Model Runner packages models (docker.io by default: oci:ai/smollm2).")
    ],
    list_quants: Annotated[
        bool,
        typer.Option("--list", help="List the repo's quantizations with size, memory estimate and fit; no download."),
    ] = False,
    ctx: o.Ctx = o.LOAD_DEFAULTS.n_ctx,
    json_out: Json = False,
    offline: o.Offline = False,
    gpu_memory: GpuMemory = None,
    ram: Ram = None,
) -> None:
    """Download a model into the shared Hugging Face cache, resumably, verified by SHA-256. An ollama: name that
    Ollama's store lacks comes from its registry (registry.ollama.ai by default; http only for a loopback host),
    each blob checked against its digest, into localgen's data dir in Ollama's layout. An oci: name comes from its
    OCI registry (Docker Hub's token sign-in is anonymous; http only for a loopback host): its GGUF layers (a split
    model's parts too), projector, chat template and license, each checked against its digest."""
    from localgen.cli.progress import make_progress
    from localgen.models import hfcache, resolve

    if (gpu_memory is not None or ram is not None) and not list_quants:
        raise UsageError("--gpu-memory and --ram describe the machine --list judges the quantizations for; add --list")
    model = resolve.embedded_model(name)
    if model is not None:
        _pull_embedded(name, model, list_quants, json_out)
        return
    from localgen.cli.inputfile import check_model_file

    check_model_file(name)  # as show says it (it said "is a local file; there is nothing to pull")
    from localgen.models import names

    spec = names.parse(name)
    ollama = _pulled_ollama_name(name)
    if isinstance(spec, names.StoreSpec) and spec.store == "oci":
        if list_quants:
            raise UsageError("pull --list lists a Hugging Face repo's quantizations; an OCI model's tag names the "
                             "one it has")
        from localgen.models import oci

        ref = _pull_registry(oci.parse_name(spec.name), offline)
    elif ollama is not None:
        if list_quants:
            raise UsageError("pull --list lists a Hugging Face repo's quantizations; an Ollama model's tag names "
                             "the one it has")
        ref = _pull_registry(ollama, offline)
    else:
        target = resolve.target(name)
        flag, offline = offline, offline or hfcache.offline_env()
        if offline and list_quants:
            raise UsageError("pull --list reads the Hub's listing; it cannot run offline")
        if list_quants:
            _list_quants(target, ctx, json_out, machine_for(gpu_memory, ram))
            return
        if offline:  # what the cache holds whole, verified, or one line saying it is not there
            ref = resolve.cached(target, make_progress(), flag)
            print(f"offline: {ref.name} is in the cache (not checked for a newer version on the Hub)",
                  file=sys.stderr)
        else:
            ref = resolve.pull(target, make_progress())  # (an older revision's copy it replaces: its note)
    if json_out:
        print(json.dumps({"name": ref.name, "file": ref.file, "sha256": ref.sha256,
                          "quantization": ref.quantization, "size": ref.summary.file_size}))
    else:
        print(f"{ref.name}  {ref.quantization}  {format_bytes(ref.summary.file_size)}  {ref.path}")
    from localgen.cli.hints import tune_tip

    tune_tip(sys.stderr.isatty(), lambda text: print(text, file=sys.stderr), ref.name, ref.path)


def _pulled_ollama_name(name: str) -> Any:
    """The OllamaName of an `ollama:` name that Ollama's own store does not hold (localgen pulls it from the
    registry); None for any other name, and for a model in Ollama's store (which Ollama updates: `pull` of it says
    there is nothing to pull)."""
    from localgen.models import names, ollamastore, presets

    spec = names.parse(name)
    if not isinstance(spec, names.StoreSpec) or spec.store != "ollama" or presets.exists(name):
        return None
    parsed = ollamastore.parse_name(spec.name)
    return None if ollamastore.in_ollamas_store(parsed) else parsed


def _pull_registry(name: Any, flag: bool) -> Any:
    """`pull ollama:NAME` or `pull oci:NAME`: the manifest and the blobs localgen uses from its registry (blobs
    already here are kept), into localgen's pulled models; offline, the pulled copy as it is, or one line saying
    there is none."""
    from localgen.cli.progress import make_progress
    from localgen.errors import NotDownloadedError
    from localgen.models import hfcache, oci, ollamastore, registry, resolve

    if not (flag or hfcache.offline_env()):
        return resolve.pull_from_registry(name, make_progress())
    is_oci = isinstance(name, oci.OciName)
    if (oci.find(name) if is_oci else registry.pulled(name)) is None:
        raise NotDownloadedError(f"{name.display} is not pulled and localgen is offline",
                                 hint=f"pull it {hfcache.without_offline(flag)}", name=name.display)
    store: Any = oci if is_oci else ollamastore
    ref = store.resolve(name.display.removeprefix(store.PREFIX))
    print(f"offline: {ref.name} is pulled (not checked for a newer version on {name.host})", file=sys.stderr)
    return ref


def _pull_embedded(name: str, model: Any, list_quants: bool, json_out: bool) -> None:
    """`pull` of a model that ships inside a Python package: nothing to download, so say where it is (or, when
    its package is missing, how to install it)."""
    from localgen.models import embedded
    from localgen.models.resolve import resolve

    if list_quants:
        raise UsageError(f"{model.name} ships inside a Python package in one quantization; there is no list")
    ref = resolve(name, offline=True, pull_missing=False)  # assembles a chunked one once
    print(f"{ref.name} is already installed: it ships inside the Python package {embedded.pip_names(model)[0]}",
          file=sys.stderr)
    if json_out:
        print(json.dumps({"name": ref.name, "file": ref.file, "sha256": ref.sha256 or model.sha256,
                          "quantization": ref.quantization, "size": ref.summary.file_size}))
    else:
        print(f"{ref.name}  {ref.quantization}  {format_bytes(ref.summary.file_size)}  {ref.path}")


def _list_quants(target: Any, ctx: int, json_out: bool, machine: Any) -> None:
    """Each quantization's size and the planner's verdict for `machine` (this one, or one described)."""
    from localgen.errors import ModelFormatError
    from localgen.models import fit, hub, store
    from localgen.models.gguf_meta import refusal
    from localgen.models.quant import group_options, rank, shared_tags
    from localgen.types import LoadParams

    s = target.spec
    def note(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    listing = hub.list_repo(s.repo, s.revision, note)
    options = group_options(list(listing.files))
    if not options:
        raise LocalgenError(f"{s.repo} has no GGUF model files")
    smallest = min(options, key=lambda x: x.size)
    summary, weights = hub.fetch_summary(s.repo, listing.commit, smallest.first.name, smallest.first.size,
                                         split=len(smallest.files) > 1, note=note)
    why = refusal(summary, (t.name for t in weights.tensors))
    if why is not None:  # as fit has it: no plan for a header llama.cpp's load refuses
        raise ModelFormatError(f"llama.cpp would not load {s.repo}/{smallest.first.name}: {why}",
                               hint="the repo's files are damaged or made for another program; nothing was downloaded")
    cached = {f.filename for f in store.cached_files(s.repo)}
    header = summary.file_size - summary.tensor_bytes  # (bits per weight count tensor bytes, as the ladder's do)
    rows: list[dict[str, Any]] = []
    for opt in options:
        # the plan (models/fit.py) for each quantization: the header read's tensors, scaled to its size
        plan = fit.plan(summary, weights.scaled(opt.size - (smallest.size - weights.total)), machine,
                        LoadParams(n_ctx=ctx), ctx=ctx)
        rows.append({
            "quantization": opt.tag, "files": [f.name for f in opt.files], "size": opt.size,
            "bits_per_weight": round((opt.size - header) * 8 / summary.n_params, 2) if summary.n_params else None,
            "memory": plan.footprint.total, "fit": plan.verdict, "context": plan.ctx,
            "downloaded": opt.first.name in cached,
        })
    shared = shared_tags(options)  # two files of one quantization: each row names its file
    ok = [r for r in rows if r["fit"] != fit.WONT_FIT and r["quantization"].upper() not in shared]
    default = next((r for r in ok if r["quantization"].upper() == target.default_quant.upper()), None)
    best = default or (max(ok, key=lambda r: rank(r["quantization"])) if ok else None)
    for r in rows:
        r["recommended"] = r is best
    if json_out:
        print(json.dumps({"repo": s.repo, "commit": listing.commit, "context": ctx, "quantizations": rows,
                          "machine": {"ram": machine.ram, "gpus": list(machine.gpus), "unified": machine.unified,
                                      "described": machine.described}}))
        return
    gpus = " + ".join(format_bytes(g) for g in machine.gpus) or "no GPU"
    judged = f" · fit judged for {gpus} described" if machine.described else ""
    print(f"{s.repo} @ {listing.commit[:10]} · {summary.architecture} · {shown_params(summary.n_params)} parameters · "
          f"memory estimated at --ctx {ctx}{judged}")
    _table(
        ["QUANT", "SIZE", "BPW", "MEMORY", "FIT", ""],
        [[r["quantization"] + (f" ({r['files'][0]})" if r["quantization"].upper() in shared else ""),
          format_bytes(r["size"]), str(r["bits_per_weight"] or "-"), format_bytes(r["memory"]),
          r["fit"],
          " ".join(x for x in ("★ recommended" if r["recommended"] else "",
                               "✓ downloaded" if r["downloaded"] else "") if x)]
         for r in rows],
    )


# ---- list ---------------------------------------------------------------------------------------------


def list_models(
    json_out: Json = False,
    show_catalogue: Annotated[bool, typer.Option("--catalogue", help="List the catalogue instead.")] = False,
    offline: o.Offline = False,
) -> None:
    """Models on this machine: embedded ones, every GGUF in the Hugging Face cache (any tool's), and the models
    Ollama and LM Studio downloaded (ollama:NAME, lmstudio:PUBLISHER/REPO:QUANT, used in place), and those pulled
    from OCI registries (oci:REPO:TAG). Never touches the network."""
    from localgen.models import catalogue
    from localgen.models.installed import installed

    entries = catalogue.load()
    if show_catalogue:
        rows: list[dict[str, Any]] = [
            {"name": e.name, "repo": e.repo or "(embedded)", "default_quant": e.default_quant, "context": e.context,
             "sampling": e.sampling, "description": e.description} for e in entries.values()]
        if json_out:
            print(json.dumps(rows))
        else:
            _table(["NAME", "SOURCE", "QUANT", "CONTEXT", "DESCRIPTION"],
                   [[r["name"], r["repo"], r["default_quant"], str(r["context"] or "-"), r["description"]]
                    for r in rows])
        return
    items = installed()
    if json_out:
        print(json.dumps(items))
        return
    if not items:
        print("no models yet: localgen pull NAME (see localgen list --catalogue)", file=sys.stderr)
        return
    _table(["NAME", "QUANT", "SIZE", "PARAMS", "CONTEXT", "WHERE"],
           [[i["name"], i["quantization"] or "-", format_bytes(i["size"]), shown_params(i["parameters"]),
             str(i["context_length"] or "-"), i["path"] or "(made from its package on first use)"] for i in items])


# ---- rm -----------------------------------------------------------------------------------------------


def rm(
    name: Annotated[
        str, typer.Argument(metavar="NAME",
                            help="Catalogue name, owner/repo[:QUANT] (every quantization without one), a model "
                                 "quantized here (NAME:TYPE), or a preset.")
    ],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
    offline: o.Offline = False,
) -> None:
    """Remove a model's files from the cache; a blob another cached model still uses is kept. A preset: only
    the preset goes, never its base model's files. An ollama: model localgen pulled: its manifest and the blobs no
    other pulled model uses; an oci: model likewise. Ollama's and LM Studio's own models are refused: their own
    tool removes them (a preset named ollama:X or lmstudio:X made before those names meant their stores is
    removed)."""
    from localgen.models import names, presets, store
    from localgen.models.mmproj import is_mmproj
    from localgen.models.resolve import embedded_model, target

    spec = names.parse(name)
    if isinstance(spec, names.StoreSpec) and not presets.exists(name):  # another tool's store: never changed here
        from localgen.models import lmstudio, ollamastore  # (a preset made before ollama: named a store goes)

        if spec.store == "oci":
            _rm_pulled_oci(name, spec.name, yes)
            return
        if spec.store == "ollama" and _rm_pulled_ollama(name, spec.name, yes):
            return
        raise (ollamastore if spec.store == "ollama" else lmstudio).refuse_removal(spec.name)
    if presets.exists(name):
        presets.check_one_file(name)  # kept as two presets by an older localgen: asked before the confirmation
        kept = presets.canonical(name)  # the name it is kept and listed under (`mine` of Ollama's `mine:latest`)
        _confirm(f"the preset {kept} (its base model stays)", 0, yes, size=False)
        presets.remove(name)
        print(f"removed the preset {kept}")
        return
    from localgen.models import quantized

    made = quantized.find(name)
    if made is not None:  # quantized here (localgen quantize): its one file
        _warn_presets_on(name)
        _confirm(f"the quantized model {name} ({made})", made.stat().st_size, yes)
        print(f"removed {name}, freed {format_bytes(quantized.remove(name))}")
        return
    if isinstance(spec, names.PathSpec):
        raise UsageError("rm removes models from the cache; delete your own .gguf files yourself")
    model = embedded_model(name)
    if model is not None:  # its presets keep working: the package stays, a removed gemma3:270m is made again
        _rm_embedded(model, yes)
        return
    t = target(name)
    quant = t.spec.quant if (isinstance(spec, names.CatalogueSpec) or t.spec.quant) else None
    files = store.find_cached(t.spec.repo, t.spec.revision, quant, t.spec.filename)
    if t.spec.revision != "main":  # a name at a tag or branch (list's name of an older copy) is that commit's copy
        from localgen.models import hfcache  # only, as a commit's name is: never main's copy of the file too

        at = hfcache.cached_commit(t.spec.repo, t.spec.revision)
        files = [f for f in files if f.commit == at]
    if quant and not t.spec.filename and files:  # a tag two files of a snapshot share names neither, as for every
        from localgen.models.resolve import ambiguous  # other command (rm took both)

        ambiguous(t.spec.repo, quant, sorted({f.filename for f in files if f.commit == files[0].commit}))
    going = store.removal(files)
    if not files:
        going = store.orphan_projectors(t.spec.repo) if not quant and not t.spec.filename else []
        if not going and _rm_unfinished(t.spec.repo, t.display, not quant and not t.spec.filename, yes):
            return
        if not going:
            raise LocalgenError(f"{t.display} is not in the cache", hint="localgen list shows what is")
    total = sum(p.stat().st_size for p in going if p.exists())
    _warn_presets_on(name, going)
    shown = [f"{f.repo}/{f.filename}" for f in files]
    shown += [f"{t.spec.repo}/{p.name} (projector)" for p in going if is_mmproj(p.name)]
    partials = _partials(t.spec.repo) if not quant and not t.spec.filename else []  # the whole repo: its unfinished
    if partials:  # downloads too, named in the question
        shown.append(f"{len(partials)} unfinished download(s) of {t.spec.repo}")
        total += sum(p.stat().st_size for p in partials if p.is_file())
    _confirm(", ".join(shown), total, yes)
    sizes = {(b := store.blob_of(p)): b.stat().st_size for p in going if p.exists()}
    links, blobs = store.remove(files, going)
    freed = sum(sizes.get(b, 0) for b in blobs)
    kept = "" if len(blobs) == len(sizes) else " (data another cached model uses was kept)"
    unfinished = ""
    if partials:
        dropped, busy = _drop_partials(t.spec.repo, partials)
        freed += dropped
        unfinished = f" and {len(partials) - busy} unfinished download(s)" if len(partials) > busy else ""
    print(f"removed {len(links)} file(s){unfinished}, freed {format_amount(freed)}{kept}")


def _partials(repo: str) -> list[Path]:
    """The downloads a Hub pull of the repo left unfinished (blobs/SHA.incomplete: an interrupted pull keeps its
    bytes to resume)."""
    from localgen.models import hfcache

    blobs = hfcache.repo_dir(repo) / "blobs"
    return sorted(blobs.glob("*.incomplete")) if blobs.is_dir() else []


def _drop_partials(repo: str, partials: list[Path]) -> tuple[int, int]:
    """Remove these unfinished downloads, each under the blob lock a pull writes it under: (bytes freed, how many
    another pull is writing now, which stay)."""
    from filelock import FileLock, Timeout

    from localgen.models import hfcache

    freed = busy = 0
    for partial in partials:
        lock = FileLock(str(hfcache.lock_path(repo, partial.name.removesuffix(".incomplete"))))
        try:
            lock.acquire(timeout=0)
        except Timeout:  # a pull writes it now
            busy += 1
            continue
        try:
            size = partial.stat().st_size
            partial.unlink()
            freed += size
        except OSError:
            busy += 1
        finally:
            lock.release()
    hfcache.drop_empty(repo)  # the last of the repo gone: its folder too, as rm of its last model takes it
    return freed, busy


def _rm_unfinished(repo: str, shown: str, whole_repo: bool, yes: bool) -> bool:
    """rm of a Hub repo nothing of which is whole in the cache: the downloads a pull left unfinished go, those no
    pull is writing now; True when it removed them. Which file each was is not known offline: a name with a tag
    is pointed at the repo's."""
    from localgen.models import store

    partials = _partials(repo)
    if not partials or next(store.cached_files(repo), None) is not None:  # (a whole model: `rm REPO` takes it)
        return False
    total = sum(p.stat().st_size for p in partials if p.is_file())
    if not whole_repo:
        raise LocalgenError(f"{shown} is not in the cache", hint=f"{len(partials)} unfinished download(s) of {repo} "
                            f"take {format_bytes(total)}: `localgen rm {repo}` removes them")
    _confirm(f"the unfinished download(s) of {repo}", total, yes)
    freed, busy = _drop_partials(repo, partials)
    left = f" ({busy} another pull is writing stayed)" if busy else ""
    print(f"removed the unfinished download(s) of {repo}, freed {format_amount(freed)}{left}")
    return True


def _rm_pulled_ollama(given: str, text: str, yes: bool) -> bool:
    """rm of a model `localgen pull ollama:...` downloaded: its manifest and the blobs no other pulled model uses
    go, and what a pull of it that gave up left (its blobs, whole or partial, that nothing else names); False where
    localgen pulled no such model and has no unfinished pull of it (Ollama's own store is never changed)."""
    from localgen.cli.progress import make_progress
    from localgen.models import ollamastore, registry

    name = ollamastore.parse_name(text)
    path, left = registry.pulled(name), registry.unfinished(name)
    if path is None and left is None:
        return False
    if path is None:
        what = f"the unfinished pull of {name.display}"
        _confirm(f"{what} from {name.host}", left or 0, yes)
    else:
        what = name.display
        try:
            size = sum(x.size for x in ollamastore.read_manifest(name, ollamastore.pulled_root(), path).layers)
        except LocalgenError:  # a damaged manifest: it goes all the same, and the blobs nothing names with it
            size = 0
        _warn_presets_on(given)
        _confirm(f"{name.display}, pulled from {name.host}", size, yes)
    freed, kept = registry.remove(name, make_progress())  # says so while a pull holds a blob
    shared = f" ({kept} blob(s) another pulled model or unfinished pull uses were kept)" if kept else ""
    print(f"removed {what}, freed {format_amount(freed)}{shared}")
    return True


def _rm_pulled_oci(given: str, text: str, yes: bool) -> None:
    """rm of a model `localgen pull oci:...` downloaded: its manifest, and the blobs no other pulled model uses
    (a ModelNotFoundError where localgen pulled no such model)."""
    from localgen.cli.progress import make_progress
    from localgen.models import oci, ocipull

    name = oci.parse_name(text)
    try:
        found = oci.find(name) if ocipull.pulled(name) is not None else None
    except LocalgenError:  # a damaged manifest: removed all the same (its blobs no other model names go with it)
        _confirm(f"{name.display}, pulled from {name.host} (its manifest is damaged)", 0, yes, size=False)
        found = None
    if found is not None:
        size = sum(x.size for x in found.layers if x.blob.exists()) + (
            found.config.size if found.config is not None else 0)
        _warn_presets_on(given)
        _confirm(f"{name.display}, pulled from {name.host}", size, yes)
    freed, kept = ocipull.remove(name, make_progress())
    shared = f" ({kept} blob(s) another pulled model uses were kept)" if kept else ""
    print(f"removed {name.display}, freed {format_amount(freed)}{shared}")


def _warn_presets_on(name: str, going: list[Path] | None = None) -> None:
    """One warning line naming the presets whose FROM is `name`, or (a Hub model's `going` links) whose FROM, in
    whatever spelling (ok/Tiny-GGUF, hf.co/ok/Tiny-GGUF:Q4_K_M), resolves to a file that goes: removing it leaves
    them without a model."""
    from localgen.cli.output import ErrWriter
    from localgen.models import presets

    gone = {p.absolute() for p in going or []}
    users = sorted(p.name for p in presets.all_presets()
                   if p.base.lower() == name.strip().lower() or (gone and _resolves_into(p.base, gone)))
    if users:
        these = f"the preset {users[0]} is" if len(users) == 1 else f"the presets {', '.join(users)} are"
        ErrWriter().warn(f"{these} made on {name}: without it they cannot run")


def _resolves_into(base: str, gone: set[Path]) -> bool:
    """Whether a preset's base, a Hub model in the cache, is (a part of) one of the `gone` links."""
    from localgen.models import resolve, store

    try:
        cached = resolve.cached_files_of(resolve.target(base, local=False))
    except LocalgenError:  # no Hub model (a path, an Ollama model, a damaged name): not one of these files
        return False
    return bool(cached) and any(p.absolute() in gone for p in store.split_parts(cached[0]))


def _confirm(desc: str, total: int, yes: bool, size: bool = True) -> None:
    """Ask before removing (or want --yes when not on a terminal); a no is exit 1."""
    if yes:
        return
    from localgen.cli.output import confirm_removal

    confirm_removal(f"{desc} ({format_bytes(total)})" if size else desc)


def _rm_embedded(model: Any, yes: bool) -> None:
    """`rm` of a model that ships inside Python packages: pip owns those; only the copy localgen assembles
    from a chunked model's packages is localgen's to remove."""
    from localgen.models import embedded

    pip = " ".join(embedded.pip_names(model))
    copy = embedded.assembled_path(model)
    if copy is None:
        raise LocalgenError(f"{model.name} ships inside the Python package {pip}, which localgen does not remove: "
                            f"nothing was removed (pip uninstall {pip} removes it)")
    if not copy.is_file():
        raise LocalgenError(f"{model.name} has not been assembled, so localgen holds nothing of it to remove; its "
                            f"chunks ship inside Python packages (pip uninstall {pip} removes them)")
    _confirm(f"the assembled copy of {model.name} ({copy})", copy.stat().st_size, yes)
    freed = embedded.remove_assembled(model)
    print(f"removed the assembled copy of {model.name}, freed {format_amount(freed)}; its "
          f"chunks stay inside Python packages (pip uninstall {pip} removes them; the next use assembles it again)")
