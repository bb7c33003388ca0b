"""Turn what the user typed into a ModelRef: a local path, an embedded model, a catalogue name or a
Hugging Face repo. Cached Hub files are used without touching the network; missing ones are pulled
(unless offline). Every Hub file is verified against its SHA-256 before first use."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from localgen.errors import LocalgenError, ModelFormatError, ModelNotFoundError, NotDownloadedError, UsageError
from localgen.models import catalogue, embedded, hfcache, mmproj, names, store
from localgen.models.gguf_meta import read_summary
from localgen.models.quant import QUANT_RE, QuantOption, best_that_fits, group_options, pick, rank, same_tag
from localgen.text import mended
from localgen.types import ModelRef, shown_path

if TYPE_CHECKING:  # the transfer code (urllib, http.client) loads only when a pull happens
    from localgen.models import download, oci, ollamastore, presets


@dataclass(frozen=True)
class Target:
    """A Hub model to find: repo, quant or file, revision, the name to show, catalogue defaults."""

    spec: names.HubSpec
    display: str
    sampling: dict[str, object]
    default_quant: str = "Q4_K_M"
    entry: str | None = None  # the catalogue entry's name, for a catalogue model


def resolve(name: str | None, offline: bool = False, progress: download.Progress | None = None,
            pull_missing: bool = True, assemble: bool = True, within: tuple[str, ...] = ()) -> ModelRef:
    """Resolve a model name to a verified local file and its GGUF summary. Without `assemble` (a listing), nothing
    is written: an embedded model in chunks not assembled yet is described from its first chunk, and its path is
    where its first use will assemble it; an OCI split whose links are missing is read through links of its own
    (its path is where a run makes them). `within`: the presets whose bases led here (a PresetCycle when one of
    them comes again)."""
    text = embedded.DEFAULT_MODEL if name is None else name  # an empty name is a mistake (names.parse), not "none"
    spec = spec_of(text)
    if isinstance(spec, names.StoreSpec):  # Ollama's or LM Studio's store, used in place; Ollama's registry
        return other_store(spec, offline, progress, pull_missing, assemble)
    if isinstance(spec, names.PathSpec):
        if not spec.path.is_file() and not spec.path.exists():
            raise ModelNotFoundError(f"no such model file: {spec.path}")
        return ModelRef(name=shown_path(spec.path.name), path=str(spec.path), source="path",
                        summary=read_summary(str(spec.path)))
    if isinstance(spec, names.CatalogueSpec):
        spec = _latest(spec)
        preset = _preset(spec)
        if preset is not None:
            from localgen.models import presets

            if preset.name in within:
                raise presets.PresetCycle([*within[within.index(preset.name):]])
            return presets.apply(preset, resolve(preset.base, offline, progress, pull_missing, assemble,
                                                 (*within, preset.name)))
        made = _quantized(spec)
        if made is not None:
            return made
        entry = _entry(spec.name, spec.quant)
        if entry.embedded:
            if spec.quant and spec.quant.upper() != entry.default_quant.upper():
                raise ModelNotFoundError(f"{entry.name} ships only as {entry.default_quant}")
            model = embedded.EMBEDDED[entry.name]
            if assemble:
                path = embedded.locate(model)
                summary = read_summary(str(path))
            else:  # a listing: described as `localgen list` describes it, nothing written
                path, summary = embedded.peek(model)
            return ModelRef(name=entry.name, path=str(path), source="embedded", summary=summary,
                            sha256=model.sha256, sampling_defaults=entry.sampling,  # a chunked one's, checked
                            context=entry.window)
        target, window = _catalogue_target(entry, spec.quant), entry.window
    else:
        target, window = Target(spec, spec.display, {}), None
    if progress is None:
        from localgen.models.download import Quiet

        progress = Quiet()
    ref = _hub_model(target, offline, progress, pull_missing)
    return ref if window is None else dataclasses.replace(ref, context=window)


def spec_of(text: str) -> names.Spec:
    """What a model name is (names.parse), but for a file in the current folder found by its name alone: a model
    known here by that name (a preset, a model quantized here, a catalogue entry) wins, as show --modelfile and rm
    take it; ./NAME is the file (a Modelfile named as the preset made from it used to hide the preset)."""
    spec = names.parse(text)
    if isinstance(spec, names.PathSpec) and not names.looks_like_path(text):
        named = names.parse(text, local=False)
        if isinstance(named, names.CatalogueSpec) and _known(_latest(named)):
            return named
    return spec


def known_name(text: str) -> bool:
    """Whether `text`, read as a name (never as a file), is a model known here: a preset, a model quantized here, a
    catalogue entry (NAME and NAME:latest as one)."""
    try:
        named = names.parse(text, local=False)
        return isinstance(named, names.CatalogueSpec) and _known(_latest(named))
    except LocalgenError:  # (a preset named with an @QUANT, say: resolving it says why)
        return False


def other_store(spec: names.StoreSpec, offline: bool = True, progress: download.Progress | None = None,
                pull_missing: bool = False, assemble: bool = True) -> ModelRef:
    """A model Ollama or LM Studio downloaded, from its own store. Where the store has no such model but a preset
    (or a user's catalogue entry) made before such names meant a store carries the whole name, the error says it is
    shadowed and how to rename it. An Ollama model in no store is pulled from its registry as a Hub model is from
    the Hub (`offline`, `pull_missing`: as _hub_model's); where it may not be, a NotDownloadedError names the
    pull. Without `assemble` (a listing, show) an OCI split's missing links are not made: nothing is written."""
    from localgen.models import lmstudio, oci, ollamastore

    try:
        if spec.store == "oci":
            return oci.resolve(spec.name, make=assemble)
        return ollamastore.resolve(spec.name) if spec.store == "ollama" else lmstudio.resolve(spec.name)
    except ModelNotFoundError as e:
        whole = f"{spec.store}:{spec.name}"
        from localgen.models import presets

        if presets.exists(whole):
            kind = "preset"
        elif whole in catalogue.for_name(whole).entries:
            kind = "catalogue entry"
        elif spec.store in ("ollama", "oci"):
            return _from_registry(spec.store, spec.name, e, offline, progress, pull_missing)
        else:
            raise
        raise ModelNotFoundError(f"{e.message}; your {kind} {whole} is shadowed: {spec.store}: now names "
                                 f"{_STORE_NAMES[spec.store]}",
                                 hint=f"rename it: `localgen cp {whole} NEWNAME`, then `localgen rm {whole}`"
                                 if kind == "preset" else f"rename it in {catalogue.user_file()}") from None


_STORE_NAMES = {"ollama": "Ollama's store", "lmstudio": "LM Studio's store", "oci": "a model of an OCI registry"}


def _from_registry(store: str, text: str, e: ModelNotFoundError, flag: bool, progress: download.Progress | None,
                   pull_missing: bool) -> ModelRef:
    """An `ollama:` or `oci:` model not here, pulled from its registry (unless offline: `flag`, or HF_HUB_OFFLINE;
    or not `pull_missing`), then read from localgen's pulled models."""
    from localgen.models import oci, ollamastore

    name = (oci if store == "oci" else ollamastore).parse_name(text)
    offline = flag or hfcache.offline_env()
    if offline or not pull_missing:
        how = f" {hfcache.without_offline(flag)}" if offline else ""
        raise NotDownloadedError(e.message, hint=f"`localgen pull {name.display}`{how} downloads it from {name.host}",
                                 name=name.display) from None
    return pull_from_registry(name, progress)


def pull_from_registry(name: oci.OciName | ollamastore.OllamaName, progress: download.Progress | None) -> ModelRef:
    """Download a model from its registry (Ollama's, or an OCI one) into localgen's pulled models, and read it from
    there."""
    from localgen.models import oci, ocipull, ollamastore, registry
    from localgen.models.download import Quiet

    if isinstance(name, oci.OciName):
        ocipull.pull(name, progress or Quiet())
        return oci.resolve(name.display.removeprefix(oci.PREFIX))
    registry.pull(name, progress or Quiet())
    return ollamastore.resolve(name.display.removeprefix(ollamastore.PREFIX))


def _latest(spec: names.CatalogueSpec) -> names.CatalogueSpec:
    """Ollama's NAME and NAME:latest as one model (what its clients and users write for a name with no tag):
    NAME:latest is NAME where no model is called NAME:latest and NAME itself is one (a preset, a quantized model,
    a catalogue entry), and NAME is NAME:latest the other way round (a user's catalogue entry of that name;
    presets keep the two as one, models/presets.py)."""
    if _known(spec):
        return spec
    if spec.name.lower().endswith(":latest"):
        other = dataclasses.replace(spec, name=spec.name[:-len(":latest")])
    elif ":" not in spec.name:
        other = dataclasses.replace(spec, name=f"{spec.name}:latest")
    else:
        return spec
    return other if other.name and _known(other) else spec


def _known(spec: names.CatalogueSpec) -> bool:
    return spec.name in catalogue.for_name(spec.name).entries or _preset(spec) is not None or (
        _quantized(spec) is not None)


def _preset(spec: names.CatalogueSpec) -> presets.Preset | None:
    """The preset a name means (a catalogue entry of that name wins, and a user's entry of it that is not right is
    an error; create refuses such a name)."""
    if spec.name in catalogue.for_name(spec.name).entries:
        return None
    from localgen.models import presets

    found = presets.find(spec.name)
    if found is not None and spec.quant:
        raise ModelNotFoundError(f"{spec.name} is a preset of {found.base}; it takes no @QUANT")
    return found


def _quantized(spec: names.CatalogueSpec) -> ModelRef | None:
    """A model quantized here (models/quantized.py), by its BASE:TYPE name; a catalogue entry's name wins."""
    from localgen.models import quantized

    if spec.name in catalogue.load():
        return None
    path = quantized.find(spec.name)
    if path is None:
        return None
    if spec.quant:
        raise ModelNotFoundError(f"{spec.name} was quantized here to one type; it takes no @QUANT")
    return ModelRef(name=spec.name, path=str(path), source="quantized", summary=read_summary(str(path)))


def _made_here(name: str) -> Path | None:
    """The file of a model quantized here under `name` (a catalogue entry's name wins, as in _quantized)."""
    from localgen.models import quantized

    return None if name in catalogue.load() else quantized.find(name)


def _pullable(base: str) -> bool:
    """Whether a preset's base is a model `pull` takes (not a file, nor one quantized here)."""
    try:
        spec = names.parse(base)
    except LocalgenError:
        return False
    if isinstance(spec, names.CatalogueSpec):
        return _made_here(spec.name) is None
    return isinstance(spec, names.HubSpec)


def _catalogue_target(entry: catalogue.CatalogueEntry, quant: str | None) -> Target:
    """The Hub model a catalogue entry names, at a quantization (its default when None)."""
    assert entry.repo
    q = quant or entry.default_quant
    spec = names.HubSpec(entry.repo, quant=q, filename=entry.files.get(q.upper()))
    return Target(spec, f"{entry.name}@{q.upper()}", entry.sampling, entry.default_quant, entry.name)


def _entry(name: str, quant: str | None = None) -> catalogue.CatalogueEntry:
    """The catalogue entry of a name; ModelNotFoundError (with what to try) where there is none. `quant`: the
    @QUANT typed with the name, kept in a suggestion."""
    cat = catalogue.for_name(name)
    entries = cat.entries
    if name not in entries:
        raise ModelNotFoundError(f"unknown model {mended(name)!r}",  # a byte not UTF-8 (caf\xe8): U+FFFD, not '\udce8'
                                 hint=_unknown_hint(name, entries, cat.unreadable is not None, quant))
    return entries[name]


def _unknown_hint(name: str, known: dict[str, catalogue.CatalogueEntry], unreadable: bool,
                  quant: str | None = None) -> str:
    """What to try for a name the catalogue lacks: the entry it names but for case (SmolLM2:135M), else those of
    its family (smollm2:7b), else the list; then a Hub repo or a file. `unreadable`: models.toml could not be read.
    A suggestion keeps the name's @QUANT where its entry takes that tag (SmolLM2:1.7B@Q8_0: smollm2:1.7b@Q8_0); an
    embedded entry's other tag is said to be none of its (the suggestion without it would run another)."""
    folded = name.casefold()
    same = [n for n in known if n.casefold() == folded]
    family = folded.split(":")[0]
    close = same or [n for n in known if n.casefold().split(":")[0] == family]
    unread = f"{catalogue.user_file()} cannot be read, so its models are unknown" if unreadable else ""
    if close:
        shown = [_with_quant(known[n], quant) for n in close]
        names = shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"
        lone = known[same[0]] if len(same) == 1 else None
        ships = (f"it ships only as {lone.default_quant}" if lone is not None and lone.embedded and quant
                 and _with_quant(lone, quant) == lone.name else "")
        rest = ships if same else "; ".join(x for x in (unread, "or give owner/repo or a .gguf path") if x)
        return f"did you mean {names}?" + (f" {rest[0].upper()}{rest[1:]}" if rest else "")
    return "; ".join(x for x in ("see `localgen list --catalogue`", unread, "or give owner/repo or a .gguf path") if x)


def _with_quant(entry: catalogue.CatalogueEntry, quant: str | None) -> str:
    """An entry's name with the @QUANT typed, where the entry takes that tag: a quantization tag (Q8_0, IQ4_XS,
    BF16), for an embedded entry only the one it ships as."""
    if not quant or not QUANT_RE.fullmatch(quant) or (entry.embedded and
                                                        quant.upper() != entry.default_quant.upper()):
        return entry.name
    return f"{entry.name}@{quant.upper()}"


def _hub_model(t: Target, flag: bool, progress: download.Progress, pull_missing: bool) -> ModelRef:
    """The model from the cache, else pulled (unless offline: `flag`, --offline's, or HF_HUB_OFFLINE)."""
    offline = flag or hfcache.offline_env()
    cached = cached_files_of(t)
    lost = _lost_part(cached[0], t, offline, flag) if cached else None
    if cached and lost is None:
        return _from_cache(cached[0], t, progress)
    if lost is not None and (offline or not pull_missing):
        raise lost
    pin = _pinned_name(t)
    if offline and pin is not None:  # the cache may hold the file at another commit: never those bytes for these
        others = sorted({f.commit[:12] for f in store.find_cached(t.spec.repo, "main", None, t.spec.filename)})
        held = f" (the cache holds it at {', '.join(others)} only)" if others else ""
        raise NotDownloadedError(f"{t.display} at revision {t.spec.revision[:12]} is not in the cache and localgen "
                                 f"is offline{held}",
                                 hint=f"fetch that revision {hfcache.without_offline(flag)}: localgen pull {pin}",
                                 name=pin)
    if offline:
        have = sorted({f"{f.repo}:{f.quant}" for f in store.cached_files()})
        raise NotDownloadedError(
            f"{t.display} is not in the cache and localgen is offline",
            hint=("cached: " + ", ".join(have[:8])) if have
            else f"nothing is cached yet; pull {hfcache.without_offline(flag)}",
            name=_pull_name(t))
    if not pull_missing:
        raise NotDownloadedError(f"{t.display} is not downloaded", hint=f"localgen pull {pin or _pull_name(t)}",
                                 name=pin or _pull_name(t))
    return pull(t, progress)


def _pull_name(t: Target) -> str:
    """The name `localgen pull` is told for a target, as the README teaches it: a catalogue entry's own name at its
    default quantization (qwen2.5:7b, not qwen2.5:7b@Q4_K_M), NAME@QUANT at another; else the name it shows."""
    if t.entry is not None and (t.spec.quant or "").upper() == t.default_quant.upper():
        return t.entry
    return t.display


def _pinned_name(t: Target) -> str | None:
    """The name that pulls this target's file at its commit (owner/repo/resolve/COMMIT/FILE), where a commit names
    it: its display (owner/repo/FILE) would pull the file at main."""
    s = t.spec
    return f"{s.repo}/resolve/{s.revision}/{s.filename}" if s.filename and hfcache.COMMIT.match(s.revision) else None


def cached_files_of(t: Target) -> list[store.CachedFile]:
    """The cached files a Hub target may mean, the one it resolves to first (a UsageError where its tag names two
    files of the repo's)."""
    s = t.spec
    cached = store.find_cached(s.repo, s.revision, s.quant, s.filename)
    if not s.quant and not s.filename and cached:
        cached.sort(key=lambda f: ((f.quant or "").upper() != t.default_quant.upper(), -rank(f.quant or "")))
    if cached and not s.filename:  # two files of one tag in the snapshot it resolves to (older snapshots may
        tag = (s.quant or cached[0].quant or "").upper()  # have the file under an older name: not a second one)
        if tag:
            mine = [f for f in cached if f.commit == cached[0].commit and (f.quant or "").upper() == tag]
            ambiguous(s.repo, tag, sorted({f.filename for f in mine}))
    return cached


def _lost_part(f: store.CachedFile, t: Target, offline: bool, flag: bool) -> NotDownloadedError | None:
    """The error for a split model whose cache lost a part (its link, or the blob it points at), naming the
    first such part; None when every part is there. Online, a pull fetches what is missing."""
    parts = store.split_parts(f)
    for i, part in enumerate(parts, 1):
        if not part.exists():
            name = t.display if t.spec.quant or t.spec.filename else f"{f.repo}:{f.quant}"
            pulled = _pull_name(t) if t.entry is not None else name
            how = f"`localgen pull {pulled}`{' ' + hfcache.without_offline(flag) if offline else ''} fetches it again"
            return NotDownloadedError(f"part {i} of {len(parts)} of {name} ({part.name}) is missing from the cache",
                                      hint=how, name=pulled)
    return None


def _from_cache(f: store.CachedFile, t: Target, progress: download.Progress) -> ModelRef:
    for part in store.split_parts(f):
        _verify_blob(store.blob_of(part), progress, part)  # a hard link's blob too (its own name is no SHA)
    name = t.display if t.spec.quant or t.spec.filename else f"{f.repo}:{f.quant}"
    proj = mmproj.in_folder(Path(f.link).parent)  # pulled with the model, into the same snapshot
    if proj is not None:
        _verify_blob(store.blob_of(proj), progress, proj)
    return ModelRef(name=name, path=str(f.link), source="hf", summary=read_summary(str(f.link)),
                    repo=f.repo,
                    sha256=f.sha256, sampling_defaults=dict(t.sampling), mmproj=str(proj) if proj else None)


def _verify_blob(blob: Path, progress: download.Progress, link: Path) -> None:
    """A cache blob is named by its SHA-256: hash it once (another tool may have written it unchecked). A bad one
    goes, with `link` where that is a hard link to it (the bytes would stay behind it)."""
    if not hfcache.SHA256.match(blob.name):
        return
    from localgen.models import download

    if not download.verify_blob(blob, blob.name, blob.name[:12], progress):
        blob.unlink()
        if not link.is_symlink():
            link.unlink(missing_ok=True)
        raise LocalgenError(f"a cached file failed its SHA-256 check and was removed: {blob}",
                            hint="pull the model again")


def choose(options: list[QuantOption], t: Target, repo: str) -> QuantOption:
    """The option the name asks for; without a tag, the default quant, else the best that fits RAM."""
    s = t.spec
    if s.filename:
        for o in options:
            if any(f.name == s.filename for f in o.files):
                return o
        raise ModelNotFoundError(f"{repo} has no file {s.filename}")
    if s.quant:
        _one_of(options, s.quant, repo)
        found = pick(options, s.quant)
        if found is None:
            tags = ", ".join(dict.fromkeys(o.tag for o in options)) or "no GGUF files"
            raise ModelNotFoundError(f"{repo} has no quantization {s.quant.upper()}", hint=f"it has: {tags}")
        return found
    if not options:
        raise ModelNotFoundError(f"{repo} has no GGUF model files")
    _one_of(options, t.default_quant, repo)
    found = pick(options, t.default_quant) or best_that_fits(options)
    _one_of(options, found.tag, repo)  # the best that fits may be a tag two files share: it names neither
    return found


def _one_of(options: list[QuantOption], tag: str, repo: str) -> None:
    """A UsageError where a tag names more than one file of the repo (a-Q4_K_M.gguf and b-Q4_K_M.gguf): which
    one is meant only its file name says."""
    ambiguous(repo, tag, [o.first.name for o in same_tag(options, tag)])


def ambiguous(repo: str, tag: str, files: list[str]) -> None:
    """A UsageError where `files` (of one quantization `tag` in `repo`) are more than one."""
    if len(files) > 1:
        raise UsageError(f"{repo}:{tag.upper()} names {len(files)} files of {repo}: {', '.join(files)}",
                         hint=f"name one by its file path: {repo}/{files[0]}")


def cached(t: Target, progress: download.Progress, flag: bool = True) -> ModelRef:
    """`pull` offline: the target as the cache holds it, verified; ModelNotFoundError when it is not there.
    `flag`: whether --offline (or LOCALGEN_OFFLINE) made it offline, rather than HF_HUB_OFFLINE alone."""
    return _hub_model(t, flag or not hfcache.offline_env(), progress, False)


def pull(t: Target, progress: download.Progress) -> ModelRef:
    """Download (or finish downloading) a Hub model and return it. Once every file of it is whole and verified,
    the revision's ref moves to the listed commit, and the copy the ref named before goes (replace_older); a
    revision that is a commit (owner/repo/resolve/COMMIT/FILE, by `pull` or a `run` that downloads) pins the file
    instead (hfcache.record_pin), so that no pull of another revision takes it away: only rm does."""
    from localgen.models import hub

    s = t.spec
    before = hfcache.cached_commit(s.repo, s.revision)
    listing = hub.list_repo(s.repo, s.revision, progress.note)
    option = choose(group_options(list(listing.files)), t, s.repo)
    from localgen.models import download

    # a vision or audio model's projector comes with it (llama.cpp's convention: mmproj-*.gguf in the repo)
    proj_name = mmproj.choose([f.name for f in listing.files])
    entry = next((f for f in listing.files if f.name == proj_name), None) if proj_name is not None else None
    wanted = [*option.files, *([entry] if entry is not None else [])]
    need = download.still_to_come(s.repo, wanted)  # the whole pull's, before any byte of it
    if need:
        what = option.first.name if len(wanted) == 1 else f"{option.first.name} and {len(wanted) - 1} more file(s)"
        download.check_space(hfcache.repo_dir(s.repo) / "blobs", need, what)
    there = {f.name for f in wanted if not download.still_to_come(s.repo, [f])}  # put there by us or another tool
    paths = [download.fetch(s.repo, listing.commit, f, progress) for f in option.files]
    proj = download.fetch(s.repo, listing.commit, entry, progress) if entry is not None else None
    name = t.display if s.quant or s.filename else f"{s.repo}:{option.tag}"
    try:
        summary = read_summary(str(paths[0]))
    except ModelFormatError as e:  # the Hub's bytes, verified, but not a model: what this pull brought goes again
        got = zip([*option.files, *([entry] if proj is not None and entry is not None else [])],
                  [*paths, *([proj] if proj is not None else [])], strict=True)
        _discard(s.repo, [path for f, path in got if f.name not in there])
        shown = f"{s.repo}/{option.first.name}"  # never the server's own paths
        why = e.message.replace(os.path.realpath(paths[0]), shown).replace(str(paths[0]), shown)
        raise ModelFormatError(why, hint="this repo's file is not a model llama.cpp can load; " + (
            "it was removed from the cache again" if option.first.name not in there else
            "the copy another tool put in the cache is kept")) from None
    hfcache.record_ref(s.repo, s.revision, listing.commit)  # only now: a pull cut short left the older one named
    if hfcache.COMMIT.match(s.revision):  # a name that means these bytes: a pull of main that moves on keeps them
        hfcache.record_pin(s.repo, listing.commit, option.first.name)
    replace_older(s.repo, s.revision, before, paths[0], progress)
    return ModelRef(name=name, path=str(paths[0]), source="hf", summary=summary,
                    repo=s.repo,
                    sha256=option.first.sha256, sampling_defaults=dict(t.sampling),
                    mmproj=str(proj) if proj else None)


def replace_older(repo: str, revision: str, before: str | None, path: Path, progress: download.Progress) -> None:
    """After a pull that moved `revision` off commit `before`: the older commit's copy of the model goes
    (store.replace_older), said in one note; a copy a preset pins (names by its commit or its path), or one pulled
    by its commit's name, stays, said so; a copy that cannot be removed (in use on Windows, a read-only cache) is
    said and kept whole: the pull succeeded."""
    from localgen.units import format_amount

    try:
        replaced = store.replace_older(repo, revision, before, str(path))
    except OSError as e:
        progress.note(f"the copy of {path.name} at the older revision {(before or '')[:12]} was kept: "
                      f"{e.strerror or e}")
        return
    if replaced is not None and replaced.kept:
        users, why = replaced.pinned_by, []
        if replaced.pulled_as is not None:
            why.append(f"it was pulled by that commit (`localgen rm {replaced.pulled_as}` removes it)")
        if users:
            why.append(f"the preset {users[0]} names it" if len(users) == 1 else
                       f"the presets {', '.join(users)} name it")
        progress.note(f"kept the copy of {replaced.filename} at the older revision {(before or '')[:12]}: "
                      f"{'; '.join(why)}")
    elif replaced is not None:
        progress.note(f"replaced the copy of {replaced.filename} at the older revision {(before or '')[:12]}, freed "
                      f"{format_amount(replaced.freed)}")


def _discard(repo: str, paths: list[Path]) -> None:
    """Remove these snapshot files of a repo from the cache (a blob another link uses stays)."""
    for p in paths:
        if p.is_symlink() or p.exists():
            blob = store.blob_of(p) if p.exists() else p
            p.unlink()
            if blob != p and blob.exists() and not _linked(repo, blob):
                blob.unlink()


def _linked(repo: str, blob: Path) -> bool:
    """Whether any snapshot link of the repo still points at this blob."""
    snaps = hfcache.repo_dir(repo) / "snapshots"
    if not snaps.is_dir():
        return False
    seen: dict[Path, list[tuple[Path, os.stat_result]]] = {}
    return any(p.is_file() and store.blob_of(p, seen) == blob for p in snaps.rglob("*"))  # a link, or a hard link


def embedded_model(name: str, local: bool = True) -> embedded.EmbeddedModel | None:
    """The embedded model a catalogue name means; None for anything else (a Hub model, a path, an unknown
    name, which target() and resolve() explain). `local`: as names.parse's."""
    spec = names.parse(name, local)
    if not isinstance(spec, names.CatalogueSpec):
        return None
    entry = catalogue.for_name(spec.name).entries.get(spec.name)  # a bad user entry of the name: its error alone
    return embedded.EMBEDDED.get(entry.name) if entry is not None and entry.embedded else None


def target(name: str, local: bool = True) -> Target:
    """The Hub target behind a catalogue name or repo reference (for pull --list and show). `local`: as
    names.parse's (False: a name a client sent the server, never a file here)."""
    spec = names.parse(name, local)
    if isinstance(spec, names.CatalogueSpec):
        spec = _latest(spec)
        preset = _preset(spec)
        if preset is not None:
            raise LocalgenError(f"{spec.name} is a preset of {preset.base}; it has no files of its own",
                                hint=f"localgen pull {preset.base}" if _pullable(preset.base) else None)
        made = _made_here(spec.name)
        if made is not None:
            raise LocalgenError(f"{spec.name} was quantized on this machine ({made}); there is nothing to pull")
        entry = _entry(spec.name, spec.quant)
        if entry.embedded or not entry.repo:
            raise LocalgenError(f"{entry.name} ships inside a Python package; there is nothing to pull")
        return _catalogue_target(entry, spec.quant)
    if isinstance(spec, names.HubSpec):
        return Target(spec, spec.display, {})
    if isinstance(spec, names.StoreSpec) and spec.store == "oci":
        from localgen.models import oci

        raise LocalgenError(f"{oci.parse_name(spec.name).display} comes from its OCI registry, not the Hub",
                            hint=f"localgen pull {name}")
    if isinstance(spec, names.StoreSpec):
        tool = "Ollama" if spec.store == "ollama" else "LM Studio"
        from localgen.models import lmstudio, ollamastore

        (ollamastore if spec.store == "ollama" else lmstudio).parse_name(spec.name)  # a name it takes, or a usage error
        raise LocalgenError(f"{name} is {tool}'s model, used in place from its store; there is nothing to pull",
                            hint=f"`ollama pull {spec.name}` updates it" if spec.store == "ollama" else None)
    raise LocalgenError(f"{name} is a local file; there is nothing to pull")
