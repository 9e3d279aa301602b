"""Every tool's `-o` never replaces what is not a regular file: a device, a FIFO or a descriptor is written in place
(or refused: `logos-compile` writes folders only), a symlink to a regular file has its target replaced and stays a
link, a regular file is replaced atomically, and `-o -` is standard output. The special files are made in a
temporary folder; the tools run in this process."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from logos_ir.author import write
from logos_ir.cli import USER_ERROR, write_output
from logos_ir.program import Cut
from logos_ir.spec import ModelSpec
from logos_ir.tools import logos_author, logos_compile, logos_opt

CUT = "decode ctx=8"


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("program") / "tiny.logos"
    path.write_text(write(ModelSpec.preset("tiny"), Cut.parse(CUT)).text)
    return path


def _opt(program: Path) -> Callable[[str], int]:
    return lambda output: logos_opt.main([str(program), "-t", "logos", "-o", output])


def _author(program: Path) -> Callable[[str], int]:
    return lambda output: logos_author.main(["--model", "tiny", "--cut", CUT, "-o", output])


TOOLS = {"logos-opt": _opt, "logos-author": _author}


def _expected(name: str, program: Path) -> bytes:
    return program.read_bytes()  # both print the tiny program's text


def _null_device(folder: Path) -> Path:
    """A character device like /dev/null, made in `folder` (root only); else a symlink to /dev/null."""
    node = folder / "null"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        with open(node, "wb"):
            pass
    except (PermissionError, OSError):
        node.unlink(missing_ok=True)
        node.symlink_to("/dev/null")
    return node


@pytest.mark.parametrize("name", sorted(TOOLS))
def test_a_device_is_written_in_place(name: str, program: Path, tmp_path: Path) -> None:
    node = _null_device(tmp_path)
    assert TOOLS[name](program)(str(node)) == 0
    assert not stat.S_ISREG(os.stat(node).st_mode), "the device became a regular file"


@pytest.mark.parametrize("name", sorted(TOOLS))
def test_dev_null_stays_a_device(name: str, program: Path) -> None:
    assert TOOLS[name](program)("/dev/null") == 0
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


@pytest.mark.parametrize("name", sorted(TOOLS))
def test_a_fifo_is_written_in_place(name: str, program: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    assert TOOLS[name](program)(str(fifo)) == 0
    reader.join(timeout=30)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert received == [_expected(name, program)]


@pytest.mark.parametrize("name", sorted(TOOLS))
def test_a_symlink_replaces_its_target(name: str, program: Path, tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    target = tmp_path / "elsewhere" / "target.txt"
    target.write_text("old\n")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    assert TOOLS[name](program)(str(link)) == 0
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_bytes() == _expected(name, program)
    assert sorted(p.name for p in target.parent.iterdir()) == ["target.txt"], "a temporary file was left"


@pytest.mark.parametrize("name", sorted(TOOLS))
def test_a_regular_file_is_replaced(name: str, program: Path, tmp_path: Path) -> None:
    output = tmp_path / "out.txt"
    output.write_text("old\n")
    inode = output.stat().st_ino
    assert TOOLS[name](program)(str(output)) == 0
    assert output.read_bytes() == _expected(name, program)
    assert output.stat().st_ino != inode, "not renamed into place"


@pytest.mark.parametrize("name", sorted(TOOLS))
def test_dash_is_standard_output(
    name: str, program: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert TOOLS[name](program)("-") == 0
    assert capfd.readouterr().out.encode() == _expected(name, program)
    assert not (tmp_path / "-").exists()


@pytest.mark.parametrize("name", sorted(TOOLS))
def test_a_socket_is_refused(name: str, program: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    path = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        assert TOOLS[name](program)(str(path)) == USER_ERROR
    assert stat.S_ISSOCK(os.lstat(path).st_mode)
    assert "is a socket" in capsys.readouterr().err


def test_a_descriptor_is_written_in_place(tmp_path: Path) -> None:
    """/proc/self/fd/N names the open file itself: written into, not a new file renamed over the link."""
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("no /proc on this system")
    read_end, write_end = os.pipe()
    try:
        write_output(f"/proc/self/fd/{write_end}", "through the pipe\n")
        assert os.read(read_end, 100) == b"through the pipe\n"
    finally:
        os.close(read_end)
        os.close(write_end)


@pytest.mark.parametrize("kind", ["fifo", "device", "symlink to a file"])
def test_logos_compile_refuses_what_is_not_a_folder(kind: str, tmp_path: Path) -> None:
    """A build is a folder: `logos-compile -o` refuses any other kind of path and leaves it as it was."""
    path = tmp_path / "out"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path = _null_device(tmp_path)
    else:
        (tmp_path / "file").write_text("old\n")
        path.symlink_to(tmp_path / "file")
    before = os.lstat(path)
    code = logos_compile.main(["--model", "tiny", "--cut", CUT, "--target", "logos", "-o", str(path)])
    assert code == USER_ERROR
    after = os.lstat(path)
    assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino)
    if kind == "symlink to a file":
        assert (tmp_path / "file").read_text() == "old\n"
