"""What this machine offers: usable CPU cores and memory. Stdlib only."""

from __future__ import annotations

import os


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
    """Physical memory, or None where it cannot be read."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
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
    """Memory available to new allocations (Linux MemAvailable), or None."""
    return proc_kib_field("/proc/meminfo", "MemAvailable")


class GPU:
    """One accelerator: name, total and free memory in bytes, and whether memory is unified (Apple)."""

    def __init__(self, name: str, total: int, free: int, unified: bool = False) -> None:
        self.name = name
        self.total = total
        self.free = free
        self.unified = unified

    def __repr__(self) -> str:
        return f"GPU({self.name!r}, total={self.total}, free={self.free}, unified={self.unified})"


def gpus() -> list[GPU]:
    """NVIDIA GPUs (through nvidia-smi) or Apple Silicon's unified memory; [] when there is none."""
    import platform
    import shutil
    import subprocess

    if platform.system() == "Darwin" and platform.machine() == "arm64":
        total = total_ram_bytes() or 0
        # Metal may use about three quarters of unified memory (recommendedMaxWorkingSetSize).
        return [GPU("Apple Silicon (unified memory)", total * 3 // 4, total * 3 // 4, unified=True)]
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,memory.total,memory.free", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=5, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    found = []
    for line in out.strip().splitlines():
        try:
            gpu_name, total_mib, free_mib = (x.strip() for x in line.split(","))
            found.append(GPU(gpu_name, int(float(total_mib)) << 20, int(float(free_mib)) << 20))
        except ValueError:
            continue
    return found


def cpu_name() -> str:
    """The CPU model name, where the OS tells."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
