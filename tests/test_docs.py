"""The documentation stays true: generated pages match the code, links resolve, the README stays short,
and nothing cites a document that is not in this repository."""

from __future__ import annotations

import ast
import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers import DOCS, README, ROOT, python_examples

README_MAX_BYTES = 10_240
REGENERATE_METRICS = ".venv/bin/python docs/gen_metrics.py"


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def gen_metrics() -> ModuleType:
    """docs/gen_metrics.py, imported from its path (docs/ is not a package)."""
    spec = importlib.util.spec_from_file_location("gen_metrics", DOCS / "gen_metrics.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- Markdown, as GitHub reads it -----------------------------------------------------------------------

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of every line outside fenced code blocks, with inline code spans blanked."""
    fenced = False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, INLINE_CODE.sub(lambda m: " " * len(m.group(0)), line)


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text lowercased, punctuation dropped, spaces to hyphens.

    >>> slug("`gatewayscope scan`")
    'gatewayscope-scan'
    >>> slug("Memory store: `gatewayscope gateway`")
    'memory-store-gatewayscope-gateway'
    >>> slug("No live session is deleted, whatever the plan file says")
    'no-live-session-is-deleted-whatever-the-plan-file-says'
    """
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor of a Markdown document (repeated headings get -1, -2, ... as on GitHub)."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            out.add(base if count == 0 else f"{base}-{count}")
    return out


def links(path: Path) -> Iterator[tuple[int, str]]:
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        for match in LINK.finditer(line):
            yield number, match.group(1)


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def broken_links(path: Path) -> list[str]:
    problems = []
    for number, target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        where = f"{_shown(path)}:{number}: ({target})"
        if not resolved.exists():
            problems.append(f"{where} {file_part} does not exist")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved.read_text(encoding="utf-8")):
            problems.append(f"{where} {_shown(resolved)} has no heading for #{anchor}")
    return problems


def test_the_anchor_rules() -> None:
    text = "# A (b), c!\n```sh\n# not a heading\n```\n## A (b), c!\n### `x_y` and *z*\n"
    assert anchors(text) == {"a-b-c", "a-b-c-1", "x_y-and-z"}


def test_the_link_rules(tmp_path: Path) -> None:
    (tmp_path / "b.md").write_text("# Here it is\n")
    page = tmp_path / "a.md"
    page.write_text("[ok](b.md#here-it-is) [web](https://example.com/x) `[code](nowhere.md)`\n"
                    "```\n[fenced](nowhere.md)\n```\n[gone](c.md) [no anchor](b.md#elsewhere) [self](#top)\n")
    found = [target for _, target in links(page)]
    assert found == ["b.md#here-it-is", "https://example.com/x", "c.md", "b.md#elsewhere", "#top"]
    broken = [problem.split(": (", 1)[1].split(")", 1)[0] for problem in broken_links(page)]
    assert broken == ["c.md", "b.md#elsewhere", "#top"]


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path: Path) -> None:
    problems = broken_links(path)
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_the_docs_index_links_every_page() -> None:
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    linked = {target.partition("#")[0] for _, target in links(DOCS / "README.md")}
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if p.name != "README.md" and p.name not in linked]
    assert not missing, f"docs/README.md does not link {', '.join(missing)}"
    assert "../README.md" in index


def test_the_readme_is_at_most_10_kb() -> None:
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, (
        f"README.md is {size:,} bytes, over {README_MAX_BYTES:,}: move the detail to a page under docs/")


@pytest.mark.parametrize("path", [README, DOCS / "python-api.md"], ids=lambda p: str(p.relative_to(ROOT)))
def test_python_examples_compile_and_use_only_the_public_api(path: Path) -> None:
    """The examples run against the sandbox in tests/e2e/test_docs_examples.py; here they must parse, and
    every ``gs.NAME`` they use must be a public name of the package."""
    import gatewayscope

    examples = python_examples(path)
    assert examples, f"{path.name} has no ```python example"
    for start, code in examples:
        tree = ast.parse(code, filename=f"{path.name}:{start}")
        used = {node.attr for node in ast.walk(tree)
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "gs"}
        unknown = sorted(used - set(gatewayscope.__all__))
        assert not unknown, f"{path.name}:{start}: gs.{', gs.'.join(unknown)} is not in gatewayscope.__all__"


def test_every_gs_name_the_docs_mention_is_public() -> None:
    import gatewayscope

    unknown = sorted({f"{path.name}: gs.{name}" for path in markdown_files()
                      for name in re.findall(r"\bgs\.([A-Za-z_]\w*)", path.read_text(encoding="utf-8"))
                      if name not in gatewayscope.__all__})
    assert not unknown, "not in gatewayscope.__all__: " + ", ".join(unknown)


