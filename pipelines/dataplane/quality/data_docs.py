"""GX Data Docs built from the validation results stored in the lake, without Spark.

Every micro-batch that GX validates (:class:`pipelines.dataplane.quality.gate.QualityGate`, every ``[quality]
validate_every_n_batches`` ingest batches) stores GX's own result per suite, an ``ExpectationSuiteValidationResult``,
as one row of ``quality/validation_runs`` (:data:`pipelines.schemas.QUALITY_VALIDATION_RUNS`):

* ``batch_id`` (long): the ingest micro-batch; ``suite`` (string): the table the suite is for, e.g.
  ``silver/broker_stats`` (the same value as in ``quality/validation_results``); ``success`` (boolean);
  ``validated_at`` (timestamp, UTC);
* ``result_json`` (string): ``ExpectationSuiteValidationResult.to_json_dict()`` as JSON, with the run identified in
  its ``meta``: ``run_id`` = run name ``batch-<batch_id>`` and run time ``validated_at``.

:func:`build_docs` reads that table with delta-rs (the ``deltalake`` package), rebuilds the results with GX's
``ExpectationSuiteValidationResultSchema``, puts them in the validation results store of an ephemeral GX context
whose Data Docs site writes to a directory and calls ``build_data_docs()``. Nothing is validated again: the pages
show exactly what GX reported for each micro-batch. One page per stored run (suite × micro-batch):
``validations/<gx suite>/batch-<id>/<run time>/<gx suite>-batch-<id>.html``; the suites' pages
(``expectations/<gx suite>.html``) come from the newest stored run of each suite.

GX's index table is drawn by bootstrap-table and jQuery loaded from public CDNs. So that the index is readable
offline too, a plain HTML list of the stored runs (with links to their pages) is added to ``index.html``; it is
hidden when those scripts load.

Command line (:func:`pipelines.dataplane.quality.cli.main`):
    python -m pipelines.dataplane.quality docs --lake LAKE [--out DIR] [--last N]
"""

from __future__ import annotations

import copy
import datetime as dt
import html
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines import tables

VALIDATION_RUNS = tables.QUALITY_VALIDATION_RUNS
DOCS_SUBDIR = "quality/data_docs"
SITE_NAME = "rate_governor"
#: Marks the offline list of runs added to GX's ``index.html``.
OFFLINE_INDEX_ID = "rate-governor-runs"


class DataDocsError(RuntimeError):
    """No stored results to build Data Docs from, or GX did not render a page of a stored run."""


def _utc(ts: dt.datetime) -> dt.datetime:
    return ts.replace(tzinfo=dt.timezone.utc) if ts.tzinfo is None else ts.astimezone(dt.timezone.utc)


def configuration_name(configuration: Any) -> str:
    """``expect_column_values_to_be_between(tps)``: a GX ``ExpectationConfiguration``'s type and its column(s).
    The one name of an expectation: quarantine reasons, ``quality/validation_results`` and the Data Docs use it."""
    return expectation_name(configuration.type, configuration.kwargs)


def expectation_name(kind: str, kwargs: dict) -> str:
    """:func:`configuration_name` of an expectation given as its type and keyword arguments."""
    kw = {k: v for k, v in kwargs.items() if v is not None}
    columns = [str(kw[k]) for k in ("column", "column_A", "column_B") if k in kw]
    return f"{kind}({','.join(columns)})"


def run_name(batch_id: int) -> str:
    """``batch-<batch_id>``: the GX run name of a validated micro-batch."""
    return f"batch-{batch_id}"


def gx_suite_name(table: str) -> str:
    """``silver/broker_stats`` → ``silver_broker_stats`` (the GX suite and data asset name of a table)."""
    return table.replace("/", "_")


def batch_identifier(table: str, batch_id: int) -> str:
    """``silver_broker_stats-batch-3``: the GX batch identifier of a stored run (the page's file name)."""
    return f"{gx_suite_name(table)}-{run_name(batch_id)}"


def stamp(result: Any, table: str, batch_id: int, at: dt.datetime) -> Any:
    """Identify a GX ``ExpectationSuiteValidationResult`` as the run of micro-batch ``batch_id`` in its ``meta``
    (as ``ValidationDefinition.run`` would): ``run_id`` (run name ``batch-<id>``, run time ``at``, naive = UTC),
    ``validation_time``, ``batch_spec.data_asset_name`` = ``table`` and ``rate_governor`` = ``{"micro_batch_id",
    "table"}``. Changes ``result`` in place and returns it."""
    from great_expectations.core.run_identifier import RunIdentifier

    run_id = RunIdentifier(run_name=run_name(batch_id), run_time=_utc(at))
    result.meta["run_id"] = run_id
    result.meta["validation_time"] = run_id.run_time
    result.meta["batch_spec"] = {**(result.meta.get("batch_spec") or {}), "data_asset_name": table}
    result.meta["rate_governor"] = {"micro_batch_id": batch_id, "table": table}
    return result


