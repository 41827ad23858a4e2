"""Batch: what operators see, a zero-copy view over a buffer's records.

A batch wraps a numpy structured array (usually a view straight into a channel slot, or a 2-D
view over several consecutive full slots, whose columns are flattened when first read, or a
read-only view of a source's own array lent to its channel), an
optional selection (row indices kept by earlier filters, so filtering copies no records) and
derived columns added by `with_columns`. Column access gathers only the column asked for.

    >>> b = Batch(records)                 # no copy
    >>> views = b[b["event_type"] == 0]     # selection only, still no record copied
    >>> views["ad_id"]                      # gathers one int64 column
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from slashrt._kernels import gather
from slashrt.errors import SchemaError

__all__ = ["Batch", "as_batch"]


class Batch:
    # `times`: each row's logical time (epoch, int64) where slashrt tracks it for a user
    # operator (`slashrt.ops.operator`: the source's watermark at each record), else None;
    # rows kept by select/with_columns/project keep theirs
    __slots__ = ("_records", "_sel", "_cols", "_len", "times")

    def __init__(
        self,
        records: np.ndarray | None,
        sel: np.ndarray | None = None,
        cols: Mapping[str, np.ndarray] | None = None,
    ):
        # records=None: a batch made only of columns (after project); it needs at least one.
        self._records = records
        self._sel = sel
        self._cols = dict(cols) if cols else {}
        self.times: np.ndarray | None = None
        if records is None:
            self._len = len(next(iter(self._cols.values())))
        else:
            self._len = records.size if sel is None else len(sel)

    # -- shape -------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._len

    @property
    def nbytes(self) -> int:
        """Bytes of the rows this batch covers (whole records, plus any added columns)."""
        row = sum(c.itemsize for c in self._cols.values())
        if self._records is not None:
            row += self._records.dtype.itemsize
        return self._len * row

    @property
    def names(self) -> tuple[str, ...]:
        if self._records is None:
            return tuple(self._cols)
        base = tuple(n for n in self._records.dtype.names if n not in self._cols)
        return base + tuple(self._cols)

    def __contains__(self, name: str) -> bool:
        return name in self._cols or (self._records is not None and name in self._records.dtype.names)

    # -- access ------------------------------------------------------------------------------------
    def column(self, name: str) -> np.ndarray:
        col = self._cols.get(name)
        if col is not None:
            return col
        try:
            if self._records is None:
                raise ValueError(name)
            col = self._records[name]
        except ValueError:
            raise SchemaError(f"no column {name!r} in batch with columns {list(self.names)}") from None
        if col.ndim > 1:
            # records of several slots: read this one field (and only the selected rows) in
            # one native pass, instead of numpy's flattening copy and then a gather
            return gather(col, self._sel)
        return col if self._sel is None else col[self._sel]

    def view(self, name: str) -> np.ndarray:
        """The column without a copy where possible: a record field read in place (for the
        records of a run of slots a 2-D strided view, slots x records) when nothing was
        selected; otherwise what `column` returns. For kernels that take strided 1-D/2-D
        views (`minmax`, `HashAgg.update`), so that a whole batch never gathers its fields."""
        if self._sel is None and self._records is not None and name not in self._cols:
            try:
                return self._records[name]
            except ValueError:
                pass  # column() names the missing column
        return self.column(name)

    def __getitem__(self, key):
        if isinstance(key, str):
            return self.column(key)
        return self.select(key)

    def select(self, rows) -> Batch:
        """Keep the rows picked by a boolean mask, an index array or a slice (no record copied)."""
        rows = np.asarray(rows) if not isinstance(rows, slice) else rows
        if isinstance(rows, np.ndarray) and rows.size == 0 and rows.dtype != np.bool_:
            rows = rows.astype(np.intp)  # np.asarray([]) is float64, no index
        if isinstance(rows, np.ndarray) and rows.dtype == np.bool_:
            if rows.shape != (self._len,):
                raise SchemaError(f"boolean mask of shape {rows.shape} for a batch of {self._len} rows")
            rows = np.flatnonzero(rows)
        if self._sel is None:
            sel = np.arange(self._len)[rows] if isinstance(rows, slice) else rows
        else:
            sel = self._sel[rows]
        cols = {n: c[rows] for n, c in self._cols.items()}
        out = Batch(self._records, sel, cols)
        if self.times is not None:
            out.times = self.times[rows]
        return out

    def with_columns(self, **columns: np.ndarray) -> Batch:
        """A batch with extra (or replaced) columns, each an array of len(self) values."""
        cols = dict(self._cols)
        for name, values in columns.items():
            values = np.asarray(values)
            if values.shape != (self._len,):
                raise SchemaError(f"column {name!r} has shape {values.shape}, expected ({self._len},)")
            cols[name] = values
        out = Batch(self._records, self._sel, cols)
        out.times = self.times
        return out

    def project(self, names) -> Batch:
        """Keep only the named columns (materialises them as columns)."""
        if not names:
            raise SchemaError("project() needs at least one column")
        out = Batch(None, None, {n: self.column(n) for n in names})
        out.times = self.times
        return out

    def to_numpy(self, dtype: np.dtype | None = None) -> np.ndarray:
        """A packed structured array holding this batch (a copy only where needed)."""
        if dtype is None:
            if not self._cols and self._sel is None and self._records is not None:
                return self._records if self._records.ndim == 1 else self._records.reshape(-1)
            dtype = np.dtype([(n, self.column(n).dtype) for n in self.names])
        out = np.empty(self._len, dtype=dtype)
        for name in dtype.names:
            out[name] = self.column(name)
        return out

    def as_records(self, dtype: np.dtype) -> np.ndarray:
        """The rows as records of `dtype`: in place where the batch is whole records of that
        dtype (a slot's, 1-D, or a run of slots', 2-D: slots x records), else a packed copy."""
        if not self._cols and self._sel is None and self._records is not None and self._records.dtype == dtype:
            return self._records
        return self.to_numpy(dtype)

    def __repr__(self) -> str:
        return f"Batch({self._len} rows, columns={list(self.names)})"


def as_batch(value) -> Batch:
    """Accept a Batch or a structured numpy array (what a user operator may return)."""
    if isinstance(value, Batch):
        return value
    if isinstance(value, np.ndarray) and value.dtype.names is not None and value.ndim == 1:
        return Batch(value)
    raise TypeError(f"expected a Batch or a 1-D structured numpy array, got {type(value).__name__}")
