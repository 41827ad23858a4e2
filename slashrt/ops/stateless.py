"""Stateless operators: user `async def` functions over batches, filter, with_column, project.

User code runs inside a guard that names the step in any error, and its result is checked
against what the step promised (a batch with the declared columns, a mask of the right shape).
"""

from __future__ import annotations

import numpy as np

from slashrt._batch import Batch, as_batch
from slashrt._dataflow import ApplySpec, FilterSpec, ProjectSpec, WithColumnSpec, is_async
from slashrt.errors import OperatorError, SlashError
from slashrt.ops._node import Node

__all__ = ["ApplyNode", "FilterNode", "WithColumnNode", "ProjectNode"]


class _UserCode(Node):
    """A node that calls a user function (sync or async) and wraps its failures."""

    def __init__(self, step_id: str, fn):
        super().__init__(step_id)
        self._fn = fn
        self._async = is_async(fn)

    async def call(self, batch: Batch):
        with UserErrors(self.step_id, "user function"):
            if self._async:
                return await self._fn(batch)
            return self._fn(batch)


class UserErrors:
    """`with UserErrors(step_id, who):` around user code: what it raises leaves as an
    OperatorError naming the step (an OperatorError as it is; another slashrt error keeps its
    own sentence; anything else says `who` raised it)."""

    __slots__ = ("step_id", "who")

    def __init__(self, step_id: str, who: str):
        self.step_id, self.who = step_id, who

    def __enter__(self) -> None:
        pass

    def __exit__(self, kind, exc, tb) -> bool:
        if not isinstance(exc, Exception) or isinstance(exc, OperatorError):
            return False
        if isinstance(exc, SlashError):
            raise OperatorError(self.step_id, f"{type(exc).__name__}: {exc}") from exc
        raise OperatorError(self.step_id, f"{self.who} raised {type(exc).__name__}: {exc}") from exc


def user_batch(step_id: str, records, names: tuple[str, ...], *, did: str, fix: str) -> Batch:
    """What user code gave back (`did`: "returned", "emitted"), as a Batch with every column
    of `names`; anything else is an OperatorError naming the step and, for missing columns,
    the `fix`."""
    try:
        batch = as_batch(records)
    except TypeError as exc:
        raise OperatorError(step_id, f"{did} the wrong type: {exc}") from None
    missing = [n for n in names if n not in batch]
    if missing:
        raise OperatorError(step_id, f"{did} a batch without columns {missing} (it has {list(batch.names)}); {fix}")
    return batch


class ApplyNode(_UserCode):
    def __init__(self, spec: ApplySpec):
        super().__init__(spec.step_id, spec.fn)
        self._names = tuple(spec.fields)

    async def push(self, batch: Batch) -> None:
        out = await self.call(batch)
        if out is None:
            return
        fix = "declare the schema it returns with apply(..., schema=...)"
        await self.emit(user_batch(self.step_id, out, self._names, did="returned", fix=fix))


class FilterNode(_UserCode):
    def __init__(self, spec: FilterSpec):
        super().__init__(spec.step_id, spec.predicate)

    async def push(self, batch: Batch) -> None:
        mask = np.asarray(await self.call(batch))
        if mask.dtype != np.bool_ or mask.shape != (len(batch),):
            raise OperatorError(
                self.step_id, f"predicate returned {mask.dtype} of shape {mask.shape}, expected bool of shape ({len(batch)},)"
            )
        await self.emit(batch.select(mask))


class WithColumnNode(_UserCode):
    def __init__(self, spec: WithColumnSpec):
        super().__init__(spec.step_id, spec.fn)
        self._name = spec.name
        self._dtype = spec.dtype

    async def push(self, batch: Batch) -> None:
        values = np.asarray(await self.call(batch))
        if values.shape != (len(batch),):
            raise OperatorError(self.step_id, f"returned shape {values.shape}, expected ({len(batch)},)")
        if self._dtype is not None and values.dtype != self._dtype:
            values = values.astype(self._dtype)
        await self.emit(batch.with_columns(**{self._name: values}))


class ProjectNode(Node):
    def __init__(self, spec: ProjectSpec):
        super().__init__(spec.step_id)
        self._names = spec.names

    async def push(self, batch: Batch) -> None:
        await self.emit(batch.project(self._names))
