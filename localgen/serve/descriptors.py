"""serve's file descriptors: each connection holds one, and so do the model files, the logs, the prefix store
and the modules a request may still import. At start the soft limit (RLIMIT_NOFILE, often 1,024) is raised to
the hard one (up to 65,536), as nginx and most servers do; the connections open at once are then capped
(serve/stalls.py), a reserve of descriptors kept for everything else, so that a client that opens connections
by the thousand and sends nothing (a flood) can never leave the server without one for a model's load or a
request's answer."""

from __future__ import annotations

import os

RESERVE = 128  # descriptors kept for what is not a connection: model files, logs, the prefix store, fetches
# under a low limit, a quarter of it: 128 kept of a limit of 128 (`ulimit -n 128`) left room for 8 connections,
# and a burst of clients was closed unanswered
RESERVE_SHARE = 4
LOW_CAP = 64  # a cap under this many connections is said at start, with what raises it
MAX_CONNECTIONS = 8192  # connections open at once, at most, however high the limit
# the soft limit asked for, at most: a hard limit of a billion (some containers') would be handed on to every
# program serve starts (MCP servers), and some close each descriptor up to it; macOS refuses an unlimited one
TARGET = 65536
MACOS_OPEN_MAX = 10240  # macOS's OPEN_MAX: the most its setrlimit takes for a process whose hard limit is unlimited


def raise_limit() -> int:
    """Raise the soft limit on open files to the hard one, at most TARGET (where the system allows it); the soft
    limit now (0 where the platform has none: Windows)."""
    try:
        import resource
    except ImportError:
        return 0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = TARGET if hard == resource.RLIM_INFINITY else min(hard, TARGET)
    # macOS refuses more than its kern.maxfilesperproc (and OPEN_MAX, 10,240, for an unlimited hard one): then
    # that, as Go's runtime asks for there
    for asked in (want, min(want, MACOS_OPEN_MAX)):
        if soft == resource.RLIM_INFINITY or soft >= asked:
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (asked, hard))
            break
        except (ValueError, OSError):
            continue
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return soft if soft != resource.RLIM_INFINITY else TARGET


def open_now() -> int:
    """Descriptors this process holds now (0 where that cannot be read)."""
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(folder))
        except OSError:
            continue
    return 0


def connection_cap(limit: int) -> int | None:
    """The connections serve keeps open at once under a soft limit of `limit` descriptors: what is left of it
    after those open now and a reserve (RESERVE, or a quarter of a low limit), at least 8 and at most
    MAX_CONNECTIONS (None: no limit known)."""
    if limit <= 0:
        return None
    return max(8, min(MAX_CONNECTIONS, limit - open_now() - min(RESERVE, limit // RESERVE_SHARE)))


def low_cap_line(cap: int | None, limit: int) -> str | None:
    """The start's line for a cap of connections low enough that clients will meet it (None: not so low)."""
    if cap is None or cap >= LOW_CAP:
        return None
    return (f"serve holds at most {cap} connections at once under a limit of {limit:,} open files: "
            "raise `ulimit -n`")
