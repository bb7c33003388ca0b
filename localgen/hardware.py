"""What this machine offers: usable CPU cores and memory, and how busy other work keeps its CPUs. Stdlib only."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def usable_cores() -> int:
    """CPUs this process may run on (affinity and cgroup aware where the OS tells)."""
    if hasattr(os, "sched_getaffinity"):
        n = len(os.sched_getaffinity(0))
    elif hasattr(os, "process_cpu_count"):
        n = os.process_cpu_count() or 1
    else:
        n = os.cpu_count() or 1
    quota = _cgroup_cpu_quota()
    if quota is not None:
        n = min(n, quota)
    return max(n, 1)


def physical_cores() -> int:
    """Cores for token generation, as llama.cpp picks them: one thread per physical core (SMT siblings add
    nothing to a memory-bound decode) and performance cores only on hybrid CPUs (E-cores stall the others),
    within the CPU affinity and any cgroup CPU quota."""
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    n = _linux_physical(allowed) if allowed else None
    if n is None:
        n = _sysctl_int("hw.perflevel0.physicalcpu") or _sysctl_int("hw.physicalcpu")
    if not n:
        return usable_cores()
    quota = _cgroup_cpu_quota()
    return max(1, min(n, quota) if quota is not None else n)


def _linux_physical(allowed: list[int]) -> int | None:
    base = "/sys/devices/system/cpu"
    performance = _cpu_list("/sys/devices/cpu_core/cpus")  # hybrid Intel: the P-cores
    cores = set()
    try:
        for cpu in allowed:
            if performance and cpu not in performance:
                continue
            with open(f"{base}/cpu{cpu}/topology/core_id") as f:
                core = f.read().strip()
            with open(f"{base}/cpu{cpu}/topology/physical_package_id") as f:
                package = f.read().strip()
            cores.add((package, core))
    except OSError:
        return None
    return len(cores) or None


def _cpu_list(path: str) -> set[int]:
    """A Linux CPU list file ("0-7,16-23") as a set; empty where there is none."""
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return set()
    out: set[int] = set()
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-", 1)
            out.update(range(int(a), int(b) + 1))
        elif part.isascii() and part.strip().isdigit():
            out.add(int(part))
    return out


def _sysctl_int(name: str) -> int | None:
    import platform
    import subprocess

    if platform.system() != "Darwin":
        return None
    try:
        out = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=2).stdout.strip()
        return int(out) if out.isascii() and out.isdigit() else None
    except (OSError, subprocess.SubprocessError):
        return None


def _cgroup_cpu_quota() -> int | None:
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return max(1, int(int(quota) / int(period)))


def total_ram_bytes() -> int | None:
    """Physical memory, or the memory limit of the container (cgroup) this process runs in where that is lower;
    None where it cannot be read."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    limited = memory_limit()
    return min(physical, limited[0]) if limited else physical


CGROUP_ROOT = "/sys/fs/cgroup"  # where cgroups are mounted (a test points it at a folder of its own)
PROC_CGROUP = "/proc/self/cgroup"  # this process's cgroup, by path under CGROUP_ROOT
NO_LIMIT = 1 << 60  # cgroup v1's "no limit" is a page-rounded 2**63 - 1: any limit this high is none


def memory_limit() -> tuple[int, int] | None:
    """The lowest memory limit on this process's cgroups (`docker run --memory`, systemd's MemoryMax) and the least
    room left under any of them (its limit less the memory charged to it that the kernel cannot drop: its usage
    less its inactive file cache), in bytes: the two may be different cgroups' (a parent's near-full 8 GiB over a
    child's 4 GiB); None where no limit is set (or no cgroup can be read: not Linux). cgroup v2, else v1's
    memory controller."""
    found = [m for m in (_cgroup2_limits() or _cgroup1_limits()) if m[0] < NO_LIMIT]
    if not found:
        return None
    return min(limit for limit, _ in found), max(0, min(limit - charged for limit, charged in found))


