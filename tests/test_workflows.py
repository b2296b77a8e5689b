"""The CI definitions: GitHub workflows, cibuildwheel settings and the CI shell scripts.

actionlint cannot be installed here (its wheel downloads a binary), so this is the check that can
run offline: the YAML parses, it validates against the GitHub workflow schema (check-jsonschema)
and zizmor finds nothing of medium or high severity, when they are installed. The rest are
properties, not a frozen matrix: every ``${{ matrix.x }}`` names a matrix key, actions are pinned
by commit SHA with the version in a comment, every job runs steps of ``.ci/run`` (which exist),
checkouts keep no credentials, Redis comes from a service container on Linux and nowhere else,
runner labels are current, the pure legs run on one OS, each job names the extras it installs,
the release publishes by trusted publishing only after every test and build job, cibuildwheel
lists the intended builds and its table holds only non-default settings, and the CI scripts parse.
"""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
import sys
from typing import Any

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"
NAMES = sorted(p.name for p in WORKFLOWS.glob("*.yml")) if WORKFLOWS.is_dir() else []
# GitHub runner images that were retired: a job asking for one never starts
RETIRED = {"macos-11", "macos-12", "macos-13", "ubuntu-18.04", "ubuntu-20.04", "windows-2019"}

yaml = pytest.importorskip("yaml", reason="PyYAML is needed to read the workflows")
if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

pytestmark = pytest.mark.skipif(
    not WORKFLOWS.is_dir(), reason="no .github/workflows (not a checkout)"
)


def load(name: str) -> dict[Any, Any]:
    data = yaml.safe_load((WORKFLOWS / name).read_text(encoding="utf-8"))
    assert isinstance(data, dict), name
    # YAML 1.1 reads the key `on` as True
    if True in data:
        data["on"] = data.pop(True)
    return data


def all_steps(workflow: dict[Any, Any]) -> list[dict[str, Any]]:
    return [step for job in workflow["jobs"].values() for step in job.get("steps", [])]


def ci_steps() -> set[str]:
    text = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    found = re.search(r"^STEPS=\(([^)]*)\)", text, re.M)
    assert found, ".ci/run lists its STEPS"
    return set(found.group(1).split())


def jobs(name: str) -> dict[str, dict[str, Any]]:
    return load(name)["jobs"]  # type: ignore[no-any-return]


def runners(job: dict[str, Any]) -> list[str]:
    """The runner labels a job can ask for (its matrix expanded)."""
    label = job["runs-on"]
    key = re.fullmatch(r"\$\{\{ matrix\.(\w+) \}\}", label)
    return list(job["strategy"]["matrix"][key.group(1)]) if key else [label]


