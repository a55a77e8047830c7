"""Harbor's network policy (``network_mode``, ``allowed_hosts``, the deprecated
``allow_internet``) as a task declares it: checked as Harbor checks it, one test per mode, and a
task that wants internet it does not get here says so in its grade, a failure giving that as
its reason (its own failure, never an infrastructure one); no Docker needed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from environments.tasks import Grade, TaskFormatError
from environments.terminal_bench import TerminalBenchTask, load_tasks

FIXTURE = (
    Path(__file__).resolve().parents[4]
    / "environments/fixtures/terminal_bench/published/greeting-file"
)


def load(tmp_path: Path, environment: str = "", agent: str = "") -> TerminalBenchTask:
    """The fixture with lines added to its [environment] and [agent] tables."""
    task_dir = tmp_path / "greeting-file"
    shutil.copytree(FIXTURE, task_dir)
    path = task_dir / "task.toml"
    text = path.read_text().replace("[agent]\n", f"[agent]\n{agent}")
    path.write_text(text.replace("[environment]\n", f"[environment]\n{environment}"))
    return load_tasks(task_dir).get("greeting-file")


def test_no_network_is_what_every_sandbox_does_and_changes_no_grade(tmp_path: Path) -> None:
    task = load(tmp_path, 'network_mode = "no-network"\n')
    assert not task.network.wants_internet
    failed = Grade(0.0, details={"output": "x"})
    assert task.network.annotate(failed) is failed


def test_allowlist_runs_without_internet_and_a_failure_says_why(tmp_path: Path) -> None:
    hosts = 'network_mode = "allowlist"\nallowed_hosts = ["PyPI.org", "*.example.com"]\n'
    task = load(tmp_path, hosts)
    grade = task.network.annotate(Grade(0.0, details={"output": "x"}))
    assert (grade.reward, grade.infra_failure) == (0.0, False)
    assert grade.details["network"] == {
        "declared": {
            "environment": {
                "network_mode": "allowlist",
                "allowed_hosts": ["pypi.org", "*.example.com"],
            }
        },
        "granted": "no-network",
        "note": grade.details["reason"],
    }
    assert "environment.network_mode = 'allowlist'" in grade.details["reason"]
    assert "no internet" in grade.details["reason"]


def test_allowed_hosts_are_normalised_as_harbor_does(tmp_path: Path) -> None:
    hosts = '["Example.COM.", "2001:DB8::1", "10.0.0.0/8", "2001:db8:0::/32", "*.pythonhosted.org"]'
    task = load(tmp_path, f'network_mode = "allowlist"\nallowed_hosts = {hosts}\n')
    (declared,) = task.network.declared
    assert declared.allowed_hosts == (
        "example.com",
        "2001:db8::1",
        "10.0.0.0/8",
        "2001:db8::/32",
        "*.pythonhosted.org",
    )


def test_public_passing_without_internet_stands_and_is_recorded(tmp_path: Path) -> None:
    task = load(tmp_path, 'network_mode = "public"\n')
    grade = task.network.annotate(Grade(1.0, details={}))
    assert grade.reward == 1.0 and "reason" not in grade.details
    assert grade.details["network"]["declared"]["environment"]["network_mode"] == "public"
    own = task.network.annotate(Grade(0.0, details={"reason": "strict grading: tampering"}))
    assert own.details["reason"] == "strict grading: tampering"  # its own reason kept
    infra = task.network.annotate(Grade(0.0, infra_failure=True, details={"error": "gone"}))
    assert infra.infra_failure and "reason" not in infra.details


def test_undeclared_is_harbors_public_default_and_not_reported(tmp_path: Path) -> None:
    task = load(tmp_path)
    assert task.network.declared == () and not task.network.wants_internet


@pytest.mark.parametrize(("value", "mode"), [("true", "public"), ("false", "no-network")])
def test_allow_internet_is_deprecated_and_mapped_as_harbor_maps_it(
    tmp_path: Path, value: str, mode: str
) -> None:
    with pytest.warns(DeprecationWarning, match="allow_internet"):
        task = load(tmp_path, f"allow_internet = {value}\n")
    (declared,) = task.network.declared
    assert (declared.mode, declared.field) == (mode, "environment.allow_internet")


def test_network_mode_wins_over_allow_internet(tmp_path: Path) -> None:
    with pytest.warns(DeprecationWarning):
        task = load(tmp_path, 'allow_internet = true\nnetwork_mode = "no-network"\n')
    assert not task.network.wants_internet


def test_a_phase_override_is_reported_under_its_table(tmp_path: Path) -> None:
    task = load(tmp_path, 'network_mode = "no-network"\n', agent='network_mode = "public"\n')
    assert task.network.wants_internet
    record = task.network.annotate(Grade(0.0)).details["network"]["declared"]
    assert record["agent"]["network_mode"] == "public"
    assert record["environment"]["network_mode"] == "no-network"


@pytest.mark.parametrize(
    ("lines", "field"),
    [
        ('network_mode = "internet"\n', "environment.network_mode"),
        ('allowed_hosts = ["pypi.org"]\n', "environment.allowed_hosts"),
        ('network_mode = "public"\nallowed_hosts = ["pypi.org"]\n', "environment.allowed_hosts"),
        ('network_mode = "allowlist"\nallowed_hosts = [""]\n', "environment.allowed_hosts"),
        # Harbor refuses a URL, a port, a host-bit CIDR and a wildcard of an address
        (
            'network_mode = "allowlist"\nallowed_hosts = ["https://pypi.org/simple"]\n',
            "allowed_hosts",
        ),
        ('network_mode = "allowlist"\nallowed_hosts = ["pypi.org:443"]\n', "allowed_hosts"),
        ('network_mode = "allowlist"\nallowed_hosts = ["10.0.0.1/8"]\n', "allowed_hosts"),
        ('network_mode = "allowlist"\nallowed_hosts = ["*.10.0.0.1"]\n', "allowed_hosts"),
        ('allow_internet = "yes"\n', "environment.allow_internet"),
    ],
)
def test_a_bad_policy_is_refused_naming_its_field(tmp_path: Path, lines: str, field: str) -> None:
    with pytest.raises(TaskFormatError, match=field.replace(".", r"\.")):
        load(tmp_path, lines)


STEPS_FIXTURE = Path(__file__).resolve().parents[4] / "tests/fixtures/harbor-1.4/ms-two-step-mean"


def load_steps(tmp_path: Path, first: str = "", agent: str = "") -> TerminalBenchTask:
    """The two-step fixture with a no-network baseline, ``first`` added to its first step's
    [steps.agent] and ``agent`` to the task's [agent]."""
    task_dir = tmp_path / "ms-two-step-mean"
    shutil.copytree(STEPS_FIXTURE, task_dir)
    path = task_dir / "task.toml"
    text = path.read_text().replace('network_mode = "public"', 'network_mode = "no-network"')
    text = text.replace("[agent]\n", f"[agent]\n{agent}", 1)
    path.write_text(text.replace("[steps.agent]\n", f"[steps.agent]\n{first}", 1))
    return load_tasks(task_dir).get("ms-two-step-mean")


