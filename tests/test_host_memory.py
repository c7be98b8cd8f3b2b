"""host_memory=reuse: a block freed by one step serves the next without page faults, counted."""

import subprocess
import sys

import pytest

FAULTS_OF_TEN_ALLOCATIONS = """
import resource, sys, torch
from trainrun.core.host_memory import reuse_freed_memory
if sys.argv[1] == "reuse":
    assert reuse_freed_memory()
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):  # warm: torch's aligned blocks settle into reusable places within a few
    torch.ones(16 << 20)  # 64 MiB, as a step's logits, allocated and freed
before = faults()
for _ in range(10):
    torch.ones(16 << 20)
print(faults() - before)
"""


def page_faults(mode: str) -> int:
    result = subprocess.run(
        [sys.executable, "-c", FAULTS_OF_TEN_ALLOCATIONS, mode], capture_output=True, text=True, check=True
    )
    return int(result.stdout)


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's mallopt")
def test_reuse_serves_freed_blocks_again_where_the_c_library_faults_fresh_pages_in():
    system, reuse = page_faults("system"), page_faults("reuse")
    pages = (64 << 20) // 4096
    assert system >= 5 * pages // 512  # each allocation's pages faulted in anew (fewer with huge pages)
    assert reuse * 20 < system  # the freed block reused: next to no faults
