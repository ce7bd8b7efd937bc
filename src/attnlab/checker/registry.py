"""The probe registry: every probe is a small function ``probe(session)`` registered by its name.

The probes themselves live in :mod:`attnlab.checker.probes` (a few per file, grouped by what they probe); this module
holds only the registry and the two exceptions a probe raises to stop early, so that the session
(:mod:`attnlab.checker.session`) can run probes without importing them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["REGISTERED", "ProbeAbort", "ProbeSkip", "ordered", "probe"]

#: Every registered probe: ``name -> probe(session)``, in the order they were registered.
REGISTERED: dict[str, Callable[[Any], None]] = {}


class ProbeAbort(Exception):
    """A call timed out, or the worker ended too often; nothing more is called."""


class ProbeSkip(Exception):
    """The probe needs a capability the function does not have."""


def probe(name: str) -> Callable[[Callable[[Any], None]], Callable[[Any], None]]:
    """Register the decorated function as the probe ``name`` (a name may be registered once)."""
    if name in REGISTERED:
        raise RuntimeError(f"probe {name!r}: defined twice")

    def register(fn: Callable[[Any], None]) -> Callable[[Any], None]:
        REGISTERED[name] = fn
        return fn

    return register


def ordered(names: tuple[str, ...]) -> dict[str, Callable[[Any], None]]:
    """The registered probes ``names``, in that order (a RuntimeError names one that is not registered)."""
    missing = [n for n in names if n not in REGISTERED]
    if missing:
        raise RuntimeError(f"probes {missing} are listed but no function is registered for them")
    return {n: REGISTERED[n] for n in names}
