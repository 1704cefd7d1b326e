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


def test_a_checkpoint_past_the_file_size_limit_is_one_line_naming_the_limit(tmp_path):
    """`ulimit -f` reached mid-checkpoint: torch's zip writer raised a RuntimeError (or a plain write EFBIG), and the
    line said nothing of the limit. Now it names the file, the limit and the fix, and leaves nothing behind."""
    import resource

    import torch

    from aiayn.common import files

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, hard))  # 1 MB; Python ignores SIGXFSZ, so writes fail
    try:
        with pytest.raises(files.DiskFull) as e:
            files.atomic_torch_save({"w": torch.zeros(1024, 1024)}, tmp_path / "last.ckpt")  # 4 MB of tensors
        with pytest.raises(files.DiskFull, match="file-size limit, 1.0 MB"):
            with files.atomic_open(tmp_path / "big.txt") as f:
                f.write("x" * (2 << 20))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert str(e.value).startswith(
        f"cannot write {tmp_path / 'last.ckpt'}: larger than this process's file-size limit, 1.0 MB (ulimit -f)"
    )
    assert str(e.value).endswith("raise the limit (ulimit -f unlimited) or write somewhere without one")
    assert os.listdir(tmp_path) == []


def test_a_full_disk_is_one_line_naming_the_file_and_the_space_it_needed(tmp_path, monkeypatch):
    """torch's zip writer reports a full disk as "unexpected pos ..." (a RuntimeError), plain writes as ENOSPC: both
    are one DiskFull line naming the file and about how much it needed, and nothing is left behind."""
    import errno
    import shutil

    import torch

    from aiayn.common import files

    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000))

    def full(obj, f):
        f.write(b"x" * 10)
        raise RuntimeError("[enforce fail at inline_container.cc:778] . unexpected pos 64 vs 0")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(files.DiskFull) as e:
        files.atomic_torch_save({"w": torch.zeros(1024, 1024)}, tmp_path / "last.ckpt")  # 4 MB of tensors
    assert str(e.value) == (
        f"no space left to write {tmp_path / 'last.ckpt'} (it needs about 4.0 MB, 1000 bytes "
        "free); free space on that disk or write somewhere with room (e.g. --out on another disk)"
    )
    assert os.listdir(tmp_path) == []
    with pytest.raises(files.DiskFull, match="metrics.json \\(it needs more space, 1000 bytes free\\)"):
        with files.atomic_open(tmp_path / "metrics.json") as f:
            f.write("{}")
            raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(RuntimeError, match="a bug"):  # not a question of space: passes through as it is
        monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 0, 10**9))
        with files.atomic_open(tmp_path / "x.txt") as f:
            raise RuntimeError("a bug")


def test_a_third_party_writers_full_disk_in_an_output_folder_is_aiayns_one_line(tmp_path, monkeypatch, capsys):
    """`aiayn export --format hf` on a full disk was a safetensors traceback (its SafetensorError is no OSError):
    a writer's error inside an output folder built atomically is the one DiskFull line where the disk is full, the
    folder left absent; an error that is not about space passes through."""
    import shutil

    from aiayn.common import files

    class SafetensorError(Exception):  # safetensors' own, raised on ENOSPC
        pass

    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(files.DiskFull) as e:
        with files.atomic_directory(tmp_path / "hf-model") as tmp:
            (tmp / "config.json").write_text("{}")
            raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull })")
    assert str(e.value).startswith(f"no space left to write {tmp_path / 'hf-model'} (it needs more space, 1000")
    assert os.listdir(tmp_path) == []
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 0, 10**9))
    with pytest.raises(SafetensorError), files.atomic_directory(tmp_path / "hf-model"):
        raise SafetensorError("a bug")
