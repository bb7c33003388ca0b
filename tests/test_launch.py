"""`localgen launch AGENT` (docs/agents.md): fake agents, Python scripts named `claude`, `codex` and `opencode` put
first on PATH, read what launch gave them (environment, flags), ask the server with the real `anthropic` and
`openai` client libraries, print what they got as JSON and exit with a chosen status. The real CLI starts a
real `localgen serve` on SmolLM2 for them, or uses one already running."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pexpect
import pytest

from tests.conftest import ROOT, InProcessCLI
from tests.test_serve import Server
from tests.trickle import trickling

# What every fake agent reports: its argv, the server's `localgen serve` child (launch's other child: its pid,
# whether its command line holds the key, its key file and whether that is still there), the server's
# /health and /v1/models, and the answer. FAKE_WAIT: wait for a signal first, and report it.
COMMON = r'''
import json, os, signal, sys, tomllib
from pathlib import Path

def serve_child(key):
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            argv = (proc / "cmdline").read_bytes().decode().split("\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getppid() and "serve" in argv:
            kf = argv[argv.index("--api-key-file") + 1]
            folder = os.path.dirname(os.readlink(proc / "fd" / "1"))  # its log's
            fd = kf.removeprefix("/dev/fd/")
            return {"pid": int(proc.name), "argv": argv, "key_on_command_line": any(key in a for a in argv),
                    "key_file": kf, "key_in_a_pipe": fd.isdigit() and os.readlink(proc / "fd" / fd).startswith("pipe:"),
                    "folder": folder, "files": sorted(os.listdir(folder)),
                    "folder_mode": oct(os.stat(folder).st_mode & 0o777)}
    return None

def report(url, key, answer_model, text, **more):
    import httpx
    if os.environ.get("FAKE_TSTP"):  # a TUI's Ctrl-Z: it stops itself (and only itself)
        print(json.dumps({"suspending": True}), flush=True)
        os.kill(os.getpid(), signal.SIGTSTP)
        more["resumed"] = True
    auth = {"Authorization": f"Bearer {key}"}
    got = {"argv": sys.argv[1:], "url": url, "serve": serve_child(key), "model": answer_model, "text": text,
           "health": httpx.get(f"{url}/health").json(), "models": httpx.get(f"{url}/v1/models", headers=auth).json(),
           "unauthorized": httpx.get(f"{url}/v1/models").status_code,
           "ps": httpx.get(f"{url}/api/ps", headers=auth).json(), **more}
    if os.environ.get("FAKE_IGNORE"):  # an agent that a SIGTERM does not end
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print(json.dumps({"waiting": True}), flush=True)
        while True:
            signal.pause()
    if os.environ.get("FAKE_WAIT"):  # the signals that come: the first, and any in the second after it
        import time
        got["signals"] = []
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, lambda signum, frame: got["signals"].append(signum))
        print(json.dumps({"waiting": True}), flush=True)
        while not got["signals"]:
            signal.pause()
        end = time.monotonic() + 1
        while time.monotonic() < end:
            time.sleep(0.05)
        try:  # the server, after the signal
            got["health_after"] = httpx.get(f"{url}/health").status_code
        except httpx.HTTPError as e:
            got["health_after"] = repr(e)
    print(json.dumps(got), flush=True)
    if os.environ.get("FAKE_KILL"):  # an agent that a signal ends
        os.kill(os.getpid(), int(os.environ["FAKE_KILL"]))
    sys.exit(int(os.environ.get("FAKE_RC", "0")))
'''

CLAUDE = COMMON + r'''
import anthropic
m = anthropic.Anthropic().messages.create(model=os.environ["ANTHROPIC_MODEL"], max_tokens=8,
                                          messages=[{"role": "user", "content": "Say hi."}])
report(os.environ["ANTHROPIC_BASE_URL"], os.environ["ANTHROPIC_AUTH_TOKEN"], m.model, m.content[0].text,
       env={k: v for k, v in os.environ.items() if k.startswith(("ANTHROPIC_", "CLAUDE_", "AWS_"))
            or k.lower() == "no_proxy" or k == "LOCALGEN_AGENT_KEY"})
'''

CODEX = COMMON + r'''
import openai
config, rest, args = {}, [], sys.argv[1:]
while args:
    if args[0] == "-c":
        key, value = args[1].split("=", 1)
        config[key] = tomllib.loads(f"v = {value}")["v"]
        args = args[2:]
    else:
        rest.append(args.pop(0))
p = config["model_providers." + config["model_provider"] + ".base_url"].removesuffix("/v1")
provider = {k.rsplit(".", 1)[1]: v for k, v in config.items() if k.startswith("model_providers.")}
key = os.environ[provider["env_key"]]
r = openai.OpenAI(base_url=provider["base_url"], api_key=key).responses.create(
    model=config["model"], input="Say hi.", max_output_tokens=8)
report(p, key, r.model, r.output_text, rest=rest, provider=provider, config_model=config["model"], config=config)
'''

OPENCODE = COMMON + r'''
import openai
config = json.loads(os.environ["OPENCODE_CONFIG_CONTENT"])
provider_id, model = config["model"].split("/", 1)
options = config["provider"][provider_id]["options"]
r = openai.OpenAI(base_url=options["baseURL"], api_key=options["apiKey"]).chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Say hi."}], max_tokens=8)
report(options["baseURL"].removesuffix("/v1"), options["apiKey"], r.model, r.choices[0].message.content,
       npm=config["provider"][provider_id]["npm"], small_model=config["small_model"],
       enabled_providers=config["enabled_providers"])
'''

AGENTS = {"claude": CLAUDE, "codex": CODEX, "opencode": OPENCODE}
CTX = "1024"  # small: each test's server loads fast


@pytest.fixture(scope="module")
def agents_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("agents")
    for name, body in AGENTS.items():
        (d / name).write_text(f"#!{sys.executable}\n{body}", encoding="utf-8")
        (d / name).chmod(0o755)
    return d


@pytest.fixture(scope="module")
def env(cli_env: dict[str, str], agents_dir: Path) -> dict[str, str]:
    # no server at the default address counts: LOCALGEN_PORT points at a port nothing listens on
    return {**cli_env, "PATH": f"{agents_dir}{os.pathsep}{cli_env['PATH']}", "LOCALGEN_PORT": str(_free_port()),
            "ANTHROPIC_API_KEY": "sk-ant-real-key-of-the-user"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch(env: dict[str, str], *args: str, **more: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "localgen", "launch", *args], env={**env, **more}, cwd=ROOT,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600)


# launch's CLI as on another system, simulated on Linux: macOS has no sigtimedwait; Windows has neither that nor
# waitpid's flags, process groups, SIGKILL, SIGHUP, signal masks or /dev/fd, and its Popen refuses preexec_fn and
# pass_fds and takes creationflags (its own work, done here by the POSIX half, keeps its os and signal). The
# server's Popen flags go to stderr as JSON; an agent told to stop is killed after 1 s, not 10.
SIMULATED = r'''
import json, os, signal, subprocess, sys, types

def copy(module):
    c = types.ModuleType(module.__name__)
    c.__dict__.update(module.__dict__)
    return c

system = sys.argv.pop(1)
if system in ("macos", "windows"):
    del signal.sigtimedwait
if system == "windows":
    subprocess.os, subprocess.signal = copy(os), copy(signal)
    for name in ("WNOHANG", "WUNTRACED", "killpg"):
        delattr(os, name)
    for name in ("SIGKILL", "SIGHUP", "pthread_sigmask"):
        delattr(signal, name)
    subprocess.CREATE_NEW_PROCESS_GROUP = 0x200

    class Popen(subprocess.Popen):
        def __init__(self, args, *, creationflags=0, **kw):
            if kw.get("preexec_fn") is not None:
                raise ValueError("preexec_fn is not supported on Windows platforms")
            assert not kw.get("pass_fds"), "pass_fds not supported on Windows."
            if "serve" in args:
                print(json.dumps({"serve_popen": sorted(kw), "creationflags": creationflags}), file=sys.stderr)
            kw.pop("start_new_session", None)  # Windows ignores it
            super().__init__(args, **kw)

    subprocess.Popen = Popen
    import localgen.childserver
    localgen.childserver.sys = copy(sys)
    localgen.childserver.sys.platform = "win32"
    import localgen.cli.launch
    localgen.cli.launch.sys = localgen.childserver.sys
import localgen.cli.launch
localgen.cli.launch.TERM_WAIT_S = 1
from localgen.cli.main import main
sys.argv[0] = "localgen"
main()
'''


def _simulated(system: str, *args: str) -> list[str]:
    """The command line of `localgen launch ARGS` as on system: linux (as it is, the wait shortened), macos or
    windows."""
    return [sys.executable, "-c", SIMULATED, system, "launch", *args]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"  # not reaped yet


def _refused(url: str) -> bool:
    try:
        httpx.get(f"{url}/health", timeout=2)
    except httpx.ConnectError:
        return True
    return False


def _check_own_server(got: dict[str, Any], ctx: int = int(CTX)) -> None:
    """The server launch started: on loopback, not the default port, one slot, the window asked for, loaded for
    good, a key that only a pipe carried (no file holds it, and no command line) and that the server demands, its
    log in a private folder; then, stopped."""
    assert got["url"].startswith("http://127.0.0.1:") and not got["url"].endswith(":11435")
    serve = got["serve"]
    assert serve is not None and not serve["key_on_command_line"] and serve["key_in_a_pipe"]
    assert serve["folder_mode"] == "0o700" and serve["files"] == ["serve.log"]
    assert got["unauthorized"] == 401
    assert got["health"]["models"]["smollm2:135m"]["slots"] == 1
    assert [m["max_model_len"] for m in got["models"]["data"] if m["id"] == "smollm2:135m"] == [ctx]
    [loaded] = got["ps"]["models"]
    assert int(loaded["expires_at"][:4]) > time.gmtime().tm_year + 5  # --keep-alive -1: never unloaded
    assert got["model"] == "smollm2:135m" and got["text"].strip()
    assert _gone(serve["pid"]) and _refused(got["url"])
    assert not Path(serve["folder"]).exists()  # the private folder and the log in it


def _removed(agent: str) -> set[str]:
    """The variables docs/agents.md says launch removes for this agent: its bullet under the table, "launch removes
    ..." up to the sentence's end, or "nothing is removed"."""
    import re

    page = (ROOT / "docs" / "agents.md").read_text(encoding="utf-8")
    said = re.split(r"\.\s", page.split(f"- **{agent}**: ", 1)[1], maxsplit=1)[0]
    if said.startswith("nothing is removed:"):
        return set()
    assert said.startswith("launch removes "), said
    return set(re.findall(r"`([A-Z][A-Z0-9_]+)`", said))


