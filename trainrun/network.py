"""Which of this host's interfaces reaches the other nodes of a multi-node run, and the launcher's
settings checked before anything starts.

gloo advertises to its peers the address this host's name resolves to unless told an interface
(``GLOO_SOCKET_IFNAME``); on the many machines whose
``/etc/hosts`` maps the host name to a loopback address (127.0.1.1 on Debian and Ubuntu), the peers
are told a loopback address and the run never starts. trainrun asks the kernel's routing table
which local address and interface reach the master (a UDP socket's ``connect`` sends nothing), and
names that interface to gloo unless the user named one (NCCL advertises an interface's own address,
and chooses its interface itself unless ``NCCL_SOCKET_IFNAME`` says one). Written here because torch's launcher
does not choose an interface and psutil, which lists them, does not route.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from trainrun.errors import ConfigError
from trainrun.schema import LauncherConfig

# what trainrun names the route's interface to: gloo's, which otherwise advertises the address the host's
# name resolves to. Not NCCL's: NCCL advertises an interface's own address, and the route to the
# master may run over a management network that its bootstrap and sockets should not (set
# NCCL_SOCKET_IFNAME to choose one; it is left as set)
INTERFACE_VARIABLES = ("GLOO_SOCKET_IFNAME",)


@dataclass(frozen=True)
class Route:
    """How this host reaches ``address``: through ``interface``, from ``local_address``."""

    host: str  # as the user gave it
    address: str  # what it resolves to
    interface: str
    local_address: str

    def environment(self) -> dict[str, str]:
        """The interface variables for the ranks, those the user set left as they are."""
        return {name: self.interface for name in INTERFACE_VARIABLES if name not in os.environ}

    def describe(self) -> str:
        """One line: the route, and what trainrun sets for the ranks and leaves to NCCL."""
        told = ", ".join(f"{name}={value}" for name, value in self.environment().items())
        told = told or ", ".join(f"{name}={os.environ[name]} as set" for name in INTERFACE_VARIABLES)
        nccl = os.environ.get("NCCL_SOCKET_IFNAME")
        nccl = f"NCCL_SOCKET_IFNAME={nccl} as set" if nccl else "NCCL chooses its interface (NCCL_SOCKET_IFNAME unset)"
        route = f"is reached through {self.interface} ({self.local_address})"
        if self.address != self.local_address and is_loopback(self.address):  # this host's own name
            route = f"is this host, which its peers reach through {self.interface} ({self.local_address})"
        return f"{self.host} ({self.address}) {route}: {told}; {nccl}"


def resolved(host: str, key: str) -> str:
    """``host``'s address (the first the resolver gives); one line naming ``key`` where it has none."""
    try:
        return socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)[0][4][0]
    except (socket.gaierror, UnicodeError):
        raise ConfigError(f"bad value for '{key}': '{host}' does not resolve to an address on this host") from None


def is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address.split("%")[0]).is_loopback


def outward_interface() -> tuple[str, str] | None:
    """(the interface of this host's default route, its address), read from the kernel's routing table
    (``/proc/net/route``, IPv4); None where there is none or it holds no address."""
    try:
        rows = [line.split() for line in Path("/proc/net/route").read_text().splitlines()[1:]]
    except OSError:
        return None
    interface = next((row[0] for row in rows if len(row) > 7 and row[1] == "00000000" and row[7] == "00000000"), None)
    addresses = psutil.net_if_addrs().get(interface or "", [])
    address = next((entry.address for entry in addresses if entry.family == socket.AF_INET), None)
    return (interface, address) if interface and address else None


def route_to(host: str, key: str, hosts_master: bool = False) -> Route:
    """The interface and local address this host reaches ``host`` through; one line naming ``key``
    where ``host`` is a loopback address (every node would reach itself) or no interface reaches it.
    On the node that ``hosts_master`` (node 0), a name of its own that resolves to a loopback address
    here (``/etc/hosts``' 127.0.1.1 on Debian and Ubuntu, while its peers resolve it to its address)
    is reached by its peers through its default route's interface, which gloo is told."""
    address = resolved(host, key)
    if is_loopback(address) and hosts_master and is_name(host) and (outward := outward_interface()) is not None:
        return Route(host, address, *outward)
    if is_loopback(address):
        raise ConfigError(
            f"bad value for '{key}': '{host}' is a loopback address ({address}) here; a multi-node launch needs "
            "the node_rank 0 machine's address that every node can reach"
        )
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((address, 9))  # routes, sends nothing
        except OSError as error:
            raise ConfigError(
                f"bad value for '{key}': no interface of this host reaches '{host}' ({address}: {error.strerror})"
            ) from None
        local = probe.getsockname()[0]
    return Route(host, address, interface_of(local, key), local)