def _cgroup2_limits() -> list[tuple[int, int]]:
    """(memory.max, charged) of this process's cgroup v2 and each above it, those that set one."""
    path = _own_cgroup(lambda controllers: controllers == "")
    found = []
    while path is not None:
        folder = os.path.join(CGROUP_ROOT, path.lstrip("/"))
        limit = _read_int(os.path.join(folder, "memory.max"))
        if limit is not None:
            found.append((limit, _charged(folder, "memory.current", "inactive_file")))
        path = None if path in ("", "/") else os.path.dirname(path.rstrip("/"))
    return found


def _cgroup1_limits() -> list[tuple[int, int]]:
    """(memory.limit_in_bytes, charged) of the memory controller's cgroup v1 this process is in, and its root's
    (a container's view)."""
    path = _own_cgroup(lambda controllers: "memory" in controllers.split(","))
    found = []
    for sub in dict.fromkeys([(path or "").lstrip("/"), ""]):
        folder = os.path.join(CGROUP_ROOT, "memory", sub)
        limit = _read_int(os.path.join(folder, "memory.limit_in_bytes"))
        if limit is not None:
            found.append((limit, _charged(folder, "memory.usage_in_bytes", "total_inactive_file")))
    return found


def _own_cgroup(controllers_match: Callable[[str], bool]) -> str | None:
    """This process's cgroup path in the hierarchy whose controllers field matches (None: none)."""
    try:
        with open(PROC_CGROUP) as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if controllers_match(controllers):
                    return path
    except (OSError, ValueError):
        pass
    return None


def _charged(folder: str, usage: str, inactive: str) -> int:
    """A cgroup's memory use the kernel cannot reclaim: its usage less its inactive file cache."""
    used = _read_int(os.path.join(folder, usage)) or 0
    cache = 0
    try:
        with open(os.path.join(folder, "memory.stat")) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == inactive:
                    cache = int(value)
                    break
    except (OSError, ValueError):
        pass
    return max(0, used - cache)