def test_the_variables_removed_are_the_pages() -> None:
    """docs/agents.md lists what launch removes from each agent's environment: the table's lists, exactly; and
    --print-env unsets them in one line."""
    from localgen.agents import AGENTS, Endpoint, shell_lines

    assert "CLAUDE_CODE_USE_FOUNDRY" in _removed("claude") and "ANTHROPIC_BEDROCK_BASE_URL" in _removed("claude")
    for name, agent in AGENTS.items():
        unset = agent.setup(Endpoint("http://127.0.0.1:1", "k", "m")).unset
        assert set(unset) == _removed(name) and len(unset) == len(set(unset)), name
        lines = shell_lines(agent, Endpoint("http://127.0.0.1:1", "", "m"), "$K")
        assert [line for line in lines if line.startswith("unset")] == ([f"unset {' '.join(unset)}"] if unset else [])


def test_claude_gets_its_own_server_and_its_exit_status_passes_through(env: dict[str, str]) -> None:
    # every variable the page says is removed, set as a user of Bedrock, Vertex, Foundry and the rest would have it
    cloud = dict.fromkeys(_removed("claude") - {"ANTHROPIC_API_KEY"}, "1")
    cloud.update(ANTHROPIC_FOUNDRY_RESOURCE="myres", ANTHROPIC_BEDROCK_BASE_URL="https://bedrock.example",
                 ANTHROPIC_SMALL_FAST_MODEL="claude-x", ANTHROPIC_CUSTOM_HEADERS="X-Org: mine")
    r = _launch(env, "claude", "-m", "smollm2:135m", "--ctx", CTX, "--", "-p", "hi there", FAKE_RC="7", **cloud)
    assert r.returncode == 7, r.stderr
    got = json.loads(r.stdout)
    assert got["argv"][0] == "--settings" and got["argv"][2:] == ["-p", "hi there"]
    _check_own_server(got)
    e = got["env"]
    # a settings.json's "env" overrides the process's (its ANTHROPIC_BASE_URL got the conversation and the key):
    # --settings overrides it in turn, every removed variable emptied, the key from apiKeyHelper, not the argv
    settings = json.loads(got["argv"][1])
    assert settings["env"]["ANTHROPIC_BASE_URL"] == got["url"] and settings["env"]["ANTHROPIC_MODEL"] == "smollm2:135m"
    assert {k for k, v in settings["env"].items() if v == ""} == _removed("claude") | {"ANTHROPIC_AUTH_TOKEN"}
    assert settings["apiKeyHelper"] == "printenv LOCALGEN_AGENT_KEY" and e["ANTHROPIC_AUTH_TOKEN"] not in got["argv"][1]
    helped = subprocess.run(settings["apiKeyHelper"], shell=True, capture_output=True, text=True,
                            env={**os.environ, "LOCALGEN_AGENT_KEY": e["LOCALGEN_AGENT_KEY"]})
    assert helped.stdout.strip() == e["ANTHROPIC_AUTH_TOKEN"]
    assert "ANTHROPIC_API_KEY" not in e  # the user's real key is not sent to the local server
    assert not set(cloud) & set(e)  # nor the code to a cloud
    assert e["ANTHROPIC_BASE_URL"] == got["url"] and not e["ANTHROPIC_BASE_URL"].endswith("/v1")
    for name in ("ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL", "ANTHROPIC_DEFAULT_SONNET_MODEL",
                 "ANTHROPIC_DEFAULT_HAIKU_MODEL", "CLAUDE_CODE_SUBAGENT_MODEL"):
        assert e[name] == "smollm2:135m"
    assert "Traceback" not in r.stderr