def run_row(batch_id: int, table: str, result: Any, at: dt.datetime) -> tuple:
    """One ``quality/validation_runs`` row (``batch_id, suite, success, validated_at, result_json``) for GX's
    result of validating micro-batch ``batch_id`` of ``table`` at ``at`` (naive = UTC); stamps ``result``."""
    stamp(result, table, batch_id, at)
    return batch_id, table, bool(result.success), at, json.dumps(result.to_json_dict())


def load_result(result_json: str) -> Any:
    """``result_json`` of a stored run → GX ``ExpectationSuiteValidationResult``.

    Raises:
        DataDocsError: the text is not a serialized GX suite validation result.
    """
    from great_expectations.core.expectation_validation_result import (
        ExpectationSuiteValidationResultSchema,
    )

    try:
        return ExpectationSuiteValidationResultSchema().load(json.loads(result_json))
    except Exception as e:
        raise DataDocsError(f"stored result is not a GX suite validation result: {e}") from e


@dataclass(frozen=True)
class StoredRun:
    """A row of ``quality/validation_runs`` with its GX result rebuilt."""

    batch_id: int
    suite: str
    success: bool
    validated_at: dt.datetime  # UTC, aware
    result: Any  # ExpectationSuiteValidationResult

    @property
    def run_name(self) -> str:
        return run_name(self.batch_id)

    @property
    def key(self) -> Any:
        """The GX ``ValidationResultIdentifier`` of the run (suite, run name + time, batch identifier)."""
        from great_expectations.core.run_identifier import RunIdentifier
        from great_expectations.data_context.types.resource_identifiers import (
            ExpectationSuiteIdentifier,
            ValidationResultIdentifier,
        )

        return ValidationResultIdentifier(
            ExpectationSuiteIdentifier(name=self.result.suite_name),
            RunIdentifier(run_name=self.run_name, run_time=self.validated_at),
            batch_identifier(self.suite, self.batch_id),
        )

    @property
    def page(self) -> str:
        """The run's page, relative to the site directory."""
        return "validations/" + "/".join(self.key.to_tuple()) + ".html"

    @property
    def failed(self) -> list[str]:
        """``<expectation type>(<columns>)`` of the expectations that failed."""
        return [configuration_name(r.expectation_config) for r in self.result.results if not r.success]


def read_runs(lake_dir: str | Path, last: int = 0) -> list[StoredRun]:
    """The stored runs of ``<lake_dir>/quality/validation_runs`` (all, or those of the ``last`` > 0 newest
    micro-batches by ``batch_id``), oldest first; read with delta-rs, no Spark.

    Raises:
        DataDocsError: the table does not exist or holds no runs, or a stored result cannot be loaded.
    """
    import pyarrow.dataset as ds
    from deltalake import DeltaTable

    path = str(Path(lake_dir) / VALIDATION_RUNS)
    if not DeltaTable.is_deltatable(path):
        raise DataDocsError(
            f"no stored validation results in {path} (GX validates every [quality] validate_every_n_batches "
            "ingest micro-batches; 0 = never)"
        )
    dataset = DeltaTable(path).to_pyarrow_dataset()
    where = None
    if last > 0:
        ids = sorted(set(dataset.to_table(columns=["batch_id"]).column("batch_id").to_pylist()))
        where = ds.field("batch_id").isin(ids[-last:])
    columns = ["batch_id", "suite", "success", "validated_at", "result_json"]
    rows = dataset.to_table(columns=columns, filter=where).to_pylist()
    if not rows:
        raise DataDocsError(f"no stored validation results in {path} (the table is empty)")
    runs = [
        StoredRun(
            batch_id=int(r["batch_id"]),
            suite=r["suite"],
            success=bool(r["success"]),
            validated_at=_utc(r["validated_at"]),
            result=load_result(r["result_json"]),
        )
        for r in rows
    ]
    return sorted(runs, key=lambda r: (r.batch_id, r.validated_at, r.suite))


def _context(out: Path) -> Any:
    import great_expectations as gx

    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    context = gx.get_context(mode="ephemeral")
    context.add_data_docs_site(
        site_name=SITE_NAME,
        site_config={
            "class_name": "SiteBuilder",
            "show_how_to_buttons": False,
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
            "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(out.resolve())},
        },
    )
    return context


