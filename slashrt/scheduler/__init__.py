"""The executor: one trio event loop interleaving compute and polling coroutines."""

from slashrt.scheduler._executor import Executor, Input
from slashrt.scheduler._stats import ExecutorStats

__all__ = ["Executor", "ExecutorStats", "Input"]