def is_name(host: str) -> bool:
    """Whether ``host`` is a host's name (not an address written out, nor ``localhost``)."""
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return host != "localhost"
    return False


def interface_of(local_address: str, key: str) -> str:
    """The interface that holds ``local_address``."""
    for name, addresses in psutil.net_if_addrs().items():
        if any(entry.address.split("%")[0] == local_address for entry in addresses):
            return name
    raise ConfigError(f"bad value for '{key}': no interface of this host holds {local_address}, its route's address")


def is_this_host(address: str) -> bool:
    """Whether ``address`` is one of this host's own (it can be bound here)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((address, 0))
        except OSError:
            return False
    return True


def is_this_machine(host: str) -> bool:
    """Whether ``host`` names the local machine wherever it is read (loopback or unspecified)."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


def check_endpoint(endpoint: str) -> None:
    """``launcher.rdzv_endpoint`` is ``host:port`` (``[v6 address]:port``) with a port from 1 to 65535."""
    host, colon, port = endpoint.rpartition(":")
    if not colon or not host.strip("[]") or "]" in port:
        raise ConfigError(f"bad value for 'launcher.rdzv_endpoint': '{endpoint}' is not host:port (node0:29400)")
    if not (port.isdigit() and 0 < int(port) <= 65535):
        raise ConfigError(f"bad value for 'launcher.rdzv_endpoint': '{endpoint}': port '{port}' is not from 1 to 65535")


def check_launcher(launcher: LauncherConfig) -> None:
    """The launcher's settings, before anything starts: devices, node rank, and a multi-node launch's
    rendezvous (a port, and a master address every node reaches, not this machine's loopback)."""
    if launcher.devices != "auto" and not (launcher.devices.isdigit() and int(launcher.devices) > 0):
        raise ConfigError(f"bad value for 'launcher.devices': '{launcher.devices}' (auto or a positive number)")
    if launcher.node_rank >= launcher.nnodes:
        raise ConfigError(
            f"bad value for 'launcher.node_rank': {launcher.node_rank} (below launcher.nnodes {launcher.nnodes})"
        )
    if launcher.fault_tolerance == "replicas" and launcher.lighthouse:
        return  # its nodes meet at the lighthouse (trainrun/replica_groups.py checks it)
    if launcher.nnodes > 1 and launcher.master_port is None and not launcher.rdzv_endpoint:
        raise ConfigError(
            "a multi-node launch needs 'launcher.master_port' (the same on every node) or 'launcher.rdzv_endpoint'"
        )
    if launcher.rdzv_endpoint:
        check_endpoint(launcher.rdzv_endpoint)
    if launcher.nnodes > 1 and not launcher.rdzv_endpoint and is_this_machine(launcher.master_addr):
        raise ConfigError(
            f"bad value for 'launcher.master_addr': '{launcher.master_addr}' is this machine on every node; "
            "a multi-node launch needs the address of the node_rank 0 machine that every node can reach"
        )


def rendezvous_answers(endpoint: str, timeout: float) -> bool:
    """Whether the rendezvous at ``endpoint`` (host:port, node 0's or the c10d host's) accepts a
    connection within ``timeout`` seconds, tried every second. torch's store client would retry as
    long, then print its own traces in many lines; this lets the launch end in one."""
    host, port = endpoint.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=min(5.0, timeout)):
                return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(1.0)


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list such as ``gpu[07-09,12],cpu3``."""
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist)
    if match is None:
        raise ConfigError(f"cannot read the Slurm node list '{nodelist}'")
    prefix, ranges = match.groups()
    return prefix + re.split(r"[-,]", ranges)[0] if ranges else prefix