def test_codex_gets_a_responses_provider_and_opencode_its_config(env: dict[str, str]) -> None:
    r = _launch(env, "codex", "-m", "smollm2:135m", "--ctx", CTX, "-ngl", "0", "--offline", "--", "exec", "fix it")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    _check_own_server(got)
    assert {"-ngl", "--offline"} <= set(got["serve"]["argv"])  # passed on to serve
    assert got["rest"] == ["exec", "fix it"] and got["config_model"] == "smollm2:135m"
    assert got["provider"]["wire_api"] == "responses" and got["provider"]["base_url"] == got["url"] + "/v1"
    assert got["provider"]["env_key"] == "LOCALGEN_AGENT_KEY"
    # no hosted web search and no sub-agents' namespace: Codex 0.171.0 sends both by default
    assert got["config"]["web_search"] == "disabled" and got["config"]["features.multi_agent"] is False
    # no -m: serve's default model; no --ctx: its trained 8,192 (less than 32,768); something else on the port
    with _other_http_server() as port:
        r = _launch(env, "opencode", LOCALGEN_PORT=str(port))
    assert r.returncode == 0, r.stderr
    assert (f"something other than localgen serve answers at http://127.0.0.1:{port}: launch starts one for the "
            "agent on another port") in r.stderr
    got = json.loads(r.stdout)
    _check_own_server(got, ctx=8192)
    assert got["npm"] == "@ai-sdk/openai-compatible"
    # no other provider, and the small model ours too: nothing goes to a cloud
    assert got["small_model"] == f"localgen/{got['model']}" and got["enabled_providers"] == ["localgen"]


