"""One test per entry of localgen/_compat.py: each checks what the patch relies on in the library (names,
signatures, behaviour) and that the library still needs it, so a new version that changes under a patch
fails here, by name, instead of somewhere deep in the CLI. The ones that import a library fresh run in a
child process."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Annotated, Any

import pytest
import typer
from typer.testing import CliRunner

from localgen import _compat

ROOT = Path(__file__).resolve().parent.parent


def child(code: str, env: dict[str, str] | None = None) -> Any:
    """Run `code` in a fresh interpreter; it prints one JSON document, returned decoded."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **(env or {})}, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


# 1. fast_typer_coercion (typer 0.29) -------------------------------------------------------------------------


def test_typer_coercion_hooks_are_where_the_patch_expects_them() -> None:
    """The names, signatures and fields the patch uses or subclasses."""
    import dataclasses

    import typer.core
    from typer import _coercion

    build = _coercion.build_runtime_param  # typer's, or the patch's where an earlier test installed it
    assert typer.core.build_runtime_param is build  # bound by name in typer.core too: the patch replaces both
    assert list(inspect.signature(build).parameters) == ["descriptor"]
    fields = {f.name for f in dataclasses.fields(_coercion.RuntimeParam)}
    assert {"parameter_info", "annotation"} <= fields
    assert list(inspect.signature(_coercion.RuntimeParam._coerce_value).parameters) == ["self", "value", "param",
                                                                                        "ctx"]
    assert {f.name for f in dataclasses.fields(_coercion.TypeDescriptor)} >= {"annotation", "parameter_info",
                                                                              "file_annotation"}
    info = typer.models.OptionInfo()
    for name in (*_compat._TYPER_OWN, "min", "max", "clamp", "exists", "dir_okay", "file_okay", "readable",
                 "writable", "resolve_path"):
        assert hasattr(info, name), name
    assert not any(getattr(info, k) for k in _compat._TYPER_OWN)  # off by default: the fast path applies


APP = """
from pathlib import Path
from typing import Annotated
import json, sys, typer
from localgen import _compat
if sys.argv[1] == "patched":
    _compat.fast_typer_coercion()
app = typer.Typer()
@app.command()
def go(n: Annotated[int, typer.Option(min=1, max=9)] = 1, x: float = 0.5, on: bool = False,
       p: Annotated[list[Path] | None, typer.Option()] = None, s: str = "") -> None:
    print(json.dumps({"n": n, "x": x, "on": on, "p": [str(q) for q in p or []], "s": s}))
try:
    app(["--n", "3", "--x", "2", "--on", "--p", "a", "--p", "b", "--s", "t"], standalone_mode=False)
finally:
    print(json.dumps({"pydantic": "pydantic" in sys.modules}))
"""


def test_typer_coercion_patch_keeps_pydantic_out_and_typer_still_needs_it(tmp_path: Path) -> None:
    """Patched, plain options coerce as typer would without importing pydantic; unpatched, typer imports it
    (the day it does not, the patch can go)."""
    script = tmp_path / "app.py"
    script.write_text(APP)
    for mode, pydantic in (("patched", False), ("unpatched", True)):
        done = subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True, cwd=ROOT,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        values, flags = (json.loads(line) for line in done.stdout.splitlines())
        assert values == {"n": 3, "x": 2.0, "on": True, "p": ["a", "b"], "s": "t"}, mode
        assert flags == {"pydantic": pydantic}, mode


def test_typer_coercion_patch_checks_ranges_as_typer_does() -> None:
    _compat.fast_typer_coercion()
    app = typer.Typer()

    @app.command()
    def go(n: Annotated[int, typer.Option(min=1, max=9)] = 1, x: float = 0.5) -> None:
        print(n, x)

    runner = CliRunner()
    ok = runner.invoke(app, ["--n", "9", "--x", "1e3"])
    assert (ok.exit_code, ok.stdout.strip()) == (0, "9 1000.0")
    for args, needle in ((["--n", "10"], "10 is not in the range 1<=x<=9"), (["--n", "two"], "not a valid integer"),
                         (["--x", "nan"], "not a finite number")):
        bad = runner.invoke(app, args)
        assert bad.exit_code == 2 and needle in bad.output, (args, bad.output)


# 2. flash_attn_argv (typer 0.29) -----------------------------------------------------------------------------


def _fa_app() -> typer.Typer:
    app = typer.Typer()

    @app.command()
    def run(flash_attn: Annotated[str | None, typer.Option("--flash-attn", "-fa")] = None,
            prompt: Annotated[str | None, typer.Option("-p")] = None) -> None:
        print(json.dumps([flash_attn, prompt]))

    return app


