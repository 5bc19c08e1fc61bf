"""The flows of the streaming job's queries (:mod:`pipelines.job.flows.ingest`, ``fast``, ``gold``), assembled into
one :class:`~pipelines.job.flows.assembly.Governor`. A flow is I/O at the edge: Spark reduces, the flow collects
once as Arrow, :mod:`pipelines.decide` decides, the flow writes and publishes.
"""
