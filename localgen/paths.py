"""Where localgen keeps its files. LOCALGEN_HOME, when set, overrides every location (tests use it)."""

from __future__ import annotations

import os
from pathlib import Path

APP = "localgen"


def _home() -> Path | None:
    value = os.environ.get("LOCALGEN_HOME")
    return Path(value).expanduser() if value else None


def config_dir() -> Path:
    """User configuration (models.toml overrides)."""
    home = _home()
    if home:
        return home / "config"
    import platformdirs

    return Path(platformdirs.user_config_dir(APP))


def data_dir() -> Path:
    """Durable data: saved chats, benchmark history, assembled embedded models."""
    home = _home()
    if home:
        return home / "data"
    import platformdirs

    return Path(platformdirs.user_data_dir(APP))


def state_dir() -> Path:
    """State that may be lost without harm: REPL input history."""
    home = _home()
    if home:
        return home / "state"
    import platformdirs

    return Path(platformdirs.user_state_dir(APP))


def cache_dir() -> Path:
    """Re-creatable caches (prompt KV states)."""
    home = _home()
    if home:
        return home / "cache"
    import platformdirs

    return Path(platformdirs.user_cache_dir(APP))