def test_typer_options_still_cannot_take_an_optional_value() -> None:
    """What the rewrite works around: a bare -fa at the end is an error, and before another option it takes
    that option as its value. If typer learns optional values, this fails and the rewrite can go."""
    runner = CliRunner()
    bare = runner.invoke(_fa_app(), ["-fa"])
    assert bare.exit_code == 2 and "requires an argument" in bare.output
    swallowed = runner.invoke(_fa_app(), ["-fa", "-p", "x"])
    assert swallowed.exit_code == 2 or json.loads(swallowed.stdout) == ["-p", None]
    assert "flag_value" in inspect.signature(typer.Option).parameters  # still there, documented as not working


def test_flash_attn_argv_gives_typer_one_word_it_parses() -> None:
    runner = CliRunner()
    for argv, want in ((["run", "-fa", "-p", "x"], ["on", "x"]), (["run", "-fa", "off", "-p", "x"], ["off", "x"]),
                       (["run", "-p", "x", "--flash-attn", "auto"], ["auto", "x"]), (["run", "-fa=on"], ["on", None])):
        done = runner.invoke(_fa_app(), _compat.flash_attn_argv(argv)[1:])
        assert done.exit_code == 0, (argv, done.output)
        assert json.loads(done.stdout) == want, argv
    assert _compat.flash_attn_argv(["bench", "-fa", "0,1"]) == ["bench", "-fa", "0,1"]
    assert _compat.flash_attn_argv(["run", "--", "-fa"]) == ["run", "--", "-fa"]
    # a misspelt value is the value (its error names it), not the prompt ("give the prompt once", with -p); a
    # prompt's word after a bare -fa stays the prompt
    assert _compat.flash_attn_argv(["run", "-fa", "onn", "-p", "x"]) == ["run", "--flash-attn=onn", "-p", "x"]
    assert _compat.flash_attn_argv(["run", "-fa", "atuo"]) == ["run", "--flash-attn=atuo"]
    assert _compat.flash_attn_argv(["run", "-fa", "of", "mice"]) == ["run", "--flash-attn=on", "of", "mice"]
    assert _compat.flash_attn_argv(["run", "-fa", "Hello"]) == ["run", "--flash-attn=on", "Hello"]


# given() in cli/options/__init__.py: public API only, but it relies on this behaviour ---------------------------------


def test_parameter_source_names_what_given_reads() -> None:
    """CommandArgs.given() reads ctx.get_parameter_source(name).name: DEFAULT for a default, something else for a
    value from the command line or an environment variable, None for no such parameter."""
    seen: dict[str, Any] = {}
    app = typer.Typer()

    @app.command()
    def go(ctx: typer.Context, a: int = 1, b: int = 2, c: Annotated[int, typer.Option(envvar="COMPAT_C")] = 3) -> None:
        seen.update({k: getattr(ctx.get_parameter_source(k), "name", None) for k in ("a", "b", "c", "nope")})

    done = CliRunner().invoke(app, ["--a", "1"], env={"COMPAT_C": "4"})
    assert done.exit_code == 0, done.output
    assert seen == {"a": "COMMANDLINE", "b": "DEFAULT", "c": "ENVIRONMENT", "nope": None}


# 3. llama_cpp_ctypes_layer and 4. bindings_function (llama-cpp-python 0.3.x) -----------------------------------


@pytest.mark.slow  # a child process (child())
def test_llama_cpp_stand_in_has_the_declarations_without_the_high_level_modules() -> None:
    got = child("""
        import importlib.metadata, json, sys, ctypes
        from localgen import _compat
        lc = _compat.llama_cpp_ctypes_layer()
        light = sorted(m for m in ("llama_cpp.llama", "llama_cpp.llama_chat_format", "numpy", "jinja2")
                       if m in sys.modules)
        fresh = _compat.bindings_function(lc, "llama_get_logits_ith")
        out = {
            "light": light,
            "names": all(callable(getattr(lc, n)) for n in ("llama_backend_init", "llama_model_load_from_file",
                                                           "llama_init_from_model", "llama_decode",
                                                           "llama_get_logits_ith", "llama_log_set")),
            "version": lc.__version__ == importlib.metadata.version("llama-cpp-python"),
            "cdll": isinstance(lc._lib, ctypes.CDLL),
            "fresh": fresh is not _compat.bindings_function(lc, "llama_get_logits_ith")
                     and fresh is not lc.llama_get_logits_ith,
            "llama": lc.Llama.__module__,
        }
        print(json.dumps(out))
    """)
    assert got == {"light": [], "names": True, "version": True, "cdll": True, "fresh": True,
                   "llama": "llama_cpp.llama"}


