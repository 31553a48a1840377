"""System memory, swap and (on macOS) memory pressure, sampled cheaply once per update."""

from __future__ import annotations

import ctypes
import sys
import time
from dataclasses import dataclass
from functools import cache
from typing import Any

import psutil


@dataclass(frozen=True, slots=True)
class SystemMemory:
    """One sample of the machine's memory (bytes) and pressure (0..1, None where unknown)."""

    used: int
    available: int
    swap_used: int
    pressure: float | None

    def update_fields(self) -> dict[str, Any]:
        """The matching keyword arguments of `records.Update`."""
        return {
            "sys_mem_used": self.used,
            "sys_mem_available": self.available,
            "swap_used": self.swap_used,
            "mem_pressure": self.pressure,
        }


_last: tuple[float, SystemMemory] | None = None


def sample(max_age: float = 0.5) -> SystemMemory:
    """Memory now, or the sample taken less than `max_age` seconds ago (0 = always fresh).

    A fresh sample costs tens of microseconds (psutil reads kernel counters; on Linux it
    parses /proc/meminfo twice, about 80 us); the cache keeps that off most updates of a
    fast run, while a slow run still gets a fresh figure every update.
    """
    global _last
    now = time.monotonic()
    if _last is not None and now - _last[0] < max_age:
        return _last[1]
    vm = psutil.virtual_memory()
    try:
        swap = psutil.swap_memory().used
    except (OSError, RuntimeError):  # some containers hide swap accounting
        swap = 0
    fresh = SystemMemory(int(vm.used), int(vm.available), int(swap), pressure())
    _last = (now, fresh)
    return fresh


def pressure() -> float | None:
    """macOS memory pressure, 0 (none) .. 1 (critical), from `kern.memorystatus_level`; else None.

    The kernel reports the percentage of memory still available to apps; pressure is the rest.
    Read with sysctlbyname through ctypes: spawning `sysctl` or `vm_stat` per update would
    cost milliseconds.
    """
    if sys.platform != "darwin":
        return None
    sysctl = _sysctlbyname()
    if sysctl is None:
        return None
    value = ctypes.c_int(0)
    size = ctypes.c_size_t(ctypes.sizeof(value))
    if sysctl(b"kern.memorystatus_level", ctypes.byref(value), ctypes.byref(size), None, 0) != 0:
        return None
    level = value.value
    if not 0 <= level <= 100:
        return None
    return round(1.0 - level / 100.0, 3)


@cache
def _sysctlbyname() -> Any:
    try:
        fn = ctypes.CDLL(None, use_errno=True).sysctlbyname
    except (OSError, AttributeError):
        return None
    fn.argtypes = [
        ctypes.c_char_p,
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.c_void_p,
        ctypes.c_size_t,
    ]
    fn.restype = ctypes.c_int
    return fn
