"""The CI definitions: GitHub workflows, cibuildwheel settings and the CI shell scripts.

actionlint cannot be installed here (its wheel downloads a binary), so this is the check that can
run offline: the YAML parses, it validates against the GitHub workflow schema when
check-jsonschema is installed, the jobs and matrices are the intended ones, every
``${{ matrix.x }}`` names a matrix key, actions are pinned by commit SHA with the version in a
comment, the workflows run the steps of ``.ci/run``, cibuildwheel lists the intended builds
and its table holds only non-default settings, and the CI scripts parse.
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
PYTHONS = ["3.10", "3.11", "3.12", "3.13", "3.14", "3.14t"]

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


@pytest.mark.parametrize("name", ["test.yml", "wheels.yml"])
def test_workflow_is_well_formed(name: str) -> None:
    wf = load(name)
    assert wf["name"] and wf["on"] and wf["jobs"]
    for job_id, job in wf["jobs"].items():
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", job_id), job_id
        assert "runs-on" in job and job.get("steps"), job_id
        for need in [job["needs"]] if isinstance(job.get("needs"), str) else job.get("needs", []):
            assert need in wf["jobs"], f"{job_id} needs unknown job {need}"
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


@pytest.mark.parametrize("name", ["test.yml", "wheels.yml"])
def test_pinned_actions_name_their_version(name: str) -> None:
    lines = [
        ln for ln in (WORKFLOWS / name).read_text(encoding="utf-8").splitlines() if "uses:" in ln
    ]
    assert lines
    for line in lines:
        assert re.search(r"uses: \S+@[0-9a-f]{40}  # v\d+\.\d+\.\d+$", line), line


@pytest.mark.parametrize("name", ["test.yml", "wheels.yml"])
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


def test_test_workflow_covers_the_matrix() -> None:
    wf = load("test.yml")
    (job,) = wf["jobs"].values()
    matrix = job["strategy"]["matrix"]
    assert {os.split("-")[0] for os in matrix["os"]} == {"ubuntu", "macos", "windows"}
    assert matrix["python"] == PYTHONS
    assert sorted(matrix["core"]) == ["compiled", "pure"]
    assert job["strategy"]["fail-fast"] is False
    # the pure leg really is pure: the env var that the build and the selector read
    assert "matrix.core == 'pure'" in job["env"]["FASTBREAKER_NO_EXTENSIONS"]
    runs = [step.get("run", "") for step in job["steps"]]
    # the workflow runs the steps of .ci/run, the one entry point
    for step in ("install", "lint", "tests", "bench", "report"):
        assert any(f"bash .ci/run {step}" in r for r in runs), step
    lint = next(s for s in job["steps"] if "bash .ci/run lint" in s.get("run", ""))
    assert "matrix.core == 'compiled'" in lint["if"]  # stubtest needs the compiled modules
    parallel = [s for s in job["steps"] if "--parallel-threads" in s.get("run", "")]
    assert parallel and "endsWith(matrix.python, 't')" in parallel[0]["if"]
    assert any("_is_gil_enabled" in r for r in runs)
    setup = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/setup-python@"))
    assert setup["with"]["python-version"] == "${{ matrix.python }}"


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
    oses = wheels["strategy"]["matrix"]["os"]
    for platform in ("ubuntu", "windows", "macos"):
        assert sum(o.startswith(platform) for o in oses) >= 2, (
            f"{platform}: x86_64 and arm64 runners"
        )
    assert "tags" in wf["on"]["push"]


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


@pytest.mark.parametrize("script", ["run", "freethreaded.sh", "tsan.sh", "debug.sh"])
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
