"""A Harbor task's network policy (``network_mode``, ``allowed_hosts``, ``allow_internet``).

Harbor 0.26 (``models/task/config.py``) lets ``[environment]`` say ``network_mode`` =
``"no-network"``, ``"allowlist"`` (with ``allowed_hosts``: names, addresses, CIDR ranges,
``*.``-wildcards) or ``"public"`` (its default), ``[agent]`` and ``[verifier]`` override it for
their phase (a separate verifier's ``[verifier.environment]`` is the verifier's baseline
instead, as in Harbor's ``trial/network_policy.py``), and the deprecated ``allow_internet`` (a
bool) stands for ``public`` / ``no-network`` where ``network_mode`` is not given. Here nothing
leaves the machine: every sandbox runs with no network (a compose task's services share one with
no route out), whatever a task declares. So a task that declares ``public`` or ``allowlist``
runs without it, and its grade says so (``details["network"]``); one that fails gets that as its
``reason``: the task's own failure, not an infrastructure one, and never a silent pass (a pass
stands: it needed no internet).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from environments.tasks import Grade, TaskFormatError
from thundersync.protocol.documents import excerpt

NO_NETWORK, ALLOWLIST, PUBLIC = "no-network", "allowlist", "public"
NETWORK_MODES = (NO_NETWORK, ALLOWLIST, PUBLIC)
GRANTED = NO_NETWORK
"""What every sandbox here gets, whatever the task declares."""
PHASES = ("environment", "agent", "verifier")
"""The tables that may declare a policy (``[environment]`` the baseline, the others a phase)."""


@dataclass(frozen=True, slots=True)
class Declared:
    """One table's declared policy: ``phase`` (a table of ``PHASES``), its mode and hosts,
    and the field it came from (``environment.allow_internet`` for the deprecated one)."""

    phase: str
    mode: str
    allowed_hosts: tuple[str, ...] = ()
    field: str = ""


@dataclass(frozen=True, slots=True)
class NetworkPolicy:
    """What a task declared (nothing: Harbor's default ``public``, which is not reported, since
    every task would be) and what it gets here (``GRANTED``)."""

    declared: tuple[Declared, ...] = ()

    @property
    def wants_internet(self) -> bool:
        """Whether any phase declared ``public`` or ``allowlist``."""
        return any(d.mode != NO_NETWORK for d in self.declared)

    def record(self) -> dict[str, Any]:
        """``details["network"]``: each phase's declaration, what it got, and why."""
        return {
            "declared": {
                d.phase: {"network_mode": d.mode, "allowed_hosts": list(d.allowed_hosts)}
                for d in self.declared
            },
            "granted": GRANTED,
            "note": self.reason(),
        }

    def reason(self) -> str:
        wanted = ", ".join(f"{d.field} = {d.mode!r}" for d in self.declared if d.mode != NO_NETWORK)
        return (
            f"the task declares {wanted}, but sandboxes here have no internet (network_mode "
            f"{GRANTED!r}): if it needs the internet, that is why it failed"
        )

    def for_step(self, declared: tuple[Declared, ...]) -> NetworkPolicy:
        """The policy while a step runs: its ``[steps.agent]`` / ``[steps.verifier]``
        declarations replace the task's of the same phase, as Harbor's phase resolution does
        (``network_policy.py``: the step's explicit policy, else the task's table's, else the
        ``[environment]`` baseline)."""
        explicit = {d.phase for d in self.declared if not _baseline(d)}
        declared = tuple(d for d in declared if not (_baseline(d) and d.phase in explicit))
        phases = {d.phase for d in declared}
        kept = tuple(d for d in self.declared if d.phase not in phases)
        return NetworkPolicy(kept + declared)

    def annotate(self, grade: Grade) -> Grade:
        """``grade`` with ``details["network"]`` when the task wanted internet, and that as the
        ``reason`` of a failed (not infrastructure-failed) grade that gives none."""
        if not self.wants_internet:
            return grade
        details = {**grade.details, "network": self.record()}
        if not grade.infra_failure and grade.reward < 1.0:
            details.setdefault("reason", self.reason())
        return dataclasses.replace(grade, details=details)


def read_network_policy(path: Path, tables: dict[str, dict[str, Any]]) -> NetworkPolicy:
    """The policy ``task.toml`` (``path``) declares in ``tables`` (its ``[environment]``,
    ``[agent]`` and ``[verifier]``), checked as Harbor checks it; TaskFormatError naming the
    field otherwise."""
    declared = [d for phase in PHASES if (d := _read_phase(path, phase, tables.get(phase, {})))]
    own = tables.get("verifier", {}).get("environment")
    if isinstance(own, dict):  # a separate verifier's environment: the verifier's baseline
        base = _read_phase(path, "verifier", own, prefix="verifier.environment", baseline=True)
        if base is not None and not any(d.phase == "verifier" for d in declared):
            declared.append(base)
    return NetworkPolicy(tuple(declared))


