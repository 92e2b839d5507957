"""gatewayscope's benchmarks: each one prints its time as a ratio against a bare baseline run the same way.

``python -m bench`` runs every registered benchmark and prints one table. A benchmark is one function
``(BenchContext) -> BenchResult`` registered with ``@register("name")`` in any module of this package
(see ``bench.common``); ``bench.common.discover`` imports them all. This package stays import-light on
purpose: benchmark modules import gatewayscope (and polars) only inside the child processes that need it,
so a baseline child measures the bare library alone.
"""
