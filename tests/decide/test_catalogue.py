"""The rule catalogue (pipelines/decide/catalogue.py) against the code and documents it describes."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.config import DetectionConfig
from pipelines.decide.catalogue import RULES, Anomaly, EvidenceKind, limited_by


def test_every_kind_has_one_rule_whose_settings_exist():
    assert set(RULES) == set(Anomaly)
    fields = set(DetectionConfig.model_fields)
    for kind, spec in RULES.items():
        assert spec.kind is kind and spec.evidence in EvidenceKind
        assert set(spec.config) <= fields, (kind, set(spec.config) - fields)
        assert set(spec.limited) <= set(spec.resource_types), kind
        # a rule that limits says what, and on which evidence a limited resource is judged
        assert bool(spec.limited) == (spec.limits is not None) == (spec.demand_evidence is not None), kind


def test_the_limiting_rule_of_each_limited_resource_type():
    assert limited_by("group") is Anomaly.RUNAWAY_RETRY and limited_by("topic") is Anomaly.TRAFFIC_SURGE
    with pytest.raises(ValueError, match="no rule limits a broker"):
        limited_by("broker")


def test_every_kind_is_documented_in_the_contracts():
    contracts = Path("docs/contracts.md").read_text()
    assert all(f"`{kind.value}`" in contracts for kind in Anomaly)
