"""examples/tour.ipynb runs from top to bottom: a tiny row trained, a translation, the HF export
loaded with AutoModelForSeq2SeqLM giving aiayn's greedy translations, and our Δ plotted beside the paper's. Its code
cells are executed in order in one namespace, as a kernel would (no Jupyter needed)."""

import json
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "tour.ipynb"


def test_the_notebook_is_a_notebook_without_outputs():
    nb = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    assert nb["nbformat"] == 4 and any(c["cell_type"] == "code" for c in nb["cells"])
    assert all(not c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code")  # committed clean


@pytest.mark.slow
def test_the_tour_notebook_runs_top_to_bottom(cache, tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    monkeypatch.setenv("AIAYN_TOUR_OUT", str(tmp_path / "tour"))
    monkeypatch.setenv("AIAYN_TOUR_STEPS", "200")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for cell in json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] == "code":
            exec(compile("".join(cell["source"]), f"{NOTEBOOK.name} cell", "exec"), namespace)
    assert len(namespace["ours"]) == 2 and all(isinstance(t, str) for t in namespace["ours"])
    assert namespace["same"], (namespace["theirs"], namespace["greedy"])
    assert (tmp_path / "tour" / "delta.png").stat().st_size > 0
    assert list(namespace["delta"].index) == ["C1"]
