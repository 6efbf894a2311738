"""Hatchling build hook of every wheel in this repository: the project commit the wheel is built from.

Written into the wheel's ``.dist-info/extra_metadata/BUILD_COMMIT`` (git's HEAD of the checkout, ``+dirty``
with uncommitted changes to tracked files, ``unknown`` outside a checkout), so what a wheel measured can be
traced to its code wherever it is installed: ``infera_vllm.validate.identity`` records it, not the git HEAD of
the directory the user runs from. ``INFERA_BUILD_COMMIT`` overrides it (a build from an exported tree).
Each package's ``pyproject.toml`` names this file (``[tool.hatch.build.targets.wheel.hooks.custom]``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

METADATA_NAME = "BUILD_COMMIT"


def build_commit(root: str) -> str:
    """HEAD of the git checkout holding ``root`` (+dirty where tracked files changed), else ``unknown``."""
    if os.environ.get("INFERA_BUILD_COMMIT"):
        return os.environ["INFERA_BUILD_COMMIT"].strip()
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


class BuildCommitHook(BuildHookInterface):
    def initialize(self, version: str, build_data: dict) -> None:
        self._directory = tempfile.mkdtemp(prefix="infera-build-commit-")
        path = os.path.join(self._directory, METADATA_NAME)
        with open(path, "w") as f:
            f.write(build_commit(self.root) + "\n")
        build_data["extra_metadata"][path] = METADATA_NAME

    def finalize(self, version: str, build_data: dict, artifact_path: str) -> None:
        shutil.rmtree(self._directory, ignore_errors=True)
