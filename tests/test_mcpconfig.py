"""--mcp FILE.json: the MCP servers of a config file as Claude Desktop, Cursor, VS Code and llama-server write it
(docs/tools.md, "MCP servers from a config file"): each started with the env and cwd it names, or reached at
its url with its headers, labelled by its name; disabled ones left out; what the file gives its servers
redacted from results like this process's secrets; every malformed file one usage error."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

from localgen.errors import UsageError
from localgen.tools.mcpconfig import McpTarget, targets
from tests.conftest import ROOT, InProcessCLI
from tests.test_tools import mcp_over_http

SERVER = str(ROOT / "tests" / "mcp_server.py")


def _write(tmp_path: Path, doc: object, name: str = "mcp.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return str(path)


def test_a_config_file_an_editor_wrote_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    """tools.md: an mcp.json as Notepad saves it (a byte order mark, CRLF) names its servers; the mark was `not
    valid JSON at line 1, column 1`."""
    path = tmp_path / "mcp.json"
    path.write_bytes(b'\xef\xbb\xbf{"mcpServers": {"calc": {"command": "x", "args": ["1"]}}}\r\n')
    assert targets([str(path)]) == [McpTarget("calc", argv=("x", "1"), named=True)]


def test_a_config_file_names_servers_as_the_desktop_apps_write_them(tmp_path: Path) -> None:
    path = _write(tmp_path, {"mcpServers": {
        "calc": {"command": sys.executable, "args": [SERVER], "env": {"A_TOKEN": "abcdefgh1234"}, "cwd": "/tmp"},
        "remote": {"url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer xyz12345678"}},
        "off": {"command": "never-started", "disabled": True}}})
    assert targets([path, "uvx some-server", "http://127.0.0.1:9/mcp"]) == [
        McpTarget("calc", argv=(sys.executable, SERVER), env={"A_TOKEN": "abcdefgh1234"}, cwd="/tmp", named=True),
        McpTarget("remote", url="https://mcp.example.com/mcp", headers={"Authorization": "Bearer xyz12345678"},
                  named=True),
        McpTarget("uvx some-server", argv=("uvx", "some-server")),
        McpTarget("http://127.0.0.1:9/mcp", url="http://127.0.0.1:9/mcp")]
    # VS Code's key, with its "type"
    vscode = _write(tmp_path, {"servers": {"calc": {"type": "stdio", "command": "x", "args": ["1"]}}}, "vs.json")
    assert targets([vscode]) == [McpTarget("calc", argv=("x", "1"), named=True)]
    # where Claude Desktop keeps it on a Mac: a path with a space is a file, not a command line
    spaced = tmp_path / "Application Support" / "Claude"
    spaced.mkdir(parents=True)
    (spaced / "claude_desktop_config.json").write_text(json.dumps({"mcpServers": {"calc": {"command": "x"}}}))
    assert targets([str(spaced / "claude_desktop_config.json")]) == [McpTarget("calc", argv=("x",), named=True)]


@pytest.mark.parametrize(("doc", "said"), [
    ("{not json", "not valid JSON at line 1, column 2"),
    ([1, 2], 'expected {"mcpServers"'),
    ({"mcpServers": {"a": "cmd"}}, "the server 'a' must be an object"),
    ({"mcpServers": {"a": {}}}, 'needs either "command" (with "args") or "url"'),
    ({"mcpServers": {"a": {"command": "x", "url": "http://h/"}}}, 'has both "command" and "url": give one'),
    ({"mcpServers": {"a": {"command": "x", "disabled": "yes"}}}, "its disabled must be true or false"),  # it ran
    ({"mcpServers": {"a": {"command": "x", "args": "one two"}}}, "args must be a list of strings"),
    ({"mcpServers": {"a": {"command": "x", "env": {"K": ["v"]}}}}, "env must map names to strings"),
    # the red team's [1] started `python 1`; numbers, true and a list for a map were taken as strings or nothing
    ({"mcpServers": {"a": {"command": "python", "args": [1]}}}, "the server 'a': its args must be a list of strings"),
    ({"mcpServers": {"a": {"command": "x", "args": [True]}}}, "args must be a list of strings"),
    ({"mcpServers": {"a": {"command": "x", "env": {"PORT": 8080}}}}, "env must map names to strings"),
    ({"mcpServers": {"a": {"command": "x", "env": []}}}, "env must map names to strings"),
    ({"mcpServers": {"a": {"url": "http://h/", "headers": {"X": 1}}}}, "headers must map names to strings"),
    ({"mcpServers": {"a": {"url": "http://h/", "headers": ""}}}, "headers must map names to strings"),
    ({"mcpServers": {"a": {"command": ["python", "s.py"]}}}, "the server 'a': its command must be a string"),
    ({"mcpServers": {"a": {"command": "x", "cwd": 1}}}, "cwd must be a string"),
    ({"mcpServers": {"a": {"url": 5}}}, "url that is not http(s)"),
    ({"mcpServers": {"a": {"url": "ftp://h/"}}}, "url that is not http(s)"),
    ({"mcpServers": {"a": {"type": "sse", "url": "http://h/sse"}}}, "old SSE transport"),
    # a URL that cannot be one is refused as --endpoint's (it was a traceback: urlsplit's ValueError)
    ({"mcpServers": {"a": {"url": "http://[::1/mcp"}}}, "the server 'a': 'http://[::1/mcp' is not a valid URL"),
    ({"mcpServers": {"a": {"url": "http://h:99999/mcp"}}}, "the server 'a' http://h:99999/mcp: the port must be 1"),
    ({"mcpServers": {"a": {"command": "x", "disabled": True}}}, "names no server"),
])
def test_a_malformed_config_file_is_one_usage_error(tmp_path: Path, doc: object, said: str) -> None:
    with pytest.raises(UsageError) as e:
        targets([_write(tmp_path, doc)])
    assert said in e.value.message and e.value.message.startswith("--mcp "), e.value.message


@pytest.mark.parametrize(("url", "said"), [
    ("http://[::1/mcp", "--mcp: 'http://[::1/mcp' is not a valid URL (invalid IPv6 URL)"),
    ("http://host:abc/mcp", "--mcp http://host:abc/mcp: the port must be 1 to 65535"),
    ("http://h:99999/mcp", "--mcp http://h:99999/mcp: the port must be 1 to 65535"),
    ("http://h:0/mcp", "--mcp http://h:0/mcp: the port must be 1 to 65535"),
    ("http://:0/mcp", "--mcp http://:0/mcp: the port must be 1 to 65535"),
    ("http://a..b/mcp", "--mcp: 'http://a..b/mcp' has a host name with an empty label"),
    ("http:///mcp", "--mcp: 'http:///mcp' has no valid host name"),  # it said "needs an http:// or https:// URL"
    ("http://u:secret@[::1/mcp", "--mcp: 'http://***@[::1/mcp' is not a valid URL"),
])
def test_an_mcp_url_that_cannot_be_one_is_a_usage_error(cli_in_process: InProcessCLI, tmp_path: Path, url: str,
                                                         said: str) -> None:
    """As --endpoint's (docs/remote.md): one line, exit 2, before anything loads, never its password (each was a
    traceback from urlsplit or the IDNA codec, in run, chat and serve alike)."""
    missing = str(tmp_path / "missing.gguf")
    for args in (("run", "-m", missing, "--mcp", url, "--yes", "Go."), ("serve", "--port", "9", "--mcp", url)):
        r = cli_in_process(*args)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and said in r.stderr, r.stderr
        assert "secret" not in r.stderr and "missing.gguf" not in r.stderr


@pytest.mark.parametrize("url", ["http://[::1/x", "http://[zz]:80/x", "http://h:abc/x", "http://h:99999/x",
                                 "http://h:0/x", "http://a..b/x", "http://a b/x", "http://u:secret@[::1/x"])
def test_mcp_and_endpoint_refuse_a_url_in_the_same_words(url: str) -> None:
    """One check for a URL wherever it is typed: `--mcp` and `--endpoint` said the same fault two ways (a port of
    letters was Python's "port could not be cast to integer value" for one, "the port must be 1 to 65535" for the
    other)."""
    from localgen.remote.endpoints import base_url

    with pytest.raises(UsageError) as by_mcp:
        targets([url])
    with pytest.raises(UsageError) as by_endpoint:
        base_url(url)
    assert by_mcp.value.message.removeprefix("--mcp") == by_endpoint.value.message.removeprefix("--endpoint")
    assert "secret" not in by_mcp.value.message


def test_an_unreachable_mcp_urls_password_and_query_stay_out_of_its_error(cli_in_process: InProcessCLI,
                                                                           tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for url, shown in ((f"http://u:secret@127.0.0.1:{port}/mcp", f"http://***@127.0.0.1:{port}/mcp"),
                       (f"http://127.0.0.1:{port}/mcp?token=secret", f"http://127.0.0.1:{port}/mcp?***")):
        r = cli_in_process("run", "-m", str(tmp_path / "missing.gguf"), "--mcp", url, "--yes", "Go.")
        assert r.returncode == 1 and f"cannot reach the MCP server {shown}: " in r.stderr, r.stderr
        assert "secret" not in r.stderr


def test_run_refuses_a_bad_config_file_before_the_model_loads(cli_in_process: InProcessCLI, tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.gguf")
    for value, said in ((str(tmp_path / "none.json"), "no such file"),
                        (_write(tmp_path, "{"), "not valid JSON"),
                        (_write(tmp_path, {"mcpServers": {"s": {"command": "python", "args": [1]}}}, "args.json"),
                         "the server 's': its args must be a list of strings")):
        r = cli_in_process("run", "-m", missing, "--mcp", value, "--yes", "Go.")
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and said in r.stderr, r.stderr
        assert "missing.gguf" not in r.stderr


def test_the_docs_config_file_works_as_written_and_a_url_that_fails_is_named_by_its_key(
        cli_in_process: InProcessCLI, tmp_path: Path) -> None:
    """docs/tools.md's mcp.json, copied as it is (`python` and the server's path made this interpreter and an
    absolute path), starts: its placeholder remote server is disabled. Enabled, its URL reaches nothing, and the
    error names the server by its key (and the URL)."""
    import re
    import socket

    text = (ROOT / "docs" / "tools.md").read_text(encoding="utf-8")
    block = re.search(r"```json\n(\{\"mcpServers\".*?)```", text, re.S)
    assert block is not None
    doc = json.loads(block[1])
    doc["mcpServers"]["calc"].update(command=sys.executable, args=[SERVER])
    missing = str(tmp_path / "missing.gguf")
    r = cli_in_process("run", "-m", missing, "--mcp", _write(tmp_path, doc), "--yes", "--tool-choice", "nosuch",
                       "Go.")
    assert r.returncode == 1 and "--tool-choice names 'nosuch', which is none of the tools" in r.stderr, r.stderr
    with socket.socket() as s:  # a port where nothing listens
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/mcp"
    doc = {"mcpServers": {"github": {"url": url}}}
    r = cli_in_process("run", "-m", missing, "--mcp", _write(tmp_path, doc, "on.json"), "--yes", "Go.")
    assert (r.returncode, r.stderr) == (1, f"localgen: error: cannot reach the MCP server github ({url}): "
                                           "Connection refused\n")


def test_a_config_files_servers_start_with_their_env_and_its_secrets_are_redacted(tmp_path: Path) -> None:
    from localgen.tools.loop import Toolbox
    from localgen.tools.spec import ToolCall

    path = _write(tmp_path, {"mcpServers": {"calc": {"command": sys.executable, "args": [SERVER],
                                                     "env": {"TEST_API_TOKEN": "given-by-the-file-123"}}}})
    box = Toolbox.open([], [path])
    try:
        assert box.source("add") == "mcp: calc"
        assert box.call(ToolCall("add", '{"a": 2, "b": 3}'), 30) == "5"
        # the server got the file's env (a bare --mcp server would say "unset"), and the model does not
        assert box.call(ToolCall("leak", "{}"), 30) == "token=[TEST_API_TOKEN redacted]"
    finally:
        box.close()


def test_two_servers_of_a_file_may_offer_a_tool_of_the_same_name(tmp_path: Path) -> None:
    """As Claude Desktop keeps both: the second server's is offered as server_tool, and calls reach it; two
    tools of one name elsewhere (two Python files, command lines) stay an error."""
    from localgen.errors import ToolError
    from localgen.tools.loop import Toolbox
    from localgen.tools.spec import ToolCall

    entry = {"command": sys.executable, "args": [SERVER]}
    path = _write(tmp_path, {"mcpServers": {"calc": entry, "calc 2": entry}})
    box = Toolbox.open([], [path])
    try:
        names = [s.name for s in box.specs]
        assert names[:3] == ["add", "leak", "crash"] and "calc_2_add" in names and box.source("calc_2_add") == \
            "mcp: calc 2"
        assert box.call(ToolCall("calc_2_add", '{"a": 1, "b": 1}'), 30) == "2"
    finally:
        box.close()
    with pytest.raises(ToolError, match="two tools are named 'add'"):
        Toolbox.open([], [f"{sys.executable} {SERVER}", f"{sys.executable} {SERVER}"])


def test_a_server_tool_name_taken_already_gets_a_counter(tmp_path: Path) -> None:
    """Servers `calc 2` and `calc_2` both offer `add` beside calc's: the first is calc_2_add, the second
    calc_2_add_2 (the start failed: "two tools are named 'calc_2_add'"), and a call reaches its own server."""
    from localgen.tools.loop import Toolbox
    from localgen.tools.spec import ToolCall

    entry = {"command": sys.executable, "args": [SERVER]}
    path = _write(tmp_path, {"mcpServers": {"calc": entry, "calc 2": entry, "calc_2": entry}})
    box = Toolbox.open([], [path])
    try:
        assert box.source("calc_2_add") == "mcp: calc 2" and box.source("calc_2_add_2") == "mcp: calc_2"
        assert box.call(ToolCall("calc_2_add_2", '{"a": 1, "b": 2}'), 30) == "3"
    finally:
        box.close()
    from localgen.tools.loop import _qualified

    long = "s" * 70  # two labels alike in their first 64 characters: the second's name cut, then counted
    assert _qualified(long, "add", {"s" * 64}) == "s" * 62 + "_2"


def test_the_servers_of_a_toolbox_close_at_once() -> None:
    """Each server's close may wait seconds for its process (the SDK gives one 2 s); they closed one after another,
    and serve's exit waited 18 s for ten servers stuck in calls. Three closes that each wait for the others to
    begin end only when they run at the same time."""
    import threading

    from localgen.tools.loop import Toolbox

    together = threading.Barrier(3, timeout=10)
    closed: list[str] = []

    class Stuck:
        def __init__(self, label: str) -> None:
            self.label = label

        def close(self) -> None:
            together.wait()  # broken (an error) unless all three are closing at once
            closed.append(self.label)

    box = Toolbox()
    box._servers = [Stuck("a"), Stuck("b"), Stuck("c")]
    box.close()
    assert sorted(closed) == ["a", "b", "c"] and not box._servers


def test_a_config_files_http_server_is_reached_with_its_headers(tmp_path: Path) -> None:
    from localgen.errors import ToolError
    from localgen.tools.loop import Toolbox
    from localgen.tools.spec import ToolCall

    with mcp_over_http() as port:
        path = _write(tmp_path, {"mcpServers": {"web": {"url": f"http://127.0.0.1:{port}/mcp",
                                                        "headers": {"Authorization": "Bearer secret-1234567"}}}})
        box = Toolbox.open([], [path])
        try:
            assert box.source("add") == "mcp: web"
            assert box.call(ToolCall("add", '{"a": 20, "b": 22}'), 30) == "42"
            # the header reached the server, and its value is kept from the model: whole, or its token alone
            assert box.call(ToolCall("authorization", "{}"), 30) == "[Authorization redacted]"
            with pytest.raises(ToolError) as e:  # a failure's reason that quotes the token
                box.call(ToolCall("add", '{"a": "secret-1234567", "b": 1}'), 30)
            assert "secret-1234567" not in e.value.message and "[Authorization token redacted]" in e.value.message
        finally:
            box.close()