def test_the_workflows_are_the_intended_ones() -> None:
    assert {"test.yml", "wheels.yml", "release.yml"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_workflow_is_well_formed(name: str) -> None:
    wf = load(name)
    assert wf["name"] and wf["on"] and wf["jobs"]
    assert wf["permissions"] == {"contents": "read"}, "least privilege at the top"
    for job_id, job in wf["jobs"].items():
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", job_id), job_id
        assert ("uses" in job) != ("steps" in job), f"{job_id}: a reusable call or steps"
        for need in [job["needs"]] if isinstance(job.get("needs"), str) else job.get("needs", []):
            assert need in wf["jobs"], f"{job_id} needs unknown job {need}"
        if "uses" in job:
            assert re.fullmatch(r"\./\.github/workflows/[\w-]+\.yml", job["uses"]), job["uses"]
            assert (ROOT / job["uses"]).exists(), job["uses"]
            continue
        assert "runs-on" in job and "timeout-minutes" in job, job_id
        matrix = job.get("strategy", {}).get("matrix", {})
        text = yaml.safe_dump(job)
        for key in re.findall(r"\$\{\{[^}]*?\bmatrix\.([A-Za-z_][\w-]*)", text):
            assert key in matrix, f"{name}: job {job_id} uses matrix.{key}, not in its matrix"
        for step in job["steps"]:
            assert ("uses" in step) != ("run" in step), (
                f"{job_id}: a step needs exactly one of uses/run"
            )
            if "uses" in step:
                # pinned by commit SHA: a tag can be moved, a commit cannot
                assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", step["uses"]), step["uses"]
            if step.get("uses", "").startswith("actions/checkout@"):
                assert step["with"]["persist-credentials"] is False, f"{job_id}: checkout"


@pytest.mark.parametrize("name", NAMES)
def test_pinned_actions_name_their_version(name: str) -> None:
    lines = [
        ln
        for ln in (WORKFLOWS / name).read_text(encoding="utf-8").splitlines()
        if "uses:" in ln and "./.github/" not in ln
    ]
    assert lines
    for line in lines:
        assert re.search(r"uses: \S+@[0-9a-f]{40}  # v\d+\.\d+\.\d+$", line), line


@pytest.mark.parametrize("name", NAMES)
def test_workflow_matches_the_github_schema(name: str) -> None:
    pytest.importorskip("check_jsonschema", reason="check-jsonschema is not installed")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "check_jsonschema",
            "--builtin-schema",
            "vendor.github-workflows",
            str(WORKFLOWS / name),
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_zizmor_finds_nothing_of_medium_or_high_severity() -> None:
    zizmor = shutil.which("zizmor", path=str(pathlib.Path(sys.executable).parent)) or shutil.which(
        "zizmor"
    )
    if zizmor is None:
        pytest.skip("zizmor is not installed (the lint extra has it)")
    out = subprocess.run(
        [zizmor, "--offline", "--min-severity", "medium", str(WORKFLOWS)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_job_runs_steps_of_ci_run() -> None:
    known = ci_steps()
    assert {"install", "lint", "tests", "pure", "slow", "bench", "report", "docs"} <= known
    assert {"wheel", "debug", "freethreaded", "tsan"} <= known
    called = set()
    for job_id, job in jobs("test.yml").items():
        runs = [s["run"] for s in job["steps"] if "run" in s]
        steps = {m for r in runs for m in re.findall(r"bash \.ci/run (\w+)", r)}
        assert steps, f"{job_id} runs no step of .ci/run"
        assert steps <= known, f"{job_id}: unknown steps {steps - known}"
        assert "install" in steps, f"{job_id} does not install through .ci/run"
        called |= steps
    # every leg that GitHub can run runs somewhere (wheel: wheels.yml; debug, 3.13t, tsan: .ci/run)
    assert {"lint", "docs", "tests", "pure", "slow", "bench", "report", "parallel"} <= called


def test_each_job_installs_only_the_extras_it_uses() -> None:
    heavy = {"docs", "bench"}  # Sphinx, matplotlib and the peers
    for job_id, job in jobs("test.yml").items():
        install = next(s["run"] for s in job["steps"] if "bash .ci/run install" in s.get("run", ""))
        extras = re.search(r"FB_EXTRAS=([\w,]+) ", install)
        assert extras, f"{job_id} installs the default (every) extra"
        named = set(extras.group(1).split(","))
        runs = " ".join(s.get("run", "") for s in job["steps"])
        for extra in heavy & named:
            assert f".ci/run {extra}" in runs, f"{job_id} installs [{extra}] and does not use it"


def test_redis_is_a_service_container_on_linux_only() -> None:
    for name in NAMES:
        for job_id, job in jobs(name).items():
            if "steps" not in job:
                continue
            labels = runners(job)
            env = job.get("env", {})
            if "services" in job:
                assert all(lb.startswith("ubuntu") for lb in labels), f"{job_id}: {labels}"
                assert "redis" in job["services"] and env.get("FB_REDIS_URL"), job_id
                assert env.get("FB_REQUIRE_REDIS"), f"{job_id}: a missing server must fail here"
            else:
                assert not env.get("FB_REQUIRE_REDIS"), job_id


def test_runner_labels_are_current_and_pure_legs_run_on_one_os() -> None:
    for name in NAMES:
        for job_id, job in jobs(name).items():
            if "steps" not in job:
                continue
            labels = runners(job)
            assert not set(labels) & RETIRED, f"{name}/{job_id}: {labels}"
            if job.get("env", {}).get("FASTBREAKER_NO_EXTENSIONS"):
                assert {lb.split("-")[0] for lb in labels} == {"ubuntu"}, job_id
    test = jobs("test.yml")
    oses = {lb.split("-")[0] for job in test.values() for lb in runners(job)}
    assert oses == {"ubuntu", "macos", "windows"}
    pythons = {
        p
        for job in test.values()
        for p in job.get("strategy", {}).get("matrix", {}).get("python", [])
    }
    assert {"3.10", "3.14", "3.14t"} <= pythons


def test_wheels_workflow_builds_from_the_sdist() -> None:
    wf = load("wheels.yml")
    sdist, wheels = wf["jobs"]["sdist"], wf["jobs"]["wheels"]
    assert any("--sdist" in s.get("run", "") for s in sdist["steps"])
    assert any(s.get("uses", "").startswith("actions/upload-artifact@") for s in sdist["steps"])
    assert wheels["needs"] == "sdist"
    # the wheels job has no checkout: it can only build from the downloaded sdist
    assert not any(s.get("uses", "").startswith("actions/checkout@") for s in wheels["steps"])
    cibw = next(s for s in wheels["steps"] if s.get("uses", "").startswith("pypa/cibuildwheel@"))
    assert "sdist" in cibw["with"]["package-dir"]
    labels = runners(wheels)
    for platform in ("ubuntu", "windows", "macos"):
        mine = [lb for lb in labels if lb.startswith(platform)]
        assert len(mine) >= 2, f"{platform}: x86_64 and arm64 runners"
    assert any(lb.endswith("-arm") for lb in labels if lb.startswith(("ubuntu", "windows")))
    assert any(lb.endswith("-intel") for lb in labels if lb.startswith("macos")), "Intel macOS"
    assert "workflow_call" in wf["on"], "release.yml calls it"


def test_release_publishes_only_after_every_test_and_build() -> None:
    wf = load("release.yml")
    assert wf["on"]["push"]["tags"], "runs on a version tag"
    jobs_ = wf["jobs"]
    publish = next(
        (jid, j)
        for jid, j in jobs_.items()
        if any("gh-action-pypi-publish@" in s.get("uses", "") for s in j.get("steps", []))
    )
    job_id, job = publish
    needs = {job["needs"]} if isinstance(job["needs"], str) else set(job["needs"])
    assert needs == set(jobs_) - {job_id}, "gated on every other job"
    called = {j["uses"] for j in jobs_.values() if "uses" in j}
    assert called == {"./.github/workflows/test.yml", "./.github/workflows/wheels.yml"}
    assert "workflow_call" in load("test.yml")["on"]
    assert job["permissions"] == {"id-token": "write"}, "trusted publishing, nothing else"
    publish_step = next(s for s in job["steps"] if "gh-action-pypi-publish@" in s.get("uses", ""))
    assert "password" not in publish_step.get("with", {}), "no stored token"


def cibw_table() -> dict[str, Any]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["cibuildwheel"]


def test_cibuildwheel_table_holds_only_non_default_settings() -> None:
    cibw = pytest.importorskip("cibuildwheel")
    defaults_file = pathlib.Path(cibw.__file__).parent / "resources" / "defaults.toml"
    with open(defaults_file, "rb") as f:
        defaults = tomllib.load(f)["tool"]["cibuildwheel"]
    table = cibw_table()
    for key, value in table.items():
        if isinstance(value, dict):
            continue  # per-platform sub-tables
        assert key in defaults, f"unknown cibuildwheel option {key!r}"
        assert value != defaults[key], f"{key} restates cibuildwheel's default"
    assert table["test-command"] and table["test-sources"]


@pytest.mark.parametrize("platform", ["linux", "windows", "macos"])
def test_cibuildwheel_builds_the_intended_wheels(platform: str) -> None:
    pytest.importorskip("cibuildwheel")
    out = subprocess.run(
        [sys.executable, "-m", "cibuildwheel", "--print-build-identifiers", "--platform", platform],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    ids = out.stdout.split()
    for tag in ("cp310", "cp311", "cp312", "cp313", "cp314", "cp314t"):
        assert any(i.startswith(tag + "-") for i in ids), f"{tag} missing on {platform}: {ids}"
    assert not any(re.search(r"i686|win32", i) for i in ids), ids  # 64-bit only
    assert not any(i.startswith(("pp", "gp")) for i in ids), ids  # CPython only


@pytest.mark.parametrize("script", ["run", "freethreaded.sh", "tsan.sh", "debug.sh", "wheel.sh"])
def test_ci_scripts_parse(script: str) -> None:
    path = ROOT / ".ci" / script
    if not path.exists():
        pytest.skip(f".ci/{script} does not exist")
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    out = subprocess.run([bash, "-n", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    shellcheck = shutil.which("shellcheck")
    if shellcheck is not None and script != "run":
        out = subprocess.run(
            [shellcheck, "-x", "-S", "warning", str(path)],
            capture_output=True,
            text=True,
            cwd=path.parent,
        )
        assert out.returncode == 0, out.stdout
