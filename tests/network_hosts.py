"""Hosts for the multi-node tests: Linux network namespaces of this machine on a bridge in a
namespace of its own (a switch), addresses 10.213.0.x that exist only inside them, all removed at
the end whatever happens (and those a killed run left, named by its process, when the next hosts
are made: :func:`remove_orphans`). The host name resolves to a loopback address in every namespace (as on
many machines), so gloo would advertise it unless told the interface; the tests set no interface
variable. Each host may have names for the others (``node0`` ...), as a cluster's DNS gives them.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

SUBNET = "10.213.0"
OURS = re.compile(r"(?:trsw|trh\d+-)(\d+)[a-z]")  # a namespace these tests made, and the process that made it
# every rank one thread, however many share its host: a rank's arithmetic is then the same on one
# node and on two, and two ranks' runs agree to the bit however long (float noise grows with steps)
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


class Hosts:
    """Network namespaces on a bridge: host ``i`` has ``eth0`` at 10.213.0.(i+1)."""

    made = 0  # in this process: each set of hosts its own names

    def __init__(self, count: int, names_file: Path | None = None) -> None:
        Hosts.made += 1
        tag = f"{os.getpid()}{chr(ord('a') + Hosts.made % 26)}"
        self.switch = f"trsw{tag}"
        self.names = [f"trh{index}-{tag}" for index in range(count)]
        self.ports = [f"port{index}" for index in range(count)]
        self.names_file = names_file  # an /etc/hosts for every host, naming the others (see enter)

    def create(self) -> None:
        run = self._ip
        run("netns", "add", self.switch)
        run("-n", self.switch, "link", "add", "br0", "type", "bridge")
        run("-n", self.switch, "link", "set", "br0", "up")
        for index, (name, port) in enumerate(zip(self.names, self.ports, strict=True)):
            run("netns", "add", name)
            run("link", "add", "eth0", "netns", name, "type", "veth", "peer", "name", port, "netns", self.switch)
            run("-n", self.switch, "link", "set", port, "master", "br0", "up")
            run("-n", name, "addr", "add", f"{self.address(index)}/24", "dev", "eth0")
            run("-n", name, "link", "set", "eth0", "up")
            run("-n", name, "link", "set", "lo", "up")
        if self.names_file is not None:
            named = "".join(f"{self.address(index)} node{index}\n" for index in range(len(self.names)))
            self.names_file.write_text(Path("/etc/hosts").read_text() + named)

    def remove(self) -> None:
        for name in [*self.names, self.switch]:
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)

    def address(self, index: int) -> str:
        return f"{SUBNET}.{index + 1}"

    def cut(self, index: int) -> None:
        """Host ``index``'s switch port down: its link is gone, no reset reaches anyone."""
        self._ip("-n", self.switch, "link", "set", self.ports[index], "down")

    def enter(self, index: int) -> list[str]:
        """The command prefix that runs a program on host ``index``: its network namespace, and where
        the hosts have names, a mount namespace whose ``/etc/hosts`` holds them (``ip netns exec``
        would also hide the machine's cgroups, which slurmd needs)."""
        if self.names_file is None:
            return ["ip", "netns", "exec", self.names[index]]
        named = f'mount --bind {self.names_file} /etc/hosts && exec "$@"'
        return [
            "nsenter", f"--net=/run/netns/{self.names[index]}", "unshare", "--mount", "--propagation", "private",
            "sh", "-c", named, "host",
        ]  # fmt: skip

    def start(self, index: int, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """``trainrun ARGS`` on host ``index``, in a process group of its own, its output piped."""
        environment = {key: value for key, value in os.environ.items() if not key.endswith("_SOCKET_IFNAME")}
        environment |= ONE_THREAD | {"PYTHONUNBUFFERED": "1", "COLUMNS": "200"} | (env or {})
        command = [*self.enter(index), sys.executable, "-m", "trainrun", *args]
        return subprocess.Popen(
            command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )

    @staticmethod
    def _ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@contextlib.contextmanager
def made_hosts(count: int, names_file: Path | None = None) -> Iterator[Hosts]:
    """``count`` hosts while the block runs; the test skipped, saying why, where they cannot be made."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    remove_orphans()
    made = Hosts(count, names_file)
    try:
        made.create()
    except (OSError, subprocess.CalledProcessError) as error:
        made.remove()
        pytest.skip(f"network namespaces cannot be made here: {getattr(error, 'stderr', error)}")
    try:
        yield made
    finally:
        made.remove()


def remove_orphans() -> None:
    """Remove the namespaces these tests made in a process that is gone (a run killed mid-test
    cannot remove its own); those of a running process, another suite worker's, stay."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for name in (line.split()[0] for line in listed.splitlines() if line.strip()):
        mine = OURS.fullmatch(name)
        if mine and not Path(f"/proc/{mine.group(1)}").exists():
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)
