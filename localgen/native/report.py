"""What llama.cpp's log says about a load, parsed once into a typed record (the only reader of that text)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# the load line that says some weights went into a repacked layout ("CPU_REPACK model buffer size = 12.66 MiB")
_REPACK_BUFFER = re.compile(r"_REPACK model buffer size = *(?!0\.00 )[0-9.]+")
_FA_AUTO = re.compile(r"Flash Attention (enabled|not supported)")
_BUFFER = re.compile(r"load_tensors:\s+(.+?) model buffer size =\s+([0-9.]+) MiB")
_OFFLOADED = re.compile(r"load_tensors:\s*(offloaded \d+/\d+ layers to GPU)")
# a tensor a placement pattern (-ot, --cpu-moe, --n-cpu-moe) moved: llama-model-loader's debug line, which
# native/logs.py keeps ("tensor blk.0.ffn_up_exps.weight (2 MiB f16) buffer type overridden to CPU")
_OVERRIDDEN = re.compile(r"tensor (\S+) \((\d+) MiB \S+\) buffer type overridden to (\S+)")


@dataclass(frozen=True)
class LoadReport:
    """One load as llama.cpp logged it."""

    buffers: tuple[tuple[str, float], ...] = ()  # (buffer, MiB of weights): "CPU_Mapped", "CUDA0", "RPC0[h:p]"
    repacked: bool = False  # some weights went into a repacked CPU layout (batch invariance depends on it)
    flash_attn_auto: bool | None = None  # what flash attention "auto" chose; None where the log did not say
    offloaded: str | None = None  # "offloaded 31/31 layers to GPU", where layers went to a GPU
    overridden: tuple[tuple[str, str, int], ...] = ()  # (tensor, buffer, MiB rounded down) a pattern placed
    # each tensor's bytes, where the loader read the model's tensor table (models/load.py): `moved` sums them
    sizes: Mapping[str, int] | None = None

    @property
    def placement(self) -> dict[str, float]:
        """Where the weights went: buffer → MiB."""
        return dict(self.buffers)

    def record(self) -> dict[str, object]:
        """What went where, for a JSON record (run --json's load, serve's /api/ps): weights by buffer (MiB),
        the layers offloaded, what the placement patterns moved."""
        return {"weights_mib": self.placement, "offloaded": self.offloaded, "moved": self.moved}

    @property
    def moved(self) -> dict[str, dict[str, float]]:
        """What the placement patterns moved, by buffer: tensors, of them experts, and MiB (to 2 decimals: the
        tensors' bytes where `sizes` has them, else each tensor's MiB rounded down, as llama.cpp logs it). A tensor put
        in RAM is under "CPU" wherever it went: beside a GPU llama.cpp gives `=CPU` that GPU's pinned host buffer
        ("overridden to CUDA_Host"), which is RAM all the same."""
        from localgen.placement import gpu_index, is_expert

        out: dict[str, dict[str, float]] = {}
        for tensor, buffer, mib in self.overridden:
            row = out.setdefault("CPU" if gpu_index(buffer) is None else buffer,
                                 {"tensors": 0, "experts": 0, "mib": 0.0})
            row["tensors"] += 1
            row["experts"] += is_expert(tensor)
            size = (self.sizes or {}).get(tensor)
            row["mib"] += size / (1 << 20) if size is not None else mib
        for row in out.values():
            row["mib"] = round(row["mib"], 2)
        return out


def parse_load_log(lines: Sequence[str]) -> LoadReport:
    """The LoadReport of a load's log lines."""
    chosen = next((m.group(1) for line in lines if (m := _FA_AUTO.search(line))), None)
    offloaded = [m.group(1) for line in lines if (m := _OFFLOADED.search(line))]
    buffers = tuple((m.group(1), float(m.group(2))) for line in lines if (m := _BUFFER.search(line)))
    return LoadReport(
        buffers=buffers,
        repacked=any(_REPACK_BUFFER.search(line) for line in lines),
        flash_attn_auto=None if chosen is None else chosen == "enabled",
        offloaded=_where_offloaded(offloaded[-1], buffers) if offloaded else None,
        overridden=tuple((m.group(1), m.group(3), int(m.group(2))) for line in lines
                         if (m := _OVERRIDDEN.search(line))),
    )


def last_load() -> LoadReport:
    """The LoadReport of the lines logged since the last logs.clear() (which each load begins with)."""
    from localgen.native import logs

    return parse_load_log(logs.lines(last=1000))


def _where_offloaded(said: str, buffers: tuple[tuple[str, float], ...]) -> str:
    """llama.cpp's "offloaded 31/31 layers to GPU", which says GPU for any device layers go to: "to RPC servers"
    where they went to RPC servers' buffers (RPC0[host:port]) and no GPU's, "to GPU and RPC servers" for both."""
    from localgen.placement import gpu_index

    if not any(name.startswith("RPC") for name, _ in buffers):
        return said
    gpu = any(gpu_index(name) is not None and not name.startswith("RPC") for name, _ in buffers)
    return said.replace("to GPU", "to GPU and RPC servers" if gpu else "to RPC servers")
