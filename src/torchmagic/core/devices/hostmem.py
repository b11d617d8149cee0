"""Host (CPU) memory of this process and machine, without psutil.

Linux reads ``/proc``; elsewhere the ``resource`` module gives the peak only. Every
function answers ``None`` when the platform cannot tell, never a guess.
"""

from __future__ import annotations

import os
import platform
import sys


def _status_kib(field: str) -> int | None:
    """A ``kB`` line of ``/proc/self/status`` (``VmRSS``, ``VmHWM``) in bytes."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def rss() -> int | None:
    """Resident set size of this process now."""
    return _status_kib("VmRSS")


def peak_rss() -> int | None:
    """Highest resident set size since start or since :func:`reset_peak_rss`."""
    peak = _status_kib("VmHWM")
    if peak is not None:
        return peak
    try:
        import resource
    except ImportError:  # Windows
        return None
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss if sys.platform == "darwin" else maxrss * 1024  # bytes on macOS, KiB else


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS counter (Linux ≥ 4.0: ``5`` into ``clear_refs``).

    Returns False where the peak cannot be reset; :func:`peak_rss` then keeps counting
    from the start of the process.
    """
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
    except OSError:
        return False
    return True


def machine_memory() -> tuple[int | None, int | None]:
    """(available, total) bytes of RAM on this machine."""
    available = total = None
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                key, _, value = line.partition(":")
                if key == "MemAvailable":
                    available = int(value.split()[0]) * 1024
                elif key == "MemTotal":
                    total = int(value.split()[0]) * 1024
    except OSError:
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (AttributeError, ValueError, OSError):
            pass
    return available, total


def cpu_name() -> str:
    """The processor's model name, as ``/proc/cpuinfo`` or ``platform`` gives it."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"
