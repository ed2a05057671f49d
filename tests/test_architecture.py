"""docs/architecture.md's diagram matches the code: every module under pipeline/, jobs/ and
kernels/ is named in it, under its own folder, and every file or folder the page names exists."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "architecture.md"
# the diagram's package headers: "linpipe (pipeline/)", "linpipe.jobs (jobs/; ...)", ...
HEADER = re.compile(r"^linpipe[\w.]* \(([\w/]+/)")


def diagram() -> list[str]:
    text = DOC.read_text()
    return text[text.index("```\n") + 4:text.index("\n```", text.index("```\n"))].splitlines()


def named_by_folder() -> dict[Path, str]:
    """Folder -> the diagram's text about it: a package header's folder holds the lines below it
    at an indent of 2; a line there that starts with `name/` opens that subfolder's entry."""
    about: dict[Path, str] = {}
    root = folder = None
    for line in diagram():
        header = HEADER.match(line)
        if header:
            root = folder = REPO / header.group(1)
            continue
        if root is None or not line.strip():
            continue
        if re.match(r"^  \S", line):  # a new entry: a subfolder, or the package's own modules
            first = line.split()[0]
            folder = root / first if first.endswith("/") and (root / first).is_dir() else root
        about[folder] = about.get(folder, "") + " " + line
    return about


def modules() -> list[Path]:
    return sorted(p for top in ("pipeline", "jobs", "kernels") for p in (REPO / top).rglob("*.py")
                  if p.name != "__init__.py")


def test_every_module_is_named_under_its_folder():
    about = named_by_folder()
    missing = [str(p.relative_to(REPO)) for p in modules()
               if not re.search(rf"(?<![\w.]){re.escape(p.name)}\b", about.get(p.parent, ""))]
    assert not missing, f"docs/architecture.md's diagram does not name: {', '.join(missing)}"


def test_every_module_the_diagram_names_exists():
    gone = []
    for folder, text in named_by_folder().items():
        for name in re.findall(r"(?<![\w./])([\w]+\.py)\b", text):
            if not (folder / name).is_file():
                gone.append(str((folder / name).relative_to(REPO)))
    assert not gone, f"docs/architecture.md names modules that are not there: {', '.join(gone)}"


def test_every_path_the_page_names_exists():
    text = DOC.read_text()
    tops = "pipeline|jobs|kernels|docs|tests|benchmarks|examples"
    paths = set(re.findall(rf"(?<![\w./])((?:{tops})/[\w./-]*)", text))
    gone = [p for p in sorted(paths) if "NAME" not in p and not (REPO / p.rstrip(".")).exists()]
    assert paths and not gone, f"docs/architecture.md names paths that are not there: {', '.join(gone)}"
