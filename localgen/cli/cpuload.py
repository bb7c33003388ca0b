"""Other work on the CPUs while something measures speed (tune's configurations, quantize --ladder's types):
CpuLoad samples it before and during, and says it in words once it is past BUSY."""

from __future__ import annotations

import time
from typing import Any

from localgen.cli.output import plural

BUSY = 0.25  # other work's share of all CPU time past which a tune's figures are not kept (without --even-if-busy)


class CpuLoad:
    """Other work on the CPUs, before and while measuring: it slows every configuration unevenly (and favours
    fewer threads), so a tune made under it is not kept as a default without saying so. Before: a half-second
    sample; while: every configuration's span, the time this process took subtracted (hardware.others_share;
    /proc/stat, where a hypervisor's steal counts as other work). Without /proc/stat, the load average before."""

    def __init__(self, before: float | None, what: str | None) -> None:
        from localgen import hardware

        self.first = before  # other work's share just before measuring (None: unknown)
        self.what = what  # the same, in words, when it was busy
        self.worst: float | None = None  # the largest share over one configuration while measuring
        self.last = hardware.cpu_sample()

    @classmethod
    def before(cls, err: Any, then: str = "the record is not kept unless --even-if-busy") -> CpuLoad:
        """Sampled now; a warning when the machine is busy already, saying what follows (`then`). quantize
        --ladder's speeds are measured under the same check."""
        import os

        from localgen import hardware

        a = hardware.cpu_sample()
        time.sleep(0.5)
        b = hardware.cpu_sample()
        share = hardware.others_share(a, b) if a and b else None
        if share is not None:
            busy = f"{share:.0%} of the CPU time" if share > BUSY else None
        else:
            cores = hardware.usable_cores()
            try:
                avg = os.getloadavg()[0]
            except (OSError, AttributeError):  # none to read; no load average at all (Windows): not known as busy
                avg = 0.0
            busy = f"a load of {avg:.1f} on {plural(cores, 'core')}" if avg > 0.5 * cores else None
        what = f"{busy} just before measuring" if busy else None
        if busy is not None:
            err.warn(f"this machine is busy (other work takes {busy}): the figures will reflect it, and {then}")
        return cls(share, what)

    def sample(self, view: Any) -> None:
        """Other work's share since the last sample (one configuration's measurements); said once it is busy."""
        from localgen import hardware

        now = hardware.cpu_sample()
        share = hardware.others_share(self.last, now) if self.last and now else None
        self.last = now
        if share is None:
            return
        if share > BUSY and (self.worst is None or self.worst <= BUSY):
            view.note(f"other work took {share:.0%} of the CPU time while that configuration was measured")
        self.worst = share if self.worst is None else max(self.worst, share)

    def busy(self) -> str | None:
        """How busy other work kept the CPUs, in words, when it was past BUSY before or while measuring."""
        parts = [self.what] if self.what else []
        if self.worst is not None and self.worst > BUSY:
            parts.append(f"up to {self.worst:.0%}{'' if parts else ' of the CPU time'} while measuring")
        return " and ".join(parts) or None
