"""The repository stands on its own for a newcomer (issue 23 items 10, 14, 15): every path
the README and docs/ name exists in a clean clone, nothing points outside the checkout,
the README's `plan` examples fit a reader's machine or say beforehand that they need a
server, and `make run` is the script the README describes (its run: `tests/test_quick_start.py`)."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "data" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _ignored(name: str) -> bool:
    """Whether git ignores ``name`` (a build product such as ``build/``: not in a clone)."""
    return subprocess.run(["git", "check-ignore", "-q", name], cwd=ROOT).returncode == 0


# the checkout's top-level entries a clone has (a local `build/` of `setup.py build_ext` is not one)
TOP = sorted(p.name for p in ROOT.iterdir() if (not p.name.startswith(".") or p.name == ".ci") and not _ignored(p.name))
# a path rooted at one of the checkout's top-level entries, e.g. `bench/tree.py`, `docs/`
PATH = re.compile(r"(?<![\w./~-])((?:%s)(?:/[\w.*-]+)*/?)" % "|".join(re.escape(t) for t in TOP if t != "README.md"))
OUTPUT_FLAG = re.compile(r"--(?:plot|out)[ =](\S+)")
LOCAL = "bench/results/local/"  # outputs of runs: only the folder ships


def named_paths(text: str) -> set[str]:
    """Repository paths named in ``text``'s code spans and code blocks."""
    spans = re.findall(r"```.*?```", text, re.S) + re.findall(r"`([^`\n]+)`", text)
    return {m.rstrip(".,;:)") for span in spans for m in PATH.findall(span)}


def in_a_clone() -> Callable[[str], bool]:
    """``exists(name)``: whether a clean clone has that file or folder (git's tracked files;
    the working tree when this is not a git checkout)."""
    run = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if run.returncode != 0:
        return lambda name: (ROOT / name).exists()
    tracked = set(run.stdout.split())
    folders = {str(Path(f).parent) + "/" for f in tracked}
    folders |= {"/".join(f.split("/")[:i]) + "/" for f in folders for i in range(1, f.count("/"))}
    return lambda name: name.rstrip("/") in tracked or name.rstrip("/") + "/" in folders


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repository_path_a_doc_names_exists(doc):
    text = doc.read_text()
    outputs = {t for t in OUTPUT_FLAG.findall(text)}
    exists, missing = in_a_clone(), []
    for name in sorted(named_paths(text)):
        if name in outputs or name.startswith(LOCAL) or "*" in name:
            ok = exists(str(Path(name).parent) + "/")  # where a run writes: its folder ships (--plot refuses others)
        else:
            ok = exists(name)
        if not ok:
            missing.append(name)
    assert missing == [], f"{doc.name} names paths that are not in the repository: {missing}"


def test_the_path_finder_sees_what_the_readme_names():
    found = named_paths((ROOT / "README.md").read_text())
    assert {"docs/DESIGN.md", "docs/RESULTS.md", "data/mooncake_synthetic_trace.jsonl.xz",
            "bench/sglang_cpu_anchor.py", "scripts/run.sh"} <= found, found
    assert named_paths("see `docs/NOPE.md` and\n```\npython bench/none.py\n```") == {"docs/NOPE.md", "bench/none.py"}


def tracked_text_files() -> list[Path]:
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    return [ROOT / f for f in files if f.endswith((".py", ".md", ".sh", ".toml", ".cfg", ".txt")) or f == "Makefile"]


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="needs a git checkout")
def test_nothing_points_outside_the_checkout():
    # was: ../shared/data/..., ../shared/DESIGN.md, ../shared/anchors/... (absent from a clone)
    outside = re.compile(r"\.\./shared|parents\[\d\]\s*/\s*[\"']shared[\"']|parent\s*/\s*[\"']shared[\"']")
    named = [str(p.relative_to(ROOT)) for p in tracked_text_files()
             if p.name != Path(__file__).name and outside.search(p.read_text(errors="replace"))]
    assert named == []


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="needs a git checkout")
def test_no_merge_conflict_markers_are_committed():
    # was: docs/STRUCTURE.md carried a conflict's markers after a merge
    marker = re.compile(r"^(<{7}|>{7}) ", re.M)
    named = [str(p.relative_to(ROOT)) for p in tracked_text_files() if marker.search(p.read_text(errors="replace"))]
    assert named == []


GIB = 1 << 30
READER_HOST_GIB = 4  # a laptop or a small VM: the README's plan examples must fit this much


def readme_plan_commands() -> list[tuple[str, list[str]]]:
    """(the README text before the command, its arguments) for each `hicache plan` in a code block."""
    text = (ROOT / "README.md").read_text()
    out = []
    for block in re.finditer(r"```bash\n(.*?)```", text, re.S):
        for line in block.group(1).splitlines():
            if "hicache plan" in line:
                args = shlex.split(line.split("#")[0])
                out.append((text[:block.start()], args[args.index("plan") + 1:]))
    return out


def test_readme_plan_examples_fit_a_readers_machine(capsys):
    # was: DeepSeek-V4-Pro at 1M tokens (21.6 GiB of host pools) and llama at --hicache-size 64
    import json
    from hicache.cli import main
    commands = readme_plan_commands()
    assert commands, "the README shows no `hicache plan`"
    for _before, argv in commands:
        assert main(["plan", *argv, "--json"]) in (0, 1)
        host = json.loads(capsys.readouterr().out)["host_bytes_total"]
        assert host <= READER_HOST_GIB * GIB, (argv, host / GIB)


def test_the_full_scale_plan_is_announced_as_server_class_before_it_is_shown():
    text = (ROOT / "README.md").read_text()
    big = text.find("--device-tokens 1048576")
    if big >= 0:
        assert "server-class" in text[max(0, big - 400):big] and "exits 1" in text[big:big + 400]


def test_make_run_is_the_script_the_readme_describes():
    makefile = (ROOT / "Makefile").read_text()
    run = makefile[makefile.index("\nrun:"):].split("\n\n")[0]
    assert "scripts/run.sh" in run
    script = (ROOT / "scripts" / "run.sh").read_text()
    for flag in ("--model deepseek-v4-flash", "--hicache-storage-backend file", "--hicache-storage-capacity 1",
                 "rm -rf"):
        assert flag in script


def test_structure_inventory_is_the_codes_own():
    """docs/STRUCTURE.md's inventory is generated from the modules' docstrings
    (`scripts/structure_inventory.py`): a module added, moved or re-described without
    regenerating it fails here, naming the first line that differs."""
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "structure_inventory.py"), "--check"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
