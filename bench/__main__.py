"""``python -m bench [--size SIZE] [--scale F] [--only NAME] [--runs N]``: run the benchmarks, print one table.

Exit status: 0 when every target was met, 1 when one was missed or a benchmark failed, 2 on bad flags.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

from bench.common import (
    IMPORT_ERRORS,
    OPTIONAL,
    REPO_ROOT,
    BenchContext,
    BenchResult,
    default_cache_dir,
    details,
    discover,
    in_table_order,
    machine_facts,
    render_table,
)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_const", const="small", dest="size",
                        help="small fixtures (a quick look; ratios at this size say little)")
    parser.add_argument("--size", choices=("full", "small", "tiny"), dest="size",
                        help="fixture size: full (default: 1M, 10M and 100k sessions, docs/performance.md), "
                             "small, tiny (smoke test)")
    parser.add_argument("--scale", type=float, default=1.0, metavar="F",
                        help="multiply the full-size stores (1M, 10M, 100k sessions) by F, from 0.0001 to 1 "
                             "(default 1: the full sizes)")
    parser.add_argument("--only", action="append", metavar="NAME",
                        help="run only this benchmark (repeatable)")
    parser.add_argument("--all", action="store_true",
                        help="also run the optional benchmarks (marked in --list)")
    parser.add_argument("--runs", type=int, metavar="N",
                        help="runs per measured side (default: 3 full, more for small)")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help=f"where built fixtures are kept between runs (default {default_cache_dir()})")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = parser.parse_args(argv)
    args.size = args.size or "full"
    if args.runs is not None and not 1 <= args.runs <= 100:
        parser.error("--runs must be from 1 to 100")
    if not 0.0001 <= args.scale <= 1.0:
        parser.error("--scale must be from 0.0001 to 1")
    cache = (args.cache_dir or default_cache_dir()).expanduser().resolve()
    if cache == REPO_ROOT or REPO_ROOT in cache.parents:
        parser.error(f"--cache-dir {cache} is inside the repository; keep fixtures out of it")
    args.cache_dir = cache
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    registry = discover()
    if args.list:
        print("\n".join([*(f"{name} (optional)" if name in OPTIONAL else name for name in registry),
                         *(f"bench.{m} (import failed)" for m in IMPORT_ERRORS)]))
        return 0
    names = args.only or in_table_order([name for name in registry if args.all or name not in OPTIONAL])
    unknown = [name for name in names if name not in registry]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(registry)}", file=sys.stderr)
        return 2
    ctx = BenchContext(size=args.size, runs=args.runs, cache_dir=args.cache_dir, scale=args.scale)
    before = machine_facts()
    results: list[BenchResult] = []
    if not args.only:
        results += [BenchResult(name=f"bench.{module}", error=f"import failed: {error}")
                    for module, error in IMPORT_ERRORS.items()]
    for name in names:
        print(f"[bench] {name} ({ctx.size}) ...", file=sys.stderr, flush=True)
        started = time.monotonic()
        try:
            result = registry[name](ctx)
        except Exception as err:  # one failing benchmark is one ERROR row, not a crash
            traceback.print_exc(file=sys.stderr)
            result = BenchResult(name=name, error=f"{type(err).__name__}: {err}")
        print(f"[bench] {name} took {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
        # the row at once too, so an interrupted run keeps what it measured
        print(render_table([result]).splitlines()[-1], details([result]), sep="\n", file=sys.stderr, flush=True)
        results.append(result)
    print(before.replace("; load average", "; before: load average"))
    print("after: " + machine_facts().rsplit("; ", 1)[-1])
    print(f"size {ctx.size}, scale {ctx.scale:g}")
    order = in_table_order([result.name for result in results])
    results.sort(key=lambda result: order.index(result.name))
    print(render_table(results))
    print()
    print(details(results))
    return 0 if all(result.met for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())
