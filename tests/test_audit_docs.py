"""Every python snippet of docs/audit.md and docs/audit-quickstart.md, run exactly as written.

Snippets of one page share a namespace, in page order (the quickstart's second
uses the first's function). The pytest recipe (a test file) runs through an
`pytest --parity-audit` on a tmp dir, forked: clean it passes; with a
bug planted in the engine it fails. The vLLM conftest imports vLLM: the
stand-in with its interface is installed under vLLM's module names.
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

from forked_pytest import pytest_in_fork
from tests import vllm_standin

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def snippets(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), re.S)


def is_test_file(code: str) -> bool:
    return "def test_" in code and "@pytest.fixture" in code and "vllm" not in code


def run_recipe(tmp_path: Path, code: str, bugs: tuple) -> int:
    folder = tmp_path / ("bug" if bugs else "clean")
    folder.mkdir()
    (folder / "test_recipe.py").write_text(code)
    (folder / "conftest.py").write_text(
        "import examples.gpt_fast.engine as engine\n"
        f"engine.Engine.__init__.__defaults__ = ('cpu', (1, 2, 4), True, {bugs!r})\n")
    return pytest_in_fork([str(folder), "-q", "--parity-audit"], tmp_path / f"{folder.name}.log", cwd=ROOT)[0]


def test_every_snippet_of_the_audit_page_runs_as_written(tmp_path, monkeypatch):
    compilation = types.ModuleType("vllm.compilation.cuda_graph")
    compilation.CUDAGraphWrapper = vllm_standin.CUDAGraphWrapper
    forward = types.ModuleType("vllm.forward_context")
    forward.get_forward_context = vllm_standin.get_forward_context
    for name, module in (("vllm", types.ModuleType("vllm")), ("vllm.compilation", types.ModuleType("c")),
                         ("vllm.compilation.cuda_graph", compilation), ("vllm.forward_context", forward)):
        monkeypatch.setitem(sys.modules, name, module)
    namespace: dict = {}
    codes = snippets("audit.md")
    assert len(codes) == 5
    for code in codes:
        if is_test_file(code):
            assert run_recipe(tmp_path, code, ()) == 0
            assert run_recipe(tmp_path, code, ("stale",)) == 1      # section 4 is not silently ignored
        else:
            exec(compile(code, "docs/audit.md", "exec"), namespace)
    assert namespace["decode"].replays == 1 and callable(namespace["parity_audit"])


def test_every_snippet_of_the_quickstart_runs_as_written():
    namespace: dict = {}
    codes = snippets("audit-quickstart.md")
    assert len(codes) == 2
    for code in codes:
        exec(compile(code, "docs/audit-quickstart.md", "exec"), namespace)
    assert namespace["error"].kind == "STALE_BUFFER"


def test_the_kinds_table_lists_only_kinds_the_audit_emits():
    from parity.audit.diagnosis import KINDS
    table = re.findall(r"^\| ([A-Z_]+) \|", (DOCS / "audit.md").read_text(), re.M)
    assert set(table) == set(KINDS)