@contextlib.contextmanager
def _other_http_server() -> Iterator[int]:
    """A web server that is not localgen serve (its /health a 404 page), on a free port."""
    import http.server
    import threading

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(scope="module")
def running(cli_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    key = tmp_path_factory.mktemp("key") / "key.txt"
    key.write_text("sk-running-server\n")
    s = Server(cli_env, "--api-key-file", str(key), "--ctx", "768", "-np", "2")
    yield s, key
    assert s.stop() == 0


def test_a_running_server_is_used_and_left_running(env: dict[str, str], running: tuple[Server, Path]) -> None:
    server, key = running
    r = _launch(env, "codex", "--api-key-file", str(key), LOCALGEN_PORT=str(server.port), FAKE_KILL="9")
    assert r.returncode == 128 + 9, r.stderr  # the agent ended by SIGKILL
    got = json.loads(r.stdout)
    assert got["url"] == server.url and got["serve"] is None  # no server of its own
    assert got["config_model"] == "smollm2:135m" and got["text"].strip()  # the server's default model
    assert server.health()["slots"] == 2  # still running, as it was started
    # the key from LOCALGEN_API_KEY; --ctx and -ngl cannot change a running server: said
    r = _launch(env, "claude", "--ctx", "4096", "-ngl", "0", LOCALGEN_PORT=str(server.port),
                LOCALGEN_API_KEY="sk-running-server", FAKE_RC="4")
    assert r.returncode == 4 and "--ctx, -ngl left as it has them" in r.stderr
    assert json.loads(r.stdout)["url"] == server.url
    r = _launch(env, "claude", LOCALGEN_PORT=str(server.port), LOCALGEN_API_KEY="sk-running-server",
                LOCALGEN_CTX="4096")  # a window from the environment is not a flag typed for this launch
    assert r.returncode == 0 and "left as" not in r.stderr, r.stderr
    r = _launch(env, "claude", "--ctx", "4096", "--n-gpu-layers=0", "--print-env", LOCALGEN_PORT=str(server.port),
                LOCALGEN_API_KEY="sk-running-server")  # --print-env says so too, with each flag as it was spelled
    assert r.returncode == 0 and "--ctx, --n-gpu-layers left as it has them (--own-server" in r.stderr, r.stderr
    # a key it needs and was not given; a model it does not have
    r = _launch(env, "claude", LOCALGEN_PORT=str(server.port))
    assert r.returncode == 1 and "needs an API key" in r.stderr and "--api-key-file" in r.stderr
    r = _launch(env, "claude", "-m", "no-such-model", "--api-key-file", str(key), LOCALGEN_PORT=str(server.port))
    assert r.returncode == 1 and "does not offer no-such-model" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    # --own-server: one of its own all the same
    r = _launch(env, "claude", "--own-server", "--ctx", CTX, LOCALGEN_PORT=str(server.port))
    assert r.returncode == 0, r.stderr
    _check_own_server(json.loads(r.stdout))
    assert server.health()["slots"] == 2


def test_a_running_servers_model_that_cannot_chat_is_refused_too(env: dict[str, str],
                                                                  running: tuple[Server, Path]) -> None:
    """agents.md: the refusal holds for a server already running, as its /api/show describes the model (no
    template). The agent was started on it (its own exit status), and --print-env printed its lines, exit 0."""
    server, key = running
    for extra in ((), ("--print-env",)):
        r = _launch(env, "codex", "-m", "gemma3:270m", "--api-key-file", str(key), *extra,
                    LOCALGEN_PORT=str(server.port), FAKE_RC="7")
        assert r.returncode == 2 and not r.stdout, r.stderr
        assert r.stderr.startswith("localgen: error: gemma3:270m has no chat template (it may be a base model), "
                                   "which codex needs"), r.stderr
    assert server.health()["slots"] == 2  # left running


def test_a_remote_model_is_refused_to_the_agents_it_cannot_reach(env: dict[str, str], cli_env: dict[str, str],
                                                                 tmp_path: Path) -> None:
    """A model a running server fronts for another (serve --endpoint; tests/fake_openai.py's `plain`): only chat
    completions reach it, so claude and codex are refused it, as a model the server does not offer, before the
    agent starts; opencode takes it."""
    from tests.fake_openai import FakeServer

    key = tmp_path / "key.txt"
    key.write_text("sk-front\n")
    upstream = FakeServer()
    server = Server(cli_env, "--api-key-file", str(key), "--endpoint", f"{upstream.url}/v1")
    try:
        for agent, route in (("claude", "/v1/messages"), ("codex", "/v1/responses")):
            for more in ((), ("--print-env",)):
                r = _launch(env, agent, "-m", "plain", "--api-key-file", str(key), *more,
                            LOCALGEN_PORT=str(server.port))
                assert r.returncode == 1 and not r.stdout, (r.stdout, r.stderr)
                assert f"does not offer plain on {route}, which {agent} uses: it runs on" in r.stderr
                assert "localgen launch opencode" in r.stderr and len(r.stderr.strip().splitlines()) == 1
        r = _launch(env, "opencode", "-m", "plain", "--api-key-file", str(key), "--print-env",
                    LOCALGEN_PORT=str(server.port))
        assert r.returncode == 0 and '\\"model\\": \\"localgen/plain\\"' in r.stdout, (r.stdout, r.stderr)
    finally:
        assert server.stop() == 0
        upstream.stop()


def test_an_agent_is_killed_10_s_after_a_sigterm_it_did_not_end_on() -> None:
    """agents.md: an agent that a SIGTERM or SIGHUP has not ended after 10 seconds is killed (the test below runs
    the simulated agents with 1 s)."""
    import localgen.cli.launch

    assert localgen.cli.launch.TERM_WAIT_S == 10


@pytest.mark.parametrize("system", ["linux", "macos", "windows"])
def test_an_agent_that_a_sigterm_does_not_end_is_killed(env: dict[str, str], running: tuple[Server, Path],
                                                         system: str) -> None:
    """On every system (macOS and Windows have no sigtimedwait: signal handlers pass the signal on; before, nothing
    killed the agent there, and launch, the agent and a server it started ran on)."""
    server, key = running
    p = subprocess.Popen(_simulated(system, "claude", "--api-key-file", str(key)), cwd=ROOT,
                         env={**env, "FAKE_IGNORE": "1", "LOCALGEN_PORT": str(server.port)}, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert p.stdout is not None
        assert json.loads(p.stdout.readline()) == {"waiting": True}
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
        assert p.returncode == 128 + signal.SIGKILL, err
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)  # launch and its agent, had they run on
        p.wait()


def _grouped(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run argv in a session of its own, and kill the whole group after it, however the test ends: the simulated
    Windows server has no parent-death signal and shares launch's group, so a failure would orphan it."""
    p = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=240)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


def test_launch_on_windows(env: dict[str, str], running: tuple[Server, Path]) -> None:
    """Windows, simulated: the server launch starts is a process group of its own (no preexec_fn, no session), its
    key in a file deleted once it answers, and stopped once the agent ends; a running server is used as on Linux
    (before: launch ended at once in a traceback on os.WNOHANG, leaving the agent running; the server it would
    start, at preexec_fn)."""
    r = _grouped(_simulated("windows", "claude", "--ctx", CTX), {**env, "FAKE_RC": "7"})
    assert r.returncode == 7 and "Traceback" not in r.stderr, r.stderr
    [popen] = [json.loads(line) for line in r.stderr.splitlines() if line.startswith('{"serve_popen"')]
    assert popen == {"serve_popen": ["env", "stderr", "stdin", "stdout"], "creationflags": 0x200}
    got = json.loads(r.stdout)
    serve = got["serve"]
    assert serve["key_file"] == os.path.join(serve["folder"], "key") and not serve["key_on_command_line"]
    assert serve["files"] == ["serve.log"] and serve["folder_mode"] == "0o700"  # the key's file gone
    assert got["unauthorized"] == 401 and got["model"] == "smollm2:135m" and got["text"].strip()
    assert _gone(serve["pid"]) and _refused(got["url"]) and not Path(serve["folder"]).exists()
    server, key = running
    r = _grouped(_simulated("windows", "codex", "--api-key-file", str(key)),
                 {**env, "LOCALGEN_PORT": str(server.port), "FAKE_RC": "4"})
    assert r.returncode == 4 and "Traceback" not in r.stderr, r.stderr
    assert json.loads(r.stdout)["url"] == server.url and server.health()["slots"] == 2


def test_a_proxy_in_the_environment_is_not_asked_for_this_machine(env: dict[str, str],
                                                                  running: tuple[Server, Path]) -> None:
    """docs/configuration.md: with HTTP_PROXY and the rest set (here to a port nothing listens on), requests to
    this machine go direct (launch's, ps's, run --endpoint's), as Ollama's clients send them; launch adds the
    server's host to the agent's NO_PROXY and no_proxy, keeping the user's list. (They all went to the proxy.)"""
    server, _ = running
    dead = f"http://127.0.0.1:{_free_port()}"
    proxied = dict.fromkeys(("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"), dead)
    base = {k: v for k, v in env.items() if k.lower() != "no_proxy"}
    r = _launch(base, "claude", LOCALGEN_PORT=str(server.port), LOCALGEN_API_KEY="sk-running-server", **proxied)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["text"].strip() and got["env"]["NO_PROXY"] == got["env"]["no_proxy"] == "127.0.0.1", got["env"]
    r = _launch(base, "codex", "--print-env", LOCALGEN_PORT=str(server.port), LOCALGEN_API_KEY="sk-running-server",
                NO_PROXY="corp.example", **proxied)
    assert r.returncode == 0 and 'export NO_PROXY="corp.example,127.0.0.1"' in r.stdout.splitlines(), r.stdout
    run = subprocess.run(["bash", "-c", r.stdout], env={**base, **proxied, "NO_PROXY": "corp.example",
                                                        "LOCALGEN_API_KEY": "sk-running-server"},
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0 and json.loads(run.stdout)["text"].strip(), run.stderr
    r = _launch(base, "codex", "--print-env", LOCALGEN_PORT=str(server.port), LOCALGEN_API_KEY="sk-running-server")
    assert r.returncode == 0 and "PROXY" not in r.stdout.upper(), r.stdout  # no proxy set: no line for it
    for args in (("ps", "--port", str(server.port), "--json"),
                 ("run", "--endpoint", f"{server.url}/v1", "--api-key-env", "LOCALGEN_API_KEY", "-p", "Hi", "-n", "2")):
        r = subprocess.run([sys.executable, "-m", "localgen", *args], capture_output=True, text=True, timeout=300,
                           env={**base, **proxied, "LOCALGEN_API_KEY": "sk-running-server"}, cwd=ROOT,
                           stdin=subprocess.DEVNULL)
        assert r.returncode == 0 and r.stdout.strip(), (args, r.stderr)


def test_print_env_lines_start_the_agent_by_hand(env: dict[str, str], running: tuple[Server, Path],
                                                 tmp_path: Path) -> None:
    server, key = running
    crlf = tmp_path / "key crlf.txt"  # a key file written on Windows: serve strips the CR, and so do the lines
    crlf.write_bytes(b"sk-running-server\r\n")
    for agent in ("claude", "codex", "opencode"):
        r = _launch(env, agent, "--print-env", "--api-key-file", str(crlf), LOCALGEN_PORT=str(server.port))
        assert r.returncode == 0, r.stderr
        assert "sk-running-server" not in r.stdout and f"$(tr -d '[:space:]' < '{crlf}')" in r.stdout
        # the lines, run by a shell, start the agent on the server (the user's real key unset for claude)
        run = subprocess.run(["bash", "-c", r.stdout], env=env, capture_output=True, text=True, timeout=300,
                             cwd=tmp_path)
        assert run.returncode == 0, run.stderr
        got = json.loads(run.stdout)
        assert got["url"] == server.url and got["model"] == "smollm2:135m" and got["text"].strip()
        if agent == "claude":
            assert "ANTHROPIC_API_KEY" not in got["env"]
    # the words after -- go on the agent's command line; LOCALGEN_HOST says where the server is
    r = _launch(env, "codex", "--print-env", "--", "exec", "fix it", LOCALGEN_HOST=f"http://localhost:{server.port}",
                LOCALGEN_API_KEY="sk-running-server")
    assert r.returncode == 0 and f"http://localhost:{server.port}/v1" in r.stdout, r.stderr
    run = subprocess.run(["bash", "-c", r.stdout], env={**env, "LOCALGEN_API_KEY": "sk-running-server"},
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["rest"] == ["exec", "fix it"]
    # a key that the shell would put into OpenCode's JSON as it is, breaking it
    r = _launch(env, "opencode", "--print-env", LOCALGEN_PORT=str(server.port), LOCALGEN_API_KEY='sk"x')
    assert r.returncode == 2 and 'the API key has " or \\ inside' in r.stderr and not r.stdout
    assert r.stderr.count("\n") == 1
    # the page's example, as it prints it
    r = _launch(env, "codex", "-m", "smollm2:135m", "--print-env", "--api-key-file", str(key),
                LOCALGEN_PORT=str(server.port))
    page = (ROOT / "docs" / "agents.md").read_text(encoding="utf-8")
    shown = page.split("--print-env --api-key-file key.txt\n```\n\n```text\n", 1)[1].split("```", 1)[0]
    assert r.stdout == (shown.replace("qwen2.5-coder:7b", "smollm2:135m").replace(":11435", f":{server.port}")
                        .replace("/home/me/key.txt", str(key)))
    # the key from LOCALGEN_API_KEY: as $LOCALGEN_API_KEY
    r = _launch(env, "claude", "--print-env", LOCALGEN_PORT=str(server.port), LOCALGEN_API_KEY="sk-running-server")
    assert r.returncode == 0 and 'ANTHROPIC_AUTH_TOKEN="$LOCALGEN_API_KEY"' in r.stdout
    assert "sk-running-server" not in r.stdout
    run = subprocess.run(["bash", "-c", r.stdout], env={**env, "LOCALGEN_API_KEY": "sk-running-server"},
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0 and json.loads(run.stdout)["url"] == server.url, run.stderr
    assert "not on PATH" not in r.stderr
    # the agent not on PATH: the lines all the same (for a shell where it is), and one warning that says how to
    # install it, as launch without --print-env says in its error
    for agent, install in (("codex", "Codex: npm install -g @openai/codex"),
                           ("opencode", "OpenCode: npm install -g opencode-ai")):
        r = _launch(env, agent, "--print-env", "--api-key-file", str(key), LOCALGEN_PORT=str(server.port),
                    PATH=env["PATH"].split(os.pathsep, 1)[1])  # without the fake agents' folder
        assert r.returncode == 0 and r.stdout.splitlines()[-1].split()[0] == agent, (r.stdout, r.stderr)
        assert r.stderr == f"warning: {agent} is not on PATH (install {install})\n", r.stderr
    r = _launch(env, "claude", "--print-env")  # nothing runs at LOCALGEN_PORT
    assert r.returncode == 1 and "no localgen serve is running" in r.stderr and not r.stdout
    # a key file named as the shell running the lines later finds it: absolute, ~ expanded (a quoted ~ reaches
    # launch as it is); one it could not open then (a process substitution's pipe) is refused
    (tmp_path / "k.txt").write_text("sk-running-server\n")
    for given in ("~/k.txt", "k.txt"):
        r = subprocess.run([sys.executable, "-m", "localgen", "launch", "codex", "--print-env", "--api-key-file",
                            given], env={**env, "HOME": str(tmp_path), "LOCALGEN_PORT": str(server.port)},
                           cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and f"< {tmp_path}/k.txt)" in r.stdout, (r.stdout, r.stderr)
        run = subprocess.run(["bash", "-c", r.stdout], env=env, capture_output=True, text=True, timeout=300,
                             cwd=ROOT)  # another folder, another HOME
        assert run.returncode == 0 and json.loads(run.stdout)["url"] == server.url, run.stderr
    script = (f'{shlex.quote(sys.executable)} -m localgen launch codex --print-env --port {server.port} '
              f'--api-key-file <(cat {shlex.quote(str(key))})')
    r = subprocess.run(["bash", "-c", script], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and not r.stdout and r.stderr.count("\n") == 1, (r.stdout, r.stderr)
    assert "--print-env: the API key file /dev/fd/" in r.stderr and "is not a file that the shell" in r.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_to_launch_goes_to_the_agent_then_the_server_stops(env: dict[str, str], sig: int) -> None:
    p = subprocess.Popen([sys.executable, "-m", "localgen", "launch", "claude", "--ctx", CTX], cwd=ROOT,
                         env={**env, "FAKE_WAIT": "1", "FAKE_RC": "5"}, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    assert json.loads(p.stdout.readline()) == {"waiting": True}
    p.send_signal(sig)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 5, err
    got = json.loads(out)
    assert got["signals"] == [sig]
    _check_own_server(got)


def test_a_stopped_and_continued_launch_goes_on(env: dict[str, str], running: tuple[Server, Path]) -> None:
    """SIGSTOP then SIGCONT (Ctrl-Z, then fg) to launch and the agent: both go on, and the agent's status comes
    through (CPython 3.11's sigtimedwait, cut short by a SIGCONT, made up a signal: launch died, the agent killed)."""
    server, key = running
    p = subprocess.Popen([sys.executable, "-m", "localgen", "launch", "claude", "--api-key-file", str(key)],
                         cwd=ROOT, env={**env, "FAKE_WAIT": "1", "FAKE_RC": "5", "LOCALGEN_PORT": str(server.port)},
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    assert p.stdout is not None
    assert json.loads(p.stdout.readline()) == {"waiting": True}
    for _ in range(3):
        os.killpg(p.pid, signal.SIGSTOP)
        time.sleep(0.5)  # longer than any wait launch makes for a signal
        os.killpg(p.pid, signal.SIGCONT)
        time.sleep(0.3)
    assert p.poll() is None
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 5 and "Traceback" not in err, err
    assert json.loads(out)["signals"] == [signal.SIGTERM]


def test_an_agent_that_stops_itself_stops_launch_and_fg_continues_both(env: dict[str, str],
                                                                       running: tuple[Server, Path]) -> None:
    """A TUI's Ctrl-Z stops the agent alone (SIGTSTP to itself): launch stops too, so the shell says "Stopped"
    and takes the terminal back; `fg` continues launch, which continues the agent."""
    server, key = running
    shell = pexpect.spawn("bash", ["--norc", "--noprofile", "-i"], cwd=str(ROOT), encoding="utf-8", timeout=120,
                          env={**env, "PS1": "$ ", "FAKE_TSTP": "1", "FAKE_RC": "3", "LOCALGEN_PORT": str(server.port)})
    try:
        shell.expect_exact("$ ")
        shell.sendline(f"{sys.executable} -m localgen launch claude --api-key-file {key}")
        shell.expect_exact('{"suspending": true}')
        shell.expect("Stopped", timeout=60)  # the shell has the terminal back
        shell.expect_exact("$ ")
        shell.sendline("fg")
        shell.expect(r'\{"argv".*\}\r\n')
        got = json.loads(shell.after)
        assert got["resumed"] and got["url"] == server.url
        shell.expect_exact("$ ")
        shell.sendline("echo status=$?")
        shell.expect(r"status=(\d+)")
        assert shell.match[1] == "3"
    finally:
        shell.close(force=True)


def _children(pid: int) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(proc.name))
        except (OSError, ValueError):
            continue
    return found


def test_a_killed_launch_leaves_no_server_and_no_agent(env: dict[str, str]) -> None:
    """SIGKILL cannot be caught: the server, told at its start to end with its parent (Linux), ends anyway; so does
    the agent, told the same (it ran on, an orphan talking to a server that was gone)."""
    p = subprocess.Popen([sys.executable, "-m", "localgen", "launch", "claude", "--ctx", CTX], cwd=ROOT,
                         env={**env, "FAKE_WAIT": "1"}, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    assert p.stdout is not None
    assert json.loads(p.stdout.readline()) == {"waiting": True}
    children = _children(p.pid)
    assert len(children) == 2  # the server and the agent
    folder = next(Path(os.readlink(f"/proc/{c}/fd/1")).parent for c in children  # the server's log's
                  if b"serve" in Path(f"/proc/{c}/cmdline").read_bytes().split(b"\0"))
    p.kill()
    p.wait()
    try:
        deadline = time.monotonic() + 120
        while not all(_gone(c) or b"serve" not in Path(f"/proc/{c}/cmdline").read_bytes() for c in children):
            assert time.monotonic() < deadline, "the server outlived launch"
            time.sleep(0.2)
        while not all(_gone(c) for c in children):
            assert time.monotonic() < deadline, "the agent outlived launch"
            time.sleep(0.2)
        told = json.loads(p.stdout.readline())  # the agent's report: the signal it was sent
        assert told["signals"] == [signal.SIGTERM], told
    finally:
        for c in children:  # the agent, left running as a shell leaves a job whose parent was killed
            if not _gone(c):
                os.kill(c, signal.SIGKILL)
        shutil.rmtree(folder)  # the server's log: launch had no chance to


def test_a_launch_killed_while_its_server_starts_leaves_no_key(env: dict[str, str]) -> None:
    """The key reaches serve in a pipe, never a file: a launch killed before its server is ready (when it would
    have deleted a key file) leaves only the server's log."""
    p = subprocess.Popen([sys.executable, "-m", "localgen", "launch", "claude", "--ctx", CTX], cwd=ROOT,
                         env={**env, "FAKE_WAIT": "1"}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    serve: list[int] = []
    while not serve:  # serve has started (its command line is serve's: its log is its stdout by then)
        assert time.monotonic() < deadline and p.poll() is None
        serve = [c for c in _children(p.pid) if b"serve" in Path(f"/proc/{c}/cmdline").read_bytes().split(b"\0")]
        time.sleep(0.02)
    folder = Path(os.readlink(f"/proc/{serve[0]}/fd/1")).parent
    try:
        assert not _answers(serve[0])  # still starting
        p.kill()
        p.wait()
        while not _gone(serve[0]):
            assert time.monotonic() < deadline + 60, "the server outlived launch"
            time.sleep(0.1)
        assert sorted(f.name for f in folder.iterdir()) == ["serve.log"]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _answers(pid: int) -> bool:
    """Whether serve (pid) already answers /health at the port on its command line."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    try:
        return httpx.get(f"http://127.0.0.1:{argv[argv.index('--port') + 1]}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_ctrl_c_at_the_terminal_reaches_the_agent_once_and_not_the_server(env: dict[str, str]) -> None:
    """The agent shares launch's terminal and process group, so a typed Ctrl-C reaches it from the terminal:
    launch does not send it again (Claude Code takes a second Ctrl-C as "quit"), and the server, in a session of
    its own, never sees it."""
    from tests.terminal import spawn

    term = spawn({**env, "FAKE_WAIT": "1", "FAKE_RC": "0"}, ["launch", "claude", "--ctx", CTX], timeout=300)
    term.expect("starting localgen serve")  # progress, on a terminal
    term.expect("is ready at http://127.0.0.1:")
    term.expect_exact('{"waiting": true}')
    term.sendintr()
    term.expect(r'\{"argv".*\}\r\n')  # the whole line
    got = json.loads(term.after)
    term.expect(pexpect.EOF)
    term.close()
    assert term.exitstatus == 0
    assert got["signals"] == [signal.SIGINT]
    assert got["health_after"] == 200  # the server, after the Ctrl-C: still answering
    _check_own_server(got)


def test_a_server_that_ends_before_it_answers(env: dict[str, str], bad_models: dict[str, Path]) -> None:
    began = time.time()
    r = _launch(env, "claude", "-m", str(bad_models["unknown_arch"]), "--ctx", CTX)
    assert r.returncode == 1 and not r.stdout
    last = r.stderr.strip().splitlines()
    assert "localgen serve exited with status 1 before it answered" in last[-1]
    assert "frobnicator" in r.stderr  # serve's own error, from its log
    assert not [d for d in Path(tempfile.gettempdir()).glob("localgen-launch-*") if d.stat().st_mtime >= began]


def test_usage_errors(home: Path, tmp_path: Path, agents_dir: Path) -> None:
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("LOCALGEN_")}
    env.update(LOCALGEN_HOME=str(home), NO_COLOR="1", HF_HUB_OFFLINE="1", PATH=str(tmp_path))
    cli = InProcessCLI(env)
    r = cli("launch", "aider")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "no agent is called 'aider'" in r.stderr and "claude, codex, opencode" in r.stderr
    r = cli("launch", "codex")  # not on PATH: how to install it, before any server starts
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "codex is not on PATH" in r.stderr and "npm install -g @openai/codex" in r.stderr
    for args in (("launch",), ("launch", "--list")):
        r = cli(*args)
        assert r.returncode == 0
        assert [line.split()[0] for line in r.stdout.splitlines()] == ["AGENT", "claude", "codex", "opencode"]
        assert all(" no " in line for line in r.stdout.splitlines()[1:])
        assert r.stdout.splitlines()[2].endswith("  npm install -g @openai/codex")  # the command that installs it
    found = InProcessCLI({**env, "PATH": str(agents_dir), "LOCALGEN_PORT": str(_free_port())})
    r = found("launch", "--list")
    assert f"{agents_dir}/claude" in r.stdout
    r = found("launch", "claude", "-m", "qwen2.5-coder:7b")  # no server runs; the model is not here
    assert r.returncode == 1 and r.stderr.count("\n") == 1
    assert "qwen2.5-coder:7b is not downloaded (localgen pull qwen2.5-coder:7b" in r.stderr
    for given, said in (("a key", "has a space inside"), (" k3y", "begins with a space"), ("k3y ", "ends with a "
                        "space"), ("k\t3y", "has a control character")):  # where the fault is, said
        r = InProcessCLI({**env, "PATH": str(agents_dir), "LOCALGEN_API_KEY": given})("launch", "claude")
        assert r.returncode == 2 and f"LOCALGEN_API_KEY {said}" in r.stderr and r.stderr.count("\n") == 1, r.stderr
        r = InProcessCLI({**env, "LOCALGEN_API_KEY": given})("ps")
        assert r.returncode == 2 and f"--api-key (or LOCALGEN_API_KEY) {said}" in r.stderr, r.stderr
    # before anything starts: a window serve would refuse; --print-env, which starts nothing, with --own-server
    for args, said in ((("--ctx", "1"), "--ctx takes 0 (the model's trained context) or 16 tokens or more, not 1"),
                       (("--print-env", "--own-server"), "--print-env and --own-server cannot be combined")):
        r = found("launch", "claude", *args)
        assert r.returncode == 2 and said in r.stderr and r.stderr.count("\n") == 1, r.stderr
    # a host that is no host: as ps says it; an IPv6 one in brackets is bracketed once
    for given in (("--host", "999.1.1.1"), ()):
        r = InProcessCLI({**env, "PATH": str(agents_dir), "LOCALGEN_HOST": "999.1.1.1"})("launch", "claude", *given)
        assert r.returncode == 2 and r.stderr.count("\n") == 1
        source = "--host" if given else "LOCALGEN_HOST"  # where the value came from
        assert f"{source} '999.1.1.1' is not a host name or address: Invalid IPv4 address" in r.stderr, r.stderr
    # a host that a URL would read as a host and a path: refused, as docs/agents.md says, before anything starts
    for args in (("launch", "codex"), ("launch", "codex", "--print-env"), ("ps",)):
        for host in ("x/y", "http://x/y", "a b"):
            r = found(*args, "--host", host, "--port", str(_free_port()))
            assert r.returncode == 2 and r.stderr.count("\n") == 1, (args, host, r.stderr)
            assert f"--host {host!r} is not a host name or address" in r.stderr, r.stderr
    r = found("launch", "claude", "--print-env", "--host", "[::1]", "--port", str(_free_port()))
    assert r.returncode == 1 and "no localgen serve is running at http://[::1]:" in r.stderr, r.stderr
    assert r.stderr.endswith("(start one: localgen serve -m MODEL --ctx 32768; or run localgen launch without "
                             "--print-env, which starts one for the agent)\n"), r.stderr  # no docs/ a pip install lacks


def test_print_env_refuses_a_fifo_at_once_never_waiting_for_a_writer(env: dict[str, str], tmp_path: Path) -> None:
    """agents.md: a pipe is refused as --print-env's key file; a FIFO nobody writes to was opened to be read first,
    and `launch --print-env` waited there for ever."""
    import os

    fifo = tmp_path / "key.fifo"
    os.mkfifo(fifo)
    r = subprocess.run([sys.executable, "-m", "localgen", "launch", "codex", "--print-env", "--api-key-file",
                        str(fifo)], env=env, cwd=ROOT, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                       timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "not a file that the shell running the lines can open later" in r.stderr, r.stderr


def test_print_env_takes_a_key_kept_in_memory_but_not_a_pipes_name(tmp_path: Path) -> None:
    """agents.md: --print-env refuses a key file no later shell can open (a pipe, /dev/fd/N, a <(...)). A regular
    file under /dev/shm (a secret kept in memory) lasts, and is taken (a review found all of /dev refused)."""
    import os
    import tempfile

    from localgen.cli.launch import _lasting
    from localgen.errors import UsageError

    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm here")
    with tempfile.NamedTemporaryFile(dir="/dev/shm") as f:
        assert _lasting(Path(f.name)) == Path(f.name)
    read, write = os.pipe()
    try:
        for fleeting in (f"/dev/fd/{read}", f"/proc/self/fd/{read}"):
            with pytest.raises(UsageError, match="not a file that the shell running the lines can open later"):
                _lasting(Path(fleeting))
    finally:
        os.close(read)
        os.close(write)
    key = tmp_path / "k.txt"
    key.write_text("k\n")
    assert _lasting(Path(os.path.relpath(key))) == key


@pytest.mark.slow  # ps's 10 s
@pytest.mark.parametrize("headers", [False, True], ids=["body", "headers"])
def test_a_server_that_trickles_and_never_answers_is_given_up_on(cli_in_process: InProcessCLI, headers: bool) -> None:
    """A port whose server keeps sending a byte now and then, never a whole answer (in its body, or in its header
    lines): ps gives up after its 10 s, saying something there did not answer (not that nothing runs), and launch
    --print-env after its 10 s probe, saying something other than localgen serve answers. Each waited for ever
    (httpx bounds each read only)."""
    with trickling(headers) as port:
        t0 = time.monotonic()
        r = cli_in_process("ps", "--port", str(port))
        assert time.monotonic() - t0 < 60, "given up on"
        assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
        assert f"the server at http://127.0.0.1:{port} did not answer /api/ps within 10 s" in r.stderr, r.stderr
        cli_in_process.env["LOCALGEN_PORT"] = str(port)
        try:
            r = cli_in_process("launch", "claude", "--print-env")
        finally:
            cli_in_process.env["LOCALGEN_PORT"] = None
        assert r.returncode == 1 and not r.stdout, r.stderr
        assert f"something other than localgen serve answers at http://127.0.0.1:{port}" in r.stderr, r.stderr


def test_a_model_that_cannot_chat_is_refused_before_the_agent_starts(env: dict[str, str], tmp_path: Path) -> None:
    """agents.md: an agent needs a chat model. An embedding model or a base model without a chat template started a
    server and the agent, exit 0, and every request of the agent was a 400."""
    from tests.tiny_bert import build

    bert = build(tmp_path / "bert.gguf")
    for model, said in ((str(bert), "bert.gguf makes embeddings (or rerank scores), not text, which claude needs"),
                        ("gemma3:270m", "gemma3:270m has no chat template (it may be a base model), which claude "
                                        "needs")):
        r = _launch(env, "claude", "-m", model, "--ctx", CTX)
        assert r.returncode == 2 and not r.stdout, r.stderr
        assert r.stderr.startswith(f"localgen: error: {said}") and r.stderr.count("\n") == 1, r.stderr
        assert "(give -m a chat model whose template renders tools, such as qwen2.5-coder:7b)" in r.stderr


def test_print_env_with_no_key_anywhere_gives_the_word_localgen(monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """agents.md: a keyless server, no --api-key-file and no LOCALGEN_API_KEY: the key stands as the word
    `localgen` (the clients insist on one), never an unset `$LOCALGEN_API_KEY`."""
    import localgen.cli.launch as launch
    from localgen.agents import AGENTS

    monkeypatch.setattr(launch, "_model_there", lambda *_: "smollm2:135m")  # no server asked
    monkeypatch.delenv("LOCALGEN_API_KEY", raising=False)
    launch._print_env(AGENTS["claude"], "http://127.0.0.1:11435", None, None, None, [])
    out = capsys.readouterr().out
    assert 'export ANTHROPIC_AUTH_TOKEN="localgen"' in out and "LOCALGEN_API_KEY" not in out, out


def test_the_flags_named_are_spelled_as_typed_before_the_agents_arguments() -> None:
    """launch's warning names --ctx and the GPU-layers flag as the user spelled them (optionorder.typed_as): the
    last spelling given, and only of launch's own arguments, not the agent's after `--` (Codex's `-c key=value`)."""
    import typer

    from localgen.cli import app, params
    from localgen.cli.optionorder import typed_as

    params.install()
    launch = typer.main.get_command(app.build("launch")).commands["launch"]  # type: ignore[attr-defined]
    for args, said in ((["codex", "--ctx", "8192", "--", "-c", "effort=high"], ("--ctx", "--gpu-layers")),
                       (["codex", "-c", "8192", "--ctx-size=9", "-ngl", "3"], ("--ctx-size", "-ngl"))):
        ctx = launch.make_context("launch", args)
        assert (typed_as(ctx, "n_ctx"), typed_as(ctx, "gpu_layers")) == said, args