def test_a_steps_network_override_holds_for_that_step_only(tmp_path: Path) -> None:
    """[steps.agent] network_mode was accepted and never read: a step that declares the
    internet failed with no word of why."""
    task = load_steps(tmp_path, first='network_mode = "allowlist"\nallowed_hosts = ["PyPI.org"]\n')
    first = task.step_task(0).network.annotate(Grade(0.0)).details
    assert first["network"]["declared"]["agent"] == {
        "network_mode": "allowlist",
        "allowed_hosts": ["pypi.org"],
    }
    assert "steps[0].agent.network_mode = 'allowlist'" in first["reason"]
    assert not task.step_task(1).network.wants_internet


def test_a_steps_override_replaces_the_tasks_for_its_phase(tmp_path: Path) -> None:
    """Harbor's resolution: the step's explicit policy, else [agent]'s, else the baseline."""
    task = load_steps(
        tmp_path, first='network_mode = "no-network"\n', agent='network_mode = "public"\n'
    )
    assert not task.step_task(0).network.wants_internet
    assert task.step_task(1).network.wants_internet  # [agent]'s public holds where no override


@pytest.mark.parametrize(
    ("first", "field"),
    [
        ('network_mode = "internet"\n', r"steps\[0\]\.agent\.network_mode"),
        ('allowed_hosts = ["pypi.org"]\n', r"steps\[0\]\.agent\.allowed_hosts"),
        ('network_mode = "allowlist"\nallowed_hosts = ["pypi.org:443"]\n', "allowed_hosts"),
    ],
)
def test_a_bad_step_policy_is_refused_naming_its_field(
    tmp_path: Path, first: str, field: str
) -> None:
    with pytest.raises(TaskFormatError, match=field):
        load_steps(tmp_path, first=first)


