"""Simulation (Spark-free): the scenario generator of synthetic RocketMQ ``stats.log`` lines and producer send failures
for a landing directory, and the broker model the backtest runs on that traffic.

``python -m pipelines.sim --out DIR [--scenario retry_storm] ...`` (:mod:`pipelines.sim.cli`) writes
(``docs/contracts.md`` §1)::

    DIR/broker_stats/<broker>/stats.log          raw stats.log lines (the folder names the broker)
    DIR/broker_stats/shipper/<broker>.jsonl      the same lines in log-shipper JSON envelopes, for a share of brokers
    DIR/send_failures/failures-<broker>.jsonl    one failed send per JSON line (§1.2 fields)

Modules, in the order the data flows:

* :mod:`~pipelines.sim.spec` — :class:`ScenarioSpec` (every knob, same spec → same bytes), :class:`Incident`
  (ground truth of what a scenario did), broker names, the per-stage random streams.
* :mod:`~pipelines.sim.world` — the scenario-independent catalog (brokers, topics and their placement, consumer
  groups and subscriptions) and the steady per-minute rate arrays (:class:`World`).
* :mod:`~pipelines.sim.causes` — causes at any second, ramped and rolled out, and the ``compound`` shape (several
  causes at once, each in the incident's ground truth).
* :mod:`~pipelines.sim.scenarios` — the scenario shapes (``retry_storm``, ``steady``, ``flash_sale``,
  ``noisy_neighbour``, ``normal_day``, ``large_mix``) that edit a World, the :data:`SCENARIOS` registry and a
  scenario's send failures (:func:`~pipelines.sim.scenarios.build_send_failures`).
* :mod:`~pipelines.sim.traffic` — World → the model frame of every stats line (:func:`build_traffic`), plus the
  hour/day lines (:func:`build_period_rows`).
* :mod:`~pipelines.sim.failures` — producer send failures (background trickle, broker-busy failures), composed per
  scenario by :func:`~pipelines.sim.scenarios.build_send_failures`.
* :mod:`~pipelines.sim.render` — the stats.log / envelope / failure JSON text and the landing directory.
* :mod:`~pipelines.sim.cli` — the command line.
* :mod:`~pipelines.sim.ticks` — the broker's rules for one tick: per-resource token buckets with the 1 s breaker,
  the send queue with fast failure.
* :mod:`~pipelines.sim.broker_model` — offered traffic from stats rows, broker capacity, and the whole-run,
  open-loop model (limits known in advance; ``bench/broker_model_udf.py``).
* :mod:`~pipelines.sim.cluster` — the closed-loop cluster (of the simulator and of :mod:`pipelines.backtest`): the
  brokers under the limits the governor publishes, the producers' retries and the consumers' fallbacks, tick by tick.
* :mod:`~pipelines.sim.admitted` — what that cluster prints (stats rows of what was admitted) and what its
  clients log (send failures of rejected attempts).
* :mod:`~pipelines.sim.irregular`, :mod:`~pipelines.sim.brokers` — the world's irregularities (shippers that lag,
  skip, repeat or stop; brokers that apply late or forget; a governor restart) and the brokers applying the
  governor's publications.
* :mod:`~pipelines.sim.loop`, :mod:`~pipelines.sim.windows` — the Spark-free closed loop: that cluster against the
  decision plane (:mod:`pipelines.decide`), Spark's windowed sums modelled, the two speeds' timing;
  :mod:`~pipelines.sim.override_tick` the job's override tick in it, :mod:`~pipelines.sim.overrides` the checks of
  a loop with overrides and the sweep's kind that draws them.
* :mod:`~pipelines.sim.values_in_force` — a limit's values in force over a run, from the brokers' timeline (the
  seconds each snapshot lasts, every change of a resource's value).
* :mod:`~pipelines.sim.truth` — the ground truth (an incident's causes) and each cause judged against it.
* :mod:`~pipelines.sim.case`, :mod:`~pipelines.sim.draws`, :mod:`~pipelines.sim.premise`,
  :mod:`~pipelines.sim.sweep` — randomized closed loops: what a case is, drawn until its kind's premise holds, run,
  judged; :mod:`~pipelines.sim.fastest` the earliest the pipeline can put a limit in force, which the sweep's
  verdict and the overrides' checks excuse a late onset by.
* :mod:`~pipelines.sim.settings`, :mod:`~pipelines.sim.figures`, :mod:`~pipelines.sim.report` — a closed loop's
  world (``conf/backtest.toml``), its figures and checks, its report and picture: shared by this loop and the
  Spark backtest (:mod:`pipelines.backtest`), which hand over the same result shape.
* :mod:`~pipelines.sim.replay` — ``python -m pipelines.sim.replay``: an operator's own recording in closed loop.
  The governor's ``--once`` run on it as a process of its own (:mod:`~pipelines.sim.replay_job`), its tables read
  (:mod:`~pipelines.sim.replay_input`), the refused sends counted once (:mod:`~pipelines.sim.replay_refused`) and
  the demand an enforced limit hid (:mod:`~pipelines.sim.replay_enforced`) added to the recorded demand
  (:mod:`~pipelines.sim.replay_demand`), the recording's brokers (:mod:`~pipelines.sim.replay_brokers`), the loop
  (:mod:`~pipelines.sim.replay_run`), its figures per resource, report and pictures
  (:mod:`~pipelines.sim.replay_figures`, :mod:`~pipelines.sim.replay_report`, :mod:`~pipelines.sim.replay_plots`).

Randomness: one ``numpy.random.default_rng(seed)`` spawns a child generator per stage
(:data:`pipelines.sim.spec.RNG_STREAMS`), so a scenario that draws more numbers does not shift the catalog or the
base noise. Same spec (with ``start``) → byte-identical files.

May import: numpy, pandas, polars (and delta-rs through it), pyarrow, matplotlib, tomli-w, the top-level modules,
:mod:`pipelines.decide` and :mod:`pipelines.writeback.records`; never pyspark (the simulator and its sweep run without
a JVM; the replay starts the governor as a process of its own).
"""
