"""The native layer's pure parts: the load report parsed from llama.cpp's log lines."""

from __future__ import annotations

from typing import Any

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


def test_tensors_put_in_ram_are_under_cpu_also_beside_a_gpu() -> None:
    """run.md: `moved` keys what went to RAM as CPU. Beside a GPU, llama.cpp puts `-ot exps=CPU` in that GPU's pinned
    host buffer and logs "overridden to CUDA_Host" (an H200's doctor said "moved to CUDA_Host", and `moved["CPU"]`
    was missing); a tensor sent to a GPU keeps that GPU's name."""
    report = parse_load_log([
        "tensor blk.0.ffn_up_exps.weight (2 MiB q4_K) buffer type overridden to CUDA_Host",
        "tensor blk.0.ffn_down_exps.weight (3 MiB q6_K) buffer type overridden to CUDA_Host",
        "tensor blk.1.attn_q.weight (1 MiB q4_K) buffer type overridden to CPU",
        "tensor blk.1.ffn_up_exps.weight (2 MiB q4_K) buffer type overridden to CUDA1",
    ])
    assert report.moved == {"CPU": {"tensors": 3, "experts": 2, "mib": 6.0},
                            "CUDA1": {"tensors": 1, "experts": 1, "mib": 2.0}}


def test_an_empty_repack_buffer_and_no_word_on_flash_attention() -> None:
    report = parse_load_log(["load_tensors:   CPU_REPACK model buffer size =     0.00 MiB",
                             "llama_context: Flash Attention not supported, set to disabled"])
    assert report.repacked is False
    assert report.flash_attn_auto is False
    assert report.offloaded is None
    assert parse_load_log([]).flash_attn_auto is None


def test_doctor_reads_the_gpu_offload_from_the_load_report(monkeypatch: Any, capsys: Any, home: Any) -> None:
    """doctor's check says where the layers went from the engine's LoadReport, not by reading the log itself:
    a load that reports no layers offloaded is a PROBLEM; one that does names it."""
    from localgen.cli import doctor
    from localgen.engine import llama
    from localgen.models.resolve import resolve
    from localgen.types import LoadParams

    ref, load = resolve(None, offline=True), LoadParams(n_ctx=512, n_gpu_layers=-1)  # layers asked on the GPU
    monkeypatch.setattr(llama, "last_load", lambda: LoadReport())
    assert doctor._smoke_test(True, (), ref, load) == 1
    assert "did not report layers offloaded to the GPU" in capsys.readouterr().out
    monkeypatch.setattr(llama, "last_load", lambda: LoadReport(offloaded="offloaded 31/31 layers to GPU"))
    assert doctor._smoke_test(True, (), ref, load) == 0
    assert "on offloaded 31/31 layers to GPU: ok" in capsys.readouterr().out