# -- generated pages --------------------------------------------------------------------------------------

def test_metrics_md_matches_the_code() -> None:
    expected = gen_metrics().render()
    current = (DOCS / "metrics.md").read_text(encoding="utf-8")
    assert current == expected, f"docs/metrics.md is out of date with the code: run {REGENERATE_METRICS}"


def test_metrics_md_lists_every_metric_the_exporter_and_the_guard_serve() -> None:
    from gatewayscope.exporter.collectors import METRICS
    from gatewayscope.guard.gateway import METRIC_HELP

    text = (DOCS / "metrics.md").read_text(encoding="utf-8")
    gauges = {"gatewayscope_guard_tombstones", "gatewayscope_guard_tombstone_capacity"}  # the rest are counters
    names = [*METRICS, *(name if name in gauges else f"{name}_total" for name in METRIC_HELP)]
    missing = [name for name in names if f"| `{name}` |" not in text]
    assert not missing, f"docs/metrics.md lacks {', '.join(missing)}: run {REGENERATE_METRICS}"


# -- nothing outside this repository --------------------------------------------------------------------

#: what cites a document that is not in this repository (spelled so this file does not match itself)
OUTSIDE = re.compile("|".join([
    r"\bDESI" + r"GN\b",                      # the design document, with or without its .md
    r"\.\./" + "shared",                      # the folder next to the repository
    "shared/" + "contracts",
    r"\bcontracts" + "/",                     # the Bifrost management-API contract
    r"\bseeds" + "/",
    r"(?i:seed[ _-]?0\d\d)",                  # the numbered task statements: "seed", a separator, three digits
]))
SCANNED = ("gatewayscope", "tests", "docs", "dashboards", "notebooks", "bench")
TEXT_SUFFIXES = {".py", ".md", ".txt", ".toml", ".yml", ".yaml", ".json", ".ipynb", ".j2", ".html", ".cfg", ".ini"}


def scanned_files(folder: str) -> Iterator[Path]:
    for path in sorted((ROOT / folder).rglob("*")):
        if path.is_file() and path.suffix in TEXT_SUFFIXES and "__pycache__" not in path.parts:
            yield path


