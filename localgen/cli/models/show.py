"""`localgen show`: look inside a model (or a preset) without loading it: its header's facts, the chat template
alone, a Modelfile that makes it again, or all of it as JSON."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer

from localgen.cli import options as o
from localgen.cli.models.manage import Json, shown_params
from localgen.cli.output import for_terminal, header_text
from localgen.errors import LocalgenError, UsageError
from localgen.units import format_bytes


def show(
    name: Annotated[str, typer.Argument(metavar="NAME", help="Model name, owner/repo[:QUANT], path, ollama:NAME, "
                                             "lmstudio:PUBLISHER/REPO or oci:REPO[:TAG].")],
    template: Annotated[bool, typer.Option("--template", help="Print the chat template, whole.")] = False,
    sha256: Annotated[
        bool, typer.Option("--sha256", help="Compute the file's SHA-256 when it is not known yet (reads the whole "
                                            "file, with a progress bar).")
    ] = False,
    json_out: Json = False,
    offline: o.Offline = False,
    mmproj: o.MmProj = None,
    as_modelfile: Annotated[
        bool, typer.Option("--modelfile", help="Print a Modelfile that `localgen create` makes this model from.")
    ] = False,
) -> None:
    """What a model is, read from its GGUF header (bounded; weights are not loaded). Local files only."""
    from localgen.models import mmproj as projectors
    from localgen.models.resolve import resolve

    _one_view(template, as_modelfile, json_out, sha256, mmproj is not None)
    from localgen.cli.inputfile import check_model_file

    check_model_file(name)
    if as_modelfile:  # a preset's own, even when its base is gone; a model's from its catalogue entry
        print(_modelfile(name, offline), end="")
        return
    # an OCI model is read as it is: pull made its split's links (show writes nothing in the store)
    ref = resolve(name, offline=offline, pull_missing=False, assemble=not name.strip().lower().startswith("oci:"))
    if mmproj is not None:
        ref = projectors.attach(ref, str(mmproj))
    s = ref.summary
    if template:
        if not s.chat_template:
            raise LocalgenError(f"{ref.name} has no chat template")
        print(for_terminal(s.chat_template, sys.stdout))  # as run's answers: escaped on a terminal, whole in a pipe
        return
    doc = _show_doc(ref, sha256)
    preset = _preset_doc(name, ref)
    if preset is not None:  # what the preset adds, before its base model's figures
        doc = {"name": doc.pop("name"), "preset": preset, **doc}
    if json_out:
        doc["chat_template"] = s.chat_template
        from localgen.cli.output import finite_json

        print(json.dumps(finite_json(doc), allow_nan=False))
        return
    _print_doc(doc)


def _one_view(template: bool, modelfile: bool, json_out: bool, sha256: bool, mmproj: bool) -> None:
    """show prints one thing: the header (plain or --json), the template alone, or a Modelfile; a flag the view asked
    for cannot honour is a usage error, not dropped."""
    views = [flag for flag, on in (("--template", template), ("--modelfile", modelfile), ("--json", json_out)) if on]
    if len(views) > 1:
        raise UsageError(f"show prints one of --template, --modelfile and --json: give one, not {' and '.join(views)}",
                         hint="--json holds the chat template too, as chat_template" if template and json_out else None)
    if template or modelfile:
        extra = [flag for flag, on in (("--sha256", sha256), ("--mmproj", mmproj)) if on]
        if extra:
            raise UsageError(f"{views[0]} prints {'the chat template' if template else 'a Modelfile'} alone: "
                             f"{' and '.join(extra)} would show nothing there")


def _show_doc(ref: Any, hash_now: bool) -> dict[str, Any]:
    """What `show` says of a model (`hash_now`: compute an unknown SHA-256, with a progress bar)."""
    from pathlib import Path

    from localgen.models import download
    from localgen.models import mmproj as projectors

    s = ref.summary
    sha = ref.sha256 or _known_sha256(ref, remembered=not hash_now)  # --sha256: one remembered is computed again
    if sha is None and hash_now:
        from localgen.cli.progress import make_progress

        target = Path(ref.path).resolve()
        progress = make_progress()
        progress.start(f"hashing {target.name}", target.stat().st_size, 0)
        sha = download.sha256_kept(target, progress)  # the next `show` knows it
        progress.finish()
    return {
        "name": ref.name, "file": ref.file, "sha256": sha, "architecture": s.architecture, "model_name": s.name,
        "parameters": s.n_params, "quantization": s.quantization, "size": s.file_size,
        "context_length": s.context_length, "layers": s.n_layers, "embedding_length": s.n_embd,
        "heads": s.n_head, "kv_heads": s.n_head_kv, "vocab_size": s.vocab_size, "license": s.license,
        "chat_template": bool(s.chat_template),
        "modalities": ["text", *projectors.modalities(ref)],
        "projector": ref.mmproj,
        "adapters": [path for path, _ in ref.adapters],  # a preset's LoRA adapters (ADAPTER)
        "load": _load_settings(ref),  # a preset's num_ctx and load settings, as its Modelfile spells them
        **_oci_doc(ref),
    }


def _oci_doc(ref: Any) -> dict[str, Any]:
    """An oci: model's config (format, quantization, parameters, size, context size as its packager wrote them),
    and its GGUF parts; {} for any other model."""
    if ref.source != "oci":
        return {}
    from localgen.models import oci

    m = oci.find(oci.parse_name(ref.name.removeprefix(oci.PREFIX)))
    if m is None:
        return {}
    return {"oci_config": oci.shown_config(m), "gguf_layers": len(m.of(oci.GGUF)),
            "license_layers": len(m.of(oci.LICENSE))}


def _load_settings(ref: Any) -> dict[str, Any]:
    from localgen.models import modelfile

    shown: dict[str, Any] = {"num_ctx": ref.context} if ref.context is not None else {}
    for knob, value in ref.load.items():
        for name, _ in modelfile.load_lines(knob, value):
            shown[name] = not value if knob == "no_mmap" else list(value) if isinstance(value, tuple) else value
    return shown


def _preset_doc(name: str, ref: Any) -> dict[str, Any] | None:
    """What a preset layers on its base model (None when `name` is no preset): the base, its settings, window,
    system prompt, messages, template and LoRA adapters; and the settings it keeps from its base (`inherited`: an
    Ollama model's params, a catalogue entry's sampling) that it does not set itself."""
    from localgen import settings
    from localgen.models import presets

    p = presets.find(name)
    if p is None:
        return None
    spec = p.spec
    inherited = {k: settings.jsonable(v) for k, v in ref.sampling_defaults.items() if k not in spec.parameters}
    return {"base": p.base, "settings": {k: settings.jsonable(v) for k, v in spec.parameters.items()},
            "inherited": inherited, "inherited_context": ref.context if spec.context is None else None,
            "context": spec.context, "system": spec.system, "messages": list(spec.messages),
            "template": spec.template is not None, "adapters": list(spec.adapters)}


def _print_preset(preset: dict[str, Any]) -> None:
    """`show`'s lines for a preset: what it is and each setting it gives, as `/set` and the flags take them."""
    from localgen import settings

    print(f"{'preset':15} of {preset['base']} (`show --modelfile` prints its Modelfile)")
    given = [f"{k} {settings.as_text(k, v) if k in settings.KNOBS else v}" for k, v in preset["settings"].items()]
    given += [f"context {preset['context']}"] if preset["context"] else []
    kept = [f"{k} {settings.as_text(k, v) if k in settings.KNOBS else v}" for k, v in preset["inherited"].items()]
    kept += [f"context {preset['inherited_context']}"] if preset["inherited_context"] is not None else []
    print(f"{'settings':15} {' · '.join(given) or 'none'}")
    if preset["system"]:
        print(f"{'system':15} " + for_terminal(preset["system"], sys.stdout).replace("\n", "\n" + " " * 16))
    if preset["messages"]:
        print(f"{'messages':15} {len(preset['messages'])} before the conversation")
    if preset["template"]:
        print(f"{'template':15} its own (--template prints it)")
    if preset["adapters"]:
        print(f"{'LoRA adapters':15} {', '.join(preset['adapters'])}")
    if kept:  # what applies beside its own: the base's (an Ollama model's params, a catalogue entry's sampling)
        print(f"{'from its base':15} {' · '.join(kept)}")


