"""Functions for `run --functions` in the tests."""

from __future__ import annotations

import os
import time
from typing import Literal


def get_weather(city: str, unit: Literal["C", "F"] = "C") -> str:
    """Get the current weather in a city.

    :param city: the city name
    :param unit: the temperature unit
    """
    return f"It is 21 {unit} and sunny in {city}."


def explode(reason: str) -> str:
    """Fail on purpose."""
    raise ValueError(f"boom: {reason}")


def stall() -> str:
    """Sleep for a minute."""
    time.sleep(60)
    return "done"


def secret() -> str:
    """Read the test's API token from the environment."""
    return "token=" + os.environ.get("TEST_API_TOKEN", "unset")
