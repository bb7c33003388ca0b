"""Loaded by Python's `site` at every start where this folder is on PYTHONPATH (tests/test_user_processes.py
puts it there): records the sockets the process makes and what it does with them (through an audit hook, so
every socket Python opens is seen, whichever library opens it), and at exit the modules it imported, as one
JSON object in the file $LOCALGEN_PROBE_OUT names. Without that variable it does nothing."""

from __future__ import annotations

import atexit
import json
import os
import sys
from typing import Any

OUT = os.environ.get("LOCALGEN_PROBE_OUT")
SOCKET_EVENTS = ("socket.__new__", "socket.bind", "socket.connect", "socket.getaddrinfo", "socket.sendto",
                 "socket.sendmsg", "socket.gethostbyname", "socket.gethostbyaddr")
events: list[list[str]] = []


def audit(event: str, args: tuple[Any, ...]) -> None:
    if event in SOCKET_EVENTS:
        # the socket itself (args[0] of most) is not yet whole at __new__: record its arguments as text only
        shown = args if event.startswith("socket.get") else args[1:]
        events.append([event, *(repr(a) for a in shown)])


def write() -> None:
    assert OUT is not None
    with open(OUT, "w") as f:
        json.dump({"modules": sorted(sys.modules), "sockets": events}, f)


if OUT:
    sys.addaudithook(audit)
    atexit.register(write)
