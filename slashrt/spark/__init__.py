"""slashrt.spark: push Spark DataFrames into running slashrt dataflows, exactly once.

On the slashrt side, an ingest endpoint feeds one dataflow source from many Spark tasks::

    with IngestServer(flow) as server:                       # or IngestEndpoint in any executor
        ingest(df, server.target("events"), secret=server.secret, end=True)
        result = server.result()

On the Spark side, `ingest` (a DataFrame, the target, a column mapping) and `stream_writer`
(Structured Streaming's foreachBatch) convert Arrow batches to slashrt records with numpy and
stream them over the authenticated TCP transport; `generators` makes the benchmark streams on
Spark. `IngestCluster` runs the dataflow on a slashrt cluster with one endpoint per executor
(`_cluster`); `run_on_spark` starts the cluster's executors as the tasks of a Spark barrier
stage (`_barrier`). The pieces: `_mapping` (Spark types to fields, checks), `_convert` (Arrow to records),
`_protocol` (what travels), `_endpoint` (slashrt side), `_ingest` (Spark side). PySpark is
needed only on the Spark side (`pip install slashrt[spark]`).
"""

from slashrt.spark._barrier import run_on_spark
from slashrt.spark._cluster import IngestCluster
from slashrt.spark._convert import ArrowConverter
from slashrt.spark._endpoint import IngestEndpoint, IngestError, IngestServer, IngestStats
from slashrt.spark._ingest import IngestReport, check_data, finish, ingest, stream_writer
from slashrt.spark._mapping import ColumnPlan, FieldPlan, IngestSchemaError, plan_columns
from slashrt.spark._protocol import IngestTarget, ingest_id_for

__all__ = [
    "ArrowConverter",
    "ColumnPlan",
    "FieldPlan",
    "IngestCluster",
    "IngestEndpoint",
    "IngestError",
    "IngestReport",
    "IngestSchemaError",
    "IngestServer",
    "IngestStats",
    "IngestTarget",
    "check_data",
    "finish",
    "ingest",
    "ingest_id_for",
    "plan_columns",
    "run_on_spark",
    "stream_writer",
]
