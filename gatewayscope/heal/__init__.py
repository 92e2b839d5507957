"""``gatewayscope heal``: unattended, bounded remediation on the same core (findings -> plan -> apply -> journal).

* :mod:`~gatewayscope.heal.settings`: the ``[heal]`` table;
* :mod:`~gatewayscope.heal.safeguards`: the lock, the breaker, the caps, the kill switch, the blockers;
* :mod:`~gatewayscope.heal.loop`: the loop (:class:`~gatewayscope.heal.loop.HealLoop`);
* :mod:`~gatewayscope.heal.status`: ``gatewayscope heal status``;
* :mod:`~gatewayscope.heal.metrics`: the ``gatewayscope_heal_*`` metrics of a heal inside the exporter.

docs/heal.md says what each safeguard does and its default.
"""
