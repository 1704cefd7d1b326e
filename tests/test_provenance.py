"""Where a run's code came from (aiayn/common/provenance.py): a checkout's own commit and cleanliness; a copy made
without .git (a GPU machine's) names its commit in $AIAYN_SOURCE; anything else records none."""

import subprocess

from aiayn.common.provenance import Source, source_of


def _checkout(path):
    (path / "aiayn").mkdir(parents=True)
    (path / "aiayn" / "x.py").write_text("x = 1\n")
    git = ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    return subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()


def test_a_checkout_records_its_commit_and_a_named_source_does_not_override_it(tmp_path, monkeypatch):
    commit = _checkout(tmp_path / "repo")
    monkeypatch.setenv("AIAYN_SOURCE", "a" * 40)
    assert source_of(tmp_path / "repo") == Source(commit, False)
    (tmp_path / "repo" / "aiayn" / "x.py").write_text("x = 2\n")
    assert source_of(tmp_path / "repo") == Source(commit, True)


def test_a_copy_without_git_records_the_commit_its_environment_names(tmp_path, monkeypatch):
    copy = tmp_path / "copy"
    (copy / "aiayn").mkdir(parents=True)
    monkeypatch.delenv("AIAYN_SOURCE", raising=False)
    assert source_of(copy) == Source(None, None)
    monkeypatch.setenv("AIAYN_SOURCE", "3AD99C2" + "0" * 33 + "+dirty")
    assert source_of(copy) == Source("3ad99c2" + "0" * 33, True)
    assert source_of(copy).describe() == "3ad99c200000 (dirty tree)"
    for wrong in ("", "not-a-commit", "abc", "3ad99c2+clean", "3ad99c2; rm -rf /"):
        monkeypatch.setenv("AIAYN_SOURCE", wrong)
        assert source_of(copy) == Source(None, None), wrong
