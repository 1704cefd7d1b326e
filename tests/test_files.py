"""Atomic writes: a failure mid-write leaves the old file (or none) and no temporary file."""

import os

import pytest

from aiayn.common.files import atomic_open, atomic_write_json, atomic_write_text


def test_an_error_mid_write_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    target = tmp_path / "metrics.json"
    atomic_write_json(target, {"dev_bleu": 1.0})
    with pytest.raises(RuntimeError), atomic_open(target) as f:
        f.write('{"dev_bleu": 2')
        raise RuntimeError("killed mid-write")
    assert target.read_text() == '{\n  "dev_bleu": 1.0\n}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]


def test_a_new_file_gets_umask_permissions_not_mkstemps_owner_only(tmp_path):
    old = os.umask(0o022)
    try:
        path = atomic_write_text(tmp_path / "report.md", "x")
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644
