"""The job-spec file (`respawn submit job.yaml`): one YAML mapping whose keys are
the job's fields, checked here before anything is sent, with errors that name
the file, the line and the field. docs/job-spec.example.yaml documents it.

Only `team`, `name` and `command` are required; everything else has the
server's default. A command may be written as a list or as one shell-like
string (split with shlex)."""

from __future__ import annotations

import datetime as dt
import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from respawn.vocabulary.names import closest_name
from respawn.vocabulary.spec_text import container_image_problem, env_problem, machine_image_problem, nul_problem

FACTORY_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
CLOUDS = ("aws", "gcp", "azure", "local")


@dataclass(frozen=True)
class Field:
    kind: str  # str, int, number, bool, argv, strings, env, images, container, datetime, factory, team
    required: bool = False
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()


# Every writable field of a job, as the API names them.
FIELDS: dict[str, Field] = {
    "team": Field("team", required=True),
    "name": Field("str", required=True, maximum=200),
    "command": Field("argv", required=True),
    "working_dir": Field("str", maximum=500),
    "machine_image": Field("images"),
    "container_image": Field("container", maximum=300),
    "env": Field("env"),
    "prepare_command": Field("argv"),
    "prepare_inputs": Field("strings"),
    "post_command": Field("argv"),
    "source_archive": Field("str", maximum=71),  # "sha256:<hex>" of an uploaded archive; or --workdir
    "source_git_url": Field("str", maximum=500),
    "source_git_commit": Field("str", maximum=64),
    "nodes": Field("int", minimum=1, maximum=64),
    "nodes_min": Field("int", minimum=1, maximum=64),
    "accelerator": Field("str", maximum=50),
    "accelerator_count": Field("int", minimum=0),
    "instance_types": Field("strings"),
    "allowed_clouds": Field("strings", choices=CLOUDS),
    "allowed_regions": Field("strings"),
    "max_price_per_hour": Field("number", minimum=0),
    "on_demand_after_preemptions": Field("int", minimum=0),
    "spare_on_rebalance": Field("bool"),
    "deadline": Field("datetime"),
    "priority": Field("int", minimum=-100, maximum=100),
    "total_steps": Field("int", minimum=1),
    "checkpoint_uri": Field("str", maximum=500),
    "checkpoint_interval_s": Field("number", minimum=1),
    "checkpoint_every_steps": Field("int", minimum=1),
    "validation_enabled": Field("bool"),
    "validation_model_factory": Field("factory"),
    "validation_batch_factory": Field("factory"),
    "validation_eval_fn": Field("factory"),
    "validation_tolerance": Field("number", minimum=0),
    "max_preemptions": Field("int", minimum=0),
    "max_restarts": Field("int", minimum=0),
}


@dataclass
class JobSpec:
    path: Path
    body: dict  # API field -> JSON value; `team` still as written (a name or an id)
    lines: dict[str, int] = field(default_factory=dict)  # field -> line in the file

    def where(self, name: str) -> str:
        line = self.lines.get(name)
        return f"{self.path}:{line}" if line else str(self.path)


class InvalidSpec(Exception):
    def __init__(self, path: Path, problems: list[str]):
        super().__init__(f"{path}: {len(problems)} problem(s)")
        self.path, self.problems = path, problems


def load_job_spec(path: Path) -> JobSpec:
    """The checked spec, or InvalidSpec listing every problem found (not just the first)."""
    try:
        text = path.read_text()
    except OSError as e:
        raise InvalidSpec(path, [f"{path}: cannot read the file: {e.strerror}"]) from e
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:  # a MarkedYAMLError, or a ReaderError for a character YAML refuses
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise InvalidSpec(path, [f"{where}: not valid YAML: {getattr(e, 'problem', None) or e}"]) from e
    if not isinstance(root, yaml.MappingNode):
        raise InvalidSpec(path, [f"{path}: a job file is a mapping of field: value (see docs/job-spec.example.yaml)"])
    spec, problems = JobSpec(path, {}), []
    for key_node, value_node in root.value:
        name, line = key_node.value, key_node.start_mark.line + 1
        if not isinstance(key_node, yaml.ScalarNode):
            problems.append(f"{path}:{line}: a field name must be plain text, not a list or mapping")
            continue
        if name in spec.lines:
            problems.append(f"{path}:{line}: field '{name}' is given twice (first on line {spec.lines[name]})")
            continue
        spec.lines[name] = line
        if name not in FIELDS:
            close = closest_name(name, FIELDS)
            hint = f"; did you mean '{close}'?" if close else "; see docs/job-spec.example.yaml for the fields"
            problems.append(f"{path}:{line}: unknown field '{name}'{hint}")
            continue
        unquoted = _env_values_not_text(value_node) if name == "env" else []
        if unquoted:
            problems += [f"{path}:{line}: field 'env': {key} must be text; quote it: {key}: \"{raw}\""
                         for line, key, raw in unquoted]
            continue
        try:
            value = yaml.SafeLoader("").construct_document(value_node)
        except yaml.YAMLError as e:  # an unknown tag (!foo), an unhashable key, ...
            problems.append(f"{path}:{line}: field '{name}': cannot be read: {getattr(e, 'problem', None) or e}")
            continue
        try:
            spec.body[name] = check(name, FIELDS[name], value)
        except ValueError as e:
            problems.append(f"{path}:{line}: field '{name}': {e}")
    for name, spec_field in FIELDS.items():
        if spec_field.required and name not in spec.lines:
            problems.append(f"{path}: field '{name}' is required")
    command_refused = "prepare_command" in spec.lines and "prepare_command" not in spec.body  # said above
    if spec.body.get("prepare_inputs") and not spec.body.get("prepare_command") and not command_refused:
        problems.append(f"{spec.where('prepare_inputs')}: field 'prepare_inputs': needs a prepare_command")
    if problems:
        raise InvalidSpec(path, problems)
    return spec


