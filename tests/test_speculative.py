"""Speculative decoding: same output as plain decoding, drafts counted, mismatched vocabularies refused."""

from __future__ import annotations

import json

from localgen.engine.speculative import LookupDrafter
from tests.conftest import CLI, InProcessCLI, assert_same_greedy_text


def _copy_prompt(items: int) -> str:
    text = "\n".join(f"Item {i}: the box holds {i * 3} apples and a note for warehouse {i % 5}." for i in range(items))
    return f"{text}\n\nCopy the list above exactly."


PROMPT = _copy_prompt(5)  # SmolLM2's; Gemma's test needs eight items (see there)


def test_lookup_finds_the_latest_continuation() -> None:
    d = LookupDrafter(max_ngram=2)
    assert d.propose([1, 2, 3, 4, 9, 2, 3, 5, 6, 2, 3], 3) == [5, 6, 2]
    assert d.propose([7, 8, 9], 3) == []
    assert d.propose([1, 2, 1], 2) == [2, 1]


# 40 answer tokens copy the first items of the list, past several drafts rejected where a number changes: a
# draft kept without its check changes the text there (lookup: at the 23rd character), and so does a rejected
# draft left in the KV cache (at the 8th); no break tried here showed only in the 80 tokens this took before
def _run(cli: CLI, *extra: str) -> dict[str, object]:
    r = cli("run", "-p", PROMPT, "-n", "40", "--json", "--no-prompt-cache", "--ctx", "1024", *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_greedy_output_is_unchanged_by_lookup_and_draft(cli: CLI) -> None:
    plain = _run(cli, "--temperature", "0", "--no-flash-attn", "--no-repack")
    lookup = _run(cli, "--temperature", "0", "--lookup", "--draft-max", "3")
    draft = _run(cli, "--temperature", "0", "--draft", "smollm2:135m", "--draft-max", "4")
    assert_same_greedy_text([lookup["text"], draft["text"]], [plain["text"]] * 2, "drafts never change greedy text")
    ls, ds = lookup["stats"], draft["stats"]
    assert isinstance(ls, dict) and isinstance(ds, dict)
    assert ls["drafted"] > 0 and 0 < ls["accepted"] <= ls["drafted"]
    from localgen.native.devices import has_gpu

    # the same model drafting for itself: nearly every draft kept on a CPU, where a draft's row is computed as the
    # check's; on a GPU the draft (one token a call) and the check (a batch) run other kernels, and near ties go
    # both ways
    # (docs/benchmarks.md, "A GPU check")
    assert ds["accepted"] >= ds["drafted"] * (0.75 if has_gpu() else 0.9), "a draft that is the model itself is " \
        "almost always right"
    assert lookup["load"]["flash_attn"] is False and lookup["load"]["repack"] is False  # type: ignore[index]
    # run.md: where each setting came from: these were said to be the user's flags
    off = "off for --draft/--lookup (a batched check would drift from plain decoding)"
    assert lookup["load"]["origins"]["flash_attn"] == lookup["load"]["origins"]["repack"] == off  # type: ignore[index]
    assert plain["load"]["origins"]["flash_attn"] == "flag"  # type: ignore[index]  # (--no-flash-attn, typed)
    assert plain["stats"]["drafted"] is None  # type: ignore[index]


def test_greedy_lookup_is_exact_on_repacked_q4_k_weights_too(cli: CLI) -> None:
    # Eight items (163 prompt tokens): with repacking and flash attention both on, lookup's text leaves the
    # plain one at its first token; with either alone it stays the same for 160 (three rows a check, under the
    # repacked GEMM's 4). With five items, both on drift only at the 274th character. 32 tokens: a rejected
    # draft left in the KV cache changes the text at the 53rd character, a draft kept unchecked at the 6th.
    args = ["run", "-m", "gemma3:270m", "--raw", "-p", _copy_prompt(8), "-n", "32", "--temperature", "0", "--json",
            "--no-prompt-cache", "--ctx", "1024"]
    plain = cli(*args, "--no-flash-attn", "--no-repack")
    lookup = cli(*args, "--lookup", "--draft-max", "2")
    assert plain.returncode == lookup.returncode == 0, lookup.stderr
    assert_same_greedy_text([json.loads(lookup.stdout)["text"]], [json.loads(plain.stdout)["text"]],
                            "drafts never change greedy text")


def test_sampling_with_lookup_is_reproducible_per_seed(cli: CLI) -> None:
    a = _run(cli, "--temperature", "1.0", "--seed", "11", "--lookup")
    b = _run(cli, "--temperature", "1.0", "--seed", "11", "--lookup")
    c = _run(cli, "--temperature", "1.0", "--seed", "12", "--lookup")
    assert a["text"] == b["text"] and a["text"] != c["text"]
    assert a["stats"]["accepted"] > 0  # type: ignore[index]


def test_bad_speculative_flags(cli: CLI, cli_in_process: InProcessCLI) -> None:
    r = cli("run", "-p", "hi", "--draft", "gemma3:270m")
    assert r.returncode == 2 and "vocabulary" in r.stderr and r.stderr.count("\n") == 1
    r = cli_in_process("run", "-p", "hi", "--draft", "smollm2:135m", "--lookup")  # a usage error: before a load
    assert r.returncode == 2 and "cannot be combined" in r.stderr
    r = cli("run", "-p", "hi", "--lookup", "--flash-attn", "-n", "4")
    assert r.returncode == 0 and "with --flash-attn, speculative output can differ slightly" in r.stderr
    r = cli("run", "-p", "hi", "--lookup", "--repack", "-n", "4")
    assert r.returncode == 0 and "with --repack" in r.stderr
    r = cli("run", "-p", "hi", "--lookup", "-ctv", "q8_0", "-n", "4")  # a quantized V cache needs flash attention
    assert r.returncode == 0 and "a quantized V cache (q8_0) keeps flash attention on, so speculative output can " \
        "differ slightly" in r.stderr, r.stderr
    for flags, words in ((("--draft-max", "3"), "--draft-max sets how many tokens --lookup or --draft drafts"),
                         (("--length-penalty", "2"), "--length-penalty scores beam search's hypotheses")):
        r = cli_in_process("run", "-p", "hi", *flags)  # without its feature: a usage error, as serve's, not ignored
        assert r.returncode == 2 and words in r.stderr and r.stderr.count("\n") == 1, r.stderr
