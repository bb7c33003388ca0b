"""What /api/show says of a model (from its GGUF header and preset, nothing loaded) and the Modelfile an
/api/create request's fields mean: text and dictionaries, no HTTP beyond the 400 for a bad field."""

from __future__ import annotations

import contextlib
import re
from typing import Any

from localgen.engine.budget import THINK_TAGS
from localgen.errors import LocalgenError
from localgen.serve.apierror import HTTPError
from localgen.types import ModelRef


def show_doc(name: str, ref: ModelRef) -> dict[str, Any]:
    """Ollama's /api/show for a model, from its GGUF header and preset (nothing loaded)."""
    from localgen.serve.listings import details, modified_at

    s = ref.summary
    doc: dict[str, Any] = {"modelfile": modelfile_of(name, ref), "parameters": parameters_text(ref),
                           "template": s.chat_template or "", "details": details(ref), "model_info": model_info(s),
                           "capabilities": capabilities(ref), "modified_at": modified_at(ref)}
    if ref.system:
        doc["system"] = ref.system
    if s.license:
        doc["license"] = s.license
    return doc


def modelfile_of(name: str, ref: ModelRef) -> str:
    """What `localgen show --modelfile` prints (one function for both): a preset's own Modelfile; for a model, FROM
    it with its sampling defaults, context, system prompt and load settings (an Ollama model's params and system
    layers)."""
    from localgen.models import modelfile, presets

    p = presets.find(name)
    if p is not None:
        return modelfile.write(p.spec)
    return modelfile.write(modelfile.Modelfile(base=name, parameters=dict(ref.sampling_defaults), context=ref.context,
                                               system=ref.system, load=dict(ref.load)))


# a Modelfile's values of localgen's own spelling, as Ollama's `parameters` spell them (Ollama's client reads them
# back as its options' types: seed an integer, numa true or false)
OLLAMA_VALUES = {("seed", "none"): "-1", **{("numa", how): "true" for how in ("distribute", "isolate", "numactl")}}


def parameters_text(ref: ModelRef) -> str:
    """Ollama's `parameters`: one `name value` a line (Ollama's names and values: OLLAMA_VALUES), the model's
    sampling defaults and a preset's load settings; a value of several lines (a stop "\\n\\nUser:") quoted on its
    one line, as Ollama's %#v quotes it (the Modelfile's \"\"\"...\"\"\" was cut at its first line)."""
    import json

    from localgen.models import modelfile

    text = modelfile.write(modelfile.Modelfile(base="x", parameters=dict(ref.sampling_defaults),
                                               context=ref.context, load=dict(ref.load)))
    rows: list[tuple[str, str]] = []
    lines = iter(text.splitlines())
    for line in lines:
        if not line.startswith("PARAMETER "):
            continue
        key, value = line.removeprefix("PARAMETER ").split(" ", 1)
        if value.startswith('"""'):  # modelfile.write's text of several lines: to its closing quotes
            body = value[3:]
            while not body.endswith('"""'):
                body += "\n" + next(lines)
            value = json.dumps(body[:-3], ensure_ascii=False)
        rows.append((key, OLLAMA_VALUES.get((key, value), value)))
    return "\n".join(f"{k:<30} {v}" for k, v in rows)


def model_info(s: Any) -> dict[str, Any]:
    """Ollama's `model_info` keys, from the GGUF summary."""
    a = s.architecture
    info: dict[str, Any] = {"general.architecture": a, "general.parameter_count": s.n_params}
    if s.name:
        info["general.name"] = s.name
    if s.quantization:
        info["general.file_type"] = s.quantization
    for key, value in (("context_length", s.context_length), ("embedding_length", s.n_embd),
                       ("block_count", s.n_layers), ("attention.head_count", s.n_head),
                       ("attention.head_count_kv", s.n_head_kv), ("vocab_size", s.vocab_size)):
        if value is not None:
            info[f"{a}.{key}"] = value
    return info