def _env_values_not_text(node) -> list[tuple[int, str, str]]:
    """(line, name, text as written) of env values YAML reads as something else
    than a string, e.g. `DEBUG: yes` (a boolean) or `WORKERS: 8` (a number)."""
    if not isinstance(node, yaml.MappingNode):
        return []
    return [(key.start_mark.line + 1, key.value, value.value) for key, value in node.value
            if isinstance(value, yaml.ScalarNode) and value.tag != "tag:yaml.org,2002:str"]


def check(name: str, spec_field: Field, value):
    """The JSON value to send for one field, or ValueError saying what is wrong."""
    if value is None:
        if spec_field.required:
            raise ValueError("must not be empty")
        return None
    return KIND_CHECKS[spec_field.kind](value, spec_field)


def _str(value, f: Field):
    if not isinstance(value, str):
        raise ValueError(f"must be text, got {_show(value)}")
    if f.maximum is not None and len(value) > f.maximum:
        raise ValueError(f"must be at most {int(f.maximum)} characters, got {len(value)}")
    return value


def _bounded(number, f: Field):
    if f.minimum is not None and number < f.minimum:
        raise ValueError(f"must be at least {f.minimum:g}, got {number}")
    if f.maximum is not None and number > f.maximum:
        raise ValueError(f"must be at most {f.maximum:g}, got {number}")
    return number


def _int(value, f: Field):
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"must be a whole number, got {_show(value)}")
    return _bounded(value, f)


def _number(value, f: Field):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"must be a number, got {_show(value)}")
    if not math.isfinite(value):  # YAML's .nan and .inf
        raise ValueError(f"must be a finite number, got {value}")
    _bounded(value, f)
    return str(value) if isinstance(value, float) else value  # money stays exact as a decimal string


def _bool(value, f: Field):
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, got {_show(value)}")
    return value


def _argv(value, f: Field):
    if isinstance(value, str):
        try:
            value = shlex.split(value)
        except ValueError as e:
            raise ValueError(f"cannot split the command into words: {e}") from e
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError("must be a list of non-empty strings (or one command line as a string); "
                         "quote numbers, e.g. ['python', 'train.py', '--epochs', '3']")
    if f.required and not value:
        raise ValueError("must not be empty")
    return _without_nul(value)


def _strings(value, f: Field):
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"must be a list of non-empty strings, got {_show(value)}")
    unknown = [v for v in value if f.choices and v not in f.choices]
    if unknown:
        raise ValueError(f"unknown {', '.join(unknown)}; choose from {', '.join(f.choices)}")
    return _without_nul(value)


def _without_nul(words: list[str]) -> list[str]:
    problem = nul_problem(words)
    if problem:
        raise ValueError(problem)
    return words


def _env(value, f: Field):
    if not isinstance(value, dict):
        raise ValueError(f"must be a mapping of NAME: value, got {_show(value)}")
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise ValueError(f"{key}: values must be strings; quote it, e.g. {key}: \"{item}\"")
    problem = env_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def _images(value, f: Field):
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ValueError(f"must be a mapping of cloud: image, e.g. aws: ami-0123456789abcdef0, got {_show(value)}")
    problem = machine_image_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def _container(value, f: Field):
    problem = container_image_problem(_str(value, f))
    if problem:
        raise ValueError(problem)
    return value


def _datetime(value, f: Field):
    if isinstance(value, dt.datetime):
        moment = value
    elif isinstance(value, str):
        try:
            moment = dt.datetime.fromisoformat(value)
        except ValueError as e:
            raise ValueError(f"must be a date and time like 2026-12-01T18:00:00Z, got {value!r}") from e
    else:
        raise ValueError(f"must be a date and time like 2026-12-01T18:00:00Z, got {_show(value)}")
    if moment.tzinfo is None:
        raise ValueError("needs a time zone, e.g. 2026-12-01T18:00:00Z or +02:00")
    return moment.isoformat()


def _factory(value, f: Field):
    if not isinstance(value, str) or not FACTORY_RE.match(value):
        raise ValueError(f"must look like 'package.module:function', got {_show(value)}")
    return value


def _team(value, f: Field):
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        raise ValueError(f"must be a team name or id, got {_show(value)}")
    return value


KIND_CHECKS = {
    "str": _str, "int": _int, "number": _number, "bool": _bool, "argv": _argv, "strings": _strings,
    "env": _env, "images": _images, "container": _container, "datetime": _datetime, "factory": _factory,
    "team": _team,
}


def _show(value) -> str:
    kind = {bool: "true/false", int: "a number", float: "a number", str: "text", list: "a list", dict: "a mapping"}
    return f"{kind.get(type(value), type(value).__name__)} ({value!r})"
