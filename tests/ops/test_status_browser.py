"""The status page in a real browser: headless Chromium (Debian's ``chromium``) loads the page, the page's own script
marks every <img> with its decoded width, and Chromium's screenshot is a real picture of it."""

from __future__ import annotations

import re
import shutil
import subprocess

import matplotlib.image as mpimg
import pytest

from pipelines.ops import status
from tests.ops.lake_fixture import NOW, build_lake

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install chromium; "
                                                ".ci/run installs it when apt-get is usable)"),
]


def chromium(tmp_path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=120, check=True)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    lake = build_lake(tmp_path_factory.mktemp("browser") / "lake")
    return status.write_page(str(lake), now=NOW)


def test_every_image_loads_in_chromium(page, tmp_path):
    dom = chromium(tmp_path, "--dump-dom", page.resolve().as_uri()).stdout
    assert 'data-images-checked="1"' in dom, "the page's load handler did not run"
    widths = [int(w) for w in re.findall(r'<img[^>]*data-natural-width="(\d+)"', dom)]
    assert len(widths) == len(re.findall(r"<img ", page.read_text())) == 4
    assert all(w > 400 for w in widths), widths


def test_screenshot_shows_the_page(page, tmp_path):
    shot = tmp_path / "status.png"
    chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,1600", "--hide-scrollbars",
             page.resolve().as_uri())
    pixels = mpimg.imread(shot)
    assert pixels.shape[:2] == (1600, 1280)
    # not a blank page: a good share of the pixels are not white (text, tables, plots)
    non_white = (pixels[:, :, :3].min(axis=2) < 0.9).mean()
    assert non_white > 0.03, non_white
