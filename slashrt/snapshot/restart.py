"""Restart strategies: after a job failed, restart it (after how many seconds) or give up (why).

Flink's three (`restart-strategy`): `NoRestart`; `FixedDelay(attempts, delay)`: up to `attempts`
restarts in the job's life, each after `delay` seconds; `FailureRate(max_failures, interval,
delay)`: restarts after `delay` as long as the failures are rare, at most `max_failures` of them
within any `interval` seconds. A strategy is a pure decision with a little memory (the failures
it has seen): `on_failure(now)` returns `Restart(delay)` or `GiveUp(reason)`, where the reason
is one sentence a user can act on; `now` is any monotonic clock's seconds.

`parse_restart(value)` builds one from user options: a strategy, a mapping
``{"strategy": "fixed-delay", "attempts": 3, "delay": "2s"}`` or a string
``"fixed-delay:attempts=3,delay=2s"`` / ``"failure-rate:max-failures=3,interval=1min,delay=1s"``
/ ``"none"``; a bad value is an OptionError naming the option and what it accepts.

Laws (tests/snapshot/test_restart.py):
- no-restart gives up at the first failure;
- fixed-delay restarts the first `attempts` failures, each after `delay`, and gives up from the
  next one on, whatever the times;
- failure-rate restarts a failure iff, counting it, at most `max_failures` failures fell in the
  `interval` seconds up to it (the window (now - interval, now]); so spreading failures out
  never makes it give up, and a burst of max_failures + 1 always does.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
import math
import re

from slashrt.errors import OptionError

__all__ = [
    "FailureRate",
    "FixedDelay",
    "GiveUp",
    "NoRestart",
    "Restart",
    "RestartStrategy",
    "STRATEGIES",
    "parse_restart",
    "parse_seconds",
]


@dataclass(frozen=True)
class Restart:
    """Restart the job from its last complete checkpoint after `delay` seconds."""

    delay: float


@dataclass(frozen=True)
class GiveUp:
    """Do not restart: the job fails, for `reason` (one sentence)."""

    reason: str


class NoRestart:
    """Never restart (the default when checkpointing is off)."""

    name = "none"

    def on_failure(self, now: float) -> Restart | GiveUp:
        return GiveUp("the restart strategy is 'none'; set one (e.g. restart='fixed-delay:attempts=3,delay=1s') to recover")

    def __repr__(self) -> str:
        return "NoRestart()"


class FixedDelay:
    """Up to `attempts` restarts in the job's life, each after `delay` seconds (Flink's
    defaults: 1 attempt, 1 s)."""

    name = "fixed-delay"

    def __init__(self, attempts: int = 1, delay: float = 1.0):
        self.attempts = _count("attempts", attempts, self.name)
        self.delay = parse_seconds(delay, f"restart strategy '{self.name}': delay")
        self.failures = 0

    def on_failure(self, now: float) -> Restart | GiveUp:
        self.failures += 1
        if self.failures <= self.attempts:
            return Restart(self.delay)
        return GiveUp(
            f"the job failed {self.failures} times and the fixed-delay strategy allows {self.attempts} "
            f"restart{'s' if self.attempts != 1 else ''}; raise attempts to keep recovering"
        )

    def __repr__(self) -> str:
        return f"FixedDelay(attempts={self.attempts}, delay={self.delay:g})"


class FailureRate:
    """Restart after `delay` seconds while at most `max_failures` failures fall within any
    `interval` seconds (Flink's defaults: 1 per 60 s, delay 1 s)."""

    name = "failure-rate"

    def __init__(self, max_failures: int = 1, interval: float = 60.0, delay: float = 1.0):
        self.max_failures = _count("max-failures", max_failures, self.name, least=1)
        self.interval = parse_seconds(interval, f"restart strategy '{self.name}': interval", positive=True)
        self.delay = parse_seconds(delay, f"restart strategy '{self.name}': delay")
        self._recent: deque[float] = deque()  # failure times within the last interval

    def on_failure(self, now: float) -> Restart | GiveUp:
        self._recent.append(now)
        while self._recent and self._recent[0] <= now - self.interval:
            self._recent.popleft()
        if len(self._recent) <= self.max_failures:
            return Restart(self.delay)
        return GiveUp(
            f"the job failed {len(self._recent)} times within {self.interval:g} s and the failure-rate "
            f"strategy allows {self.max_failures}; raise max-failures or shorten the interval"
        )

    def __repr__(self) -> str:
        return f"FailureRate(max_failures={self.max_failures}, interval={self.interval:g}, delay={self.delay:g})"


RestartStrategy = NoRestart | FixedDelay | FailureRate
STRATEGIES = {cls.name: cls for cls in (NoRestart, FixedDelay, FailureRate)}
_OPTIONS = {"none": set(), "fixed-delay": {"attempts", "delay"}, "failure-rate": {"max-failures", "interval", "delay"}}


def parse_restart(value: object) -> RestartStrategy:
    """A restart strategy from a user option (see the module docstring); OptionError if bad."""
    if isinstance(value, (NoRestart, FixedDelay, FailureRate)):
        return value
    if value is None:
        return NoRestart()
    if isinstance(value, str):
        name, _, rest = value.strip().partition(":")
        options = {}
        for part in filter(None, (p.strip() for p in rest.split(","))):
            key, eq, raw = part.partition("=")
            if not eq:
                raise OptionError(f"restart strategy {value!r}: {part!r} is not key=value (e.g. 'fixed-delay:attempts=3,delay=1s')")
            options[key.strip()] = raw.strip()
    elif isinstance(value, Mapping):
        options = {str(k).replace("_", "-"): v for k, v in value.items()}
        name = options.pop("strategy", None)
        if not isinstance(name, str):
            raise OptionError(f"restart strategy {dict(value)!r}: give its name as 'strategy' ({', '.join(STRATEGIES)})")
    else:
        raise OptionError(f"restart strategy must be a string like 'fixed-delay:attempts=3,delay=1s' or a mapping, got {value!r}")
    name = name.strip().lower()
    if name not in STRATEGIES:
        raise OptionError(f"restart strategy must be one of {', '.join(STRATEGIES)}, got {name!r}")
    unknown = sorted(set(options) - _OPTIONS[name])
    if unknown:
        takes = ", ".join(sorted(_OPTIONS[name])) or "no options"
        raise OptionError(f"restart strategy {name!r} takes {takes}; {unknown[0]!r} is not one of them")
    return STRATEGIES[name](**{k.replace("-", "_"): v for k, v in options.items()})


_UNITS = {"ms": 0.001, "s": 1.0, "min": 60.0, "h": 3600.0}
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ms|s|min|h)?\s*$")


def parse_seconds(value: object, name: str, positive: bool = False) -> float:
    """Seconds from a number or a string with a unit ("250ms", "2s", "1.5min", "1h"); OptionError
    naming `name` if it is not a finite duration >= 0 (> 0 if `positive`)."""
    seconds = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and (match := _DURATION.match(value)):
        seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if seconds is None or not math.isfinite(seconds) or seconds < 0 or (positive and seconds == 0):
        least = "> 0" if positive else ">= 0"
        raise OptionError(f"{name} must be a duration {least} (seconds, or a string like '250ms', '2s', '1min'), got {value!r}")
    return seconds


def _count(option: str, value: object, strategy: str, least: int = 0) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise OptionError(f"restart strategy '{strategy}': {option} must be a whole number >= {least}, got {value!r}")
    return value
