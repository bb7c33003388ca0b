"""localgen/redact.py: what of a key an upstream's text repeats is hidden (docs/remote.md, docs/serve.md)."""

from __future__ import annotations

from localgen.redact import scrubbed, url_shown

KEY = "sk-upstream-secret-9f8e7d"


def test_the_key_and_any_run_of_its_first_or_last_8_characters_are_hidden() -> None:
    said = f"key {KEY}; starts {KEY[:8]}, {KEY[:12]}; ends {KEY[-8:]}, {KEY[-15:]}; middle {KEY[6:14]}"
    assert scrubbed(said, KEY) == "key ***; starts ***, ***; ends ***, ***; middle " + KEY[6:14]
    assert scrubbed(f"{KEY[:7]} and {KEY[-7:]}", KEY) == f"{KEY[:7]} and {KEY[-7:]}"  # shorter runs tell nothing
    assert scrubbed("k1234 and k123 and 1234", "k1234") == "*** and k123 and 1234"  # under 8 characters: only whole
    assert scrubbed(f"x{KEY}y", None) == f"x{KEY}y"


def test_a_urls_credentials_and_query_are_hidden() -> None:
    assert url_shown("http://bob:pw@h:8/v1?api_key=S#frag") == "http://***@h:8/v1?***#***"