def _suites_from_runs(runs: list[StoredRun]) -> list[Any]:
    """Per GX suite, the suite as its newest stored run validated it (the expectations of that result)."""
    import great_expectations as gx

    newest: dict[str, StoredRun] = {}
    for run in runs:
        newest[run.result.suite_name] = run
    suites = []
    for name, run in sorted(newest.items()):
        expectations = []
        for r in run.result.results:
            conf = copy.deepcopy(r.expectation_config)
            conf.kwargs.pop("batch_id", None)  # the batch it ran on, not part of the expectation
            conf.id = None  # the id binds it to the suite it ran in; this is a new suite object
            expectations.append(conf.to_domain_obj())
        suites.append(gx.ExpectationSuite(name=name, expectations=expectations))
    return suites


def _offline_index(runs: list[StoredRun]) -> str:
    rows = []
    for run in reversed(runs):  # newest first, as GX's table
        failed = run.failed
        total = len(run.result.results)
        status = "passed" if run.success else f"FAILED {len(failed)} of {total}: " + ", ".join(failed)
        rows.append(
            "<tr>"
            f"<td>{html.escape(run.suite)}</td>"
            f"<td>{run.batch_id}</td>"
            f'<td><a href="{html.escape(run.page)}">{html.escape(run.run_name)}</a></td>'
            f"<td>{run.validated_at:%Y-%m-%d %H:%M:%S} UTC</td>"
            f"<td>{html.escape(status)}</td>"
            "</tr>"
        )
    return (
        f'<div id="{OFFLINE_INDEX_ID}" class="container-fluid pl-5 pr-5">'
        "<h3>Validation runs (stored in quality/validation_runs)</h3>"
        '<table class="table table-sm" border="1" cellpadding="4" style="border-collapse: collapse">'
        "<thead><tr><th>Suite (table)</th><th>Micro-batch</th><th>Run name</th><th>Run time</th>"
        "<th>Result</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table></div>"
        "<script>if (window.jQuery && window.jQuery.fn && window.jQuery.fn.bootstrapTable) {"
        f'document.getElementById("{OFFLINE_INDEX_ID}").hidden = true;}}</script>'
    )


def build_site(runs: list[StoredRun], out_dir: str | Path) -> Path:
    """Build the GX Data Docs site of ``runs`` into ``out_dir`` (created if missing) and return its
    ``index.html``. Pages of runs built earlier into the same directory stay; the index lists only ``runs``.

    Raises:
        DataDocsError: GX did not render the page of a run (GX logs rendering errors instead of raising).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    context = _context(out)
    for suite in _suites_from_runs(runs):
        context.suites.add(suite)
    store = context.validation_results_store
    for run in runs:
        store.set(run.key, run.result)
    context.build_data_docs(site_names=[SITE_NAME])
    missing = [run.page for run in runs if not (out / run.page).is_file()]
    if missing:
        raise DataDocsError(f"GX did not render {len(missing)} of {len(runs)} pages, e.g. {missing[0]}")
    index = out / "index.html"
    text = index.read_text(encoding="utf-8")
    listing = _offline_index(runs)
    text = text.replace("</body>", listing + "</body>", 1) if "</body>" in text else text + listing
    index.write_text(text, encoding="utf-8")
    return index


def build_docs(
    lake_dir: str | Path, out_dir: str | Path | None = None, *, last: int = 0, echo: Callable[[str], Any] = print
) -> Path:
    """Build GX Data Docs from the runs stored in ``<lake_dir>/quality/validation_runs`` (all, or those of the
    ``last`` newest micro-batches) into ``out_dir`` (default ``<lake_dir>/quality/data_docs``). ``echo`` gets one
    line per run (micro-batch, table, run time, result, page relative to the site) and then
    ``Data Docs: <index.html>``. No Spark,
    no validation. Returns the path of ``index.html``.

    Raises:
        DataDocsError: nothing stored, a stored result cannot be loaded, or a page was not rendered.
    """
    runs = read_runs(lake_dir, last)
    out = Path(out_dir) if out_dir else Path(lake_dir) / DOCS_SUBDIR
    index = build_site(runs, out)
    for run in runs:
        failed = run.failed
        result = "passed" if run.success else f"FAILED {len(failed)}/{len(run.result.results)}: {', '.join(failed)}"
        echo(f"batch {run.batch_id:>6}  {run.suite:<22} {run.validated_at:%Y-%m-%dT%H:%M:%SZ}  {result}  {run.page}")
    echo(f"Data Docs: {index}")
    return index