def with_verifier(tmp_path: Path, lines: str, verifier: str = "") -> TerminalBenchTask:
    """The fixture with ``lines`` appended (a [verifier.environment] table) and ``verifier``
    added to its [verifier] table."""
    task_dir = tmp_path / "greeting-file"
    shutil.copytree(FIXTURE, task_dir)
    path = task_dir / "task.toml"
    text = path.read_text().replace("[verifier]\n", f"[verifier]\n{verifier}")
    path.write_text(text + lines)
    return load_tasks(task_dir).get("greeting-file")


def test_a_separate_verifiers_environment_is_the_verifiers_baseline(tmp_path: Path) -> None:
    """Harbor (``trial/network_policy.py``): a separate verifier with an environment of its own
    takes that environment's policy, not the task's; [verifier] network_mode still wins."""
    own = '[verifier.environment]\ndocker_image = "python:3.12"\nnetwork_mode = "public"\n'
    task = with_verifier(tmp_path / "a", own)
    assert task.network.wants_internet
    record = task.network.annotate(Grade(0.0)).details
    assert record["network"]["declared"] == {
        "verifier": {"network_mode": "public", "allowed_hosts": []}
    }
    assert "verifier.environment.network_mode = 'public'" in record["reason"]
    overridden = with_verifier(tmp_path / "b", own, 'network_mode = "no-network"\n')
    assert not overridden.network.wants_internet


def test_a_separate_verifiers_allow_internet_is_read_as_harbor_reads_it(tmp_path: Path) -> None:
    lines = '[verifier.environment]\ndocker_image = "python:3.12"\nallow_internet = true\n'
    with pytest.warns(DeprecationWarning, match="verifier.environment.allow_internet"):
        task = with_verifier(tmp_path, lines)
    (declared,) = task.network.declared
    assert (declared.phase, declared.mode) == ("verifier", "public")
    assert declared.field == "verifier.environment.allow_internet"


def test_a_steps_separate_verifier_takes_its_environments_policy(tmp_path: Path) -> None:
    """[steps.verifier.environment] network_mode is that step's verifier baseline; an explicit
    [verifier] network_mode of the task still wins, as in Harbor's resolution."""
    own = (
        "[steps.verifier]\ntimeout_sec = 120.0\n\n[steps.verifier.environment]\n"
        'docker_image = "python:3.12"\nnetwork_mode = "public"\n'
    )

    def load_with(folder: Path, verifier: str = "") -> TerminalBenchTask:
        task_dir = folder / "ms-two-step-mean"
        shutil.copytree(STEPS_FIXTURE, task_dir)
        path = task_dir / "task.toml"
        text = path.read_text().replace('network_mode = "public"', 'network_mode = "no-network"')
        text = text.replace("[verifier]\n", f"[verifier]\n{verifier}", 1)
        path.write_text(text.replace("[steps.verifier]\ntimeout_sec = 120.0\n", own, 1))
        return load_tasks(task_dir).get("ms-two-step-mean")

    task = load_with(tmp_path / "a")
    details = task.step_task(0).network.annotate(Grade(0.0)).details
    assert details["network"]["declared"]["verifier"]["network_mode"] == "public"
    assert "steps[0].verifier.environment.network_mode = 'public'" in details["reason"]
    assert not task.step_task(1).network.wants_internet
    pinned = load_with(tmp_path / "b", 'network_mode = "no-network"\n')
    assert not pinned.step_task(0).network.wants_internet
