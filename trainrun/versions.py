"""The installed packages against the floors trainrun declares (``setup.cfg``, read back from the
installed distribution's metadata, so the floors are written once).

Below a floor trainrun would fail somewhere inside a run with an error about a missing function
(``torch.nn.utils.get_total_norm`` needs torch 2.6), so the command line refuses an older package
before any work, in one line naming the package, the version found and the one needed.
"""

from __future__ import annotations

import importlib.metadata

from packaging.requirements import Requirement


def check_requirements(distribution: str = "trainrun") -> None:
    """Raise ImportError naming the first installed requirement of ``distribution`` below its floor."""
    try:
        requirements = importlib.metadata.requires(distribution) or []
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return
    for line in requirements:
        requirement = Requirement(line)
        if requirement.marker is not None or not requirement.specifier:  # extras, or no floor
            continue
        try:
            found = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            continue  # its import fails with Python's own message
        if not requirement.specifier.contains(found, prereleases=True):
            raise ImportError(
                f"trainrun needs {requirement.name}{requirement.specifier} but {found} is installed: "
                f"pip install '{requirement.name}{requirement.specifier}'"
            )