def outside_references(paths: Iterator[Path] | list[Path]) -> list[str]:
    hits = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            for match in OUTSIDE.finditer(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {match.group(0)!r} in: {line.strip()[:120]}")
    return hits


def test_the_outside_reference_rules() -> None:
    # each "~" keeps this file from citing what it looks for; it is removed before matching
    for cited in ("see DE~SIGN.md", "(DE~SIGN, rule 3)", "../sh~ared/peers/x.tar.gz", "contr~acts/bifrost.md",
                  "se~ed 000", "Se~ed 002", "the se~ed-000 race", "test_se~ed000_race", "se~eds/002.md"):
        assert OUTSIDE.search(cited.replace("~", "")), cited
    for fine in ("--seed realistic", "rng seed 4574", "a design rule", "seed.py", "the seeded store"):
        assert not OUTSIDE.search(fine), fine


def test_the_readme_and_docs_cite_nothing_outside_the_repository() -> None:
    hits = outside_references([README, *scanned_files("docs")])
    assert not hits, "references to documents outside this repository:\n" + "\n".join(hits)


@pytest.mark.parametrize("folder", [f for f in SCANNED if f != "docs"])
def test_nothing_cites_a_document_outside_the_repository(folder: str) -> None:
    """State the rule (docs/remediation.md, docs/concepts.md) instead of citing a document that is not here."""
    hits = outside_references(scanned_files(folder))
    assert not hits, (f"{len(hits)} reference(s) under {folder}/ to documents outside this repository; state the "
                      "rule itself or link the page of docs/ that states it:\n" + "\n".join(hits))


# -- the package map and the pointers -----------------------------------------------------------------------

_MAP_NAME = re.compile(r"[\w.]+(/|\.py)")


def package_map(text: str) -> set[str]:
    """The module paths (``sources/bifrost/read.py``) concepts.md's package map names under ``gatewayscope/``:
    each entry line (two spaces a level), and the ``NAME.py`` names a package's own lines list."""
    start = text.index("\ngatewayscope/\n") + 1
    named: set[str] = set()
    packages: list[str] = []  # the package of each level: packages[0] is the top level
    owner = ""  # the package whose lines these are
    for line in text[start:].splitlines()[1:]:
        if line.startswith("```") or (line and not line.startswith(" ")):
            break  # the fence, or dashboards/ and the other top-level folders
        indent = len(line) - len(line.lstrip(" "))
        token = line.strip().split(" ")[0].rstrip(",")
        if indent % 2 == 0 and _MAP_NAME.fullmatch(token):
            level = indent // 2 - 1
            del packages[level:]
            parent = "".join(packages)
            if token.endswith("/"):
                packages.append(token)
                owner = parent + token
                listed = line.strip()[len(token):]
            else:
                named.add(parent + token)
                owner = parent
                listed = line.strip()[len(token):] if "," in line.strip()[:len(token) + 1] else ""
        else:
            listed = line
        named.update(owner + name for name in re.findall(r"(?<![/\w])\w+\.py\b", listed))
    return named


def test_the_package_map_parser() -> None:
    text = ("x\n```text\ngatewayscope/\n  a.py         one\n  pkg/         two: b.py, c.py\n"
            "                 d.py (continued)\n    e.py       three\n    sub/     four\n      f.py   five\n"
            "    g.py, h.py   six\n  i.py  seven\ndashboards/  no\n  z.py\n```\n")
    assert package_map(text) == {"a.py", "pkg/b.py", "pkg/c.py", "pkg/d.py", "pkg/e.py", "pkg/sub/f.py",
                                 "pkg/g.py", "pkg/h.py", "i.py"}


def test_every_module_is_in_the_package_map() -> None:
    named = package_map((DOCS / "concepts.md").read_text(encoding="utf-8"))
    package = ROOT / "gatewayscope"
    modules = {path.relative_to(package).as_posix() for path in package.rglob("*.py")
               if "__pycache__" not in path.parts and not (path.name == "__init__.py" and path.parent != package)}
    assert sorted(modules - named) == [], "docs/concepts.md's package map lacks these modules"
    assert sorted(named - modules) == [], "docs/concepts.md's package map names modules that are not there"


#: a pointer from code to a page of docs/, with the section it names
_DOCS_POINTER = re.compile(r"docs/([\w-]+\.md)(?:#([\w-]+))?")
#: a pointer to a part of the README (its reference pages are under docs/: point there)
_README_POINTER = re.compile(r"\b(?:see|in|documented in) README\b|\bREADME, ")
#: a work log in code or docs: the issue a thing came from, its sizes or its table
_WORK_LOG = re.compile(r"\bissue \d+\b|\bthe issue's\b", re.IGNORECASE)
POINTING = [*sorted((ROOT / "gatewayscope").rglob("*.py")), *sorted((ROOT / "bench").rglob("*.py")),
            ROOT / "dashboards" / "build.py", ROOT / "Makefile"]


def pointer_problems(path: Path, text: str) -> list[str]:
    """Each pointer of ``text`` that names a page or a section that is not there, a README section, or an issue."""
    problems = []
    for number, line in enumerate(text.splitlines(), start=1):
        where = f"{path.relative_to(ROOT)}:{number}"
        for page, anchor in _DOCS_POINTER.findall(line):
            target = DOCS / page
            if not target.exists():
                problems.append(f"{where}: docs/{page} does not exist")
            elif anchor and anchor not in anchors(target.read_text(encoding="utf-8")):
                problems.append(f"{where}: docs/{page} has no heading for #{anchor}")
        if _README_POINTER.search(line):
            problems.append(f"{where}: points at a README section; name the page under docs/ instead")
        if _WORK_LOG.search(line):
            problems.append(f"{where}: speaks of an issue; say what the thing is")
    return problems


def test_the_pointer_rules(tmp_path: Path) -> None:
    text = ("docs/cli.md#scan---format-json fine\ndocs/nowhere.md\ndocs/cli.md#no-such-part\n"
            "(see README, Performance)\nthe issue's sizes\n")
    assert [p.split(": ", 1)[1] for p in pointer_problems(ROOT / "x.py", text)] == [
        "docs/nowhere.md does not exist", "docs/cli.md has no heading for #no-such-part",
        "points at a README section; name the page under docs/ instead", "speaks of an issue; say what the thing is"]


@pytest.mark.parametrize("path", POINTING, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_pointer_in_code_names_a_section_that_is_there(path: Path) -> None:
    if "__pycache__" in path.parts:
        pytest.skip("bytecode")
    assert pointer_problems(path, path.read_text(encoding="utf-8")) == []


def test_the_docs_keep_no_work_log() -> None:
    problems = [p for page in sorted(DOCS.glob("*.md")) for p in pointer_problems(page, page.read_text(
        encoding="utf-8")) if "speaks of an issue" in p]
    assert problems == []


def test_the_tour_and_the_api_section_tell_the_same_tally() -> None:
    """README's tour and its Python API section apply the same plan to the same sandbox: the same count."""
    text = README.read_text(encoding="utf-8")
    counts = re.findall(r"(\d+) done, 0 refused", text)
    assert len(counts) >= 2 and len(set(counts)) == 1, counts
