"""The models on this machine, by the names `run -m` takes: embedded ones, every GGUF in the Hugging Face
cache (any tool's; a catalogue entry's name where one matches), models quantized here, the models Ollama and LM
Studio downloaded (used in place), and presets (with their base's figures). What `localgen list` prints and what
`serve` offers. Never touches the network."""

from __future__ import annotations

from typing import Any

from localgen.errors import LocalgenError


def _item(name: str, path: str | None, source: str, s: Any) -> dict[str, Any]:
    return {"name": name, "quantization": s.quantization, "size": s.file_size, "parameters": s.n_params,
            "context_length": s.context_length, "architecture": s.architecture, "source": source, "path": path}


def installed() -> list[dict[str, Any]]:
    """Each model here: name, quantization, size, parameters, context_length, architecture, source
    (embedded, hf cache, quantized, ollama, lmstudio, preset) and path (None for a chunked model not assembled yet:
    there is no file until its first use makes it); a preset whose base is gone says so and has no figures."""
    from localgen.models import catalogue, embedded, quantized, store
    from localgen.models.gguf_meta import read_summary

    entries = catalogue.load()
    by_repo = {(e.repo, e.default_quant.upper()): e.name for e in entries.values() if e.repo}
    items: list[dict[str, Any]] = []
    for name, model in embedded.EMBEDDED.items():
        try:  # a chunked model not assembled yet is listed from its first chunk: its first use assembles it
            path, summary = embedded.peek(model)
        except LocalgenError:
            continue
        items.append(_item(name, str(path) if path.is_file() else None, "embedded", summary))
    cached = list(store.cached_files())
    files_of: dict[tuple[str, str], set[str]] = {}  # (repo, quant): the file names of it, over every commit
    for f in cached:
        files_of.setdefault((f.repo, (f.quant or "?").upper()), set()).add(f.filename)
    hub_items: list[tuple[Any, dict[str, Any]]] = []
    for f in cached:
        try:
            summary = read_summary(str(f.link))
        except LocalgenError:
            continue
        quant = (f.quant or "?").upper()
        if len(files_of[(f.repo, quant)]) > 1:  # two files of one quantization: only the file path tells them apart
            name = f"{f.repo}/{f.filename}"
        else:
            name = by_repo.get((f.repo, quant), f"{f.repo}:{quant}")
        item = _item(name, str(f.link), "hf cache", summary)
        item["size"] = store.total_size(f)
        items.append(item)
        hub_items.append((f, item))
    _older_revisions(hub_items)
    for name, path in quantized.all_models():  # made here by `localgen quantize`
        try:
            summary = read_summary(str(path))
        except LocalgenError:
            continue
        items.append(_item(name, str(path), "quantized", summary))
    items += _other_stores()
    return items + _presets({item["name"]: item for item in items})


def _older_revisions(hub_items: list[tuple[Any, dict[str, Any]]]) -> None:
    """A name the cache holds at more than one commit (an older revision a tag still names, or another tool
    kept): the copy the name resolves to keeps it (at the commit refs/main names, else the first), each other one
    is named by its revision, as run takes it: OWNER/REPO/resolve/REF-OR-COMMIT/FILE."""
    from localgen.models import hfcache

    by_name: dict[str, list[tuple[Any, dict[str, Any]]]] = {}
    for f, item in hub_items:
        by_name.setdefault(item["name"], []).append((f, item))
    for group in by_name.values():
        if len(group) < 2:
            continue
        main = hfcache.cached_commit(group[0][0].repo, "main")
        keep = next((i for i, (f, _) in enumerate(group) if f.commit == main), 0)
        for i, (f, item) in enumerate(group):
            if i != keep:
                item["name"] = f"{f.repo}/resolve/{_ref_of(f.repo, f.commit)}/{f.filename}"


def _ref_of(repo: str, commit: str) -> str:
    """A ref (branch or tag) that names this commit in the cache, else the commit itself."""
    from localgen.models import hfcache, store

    refs = hfcache.repo_dir(repo) / "refs"
    # (a nested ref, refs/pr/1, is no revision a resolve name can carry: its commit is)
    return next((ref.name for ref in sorted(refs.glob("*")) if store.names_commit(ref, commit)), commit)


def _other_stores() -> list[dict[str, Any]]:
    """The models Ollama and LM Studio downloaded, by the names run takes (ollama:..., lmstudio:...), used in
    place, and those localgen pulled from OCI registries (oci:...). An Ollama model with any damaged layer (its
    GGUF, projector, adapter, params, system prompt or messages: the same reading run does) is not listed, as the
    server's listings leave it out: `show` names the damage."""
    from localgen.models import lmstudio, oci, ollamastore
    from localgen.models.gguf_meta import read_summary

    items = []
    for m in ollamastore.all_manifests():
        try:
            parts = ollamastore.read_parts(m, warn=False)
            summary = read_summary(str(parts.blob))
        except LocalgenError:
            continue
        item = _item(m.name.display, str(parts.blob), "ollama", summary)
        item["size"] = parts.layer.size + sum(x.size for x in m.of("projector")[:1])
        items.append(item)
    for om in oci.all_manifests():  # pulled from an OCI registry (localgen pull oci:...)
        try:
            op = oci.read_parts(om, make=False)  # a split's links as they are: a listing writes nothing
            summary = op.summary(check_data=False)
        except LocalgenError:
            continue
        item = _item(om.name.display, str(op.path), "oci", summary)
        item["size"] = sum(x.size for x in op.ggufs) + sum(x.size for x in om.of(oci.MMPROJ)[:1])
        items.append(item)
    for name, path, size in lmstudio.all_models():
        try:
            summary = read_summary(str(path))
        except LocalgenError:
            continue
        item = _item(name, str(path), "lmstudio", summary)
        item["size"] = size
        items.append(item)
    return items


def _presets(listed: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The presets, each with its base's figures: taken from the base's own entry when it is listed above (so an
    embedded base is read as listing reads it, never assembled), otherwise from resolving the preset."""
    from localgen.models import presets
    from localgen.models.resolve import resolve

    items = []
    for p in presets.all_presets():
        base = listed.get(p.base)
        if base is not None:
            items.append({**base, "name": p.name, "path": f"preset of {p.base}", "source": "preset", "base": p.base})
            continue
        try:
            ref = resolve(p.name, offline=True, pull_missing=False)
        except presets.PresetCycle as e:  # never usable: left out, as a damaged preset is
            presets.left_out(e)
            continue
        except LocalgenError:
            items.append({"name": p.name, "quantization": None, "size": 0, "parameters": None,
                          "context_length": None, "architecture": None, "source": "preset", "base": p.base,
                          "path": f"preset of {p.base} (missing)"})
            continue
        item = _item(p.name, f"preset of {p.base}", "preset", ref.summary)
        item["base"] = p.base
        items.append(item)
    return items
