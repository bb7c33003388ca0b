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


def available_ram_bytes() -> int | None:
    """Memory available to new allocations (Linux MemAvailable), or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
