"""What the shared flags that name files or texts mean, read and checked before anything loads: the chat
template and projector over a model (--chat-template-file, --mmproj), and the grammar an answer must follow
(--grammar, -j/--json-schema, -jf/--json-schema-file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from localgen.cli.options import OutputFormat


def with_template(ref: Any, proj: Path | None, path: Path | None) -> Any:
    """The model with --chat-template-file's template (`path`) in place of its own, and --mmproj's projector
    (`proj`, checked against the model's width from the two headers, before anything loads)."""
    import dataclasses

    if proj is not None:
        from localgen.models import mmproj

        ref = mmproj.attach(ref, str(proj))
    if path is None:
        return ref
    from localgen.errors import UsageError
    from localgen.text import MAX_PROMPT_TEXT, read_file

    try:
        text = read_file(path, f"the chat template {path}", limit=MAX_PROMPT_TEXT)
    except OSError as e:
        raise UsageError(f"cannot read the chat template {path}: {e}") from None
    if not text.strip():
        raise UsageError(f"the chat template file {path} is empty")
    if "messages" not in text:  # every chat template loops over the conversation; this would drop it
        raise UsageError(f"the chat template file {path} never reads `messages`, so the conversation would not "
                         "reach the model: is it a Jinja chat template?")
    from localgen.engine.template import ChatTemplate
    from localgen.errors import TemplateError

    try:  # compiled now: its faults are the file's (they said "the model's chat template is broken", after the load)
        ChatTemplate(text, "", "")
    except TemplateError as e:
        raise UsageError(e.message.replace("the model's chat template", f"the chat template file {path}"),
                         hint="fix the file, or leave --chat-template-file out") from None
    return dataclasses.replace(ref, summary=dataclasses.replace(ref.summary, chat_template=text))


def _is_json(text: str) -> bool:
    import json

    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def output_grammar(out: OutputFormat) -> tuple[str | None, str | None]:
    """The GBNF grammar of --grammar, -j/--json-schema or -jf/--json-schema-file (one of them: options/plan.py checks),
    and the JSON schema it came from (a remote server takes the schema itself); (None, None) without them."""
    if out.grammar is not None:
        return _gbnf(str(out.grammar)), None
    from localgen.text import MAX_PROMPT_TEXT, read_file

    schema: str | None = None
    if out.json_schema_file:
        schema = read_file(out.json_schema_file, f"the JSON schema file {out.json_schema_file}",
                           limit=MAX_PROMPT_TEXT)
    elif out.json_schema:
        schema = out.json_schema
        if not schema.lstrip().startswith(("{", "[")) and Path(schema).expanduser().is_file():
            schema = read_file(Path(schema).expanduser(), f"the JSON schema file {schema}",
                               limit=MAX_PROMPT_TEXT)
        elif not schema.lstrip().startswith(("{", "[")) and not _is_json(schema):  # a file's name, by its looks
            from localgen.cli.inputfile import input_problem
            from localgen.errors import UsageError

            raise UsageError(f"-j/--json-schema {schema}: {input_problem(schema) or 'not a file'}, and the text is "
                             "not JSON")
    if schema is None:
        return None, None
    from localgen.engine.grammar import grammar_from_json_schema

    return grammar_from_json_schema(schema), schema


def _bounded(gbnf: str, what: str) -> str:
    """A grammar within engine/grammar.py's bound (llama.cpp parses it where Ctrl-C cannot reach); past it, a
    usage error naming the bound."""
    from localgen.engine.grammar import check_grammar_size

    check_grammar_size(gbnf, what)
    return gbnf


def _gbnf(value: str) -> str:
    """--grammar's GBNF: the file it names when one exists, else the value itself when it has a rule (llama.cpp
    parses it when the model loads, where a vocabulary is at hand)."""
    from localgen.errors import UsageError
    from localgen.text import MAX_PROMPT_TEXT, read_file

    if not value.strip():
        raise UsageError("--grammar is empty: give a GBNF file or the grammar itself (root ::= ...)")
    path = Path(value).expanduser()
    try:  # a file, or a pipe or device read as one (`--grammar <(make-grammar)`, /dev/stdin), as -j FILE's
        named = path.is_file() or (path.exists() and not path.is_dir() and "::=" not in value)
    except OSError:  # a grammar longer than a file's name may be ("File name too long"): no file
        named = False
    if named:
        try:
            text = read_file(path, f"the grammar file {value}", limit=MAX_PROMPT_TEXT)
        except OSError as e:
            raise UsageError(f"cannot read the grammar file {value}: {e.strerror or e}") from None
        if not text.strip():
            raise UsageError(f"the grammar file {value} is empty")
        return _bounded(text, f"the grammar file {value}")
    if "::=" in value:
        return _bounded(value, "--grammar")
    from localgen.cli.inputfile import input_problem

    raise UsageError(f"--grammar {value[:100]}: {input_problem(value) or 'not a file'}, and the text is not GBNF (a "
                     "grammar has rules, such as root ::= \"yes\" | \"no\")")
