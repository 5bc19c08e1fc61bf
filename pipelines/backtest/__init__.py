"""The closed-loop backtest through Spark: the real governor's queries on the product's trigger grid, against the
simulated cluster of :mod:`pipelines.sim` that obeys the published limits; its figures and checks.

Imported by nothing in the product (``tests/test_layout.py``). May import every other plane.
"""
