"""Registers the ``aeron`` data source with PySpark: Spark imports every installed top-level module
named ``pyspark_<x>`` and registers its ``DefaultSource`` under ``DefaultSource.name()``."""

from aeron_spark.connector.datasource import AeronDataSource as DefaultSource

__all__ = ["DefaultSource"]
