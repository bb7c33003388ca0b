"""What a red team found named wrong: a preset name whose byte is not UTF-8 shown as '\\udce8'; a tuning.json whose
"records" is {} said to hold "1 tuning record" that cannot be read; `fit` blaming --override-tensor for a buffer
type a preset's PARAMETER override_tensor set."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import HF_PRIVATE, InProcessCLI


@pytest.fixture
def own(tmp_path: Path, smollm2_path: Path) -> InProcessCLI:
    """The CLI in process with a home of this test's own (its presets, its tuning records)."""
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("LOCALGEN_") or k in HF_PRIVATE}
    env.update(LOCALGEN_HOME=str(tmp_path / "home"), NO_COLOR="1", HF_HUB_OFFLINE="1")
    return InProcessCLI(env)


@pytest.mark.parametrize("command", [["cp", "smollm2:135m"], ["create", "-f", "-"]])
def test_a_preset_name_with_a_byte_that_is_not_utf8_is_shown_readably(own: InProcessCLI, command: list[str]) -> None:
    """`localgen cp smollm2:135m caf$'\\xe8'` (a Latin-1 terminal's é): the byte and U+FFFD, not '\\udce8'."""
    name = "caf\udce8"  # as Python keeps argv's byte 0xe8 (surrogateescape)
    args = [*command[:1], *command[1:], name] if command[0] == "cp" else ["create", name, "-f", "-"]
    r = own(*args, input="FROM smollm2:135m\n")
    assert (r.returncode, r.stdout, r.stderr.count("\n")) == (2, "", 1), r.stderr
    assert r.stderr.startswith("localgen: error: bad preset name 'caf\ufffd': byte 0xe8, not UTF-8, is not allowed: "
                               "a name takes ASCII letters"), r.stderr
    assert "udce8" not in r.stderr, r.stderr


@pytest.mark.parametrize(("records", "said"), [({}, None), ("", None), (None, None), (5, "1 tuning record"),
                                               ([5, {"key": 1}], "2 tuning records")])
def test_tune_show_counts_the_records_a_file_holds(own: InProcessCLI, tmp_path: Path, records: object,
                                                  said: str | None) -> None:
    """`"records": {}` holds no record: no warning of "1 tuning record ... cannot be read"; what is there is
    counted as before."""
    state = tmp_path / "home" / "state"
    state.mkdir(parents=True)
    (state / "tuning.json").write_text(json.dumps({"format": 1, "records": records, "hashes": []}))
    r = own("tune", "--show")
    assert r.returncode == 0, r.stderr
    if said is None:
        assert "cannot be read" not in r.stderr, r.stderr
    else:
        assert r.stderr.startswith(f"warning: {said} in {state / 'tuning.json'} cannot be read"), r.stderr


def test_fit_names_the_preset_whose_override_tensor_names_a_gpu_the_plan_lacks(own: InProcessCLI) -> None:
    """The preset's PARAMETER, as run says it; a typed -ot that replaces it is -ot's error."""
    made = own("create", "otbot", "-f", "-", input="FROM smollm2:135m\nPARAMETER override_tensor exps=CUDA5\n")
    assert made.returncode == 0, made.stderr
    r = own("fit", "-m", "otbot", "--gpu-memory", "24G")
    assert (r.returncode, r.stdout, r.stderr) == (2, "", "localgen: error: the preset otbot's PARAMETER "
                                                  "override_tensor: CUDA5 names GPU 5, and the plan has 1 GPU "
                                                  "(give -ot to replace it here)\n"), r.stderr
    r = own("fit", "-m", "otbot", "--gpu-memory", "24G", "-ot", "exps=CUDA3")
    assert (r.returncode, r.stderr) == (2, "localgen: error: --override-tensor: CUDA3 names GPU 3, and the plan has "
                                        "1 GPU\n"), r.stderr
    r = own("fit", "-m", "otbot", "--gpu-memory", "24G", "-ot", "exps=CUDA0")
    assert r.returncode == 0 and "full GPU" in r.stdout, r.stderr


