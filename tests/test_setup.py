"""The set-up: scripts/install_espeak.sh runs under POSIX sh, and no test installs a system package."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "install_espeak.sh"


def _fake_bin(tmp_path: Path, *, uid: int, apt_exit: int | None) -> Path:
    """A PATH with only `cat`, an `id` that prints ``uid``, and an `apt-get` that exits ``apt_exit`` (none
    when None); espeak-ng is absent, so nothing on this machine is installed or changed."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(shutil.which("cat"), bin_dir / "cat")
    (bin_dir / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    if apt_exit is not None:
        (bin_dir / "apt-get").write_text(f"#!/bin/sh\necho \"apt-get $*\" >> {tmp_path}/apt.log\nexit {apt_exit}\n")
    for f in bin_dir.iterdir():
        if not f.is_symlink():
            f.chmod(0o755)
    return bin_dir


def _run(tmp_path: Path, bin_dir: Path) -> subprocess.CompletedProcess:
    sh = shutil.which("dash") or "/bin/sh"  # the shell `make` and Debian's /bin/sh use
    return subprocess.run([sh, str(SCRIPT)], env={"PATH": str(bin_dir)}, capture_output=True, text=True,
                          timeout=30)


def test_without_apt_rights_it_says_how_and_lets_the_set_up_go_on(tmp_path):
    proc = _run(tmp_path, _fake_bin(tmp_path, uid=1000, apt_exit=0))
    assert proc.returncode == 0, proc.stderr
    assert "sudo apt-get install -y espeak-ng" in proc.stdout and "brew install espeak-ng" in proc.stdout
    assert not (tmp_path / "apt.log").exists()  # not root: apt-get is never called


def test_a_failing_apt_get_fails_loudly(tmp_path):
    proc = _run(tmp_path, _fake_bin(tmp_path, uid=0, apt_exit=100))
    assert proc.returncode == 1
    assert "apt-get could not install espeak-ng" in proc.stderr and "SKIP_ESPEAK=1" in proc.stderr
    assert (tmp_path / "apt.log").read_text().splitlines() == [
        "apt-get install -y --no-install-recommends espeak-ng", "apt-get update"]


def test_the_makefile_does_not_swallow_the_script_or_stamp_it():
    text = (REPO / "Makefile").read_text()
    line = next(ln for ln in text.splitlines() if "install_espeak.sh" in ln)
    assert "|| true" not in line
    stamp = text[text.index("$(VENV)/.installed:"):text.index("touch $@")]
    assert "espeak" not in stamp  # checked on every set-up, not once behind the .venv stamp


def test_no_test_installs_system_packages():
    def runs_an_installer(text: str) -> bool:
        return "subprocess" in text and ("install_espeak" in text or "apt-get" in text)

    offenders = [p.name for p in (REPO / "tests").rglob("*.py")
                 if p.name != Path(__file__).name and runs_an_installer(p.read_text())]
    assert offenders == []


@pytest.mark.skipif(shutil.which("dash") is None, reason="dash is not installed")
def test_script_parses_under_dash():
    assert subprocess.run(["dash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
