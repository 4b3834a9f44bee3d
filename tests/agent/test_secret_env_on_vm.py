"""A job's secret env on the VM (issue 17 item 5): the trainer gets it like env, and
the agent's refusal of a malformed one names the variables, never a value."""

from __future__ import annotations

import pytest

from respawn import protocol
from respawn.agent.jobspec import check_job_spec
from respawn.agent.supervisor import trainer_env


def test_the_trainer_gets_the_secret_env_beside_the_env():
    job = protocol.JobSpec(job_id=1, instance_id=2, command=["python", "train.py"], env={"BATCH": "8"},
                           secret_env={"HF_TOKEN": "hf_value"})
    env = trainer_env(job, {}, base={"PATH": "/bin"})
    assert (env["BATCH"], env["HF_TOKEN"]) == ("8", "hf_value")


def test_a_malformed_secret_env_is_refused_naming_the_variable_not_its_value():
    job = protocol.JobSpec(job_id=1, instance_id=2, command=["x"], secret_env={"HF_TOKEN": 123456789})
    with pytest.raises(ValueError, match=r"job.secret_env must map strings to strings, got names \['HF_TOKEN'\]") as caught:
        check_job_spec(job)
    assert "123456789" not in str(caught.value)
