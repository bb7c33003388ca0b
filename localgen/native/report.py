"""What llama.cpp's log says about a load, parsed once into a typed record (the only reader of that text)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

# the load line that says some weights went into a repacked layout ("CPU_REPACK model buffer size = 12.66 MiB")
_REPACK_BUFFER = re.compile(r"_REPACK model buffer size = *(?!0\.00 )[0-9.]+")
_FA_AUTO = re.compile(r"Flash Attention (enabled|not supported)")
_BUFFER = re.compile(r"load_tensors:\s+(.+?) model buffer size =\s+([0-9.]+) MiB")
_OFFLOADED = re.compile(r"load_tensors:\s*(offloaded \d+/\d+ layers to GPU)")


@dataclass(frozen=True)
class LoadReport:
    """One load as llama.cpp logged it."""

    buffers: tuple[tuple[str, float], ...] = ()  # (buffer, MiB of weights): "CPU_Mapped", "CUDA0", "RPC0[h:p]"
    repacked: bool = False  # some weights went into a repacked CPU layout (batch invariance depends on it)
    flash_attn_auto: bool | None = None  # what flash attention "auto" chose; None where the log did not say
    offloaded: str | None = None  # "offloaded 31/31 layers to GPU", where layers went to a GPU

    @property
    def placement(self) -> dict[str, float]:
        """Where the weights went: buffer → MiB."""
        return dict(self.buffers)


def parse_load_log(lines: Sequence[str]) -> LoadReport:
    """The LoadReport of a load's log lines."""
    chosen = next((m.group(1) for line in lines if (m := _FA_AUTO.search(line))), None)
    offloaded = [m.group(1) for line in lines if (m := _OFFLOADED.search(line))]
    return LoadReport(
        buffers=tuple((m.group(1), float(m.group(2))) for line in lines if (m := _BUFFER.search(line))),
        repacked=any(_REPACK_BUFFER.search(line) for line in lines),
        flash_attn_auto=None if chosen is None else chosen == "enabled",
        offloaded=offloaded[-1] if offloaded else None,
    )


def last_load() -> LoadReport:
    """The LoadReport of the lines logged since the last logs.clear() (which each load begins with)."""
    from localgen.native import logs

    return parse_load_log(logs.lines(last=1000))
