"""The rule catalogue: every anomaly kind the governor detects, defined once, with what each rule needs, and the
one registry of the limit policies (:func:`policy_for`).

``gold/anomalies.anomaly`` holds :class:`~pipelines.decide.words.Anomaly` values (docs/contracts.md §2). Per rule,
:data:`RULES` says:

* ``resource_types``: what it flags (a consumer group, a topic, a broker);
* ``evidence``: :attr:`EvidenceKind.MONOTONE` (a count floor, or a floor and a factor of a baseline of finalized
  windows: the lines still to come can only add, so the fast path may act on an open window's partial sums) or
  :attr:`EvidenceKind.RATIO` (retry ÷ consume, failures ÷ attempts: acts on an open window only once every expected
  broker has reported, so the denominator is final; :mod:`pipelines.decide.rules.preliminary`);
* ``limited``: the resource types it limits, ``limits`` what such a limit governs and ``policy`` the class that
  owns its limit's life (:mod:`pipelines.decide.limits.base`; none: it limits nothing itself);
* ``demand_evidence``: under an enforced limit the cap shows, so the limited resource is judged by its rule on
  this evidence (:mod:`pipelines.decide.rules.evidence`, the policy's ``judge``);
* ``normal``: what the baseline frozen with its limit (``state/policy.baseline_tps``) is, when it is the limited
  resource's own normal rate (:func:`normal_floor`: the lowest limit its normal traffic passes under,
  ``rate_governor_limit_normal_floor_messages_per_second``, docs/metrics.md); None when it is another figure;
* ``config``: its thresholds in ``[detection]`` (:class:`pipelines.config.DetectionConfig`); its predicate:
  :mod:`pipelines.decide.rules.facts`;
* ``source``: where the rule comes from.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from pipelines.decide.limits.base import Limit, LimitPolicy
from pipelines.decide.limits.retry_storm import RetryStormLimit
from pipelines.decide.limits.steps import Params
from pipelines.decide.rules import facts
from pipelines.decide.limits.surge import SurgeLimit
from pipelines.decide.words import Anomaly

__all__ = ["Anomaly", "EvidenceKind", "RuleSpec", "RULES", "limited_by", "normal_floor", "policy_for"]


class EvidenceKind(str, Enum):
    """How a rule's evidence grows as an open window's lines land (see the module docstring)."""

    MONOTONE = "monotone"
    RATIO = "ratio"


@dataclass(frozen=True)
class RuleSpec:
    """One rule of the catalogue (fields: see the module docstring)."""

    kind: Anomaly
    resource_types: tuple[str, ...]
    evidence: EvidenceKind
    limited: tuple[str, ...]
    limits: str | None
    demand_evidence: str | None
    config: tuple[str, ...]
    source: str
    policy: type[LimitPolicy] | None = None
    normal: str | None = None


RULES: dict[Anomaly, RuleSpec] = {
    Anomaly.RUNAWAY_RETRY: RuleSpec(
        Anomaly.RUNAWAY_RETRY, ("group",), EvidenceKind.RATIO, limited=("group",),
        limits="the group's retry traffic: one limiter per broker keyed %RETRY%<group>",
        demand_evidence="per broker the larger of the group's SNDBCK_PUT_NUMS and the plain sends to %RETRY%<group> "
                        "(TOPIC_PUT_NUMS), against the cluster-wide limit; RATE_LIMITED failures naming "
                        "%RETRY%<group>; the limiter's own last rejection (control/limiter_rejections)",
        config=("retry_ratio_threshold", "retry_floor_tps", "critical_factor"),
        source="article 001: a consumer that never acknowledged, %RETRY%get-pugc-to-ai-consumer at 785 TPS",
        policy=RetryStormLimit),  # its frozen baseline is the group's consume rate, not its retry traffic's normal
    Anomaly.TRAFFIC_SURGE: RuleSpec(
        Anomaly.TRAFFIC_SURGE, ("topic", "broker"), EvidenceKind.MONOTONE, limited=("topic",),
        limits="a topic's puts, only while a broker carrying it is BROKER_BUSY (else an advisory record)",
        demand_evidence="the topic's cluster-wide TOPIC_PUT_NUMS against its limit; RATE_LIMITED failures of the "
                        "topic; the carriers' health (BROKER_BUSY) for probing the limit upward, and a busy carrier "
                        "hides the demand under the limit; firing, its puts on a busy broker read through the other "
                        "writes that broker kept (crowding.crowded_demand)",
        config=("surge_factor", "busy_surge_factor", "surge_floor_tps", "baseline_windows", "baseline_min_windows",
                "baseline_quantile", "critical_factor"),
        source="article 001: one broker's writes rose about 8x",
        policy=SurgeLimit,
        normal="the topic's baseline puts, msg/s cluster-wide (the baseline_quantile of its last baseline_windows "
               "final windows, frozen when the limit was set)"),
    Anomaly.BROKER_BUSY: RuleSpec(
        Anomaly.BROKER_BUSY, ("broker",), EvidenceKind.MONOTONE, limited=(), limits=None, demand_evidence=None,
        config=("busy_failures_floor", "critical_factor"),
        source="article 001: [TIMEOUT_CLEAN_QUEUE]broker busy fast failures rejected sends of every topic"),
    Anomaly.FAILURE_SPIKE: RuleSpec(
        Anomaly.FAILURE_SPIKE, ("topic",), EvidenceKind.RATIO, limited=(), limits=None, demand_evidence=None,
        config=("failure_rate_threshold", "failure_floor", "critical_factor"),
        source="producer send failures; the limiter's own RATE_LIMITED rejections never count"),
}


def limited_by(resource_type: str) -> Anomaly:
    """The rule whose limit governs a limited resource of ``resource_type`` (``group`` → RUNAWAY_RETRY, ``topic``
    → TRAFFIC_SURGE).

    Raises:
        ValueError: no rule limits that type.
    """
    for spec in RULES.values():
        if resource_type in spec.limited:
            return spec.kind
    raise ValueError(f"no rule limits a {resource_type}")


def normal_floor(resource_type: str, baseline_tps: float | None, headroom: float) -> float | None:
    """The lowest limit a limited resource's normal traffic passes under (msg/s cluster-wide): ``headroom``
    (``limits.surge_squeeze_headroom``, 1.5) × the ``baseline_tps`` frozen with its limit (``state/policy``), where
    its rule's ``normal`` says that baseline is the resource's own (a topic's baseline puts); None otherwise (a
    retry storm's frozen baseline is its group's consume rate). The same headroom is the surge squeeze's floor
    (:meth:`pipelines.decide.limits.surge.SurgeLimit.squeeze_floor`): a topic's traffic back at its normal, a median,
    reaches the cap's ``bound_share`` under less (docs/decisions.md §8). A limit under it keeps a fixed topic at the
    cap, and where its carriers have too little headroom for a probe it is never lifted
    (``RateGovernorLimitUnderNormal``, the status page).

    Raises:
        ValueError: no rule limits that type.
    """
    if baseline_tps is None or RULES[limited_by(resource_type)].normal is None:
        return None
    return facts.normal_floor(baseline_tps, headroom)


def policy_for(resource_type: str, params: Params) -> Limit:
    """The limit policy of a limited resource type (its rule's ``policy``), with ``params``.

    Raises:
        ValueError: no rule limits that type.
    """
    return RULES[limited_by(resource_type)].policy(params)
