"""The native layer's pure parts: the load report parsed from llama.cpp's log lines."""

from __future__ import annotations

from localgen.native.report import LoadReport, parse_load_log

_LOG = [
    "llama_model_loader: - type q4_K:  193 tensors",
    "load_tensors: offloading 30 repeating layers to GPU",
    "load_tensors: offloaded 31/31 layers to GPU",
    "load_tensors:        CUDA0 model buffer size =    92.10 MiB",
    "load_tensors:   CPU_Mapped model buffer size =    28.12 MiB",
    "load_tensors:   CPU_REPACK model buffer size =    12.66 MiB",
    "llama_context: Flash Attention enabled",
]


def test_a_load_log_becomes_one_report() -> None:
    report = parse_load_log(_LOG)
    assert report == LoadReport(buffers=(("CUDA0", 92.10), ("CPU_Mapped", 28.12), ("CPU_REPACK", 12.66)),
                                repacked=True, flash_attn_auto=True, offloaded="offloaded 31/31 layers to GPU")
    assert report.placement == {"CUDA0": 92.10, "CPU_Mapped": 28.12, "CPU_REPACK": 12.66}


def test_an_empty_repack_buffer_and_no_word_on_flash_attention() -> None:
    report = parse_load_log(["load_tensors:   CPU_REPACK model buffer size =     0.00 MiB",
                             "llama_context: Flash Attention not supported, set to disabled"])
    assert report.repacked is False
    assert report.flash_attn_auto is False
    assert report.offloaded is None
    assert parse_load_log([]).flash_attn_auto is None
