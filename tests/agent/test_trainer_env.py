"""The environment the trainer starts with: the channel contract, the gang, no agent secrets."""

from __future__ import annotations

import pytest

from respawn import protocol
from respawn.agent.supervisor import trainer_env


def test_the_trainer_gets_the_channel_and_gang_variables_but_not_the_bootstrap_token():
    job = protocol.JobSpec(
        job_id=1, instance_id=2, command=["python", "train.py"], env={"WANDB_MODE": "offline"}, checkpoint_uri="s3://b/job-1",
        resume_from="s3://b/job-1/step-00000100", checkpoint_interval_s=120.0, total_steps=1000, rank=1, world_size=2, rendezvous_addr="10.0.0.5:29500",
        validation=protocol.ValidationSpec(model_factory="m:model", batch_factory="m:batch"),
    )
    env = trainer_env(job, {protocol.ENV_STATUS_FILE: "/w/status.json"}, base={"PATH": "/bin", "RESPAWN_BOOTSTRAP_TOKEN": "secret", protocol.ENV_RESUME_FROM: "stale"})
    assert "RESPAWN_BOOTSTRAP_TOKEN" not in env
    assert env["WANDB_MODE"] == "offline" and env[protocol.ENV_STATUS_FILE] == "/w/status.json"
    assert env[protocol.ENV_RESUME_FROM] == "s3://b/job-1/step-00000100"
    assert (env["RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"], env["MASTER_PORT"]) == ("1", "2", "10.0.0.5", "29500")
    # ...and torchrun's defaults for its flags: a plain `torchrun --nproc-per-node N` joins the gang.
    assert (env["PET_NODE_RANK"], env["PET_NNODES"], env["PET_MASTER_ADDR"], env["PET_MASTER_PORT"]) == \
        ("1", "2", "10.0.0.5", "29500")
    assert (env[protocol.ENV_CHECKPOINT_INTERVAL_S], env[protocol.ENV_TOTAL_STEPS], env[protocol.ENV_VALIDATION_MODEL_FACTORY]) == ("120.0", "1000", "m:model")


def test_no_resume_point_means_none_is_inherited():
    job = protocol.JobSpec(job_id=1, instance_id=2, command=["x"])
    assert protocol.ENV_RESUME_FROM not in trainer_env(job, {}, base={protocol.ENV_RESUME_FROM: "stale"})


def test_a_malformed_rendezvous_address_is_named():
    job = protocol.JobSpec(job_id=1, instance_id=2, command=["x"], world_size=2, rendezvous_addr="10.0.0.5")
    with pytest.raises(ValueError, match="'10.0.0.5' must look like 'host:port'"):
        trainer_env(job, {}, base={})