_LABELS = {"model_name": "model", "size": "file size", "context_length": "context length",
           "embedding_length": "embedding", "kv_heads": "KV heads", "vocab_size": "vocabulary",
           "adapters": "LoRA adapters", "load": "load settings", "oci_config": "OCI config"}


def _print_doc(doc: dict[str, Any]) -> None:
    """`show`'s lines: a label and a value each."""
    for k, v in doc.items():
        if k == "preset":
            _print_preset(v)
            continue
        if k == "size":
            v = format_bytes(v)
        elif k == "parameters":
            v = f"{shown_params(v)} ({v:,})"
        elif k == "chat_template":
            v = "yes (--template prints it)" if v else "none (a base model: prompts go to it as plain completions)"
        elif k == "sha256" and v is None:
            v = "not known yet (--sha256 computes it)"
        elif k in ("projector", "adapters", "load", "oci_config") and not v:
            continue
        elif k == "oci_config":
            v = " · ".join(f"{name} {x}" for name, x in v.items())
        elif k in ("modalities", "adapters"):
            v = ", ".join(v)
        elif k == "load":
            v = " · ".join(f"{name} {_shown(x)}" for name, x in v.items())
        print(f"{_LABELS.get(k, k.replace('_', ' ')):15} {header_text(str(v)) if v is not None else '-'}")



def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return ", ".join(value) if isinstance(value, list) else str(value)


def _modelfile(name: str, offline: bool) -> str:
    """A preset's own Modelfile (even when its base is gone); for a model, FROM it with its settings: what /api/show
    gives as its modelfile (serve/describe.py)."""
    from localgen.models import modelfile, presets
    from localgen.models.resolve import resolve
    from localgen.serve.describe import modelfile_of

    p = presets.find(name)
    if p is not None:
        return modelfile.write(p.spec)
    return modelfile_of(name, resolve(name, offline=offline, pull_missing=False))


def _known_sha256(ref: Any, remembered: bool = True) -> str | None:
    """A SHA-256 known without reading the file: a cache blob's name, an embedded model's published one, or (where
    `remembered`) the one `show --sha256` computed of this file as it is now."""
    from pathlib import Path

    from localgen.models import download, embedded, hfcache, store

    try:
        blob = store.blob_of(Path(ref.path)).name  # a hard link's blob too (its own name is no SHA)
    except OSError:
        blob = ""
    if hfcache.SHA256.match(blob):
        return blob
    model = embedded.EMBEDDED.get(ref.name)
    if model is not None and model.sha256 is not None and ref.source == "embedded":
        return model.sha256
    return download.known_sha256(Path(ref.path)) if remembered else None