def _read_int(path: str) -> int | None:
    """A cgroup file holding one number (None: missing, unreadable, or `max`)."""
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def proc_kib_field(path: str, key: str) -> int | None:
    """A "Key:   123 kB" line of a Linux /proc file, in bytes; None where there is none."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def available_ram_bytes() -> int | None:
    """Memory available to new allocations (Linux MemAvailable; on macOS what vm_stat says apps, the kernel and
    the compressor do not hold), or None."""
    found = proc_kib_field("/proc/meminfo", "MemAvailable")
    found = found if found is not None else _vm_stat_available()
    limited = memory_limit()  # a container's limit: what is left of it, where less
    if limited:
        found = limited[1] if found is None else min(found, limited[1])
    return found


def _darwin_output(argv: list[str]) -> str | None:
    """What a macOS tool (sysctl, vm_stat) writes, or None: not macOS, or it failed."""
    import platform
    import subprocess

    if platform.system() != "Darwin":
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=2)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return done.stdout if done.returncode == 0 else None


def _vm_stat_available() -> int | None:
    """macOS: the RAM that apps' own memory, the kernel's wired pages and the compressor do not hold, from vm_stat,
    in bytes (Activity Monitor's sum, turned round): the file cache counts as available, as in Linux's MemAvailable,
    so a model file read before (llama.cpp maps it) does not look as if it held the memory. Without the anonymous
    pages line (an older vm_stat), free + inactive + speculative + purgeable pages. None where it cannot be read."""
    import re

    text = _darwin_output(["vm_stat"])
    if not text:
        return None
    size = re.search(r"page size of (\d+) bytes", text)
    pages = {m[1].lower(): int(m[2]) for m in re.finditer(
        r"^(?:Pages )?(free|inactive|speculative|purgeable|wired down|occupied by compressor|Anonymous pages)"
        r":\s+(\d+)\.?\s*$", text, re.MULTILINE)}
    if not size or "free" not in pages:
        return None
    page = int(size[1])
    total = total_ram_bytes()
    if total and "anonymous pages" in pages:
        held = (max(0, pages["anonymous pages"] - pages.get("purgeable", 0)) + pages.get("wired down", 0)
                + pages.get("occupied by compressor", 0)) * page
        return max(0, total - held)
    return sum(pages.get(k, 0) for k in ("free", "inactive", "speculative", "purgeable")) * page


def metal_budget(total: int) -> int:
    """What Metal lets a process use of `total` bytes of unified memory (about Apple's recommendedMaxWorkingSetSize,
    as llama.cpp's load logs show it): two thirds up to 32 GiB (10,922.67 MiB on 16 GiB, 21,845.34 MiB on 32 GiB),
    three quarters above (27 GiB on 36 GiB; recent macOS gives the largest Macs a little more)."""
    return total * 3 // 4 if total > 32 << 30 else total * 2 // 3


class GPU:
    """One accelerator: name, total and free memory in bytes (None where nvidia-smi says `[N/A]`, as for MIG
    and for NVIDIA's unified-memory chips), and whether memory is unified (Apple)."""

    def __init__(self, name: str, total: int | None, free: int | None, unified: bool = False) -> None:
        self.name = name
        self.total = total
        self.free = free
        self.unified = unified

    def __repr__(self) -> str:
        return f"GPU({self.name!r}, total={self.total}, free={self.free}, unified={self.unified})"


SMI_BYTES = 64 << 10  # of nvidia-smi's output read: a line per GPU, MAX_DEVICES of them, fit many times over
_QUERY = ["--query-gpu=name,memory.total,memory.free", "--format=csv,noheader,nounits"]


def gpus() -> list[GPU]:
    """NVIDIA GPUs (through nvidia-smi) or Apple Silicon's unified memory; [] when there is none."""
    return gpu_listing()[0]


def gpu_listing() -> tuple[list[GPU], str | None]:
    """gpus(), and what of nvidia-smi's output was left out, in words (None: nothing): at most MAX_DEVICES GPUs
    (llama.cpp's most devices) and SMI_BYTES of output are read, whatever a broken or stand-in nvidia-smi writes."""
    import platform
    import shutil
    import subprocess

    from localgen.types import MAX_DEVICES

    if platform.system() == "Darwin" and platform.machine() == "arm64":
        # what Metal may use of unified memory; how much of it is free now, nothing here can tell
        return [GPU("Apple Silicon (unified memory)", metal_budget(total_ram_bytes() or 0), None, unified=True)], None
    exe = shutil.which("nvidia-smi")
    if not exe:
        return [], None
    try:
        rc, raw, _ = _bounded_run([exe, *_QUERY])
    except (OSError, subprocess.SubprocessError):
        return [], None
    if rc:
        return [], None
    cut = len(raw) > SMI_BYTES
    lines = raw[:SMI_BYTES].decode(errors="replace").strip().splitlines()
    if cut and lines:
        lines = lines[:-1]  # the last line read may be cut short
    found: list[GPU] = []
    left = 0
    for line in lines:
        fields = [x.strip() for x in line.rsplit(",", 2)]  # a name may hold a comma; the numbers do not
        if len(fields) == 3 and fields[0]:
            if len(found) == MAX_DEVICES:
                left += 1
                continue
            found.append(GPU(fields[0][:200], _mib(fields[1]), _mib(fields[2])))
    parts = [f"{left:,} GPU line{'s' if left != 1 else ''} past llama.cpp's {MAX_DEVICES} devices left out"
             ] if left else []
    if cut:
        parts.append(f"nvidia-smi's output past {SMI_BYTES >> 10} KiB not read")
    return found, "; ".join(parts) or None


def _bounded_run(argv: list[str], timeout: float = 5.0) -> tuple[int, bytes, bytes]:
    """Run `argv` keeping at most SMI_BYTES + 1 of its stdout and of its stderr: (exit status, stdout, stderr). A
    program still writing past them is killed (exit status 0: what was read is kept); one still running after
    `timeout` seconds raises subprocess.TimeoutExpired."""
    import subprocess
    import threading

    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    got: dict[str, bytes] = {}

    def read(name: str, stream: Any) -> None:
        got[name] = stream.read(SMI_BYTES + 1)

    readers = [threading.Thread(target=read, args=(n, f), daemon=True) for n, f in (("out", p.stdout),
                                                                                     ("err", p.stderr))]
    for t in readers:
        t.start()
    deadline = time.monotonic() + timeout
    for t in readers:
        t.join(max(0.0, deadline - time.monotonic()))
    over = any(len(v) > SMI_BYTES for v in got.values())
    try:
        rc = p.wait(max(0.0, deadline - time.monotonic())) if not over else None
    except subprocess.TimeoutExpired:
        rc = None
    if rc is None:
        p.kill()
        p.wait()
        for t in readers:
            t.join(1.0)
    for f in (p.stdout, p.stderr):
        if f is not None:
            f.close()
    if rc is None and not over:
        raise subprocess.TimeoutExpired(argv, timeout)
    return rc or 0, got.get("out", b""), got.get("err", b"")


def _mib(text: str) -> int | None:
    """One of nvidia-smi's memory figures (MiB) in bytes; None for `[N/A]`, `[Not Supported]` and the like."""
    try:
        value = float(text)
    except ValueError:
        return None
    return int(value) << 20 if value >= 0 and value == value and value != float("inf") else None


def why_no_gpu() -> str:
    """Why gpus() found none, in a few words: no nvidia-smi, or what the nvidia-smi there said when it failed
    (a driver not loaded says so there), or that it listed none."""
    import shutil
    import subprocess

    exe = shutil.which("nvidia-smi")
    if not exe:
        return "no nvidia-smi; not Apple Silicon"
    try:
        rc, out, err = _bounded_run([exe, *_QUERY])
    except subprocess.TimeoutExpired:
        return f"{exe} did not answer in 5 s"
    except OSError as e:
        return f"{exe} cannot run: {e.strerror or e}"
    text = (err + b"\n" + out).decode(errors="replace")
    said = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if rc:
        return f"{exe} failed (exit {rc})" + (f": {said[:200]}" if said else "")
    return f"{exe} lists no GPU" + (f" ({said[:200]})" if said else "")


def cpu_name() -> str:
    """The CPU model name, where the OS tells (/proc/cpuinfo; macOS: sysctl's machdep.cpu.brand_string)."""
    import platform

    brand = (_darwin_output(["sysctl", "-n", "machdep.cpu.brand_string"]) or "").strip()
    if brand:
        return brand[:200]
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@dataclass(frozen=True)
class CpuSample:
    """Every CPU's time so far, in seconds (all of it, and the busy part: time stolen by a hypervisor counts as
    busy), and this process's own CPU time (its threads and waited-for children)."""

    total: float
    busy: float
    own: float


def cpu_sample() -> CpuSample | None:
    """Now's CpuSample, from /proc/stat (Linux); None where it cannot be read."""
    try:
        with open("/proc/stat") as f:
            head = f.readline().split()
        # user nice system idle iowait irq softirq steal (guest and guest_nice are counted in user already)
        fields = [int(x) for x in head[1:9]]
        tick = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    if head[:1] != ["cpu"] or len(fields) < 4 or tick <= 0:
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle and iowait
    t = os.times()
    return CpuSample(sum(fields) / tick, (sum(fields) - idle) / tick,
                     t.user + t.system + t.children_user + t.children_system)


def others_share(before: CpuSample, after: CpuSample) -> float | None:
    """The share of every CPU's time between two samples that other work took (other processes, and a
    hypervisor's steal): busy time less this process's own, over all of it; None over no time."""
    total = after.total - before.total
    if total <= 0:
        return None
    others = (after.busy - before.busy) - (after.own - before.own)
    return max(0.0, min(1.0, others / total))
