"""The source archive's format (agents/respawn/sourcetree.py, agents/respawn/cli/workdir.py): the same tree
gives the same bytes, ignore files are honoured as git would, and unpacking refuses
every entry that could land outside the directory or is no plain file, directory or
link within it."""

import io
import os
import tarfile
import tracemalloc

import pytest

from respawn.sourcetree import BadArchive, unpack
from respawn.cli import workdir
from respawn.cli.errors import CliError
from tests.agent.archives import header_bomb, hostile_tar, user_workdir


def names(archive: workdir.Archive) -> list[str]:
    with tarfile.open(archive.path) as tar:
        return tar.getnames()


def test_the_same_tree_gives_the_same_bytes_whatever_its_times_and_owners(tmp_path):
    first = workdir.build(user_workdir(tmp_path / "a"), 10**6)
    copy = user_workdir(tmp_path / "b")
    for path in copy.rglob("*"):
        os.utime(path, (1_700_000_000, 1_700_000_000), follow_symlinks=False)
    os.chmod(copy / "helper.py", 0o600)  # group and other bits are not kept; the owner's x bit is
    second = workdir.build(copy, 10**6)
    assert (first.sha256, first.bytes) == (second.sha256, second.bytes)
    assert first.path.read_bytes() == second.path.read_bytes()
    (copy / "train.py").chmod(0o755)
    assert workdir.build(copy, 10**6).sha256 != first.sha256
    with tarfile.open(first.path) as tar:
        assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in tar} == {(0, 0, 0, "", "")}


def test_entries_are_sorted_and_ignore_files_are_honoured_like_git(tmp_path):
    root = user_workdir(tmp_path / "w")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / "configs" / ".gitignore").write_text("*.local.yaml\n")
    (root / "configs" / "mine.local.yaml").write_text("x\n")
    (root / "notes.log").write_text("x\n")
    (root / "keep.log").write_text("x\n")
    (root / ".respawnignore").write_text("*.log\n!keep.log\nconfigs/base.yaml\n")
    listed = names(workdir.build(root, 10**6))
    assert listed == sorted(listed)
    assert listed == [".gitignore", ".respawnignore", "configs", "configs/.gitignore", "configs/current.yaml",
                      "helper.py", "keep.log", "train.py"]


def test_a_missing_or_oversized_workdir_or_a_link_out_of_it_is_refused_saying_why(tmp_path):
    with pytest.raises(CliError, match="no such directory"):
        workdir.build(tmp_path / "nope", 10**6)
    root = user_workdir(tmp_path / "w")
    (root / "weights.bin").write_bytes(b"\1" * 5000)
    with pytest.raises(CliError, match=r"over the limit .* Largest: weights\.bin") as refused:
        workdir.build(root, 4000)
    assert refused.value.exit_code == 2
    (root / "weights.bin").unlink()
    (root / "escape").symlink_to("../outside")
    with pytest.raises(CliError, match="escape is a symbolic link out of the directory"):
        workdir.build(root, 10**6)


def test_what_the_cli_builds_unpacks_as_it_was(tmp_path):
    archive = workdir.build(user_workdir(tmp_path / "w"), 10**6)
    contents = unpack(archive.path, tmp_path / "out")
    assert (contents.files, archive.files) == (4, 4)
    assert (tmp_path / "out" / "train.py").read_text() == (tmp_path / "w" / "train.py").read_text()
    assert os.readlink(tmp_path / "out" / "configs" / "current.yaml") == "base.yaml"
    assert not (tmp_path / "out" / "data").exists()


@pytest.mark.parametrize("entries, why", [
    ([("/etc/cron.d/evil", "file", b"x")], "absolute path"),
    ([("../evil.py", "file", b"x")], "'..'"),
    ([("a/../../evil.py", "file", b"x")], "'..'"),
    ([("out", "symlink", "/etc")], "absolute"),
    ([("out", "symlink", "../../etc")], "outside"),
    ([("top", "symlink", "."), ("top/evil.py", "file", b"x")], "inside the symbolic link"),
    ([("dev", "device", b"")], "a device file"),
    ([("pipe", "fifo", b"")], "a named pipe"),
    ([("a.py", "file", b"x"), ("b.py", "hardlink", "a.py")], "a hard link"),
    ([("a.py", "file", b"x"), ("a.py", "file", b"y")], "given twice"),
    ([("holes.bin", "sparse", b"")], "a sparse file"),
])
def test_unpacking_refuses_entries_that_leave_the_directory_or_are_not_plain(tmp_path, entries, why):
    archive = tmp_path / "evil.tar.gz"
    hostile_tar(archive, *entries)
    with pytest.raises(BadArchive, match=why):
        unpack(archive, tmp_path / "out")
    assert not (tmp_path / "evil.py").exists() and not (tmp_path.parent / "evil.py").exists()


def test_unpacking_refuses_what_is_no_gzipped_tar_and_more_than_the_limit(tmp_path):
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"PK\x03\x04 this is a zip, or nothing")
    with pytest.raises(BadArchive, match="not a gzip'd tar"):
        unpack(junk, tmp_path / "out")
    big = tmp_path / "big.tar.gz"
    hostile_tar(big, ("a.bin", "file", b"\0" * 3000), ("b.bin", "file", b"\0" * 3000))
    with pytest.raises(BadArchive, match="more than the limit of 5000 bytes"):
        unpack(big, tmp_path / "out2", max_unpacked_bytes=5000)


def peak_bytes_while(call) -> int:
    """The most memory Python held while `call()` ran (what a hostile archive costs)."""
    tracemalloc.start()
    try:
        call()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("kind", [tarfile.XHDTYPE, tarfile.GNUTYPE_LONGNAME], ids=["pax", "gnu-long-name"])
def test_a_header_of_megabytes_is_refused_before_it_is_read(tmp_path, kind):
    # 65 KB of gzip holding a 64 MiB header: tarfile reads such a header whole, so it cost
    # ~3,000 times the archive's size in memory before any member check ran (issue 35).
    bomb = tmp_path / "bomb.tar.gz"
    header_bomb(bomb, 64 << 20, kind=kind)
    assert bomb.stat().st_size < 70_000

    def unpack_it():
        with pytest.raises(BadArchive, match="a header of 67108864 bytes"):
            unpack(bomb, tmp_path / "out", max_unpacked_bytes=100_000)

    assert peak_bytes_while(unpack_it) < 10 * 100_000
    assert not (tmp_path / "out" / "train.py").exists()


def test_an_archive_decompressing_far_past_its_limit_is_refused_however_its_bytes_are_spent(tmp_path):
    # Headers each within the bound, and no file data to count: only the stream's length says.
    many = tmp_path / "many.tar.gz"
    header_bomb(many, 60_000, headers=40)
    with pytest.raises(BadArchive, match="decompresses to more than"):
        unpack(many, tmp_path / "out", max_unpacked_bytes=5000)
    assert unpack(many, tmp_path / "roomy", max_unpacked_bytes=10**6).files == 1


def test_a_member_with_more_pax_records_than_any_tree_needs_is_refused(tmp_path):
    # Each record is a dict entry tarfile copies into every later member: kept small, so
    # an archive cannot grow memory by the square of its members.
    archive = tmp_path / "records.tar.gz"
    with tarfile.open(archive, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("train.py")
        info.pax_headers = {f"respawn.k{i}": "v" for i in range(100)}
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(BadArchive, match="100 pax records"):
        unpack(archive, tmp_path / "out")
