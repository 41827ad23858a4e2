"""Public sinks: `slashrt.sinks.Collect()`, `Callback(fn)`, `CsvFile(path)`, `ParquetFile(path)`."""

from slashrt.ops.sinks import Callback, Collect, CsvFile, ParquetFile

__all__ = ["Callback", "Collect", "CsvFile", "ParquetFile"]
