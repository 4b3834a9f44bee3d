"""The job-spec file: every job field is documented and checkable, and bad files
are refused with the line and the field named, before anything is sent."""

from pathlib import Path

import pytest
import yaml

from respawn_server.jobs.api.serializers import JobSerializer
from respawn.cli.jobspec import FIELDS, InvalidSpec, load_job_spec

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "job-spec.example.yaml"


def writable_job_fields() -> set[str]:
    return {name for name, f in JobSerializer().fields.items() if not f.read_only}


def test_the_spec_and_the_documented_example_cover_every_job_field():
    # Secret values come by `--secret` / `--secret-from-env`, never from a file one commits.
    assert set(FIELDS) == writable_job_fields() - {"secret_env"}
    assert set(yaml.safe_load(EXAMPLE.read_text())) == set(FIELDS)
    assert load_job_spec(EXAMPLE).body["team"] == "vision"


def write(tmp_path, text) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


def problems_of(path) -> list[str]:
    with pytest.raises(InvalidSpec) as refused:
        load_job_spec(path)
    return refused.value.problems


def test_every_problem_is_reported_with_its_line(tmp_path):
    path = write(tmp_path, "team: vision\nname: x\ncommand: python t.py\nnodes: 0\npriorty: 3\n"
                           "validation_model_factory: not a factory\n")
    assert problems_of(path) == [
        f"{path}:4: field 'nodes': must be at least 1, got 0",
        f"{path}:5: unknown field 'priorty'; did you mean 'priority'?",
        f"{path}:6: field 'validation_model_factory': must look like 'package.module:function', got text "
        "('not a factory')",
    ]


def test_missing_required_fields_are_named(tmp_path):
    assert problems_of(write(tmp_path, "name: x\n")) == [
        f"{tmp_path / 'job.yaml'}: field 'team' is required",
        f"{tmp_path / 'job.yaml'}: field 'command' is required",
    ]


def test_values_yaml_would_misread_are_caught(tmp_path):
    path = write(tmp_path, "team: vision\nname: x\ncommand: [python, t.py, --epochs, 3]\nenv:\n  DEBUG: yes\n"
                           "validation_enabled: maybe\n")
    problems = problems_of(path)
    assert problems[0].startswith(f"{path}:3: field 'command': must be a list of non-empty strings")
    assert problems[1] == f"{path}:5: field 'env': DEBUG must be text; quote it: DEBUG: \"yes\""
    assert problems[2] == f"{path}:6: field 'validation_enabled': must be true or false, got text ('maybe')"


def test_broken_yaml_points_at_the_spot(tmp_path):
    (problem,) = problems_of(write(tmp_path, "team: vision\ncommand: [python\n"))
    assert problem.startswith(f"{tmp_path / 'job.yaml'}:3:") and "not valid YAML" in problem


def test_a_command_line_string_is_split_like_a_shell(tmp_path):
    spec = load_job_spec(write(tmp_path, "team: 3\nname: x\ncommand: python train.py --name 'my run'\n"))
    assert spec.body == {"team": 3, "name": "x", "command": ["python", "train.py", "--name", "my run"]}