def read_step_network(
    path: Path, field: str, agent: dict[str, Any], verifier: dict[str, Any]
) -> tuple[Declared, ...]:
    """Step ``field``'s (``steps[i]``) phase overrides, ``[steps.agent]`` and
    ``[steps.verifier]`` ``network_mode`` / ``allowed_hosts``, checked as the task's tables
    are (TaskFormatError naming the field); each is declared for its phase, with its field."""
    declared = []
    for phase, table in (("agent", agent), ("verifier", verifier)):
        found = _read_phase(path, phase, table, prefix=f"{field}.{phase}")
        own = table.get("environment") if phase == "verifier" else None
        if found is None and isinstance(own, dict):  # the step's separate verifier's baseline
            prefix = f"{field}.verifier.environment"
            found = _read_phase(path, phase, own, prefix=prefix, baseline=True)
        if found is not None:
            declared.append(found)
    return tuple(declared)


def _baseline(declared: Declared) -> bool:
    """Whether a verifier's declaration is its separate environment's baseline, which an
    explicit ``[verifier]`` / ``[steps.verifier]`` ``network_mode`` overrides."""
    return "verifier.environment." in declared.field


def _read_phase(
    path: Path,
    phase: str,
    table: dict[str, Any],
    *,
    prefix: str | None = None,
    baseline: bool = False,
) -> Declared | None:
    """A table's declaration; an environment's (``baseline``: ``[environment]``, a separate
    verifier's ``[verifier.environment]``) may say the deprecated ``allow_internet``."""
    prefix = prefix or phase
    mode, hosts = table.get("network_mode"), table.get("allowed_hosts")
    if mode is not None and mode not in NETWORK_MODES:
        raise TaskFormatError(
            path,
            f"{prefix}.network_mode",
            f"expected one of {', '.join(NETWORK_MODES)}, got {excerpt(mode)}",
        )
    allowed = _read_hosts(path, f"{prefix}.allowed_hosts", hosts)
    if hosts is not None and mode != ALLOWLIST:
        raise TaskFormatError(
            path, f"{prefix}.allowed_hosts", "is only valid when network_mode = 'allowlist'"
        )
    legacy = table.get("allow_internet") if baseline or phase == "environment" else None
    if legacy is not None:
        field = f"{prefix}.allow_internet"
        if not isinstance(legacy, bool):
            raise TaskFormatError(path, field, f"expected true or false, got {excerpt(legacy)}")
        warnings.warn(
            f"{path}: field '{field}' is deprecated; use [{prefix}] network_mode "
            "(Harbor's rule: true is 'public', false 'no-network')",
            DeprecationWarning,
            stacklevel=4,
        )
    if mode is not None:
        return Declared(phase, mode, allowed, f"{prefix}.network_mode")
    if legacy is not None:
        return Declared(phase, PUBLIC if legacy else NO_NETWORK, (), f"{prefix}.allow_internet")
    return None


def _read_hosts(path: Path, field: str, value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(h, str) and h.strip() for h in value):
        raise TaskFormatError(
            path, field, f"expected a list of hostnames, addresses or CIDRs, got {excerpt(value)}"
        )
    return tuple(_read_host(path, field, h) for h in value)


_HOST_LABEL = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")


def _read_host(path: Path, field: str, value: str) -> str:
    """One ``allowed_hosts`` entry as Harbor normalises it (``_validate_allowed_host_names``):
    a hostname, a ``*.``-wildcard hostname, an IP address or a CIDR range; a URL, a port or a
    path is refused, as Harbor refuses it."""
    host = value.strip().lower().rstrip(".")
    if "/" in host or ":" in host:  # a CIDR range or an IPv6 address, nothing else
        try:
            if "%" not in host:
                if "/" in host:
                    return ipaddress.ip_network(host, strict=True).compressed
                return ipaddress.IPv6Address(host).compressed
        except ValueError:
            pass
    else:
        name = host.removeprefix("*.")
        labels_ok = name and "*" not in name and all(_HOST_LABEL.match(p) for p in name.split("."))
        if labels_ok and not (host.startswith("*.") and _is_address(name)):  # *.<an address>
            return host
    raise TaskFormatError(
        path,
        field,
        "expected a hostname, *.hostname, IP address or CIDR range (not a URL, port or path), "
        f"got {excerpt(value)}",
    )


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
