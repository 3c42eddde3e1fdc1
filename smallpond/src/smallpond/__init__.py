"""smallpond: partitioned, lazy DataFrames over DuckDB, on a local process pool or on Ray.

    import smallpond
    sp = smallpond.init()
    df = sp.read_parquet("data/*.parquet").repartition(8, hash_by="key")
    df = sp.partial_sql("select key, count(*) as n from {0} group by key", df)
    df.write_parquet("out/")
"""
from ._version import __version__

# session and DataFrame
from .session import Session, init
from .dataframe import DataFrame

# logical plan
from .logical.dataset import (DataSet, ParquetDataSet, CsvDataSet, JsonDataSet, ArrowTableDataSet,
                              PandasDataSet)
from .logical.node import (Context, Node, LogicalPlan, DataSourceNode, DataSetPartitionNode,
                           EvenlyDistributedPartitionNode, HashPartitionNode, ShuffleNode, SqlEngineNode,
                           ArrowComputeNode, PandasComputeNode, ArrowBatchNode, ConsolidateNode, LimitNode,
                           DataSinkNode, RootNode)

# execution
from .execution.task import RuntimeContext, TaskError

__all__ = [
    "__version__", "init", "Session", "DataFrame",
    "DataSet", "ParquetDataSet", "CsvDataSet", "JsonDataSet", "ArrowTableDataSet", "PandasDataSet",
    "Context", "Node", "LogicalPlan", "DataSourceNode", "DataSetPartitionNode", "EvenlyDistributedPartitionNode",
    "HashPartitionNode", "ShuffleNode", "SqlEngineNode", "ArrowComputeNode", "PandasComputeNode",
    "ArrowBatchNode", "ConsolidateNode", "LimitNode", "DataSinkNode", "RootNode",
    "RuntimeContext", "TaskError",
]