def capabilities(ref: ModelRef) -> list[str]:
    """What the model does, as Ollama names it: completion or embedding, tools when its chat template
    renders tools, thinking when it has a thinking switch or block, vision and audio with a projector."""
    from localgen.models import mmproj

    s = ref.summary
    encoder = s.encoder_only
    out = ["embedding"] if encoder else ["completion"]
    template = s.chat_template or ""
    if not encoder and "tools" in template:
        out.append("tools")
    if not encoder and thinks(template):
        out.append("thinking")
    with contextlib.suppress(LocalgenError):  # a projector that cannot be read says so when the model loads
        out += ["vision" if m == "image" else m for m in mmproj.modalities(ref)]  # Ollama's name for images
    return out


def thinks(template: str | None) -> bool:
    """Whether a chat template lets the model think: it has a thinking switch (`enable_thinking`) or writes a
    reasoning block the answer stage reads apart (`<think>`, `[THINK]`, ...), or only its end (early
    DeepSeek-R1 distills' templates have `</think>` alone: the model writes the opening)."""
    text = template or ""
    return "enable_thinking" in text or any(tag in text for pair in THINK_TAGS for tag in pair)


def modelfile_text(body: dict[str, Any]) -> str:
    """The Modelfile a /api/create request means: its `modelfile` text (older clients), or one written from
    `from`, `system`, `template`, `parameters` and `messages`."""
    from localgen.models.modelfile import quote

    for unsupported in ("files", "adapters"):  # `quantize`: serve/manage.py's create
        if body.get(unsupported):
            hint = " (a preset with a LoRA: localgen create, on the server)" if unsupported == "adapters" else ""
            raise HTTPError(400, f"`{unsupported}` is not supported: a preset takes a model already here "
                                 f"(`from`) with settings over it{hint}")
    if body.get("modelfile") is not None and not isinstance(body["modelfile"], str):
        raise HTTPError(400, "`modelfile` must be a string")
    if isinstance(body.get("modelfile"), str) and body["modelfile"].strip():
        return str(body["modelfile"])
    base = body.get("from")
    if not isinstance(base, str) or not base:
        raise HTTPError(400, "`from` must name the model the preset is made from")
    lines = [f"FROM {quote(base)}"]
    params = {} if body.get("parameters") is None else body["parameters"]  # [] or "" is no object: a 400
    if not isinstance(params, dict):
        raise HTTPError(400, "`parameters` must be an object")
    for key, value in params.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):  # a name with a space or a line end would write more lines
            raise HTTPError(400, f"`parameters` has no setting named {key[:64]!r}", param=f"parameters.{key[:64]}")
        for v in value if isinstance(value, list) else [value]:
            if not isinstance(v, (str, int, float)):  # an object or a null would be Python's {'a': 1} or None
                raise HTTPError(400, f"`parameters.{key[:64]}` must be a string, a number, true or false, or a "
                                     "list of them")
            text = ("true" if v else "false") if isinstance(v, bool) else str(v)
            lines.append(f"PARAMETER {key} {quote(text)}")
    for field in ("system", "template"):
        value = body.get(field)
        if value is not None:
            if not isinstance(value, str):
                raise HTTPError(400, f"`{field}` must be a string")
            lines.append(f"{field.upper()} {quote(value)}")
    messages = [] if body.get("messages") is None else body["messages"]
    if not isinstance(messages, list):
        raise HTTPError(400, "`messages` must be a list")
    for m in messages:  # a content not sent (or null) is "", as Go decodes it into Ollama's api.Message
        content = m.get("content") if isinstance(m, dict) and m.get("content") is not None else ""
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(content, str):
            raise HTTPError(400, "each of `messages` must have a `role` and a `content` string")
        lines.append(f"MESSAGE {m['role']} {quote(content)}")
    return "\n".join(lines) + "\n"
