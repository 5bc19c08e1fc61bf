"""The status page from a small lake written in the governor's table schemas (no Spark session needed)."""

from __future__ import annotations

import base64
import io
import re

import matplotlib.image as mpimg
import pytest

from pipelines.ops import status
from pipelines.writeback import publish
from tests.ops.lake_fixture import GROUP, NOW, RETRY_TOPIC, build_lake, minute, write_rows


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    return build_lake(tmp_path_factory.mktemp("status") / "lake")


def images(page: str) -> dict[str, bytes]:
    return {alt: base64.b64decode(data) for alt, data in
            re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,([^"]+)">', page)}


def test_page_shows_limits_timeline_tps_and_quarantine(lake, tmp_path):
    page_path = status.write_page(str(lake), tmp_path / "out", now=NOW)
    page = page_path.read_text()
    pictures = images(page)
    # the timeline, the limited group, its broker (flagged too), the retry topic's broker is the same one, quarantine
    assert sorted(pictures) == sorted(["Timeline", f"TPS group {GROUP}", "TPS broker broker-a", "Quarantine"])
    for alt, png in pictures.items():
        pixels = mpimg.imread(io.BytesIO(png), format="png")
        assert pixels.shape[0] > 100 and pixels.shape[1] > 400, alt
    # limits in force with reason and expiry; the advisory one expired before NOW is marked as such
    assert "get-pugc-to-ai-consumer" in page and "retry ratio 2.60" in page
    assert page.count("(expired: brokers fell back to their default)") == 1
    assert re.search(r'<tr class="expired">(?:(?!</tr>).)*orders', page)
    assert "anomaly windows: 30; limit decisions: 2; quarantined: 2" in page
    assert "Input records: 7" in page
    # Data Docs not built in this lake: the page says how to build them
    assert "python -m pipelines.dataplane.quality docs --lake" in page
    assert status.IMAGE_CHECK_SCRIPT in page


def test_limits_held_longer_than_the_maximum_are_flagged_for_a_person(lake, tmp_path):
    """The group's limit started with the window ending 10:21 and the newest window ends 10:40: held 19 minutes.
    Under a 60-minute maximum it is a plain row; under a 10-minute one it is flagged."""
    calm = status.write_page(str(lake), tmp_path / "calm", now=NOW).read_text()
    row = re.search(r'<tr class="[^"]*">(?:(?!</tr>).)*get-pugc-to-ai-consumer(?:(?!</tr>).)*</tr>', calm).group(0)
    assert "2026-11-22 10:21" in row and "broker-a 30.0" in row and "held-long" not in row
    flagged = status.write_page(str(lake), tmp_path / "flag", now=NOW, max_held_seconds=600).read_text()
    assert re.search(r'<tr class="held-long">(?:(?!</tr>).)*held over 10 min: look at it', flagged)


def test_an_enforced_limit_under_what_its_topic_s_normal_traffic_needs_is_flagged_and_a_storm_s_never(tmp_path):
    """A topic held at 289.4 msg/s on the baseline of 289.3 frozen with its limit (issue 49's sweep case 218, never
    lifted after its fixes) is under the 434.0 msg/s its normal traffic needs (limits.surge_squeeze_headroom 1.5x);
    at a headroom of 1.0 it is not. The group's storm limit never is, though its frozen baseline (its consume rate,
    100) is over its 30.0: a retry storm's limit has no normal of its own; nor is a topic an operator pinned under
    its floor (a person's decision). The newest state row wins; a bad --normal-headroom is one line and exit 2."""
    lake = build_lake(tmp_path / "lake")
    write_rows(lake, "state/policy", [
        {"resource_type": "topic", "resource": "payment-events", "limit_qps": 289.4, "baseline_tps": 150.0,
         "batch_id": 1},
        {"resource_type": "topic", "resource": "payment-events", "limit_qps": 289.4, "baseline_tps": 289.3,
         "batch_id": 2},
        {"resource_type": "group", "resource": GROUP, "limit_qps": 30.0, "baseline_tps": 100.0, "batch_id": 2},
        {"resource_type": "topic", "resource": "promo", "limit_qps": 50.0, "baseline_tps": 400.0, "batch_id": 2,
         "override_id": "ovr-0a1b2c3d"}])
    records = publish.read_published(str(lake)) + [
        {"resource_type": "topic", "resource": "payment-events", "limit_qps": 289.4, "burst": 289, "mode": "enforce",
         "expires_at": "2026-11-22T11:00:00Z", "version": 5, "reason": "TRAFFIC_SURGE: payment-events",
         "signature": "ef"},
        {"resource_type": "topic", "resource": "promo", "limit_qps": 50.0, "burst": 50, "mode": "enforce",
         "expires_at": "2026-11-22T11:00:00Z", "version": 2, "reason": "pinned by ovr-0a1b2c3d", "signature": "ab"}]
    publish.write_limits_file(str(lake), records, NOW)
    page = status.write_page(str(lake), tmp_path / "out", now=NOW).read_text()
    assert re.search(r'<tr class="under-normal">(?:(?!</tr>).)*payment-events(?:(?!</tr>).)*under its normal floor, '
                     r'434.0 msg/s: no probe lifts it; exempt it once it is fixed', page)
    for name in ("get-pugc-to-ai-consumer", "promo"):
        row = re.search(rf'<tr class="[^"]*">(?:(?!</tr>).)*{name}(?:(?!</tr>).)*</tr>', page).group(0)
        assert "normal floor" not in row and "under-normal" not in row, name
    plain = status.write_page(str(lake), tmp_path / "plain", now=NOW, normal_headroom=1.0).read_text()
    assert "class=\"under-normal\"" not in plain and "normal floor" not in plain
    assert status.main(["--lake", str(lake), "--normal-headroom", "0.5"]) == 2


def test_a_limit_shows_what_its_last_probe_admitted_beyond_the_level_before_it(tmp_path):
    """The newest state row of the group says its last undone probe let 468 messages through beyond the limit it
    raised: its row says so; a topic without a probe says nothing of one."""
    lake = build_lake(tmp_path / "lake")
    write_rows(lake, "state/policy", [
        {"resource_type": "group", "resource": GROUP, "limit_qps": 30.0, "baseline_tps": 300.0, "batch_id": 3,
         "probe_excess_messages": 468.0}])
    page = status.write_page(str(lake), tmp_path / "out", now=NOW).read_text()
    row = re.search(rf'<tr class="[^"]*">(?:(?!</tr>).)*{GROUP}(?:(?!</tr>).)*</tr>', page).group(0)
    assert "its last probe admitted 468 messages beyond the level before it" in row


def test_a_limit_whose_windows_have_all_been_at_its_cap_for_30_minutes_is_named_for_a_person(tmp_path):
    """The group's windows have all been at its cap since minute 9, 31 minutes before the newest window (minute 40):
    its row is marked and says so; at its cap since minute 11 (29 minutes) it is not; nor under an override."""
    lake = build_lake(tmp_path / "lake")
    write_rows(lake, "state/policy", [
        {"resource_type": "group", "resource": GROUP, "limit_qps": 30.0, "baseline_tps": 300.0, "batch_id": 3,
         "at_cap_since": minute(9)}])
    page = status.write_page(str(lake), tmp_path / "out", now=NOW).read_text()
    row = re.search(rf'<tr class="([^"]*)">(?:(?!</tr>).)*{GROUP}(?:(?!</tr>).)*</tr>', page)
    assert "at-cap" in row.group(1) and "at its cap for 31 min" in row.group(0)
    for since, override in ((minute(11), None), (minute(9), "ovr-0a1b2c3d")):
        write_rows(lake, "state/policy", [
            {"resource_type": "group", "resource": GROUP, "limit_qps": 30.0, "baseline_tps": 300.0, "batch_id": 4,
             "at_cap_since": since, "override_id": override}], mode="overwrite")
        page = status.write_page(str(lake), tmp_path / "out", now=NOW).read_text()
        assert "at its cap for" not in page and "at-cap" not in page.split("</style>")[-1], (since, override)


def test_figures_are_limited_and_ordered(lake):
    st = status.add_figures(status.read_status(str(lake), NOW), max_resources=1)
    titles = [f.title for f in st.figures]
    assert titles == ["Timeline", f"TPS group {GROUP}", "Quarantine"]  # the limited resource first
    assert st.omitted == ["broker broker-a"]


def test_tps_series_cover_the_resource_around_its_events(lake):
    st = status.read_status(str(lake), NOW)
    series = status._series(str(lake), "group", GROUP)
    assert set(series) == {"consume TPS", "retry TPS (sent back)"}
    assert series["retry TPS (sent back)"]["tps"].max() == 780.0
    assert status._brokers_of(str(lake), {RETRY_TOPIC}, set()) == ["broker-a"]
    assert len(st.decisions) == 2 and len(st.anomalies) == 30


def test_data_docs_link_when_built(lake, tmp_path):
    docs = lake / "quality" / "data_docs"
    docs.mkdir(parents=True)
    (docs / "index.html").write_text("<html></html>")
    try:
        page = status.write_page(str(lake), tmp_path, now=NOW).read_text()
    finally:
        (docs / "index.html").unlink()
    assert f'<a href="{(docs / "index.html").resolve().as_uri()}">Data Docs</a>' in page


def test_cli_writes_the_page_and_names_it(lake, tmp_path, capsys):
    assert status.main(["--lake", str(lake), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out.strip()
    assert out == f"status page: {(tmp_path / 'index.html').resolve().as_uri()}"


def test_cli_on_a_directory_without_tables_says_so_in_one_line(tmp_path, capsys):
    assert status.main(["--lake", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no governor tables under" in err


def test_empty_lake_still_renders(tmp_path):
    (tmp_path / "gold").mkdir()
    page = status.write_page(str(tmp_path), now=NOW).read_text()
    assert "No limits in force" in page and "No anomaly and no decision so far." in page
    assert images(page) == {}


def test_a_replayed_recording_says_so_and_shows_the_same_scenario_in_closed_loop(lake, tmp_path):
    """./run.sh's page: the input note at the top, and the simulator's closed loop of the same scenario as the last
    figure, with its summary line (a real simulation of a short article scenario, no Spark)."""
    import datetime as dt

    from pipelines.config import load_config
    from pipelines.ops import demo
    from pipelines.sim.spec import ScenarioSpec

    spec = ScenarioSpec(seed=7, minutes=24, onset_minute=12, start=dt.datetime(2026, 1, 5, 6, 0, tzinfo=dt.timezone.utc))
    note, loop = demo.replay_and_closed_loop(spec, load_config(str(demo.DEFAULT_CONF)), tmp_path)
    assert (tmp_path / "closed-loop.png").stat().st_size > 10_000
    page = status.write_page(str(lake), tmp_path / "out", now=NOW, input_note=note, closed_loop=loop).read_text()
    assert "<b>Input.</b> a recording, replayed." in page and "never obeyed the limits" in page
    assert page.index("<b>Input.</b>") < page.index("<h2>Limits in force</h2>")
    pictures = images(page)
    assert "The same scenario in closed loop (simulator)" in pictures
    pixels = mpimg.imread(io.BytesIO(pictures["The same scenario in closed loop (simulator)"]), format="png")
    assert pixels.shape[0] > 400
    # the closed loop limits the storm: its figures, as the summary line says
    assert re.search(r"limit in force \d+ s after the storm began, brokers admitted (0\.\d\d|1\.\d\d)x", loop.caption)
    # without the note and figure (a production lake), neither appears
    plain = status.write_page(str(lake), tmp_path / "plain", now=NOW).read_text()
    assert "<b>Input.</b>" not in plain and "closed loop" not in plain