def test_llama_cpp_version_line_is_where_bindings_version_reads_it() -> None:
    import importlib.metadata
    import re

    init_py = _compat.llama_cpp_ctypes_layer().__file__  # the stand-in (or the real package) keeps __init__'s path
    assert init_py is not None and Path(init_py).name == "__init__.py"
    text = Path(init_py).read_text(encoding="utf-8")
    assert re.search(r"^__version__ = [\"']([^\"']+)", text, re.M)  # else a slower fallback, still right
    assert _compat.bindings_version(init_py) == importlib.metadata.version("llama-cpp-python")


# 5. sqlite_utils_module (sqlite-utils 4.2) ---------------------------------------------------------------------

FAKE_PANDAS = "class Timestamp:\n    pass\n"


@pytest.mark.slow  # a child process (child())
@pytest.mark.parametrize("patched", [True, False])
def test_sqlite_utils_imports_pandas_unless_patched(tmp_path: Path, patched: bool) -> None:
    """Unpatched, sqlite_utils imports pandas as it loads (the day it stops, the patch can go); patched, it
    does not, sqlite_utils still works, and `import pandas` works again afterwards."""
    (tmp_path / "pandas").mkdir()
    (tmp_path / "pandas" / "__init__.py").write_text(FAKE_PANDAS)
    got = child(f"""
        import json, sys
        from localgen import _compat
        if {patched}:
            su = _compat.sqlite_utils_module()
        else:
            import sqlite_utils as su
        loaded = "pandas" in sys.modules
        db = su.Database(memory=True)
        db["t"].insert({{"a": 1}})
        import pandas
        print(json.dumps({{"rows": db["t"].count, "loaded": loaded, "later": hasattr(pandas, "Timestamp")}}))
    """, env={"PYTHONPATH": str(tmp_path)})
    assert got == {"rows": 1, "loaded": not patched, "later": True}


# 6. httpx_transport (httpx 0.28, httpcore 1.0) -----------------------------------------------------------------


def test_httpx_transport_still_needs_its_pool_replaced() -> None:
    """HTTPTransport takes no network backend (when it does, pass ours and drop the patch) and keeps its
    connections in `_pool`, an httpcore.ConnectionPool, which takes one."""
    import httpcore
    import httpx

    assert "network_backend" not in inspect.signature(httpx.HTTPTransport).parameters
    assert isinstance(httpx.HTTPTransport()._pool, httpcore.ConnectionPool)
    assert {"ssl_context", "network_backend"} <= set(inspect.signature(httpcore.ConnectionPool).parameters)


def test_httpx_transport_connects_through_the_given_backend() -> None:
    import http.server
    import ssl
    import threading

    import httpcore
    import httpx

    class Quiet(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: Any) -> None:
            pass

    class Recording(httpcore.SyncBackend):
        def __init__(self) -> None:
            self.hosts: list[str] = []

        def connect_tcp(self, host: str, port: int, *args: Any, **kw: Any) -> Any:
            self.hosts.append(f"{host}:{port}")
            return super().connect_tcp(host, port, *args, **kw)

    server = http.server.HTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    backend = Recording()
    try:
        with httpx.Client(transport=_compat.httpx_transport(ssl.create_default_context(), backend)) as client:
            reply = client.get(f"http://127.0.0.1:{server.server_port}/")
    finally:
        server.shutdown()
        server.server_close()
    assert (reply.status_code, reply.text) == (200, "ok")
    assert backend.hosts == [f"127.0.0.1:{server.server_port}"]


# 7. schema_converter_class (llama-cpp-python 0.3.x) -----------------------------------------------------------


def test_the_bindings_converter_still_leaves_backslashes_unescaped() -> None:
    """The bindings' _format_literal escapes `"` but not `\\` (when it does both, drop the subclass); every
    literal of JSON text goes through it, so the subclass's own makes a JSON-escaped quote a GBNF one."""
    from localgen.native.lib import lib

    lib()
    from llama_cpp.llama_grammar import SchemaConverter

    theirs = SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    assert theirs._format_literal(json.dumps('"q')) == '"\\"\\\\"q\\""', "a backslash left bare ends the literal"
    ours = _compat.schema_converter_class()(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    assert ours._format_literal(json.dumps('"q\t')) == '"\\"\\\\\\"q\\\\t\\""'