@pytest.mark.parametrize(("knob", "value", "said", "flag"), [
    ("override_tensor", ("exps=CPU,",), "PARAMETER override_tensor has an empty item in 'exps=CPU,'", "-ot"),
    ("rpc", "127.0.0.1:99999", "PARAMETER rpc 127.0.0.1:99999: the port must be 1 to 65535", "--rpc"),
])
def test_a_presets_load_setting_refused_since_it_was_saved_names_the_preset(smollm2_path: Path, knob: str,
                                                                           value: object, said: str,
                                                                           flag: str) -> None:
    """A preset saved with `PARAMETER override_tensor exps=CPU,` (taken then; an empty item is refused now) failed
    every load with `--override-tensor has an empty item ...`, a flag never typed and no way out: its PARAMETER
    line is named, with the flag that replaces it, as for a buffer type this build lacks. Replaced, it loads."""
    import dataclasses

    from localgen.cli.options import preset
    from localgen.errors import UsageError
    from localgen.models.resolve import resolve
    from localgen.types import LoadParams

    ref = dataclasses.replace(resolve(str(smollm2_path)), name="oldbot", load={knob: value})
    with pytest.raises(UsageError) as e:
        preset.load_params(ref, LoadParams(), lambda name: False)
    assert e.value.message.startswith(f"the preset oldbot's {said}"), e.value.message
    assert e.value.hint == f"give {flag} to replace it here"
    assert preset.load_params(ref, LoadParams(), lambda name: name == knob) == LoadParams().for_model(
        ref.summary.context_length)


def test_a_load_setting_checked_as_text_names_where_it_was_written() -> None:
    """check_load (a preset's file read back, an Ollama model's params): -ot's and --rpc's errors name the line
    given, where the caller gives one; their flags otherwise."""
    from localgen.errors import UsageError
    from localgen.loadsettings import check_load

    with pytest.raises(UsageError, match=r"^PARAMETER override_tensor has an empty item in 'exps=CPU,'"):
        check_load("override_tensor", ("exps=CPU,",), "PARAMETER override_tensor")
    with pytest.raises(UsageError, match=r"^PARAMETER rpc takes HOST:PORT"):
        check_load("rpc", "x", "PARAMETER rpc")
    with pytest.raises(UsageError, match=r"^--override-tensor has an empty item"):
        check_load("override_tensor", ("exps=CPU,",))


def test_an_empty_override_tensor_item_is_named_by_its_parameter_line_in_a_modelfile_and_a_saved_preset(
        own: InProcessCLI, tmp_path: Path) -> None:
    """`PARAMETER override_tensor exps=CPU,` said `PARAMETER override_tensor: --override-tensor has an empty item`
    in a Modelfile, and a preset saved with it before empty items were refused named the flag alone: both name the
    PARAMETER line, once."""
    r = own("create", "oldbot", "-f", "-", input="FROM smollm2:135m\nPARAMETER override_tensor exps=CPU,\n")
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert r.stderr.startswith("localgen: error: stdin line 2: PARAMETER override_tensor has an empty item in "
                               "'exps=CPU,'"), r.stderr
    r = own("create", "oldbot", "-f", "-", input="FROM smollm2:135m\nPARAMETER override_tensor exps=CPU\n")
    assert r.returncode == 0, r.stderr
    saved = tmp_path / "home" / "data" / "presets" / "oldbot.json"
    data = json.loads(saved.read_text())
    data["load"]["override_tensor"] = ["exps=CPU,"]  # as a preset created before the refusal keeps it
    saved.write_text(json.dumps(data))
    r = own("run", "-m", "oldbot", "-p", "hi", "-n", "1")
    assert (r.returncode, r.stdout, r.stderr.count("\n")) == (1, "", 1), r.stderr
    assert f"the preset file {saved} is damaged: PARAMETER override_tensor has an empty item in 'exps=CPU,'" in \
        r.stderr, r.stderr
    assert "--override-tensor" not in r.stderr, r.stderr
