"""What the benchmark and reference scripts share: a free port, a server process that is always stopped, rounds
that alternate between the things compared, medians, percentiles and ratios, timed runs, a tool's path checked,
and a GGUF header the size of Llama 3's.

The scripts import it as `import harness` (run as `python scripts/x.py`, scripts/ is first on sys.path); a
script that tests import as `scripts.x` imports it inside the function that needs it. Nothing here imports
localgen, httpx or numpy at import, so a script's `--help` stays quick.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import socket
import statistics
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

K = TypeVar("K")
T = TypeVar("T")


class ServerError(SystemExit):
    """A server that exited or never answered: a SystemExit, so a script ends with this one line (exit 1)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def answers(url: str, timeout: float = 1.0) -> bool:
    """Whether a GET of `url` answers 200 now."""
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no proxy: the servers are local
    try:
        with direct.open(url, timeout=timeout) as r:
            return int(r.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, grace: float = 30.0) -> None:
    """Ask a process to end with `sig`, wait up to `grace` seconds, then kill it; a no-op once it has exited."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(grace)
            return
        except subprocess.TimeoutExpired:
            proc.kill()
    proc.wait()


@contextmanager
def server(cmd: Sequence[str], ready_url: str, *, timeout: float = 120.0, env: Mapping[str, str] | None = None,
           cwd: str | Path | None = None, quiet: bool = True, stop_signal: int = signal.SIGTERM,
           grace: float = 30.0, name: str | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """Start `cmd`, wait until `ready_url` answers 200, yield the process; stop it on the way out, whatever
    happened. Raises ServerError if it exits first or does not answer within `timeout` seconds. `quiet`
    sends its output to /dev/null (else it shares the script's)."""
    out = subprocess.DEVNULL if quiet else None
    label = name or Path(cmd[0]).name
    proc = subprocess.Popen(list(cmd), env=None if env is None else dict(env), cwd=cwd, stdin=subprocess.DEVNULL,
                            stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + timeout
        while not answers(ready_url):
            if proc.poll() is not None:
                raise ServerError(f"{label} exited ({proc.returncode}) before answering {ready_url}: "
                                  f"{' '.join(cmd)}")
            if time.monotonic() > deadline:
                raise ServerError(f"{label} did not answer {ready_url} within {timeout:g} s: {' '.join(cmd)}")
            time.sleep(0.2)
        yield proc
    finally:
        stop(proc, stop_signal, grace)


def order(labels: Sequence[K], round_: int, flip: bool = True) -> list[K]:
    """The order of one round: as given, or (with `flip`) reversed every other round, so each goes first
    half the time."""
    return list(labels[::-1] if flip and round_ % 2 else labels)


def alternate(cases: Mapping[K, Callable[[], T]], rounds: int, *, flip: bool = True,
              after: Callable[[int, dict[K, list[T]]], None] | None = None) -> dict[K, list[T]]:
    """Run every case once a round for `rounds` rounds, in turn (A, B, B, A, ... with `flip`, else A, B, A,
    B, ...), so drift on the machine hits them all; each case's results, in round order. `after(round,
    samples)` is called at the end of each round (to print progress)."""
    samples: dict[K, list[T]] = {k: [] for k in cases}
    for r in range(rounds):
        for k in order(list(cases), r, flip):
            samples[k].append(cases[k]())
        if after is not None:
            after(r, samples)
    return samples


def median(xs: Iterable[float]) -> float:
    """The median (the mean of the middle two for an even count)."""
    return float(statistics.median(list(xs)))


def percentile(xs: Iterable[float], p: float) -> float:
    """The `p` quantile (0 to 1) as the sample nearest rank p·(n-1): no interpolation; nan for none."""
    s = sorted(xs)
    return s[min(len(s) - 1, round(p * (len(s) - 1)))] if s else float("nan")


def paired_ratio(a: Sequence[float], b: Sequence[float]) -> float:
    """The median of each round's a/b: robust to drift that moves both runs of a round together."""
    return median(x / y for x, y in zip(a, b, strict=True))


def ratio(a: float, b: float, spec: str = ".2f") -> str:
    """a/b as printed, `spec` the format: ratio(3, 2) == '1.50x'."""
    return f"{a / b:{spec}}x"


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    """Wall seconds of one call, and what it returned."""
    t0 = time.perf_counter()
    got = fn()
    return time.perf_counter() - t0, got


def run_timed(cmd: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
              timeout: float | None = None) -> float:
    """Wall seconds of one run of `cmd`, its output discarded; raises CalledProcessError if it fails."""
    return timed(lambda: subprocess.run(list(cmd), env=None if env is None else dict(env), cwd=cwd, check=True,
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, timeout=timeout))[0]


def same_answers(theirs: Mapping[str, Mapping[str, str]], ours: Mapping[str, Mapping[str, str]],
                 peer: str = "llama-server") -> bool:
    """Print each pair of answers (by group, then case) as the same or DIFFERENT, then how many are the same:
    a reference script's comparison of llama.cpp's answers with localgen's. True when all are."""
    same = total = 0
    for group, cases in theirs.items():
        for case, want in cases.items():
            got = ours[group][case]
            total += 1
            same += got == want
            print(f"{'same' if got == want else 'DIFFERENT'}  {group} / {case}\n  {peer + ':':<14}{want!r}\n"
                  f"  {'localgen:':<14}{got!r}")
    print(f"{same} of {total} the same")
    return same == total


def executable(path: str) -> str:
    """An argparse `type`: the program at `path` (or found on PATH), else a usage error naming it."""
    if shutil.which(path) is None:
        raise argparse.ArgumentTypeError(f"no program at {path} (build it, or give its path)")
    return path


def llama3_header(path: Path) -> Path:
    """A GGUF with a Llama-3-sized tokenizer (128k tokens, 280k merges) and one tiny tensor, for timing how
    headers are read. Needs numpy and gguf (dev dependencies): ImportError without them."""
    import numpy as np
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), "llama")
    w.add_context_length(8192)
    w.add_block_count(32)
    w.add_embedding_length(4096)
    w.add_head_count(32)
    w.add_head_count_kv(8)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"tok{i}".encode() for i in range(128_256)])
    w.add_token_merges([f"m{i} x{i}" for i in range(280_147)])
    w.add_token_types([1] * 128_256)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
