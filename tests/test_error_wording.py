"""Errors that said something else than what happened: a link to nothing where a folder goes called "a file", a
name lookup that failed for now called "not found", a folder given to `show` an exit 1 where `fit` says 2, and
`serve --collection` of a collection stored with `-m ./bert.gguf` hinting those words from any folder after
loading a model it did not need."""

from __future__ import annotations

import shutil
import socket
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from tests.conftest import CLI, InProcessCLI


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def own(cli_in_process: InProcessCLI, tmp_path: Path) -> InProcessCLI:
    """The in-process CLI with a LOCALGEN_HOME of this test's own."""
    (tmp_path / "home").mkdir()
    return InProcessCLI({**cli_in_process.env, "LOCALGEN_HOME": str(tmp_path / "home")})


def test_a_link_to_nothing_where_a_folder_goes_is_named_a_broken_link(own: InProcessCLI, tmp_path: Path) -> None:
    """A config folder that is a symbolic link to nothing was `... is a file, not a folder`: it is said to be a
    broken link, with the path it names; a link loop and a link to a file are said as such too."""
    from localgen import paths
    from localgen.engine.promptcache import _reason

    home = Path(str(own.env["LOCALGEN_HOME"]))
    gone = tmp_path / "unmounted" / "config"
    (home / "config").symlink_to(gone)
    r = own("logs", "off")
    assert (r.returncode, r.stdout) == (1, ""), r.stderr
    assert r.stderr == (f"localgen: error: {home / 'config'} is a broken link (to {gone}, which does not exist), not "
                        "a folder\n"), r.stderr
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "file").write_text("")
    (tmp_path / "to-file").symlink_to("file")  # a relative target is shown from the link's folder
    for link, said in ((tmp_path / "loop", f"{tmp_path / 'loop'} is a symbolic link loop (through "
                                           f"{tmp_path / 'loop'}), not a folder"),
                       (tmp_path / "to-file", f"{tmp_path / 'to-file'} is a link to a file, {tmp_path / 'file'}, "
                                              "not a folder")):
        with pytest.raises(NotADirectoryError) as caught:
            paths.make_dirs(link)
        assert paths.os_reason(caught.value) == said
    with pytest.raises(OSError) as made:  # the prompt cache's warning says the same of its folder
        paths.private_dir(home / "config" / "prompt-states")
    assert _reason(made.value, home / "config" / "prompt-states").startswith(
        f"{home / 'config'} is a broken link (to {gone}, which does not exist)")
    (home / "config").unlink()
    (home / "config").write_text("")
    r = own("logs", "off")  # a file is still a file
    assert r.stderr == f"localgen: error: {home / 'config'} is a file, not a folder\n", r.stderr


def test_an_rpc_host_whose_lookup_fails_for_now_is_not_called_unknown(own: InProcessCLI,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """--rpc HOST:PORT whose name lookup failed for now (EAI_AGAIN: no answer from DNS) said "check the host name:
    box.lan is not found", as of a name that does not exist; it says the name could not be resolved right now.
    A name the resolver does not know (EAI_NONAME) is still "not found"."""
    said = {}

    def lookup(err: int, why: str) -> None:
        def failing(*args: object, **kw: object) -> object:
            raise socket.gaierror(err, why)

        monkeypatch.setattr(socket, "getaddrinfo", failing)
        r = own("run", "-m", "smollm2:135m", "--rpc", "box.lan:50052", "-p", "hi", "-n", "1")
        assert (r.returncode, r.stdout, r.stderr.count("\n")) == (1, "", 1), r.stderr
        said[err] = r.stderr

    lookup(socket.EAI_AGAIN, "Temporary failure in name resolution")
    lookup(socket.EAI_NONAME, "Name or service not known")
    assert said[socket.EAI_AGAIN] == ("localgen: error: cannot reach the RPC server box.lan:50052: box.lan could not "
                                      "be resolved right now (a temporary failure of the name lookup) (try again, or "
                                      "give the server's IP address)\n")
    assert said[socket.EAI_NONAME] == ("localgen: error: cannot reach the RPC server box.lan:50052: Name or service "
                                       "not known (check the host name: box.lan is not found)\n")


def test_a_folder_given_to_show_or_cp_is_a_usage_error_as_fit_says(own: InProcessCLI, tmp_path: Path) -> None:
    """A folder given as a model: `fit -m DIR` exits 2 (a usage error, as any flag's folder), `show DIR` and
    `cp DIR x` exited 1 with "is a directory, not a .gguf file"; exit 2 now, said as a FIFO is."""
    folder = tmp_path / "m.gguf"
    folder.mkdir()
    r = own("fit", "-m", str(folder))
    assert (r.returncode, r.stderr) == (2, f"localgen: error: -m/--model {folder}: a folder, not a file\n")
    for args in (["show", str(folder)], ["show", "--template", str(folder)], ["cp", str(folder), "x"]):
        r = own(*args)
        assert (r.returncode, r.stdout, r.stderr) == (2, "", f"localgen: error: {folder} is a folder, not a model "
                                                             "file\n"), (args, r.stderr)


def test_serve_collection_of_a_relative_model_path_hints_its_full_path_before_any_load(cli_env: dict[str, str],
                                                                                       tmp_path: Path,
                                                                                       smollm2_path: Path) -> None:
    """A collection stored with `-m ./bert.gguf` kept those words: `serve --collection` from another folder hinted
    `-m ./bert.gguf` (another file there, or none), and when a bert.gguf was there it loaded the default model first,
    then refused (on demand serve offers models by name, never a file's path). The collection keeps the file's full
    path: the hint names it, the refusal comes before any load, and `similar` finds the model from any folder.
    A collection an older localgen kept with a relative path says where that path is read from."""
    from tests.tiny_bert import build

    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    here.mkdir()
    elsewhere.mkdir()
    bert = build(here / "bert.gguf")
    shutil.copyfile(smollm2_path, elsewhere / "bert.gguf")  # another file of that name
    hcli = CLI({**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")})
    r = hcli("embed", "-m", "./bert.gguf", "--store", "rel", "The cat sits on the mat.", cwd=here)
    assert r.returncode == 0, r.stderr
    refused = (f"localgen: error: --collection 'rel' was made with bert.gguf, which this server does not offer "
               f"(serve it too: -m {bert})\n")
    for args in ([], ["-m", "smollm2:135m"]):
        r = hcli("serve", *args, "--collection", "rel", "--port", str(_free_port()), cwd=elsewhere, timeout=120)
        assert (r.returncode, r.stdout, r.stderr) == (2, "", refused), (args, r.stderr)
    r = hcli("similar", "rel", "cat", cwd=elsewhere)
    assert r.returncode == 0 and "The cat sits" in r.stdout, r.stderr
    db = tmp_path / "home" / "data" / "embeddings" / "embeddings.db"
    with closing(sqlite3.connect(db)) as conn, conn:  # as an older localgen kept it: -m as typed
        conn.execute("UPDATE collections SET model_spec = './bert.gguf'")
    r = hcli("serve", "--collection", "rel", "--port", str(_free_port()), cwd=elsewhere, timeout=120)
    assert (r.returncode, r.stderr) == (2, "localgen: error: --collection 'rel' was made with bert.gguf, which this "
                                           "server does not offer (serve it too: -m ./bert.gguf from the folder the "
                                           "collection was stored from, or -m the model's full path)\n"), r.stderr
