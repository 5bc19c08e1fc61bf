"""Spark transforms of the data plane, ``DataFrame -> DataFrame``: parse, silver, the windowed TPS sums, checks and
the known-broker filter. Built-in Column functions only (a UDF only in :mod:`udfs`).
"""
