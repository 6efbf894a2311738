"""The README's "Using it" install lines, run as written in a fresh virtual environment: the wheels built as
``nox -s wheels`` builds them, then its ``pip install`` line, then doctor sees exactly the ops installed."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
README = ROOT / "README.md"


def using_it_commands() -> list[str]:
    """The command lines of the README's "Using it" code block, comments dropped."""
    text = README.read_text().split("## Using it", 1)[1]
    block = [line[4:] for line in text.splitlines() if line.startswith("    ")]
    return [line.split("#")[0].strip() for line in block if line.strip()]


@pytest.mark.skipif(not README.is_file(), reason="tests run outside the repository")
def test_readme_install_lines_work_in_a_fresh_venv(tmp_path):
    commands = using_it_commands()
    assert commands[:2] == ["nox -s wheels", "pip install --find-links dist infera-norm infera-attn-paged"], commands
    # nox -s wheels: its own command (noxfile.wheels), every package of the checkout into dist/
    packages = [str(ROOT / "meta" / "infera-vllm"), *map(str, sorted((ROOT / "packages").glob("infera-*")))]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), *packages],
                   check=True, capture_output=True, text=True, timeout=600)
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "venv")], check=True, timeout=300)
    bin_dir = tmp_path / "venv" / "bin"
    pip = shlex.split(commands[1])
    assert pip[0] == "pip"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFERA_", "PYTHONPATH", "VIRTUAL_ENV"))}
    proc = subprocess.run([str(bin_dir / "python"), "-m", *pip], cwd=tmp_path, capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doctor = subprocess.run([str(bin_dir / "infera-vllm"), "doctor", "--json"], cwd=tmp_path, capture_output=True,
                            text=True, env=env, timeout=300)
    assert doctor.returncode == 0, doctor.stderr
    ops = {o["op"]: o["distribution"] for o in json.loads(doctor.stdout)["ops"]}
    assert ops == {"norm": "infera-norm", "attn-paged": "infera-attn-paged"}  # what was installed, nothing else
