"""Before the trainer: the job's code put in place, the validator warmed, the prepare
step run, the container image pulled; and the log's word on where training resumes."""

from __future__ import annotations

import functools
import os
import queue
import threading
import time
from typing import TYPE_CHECKING

from respawn import protocol
from respawn.agent import container, dispatch, ending, heartbeat_answers, notice_handling, prepare, registration, shipping, source
from respawn.agent.channel import output_tail
from respawn.agent.supervisor import TrainerProcess
from respawn.agent.validation import Validator

if TYPE_CHECKING:
    from respawn.agent.lifecycle import Agent

PREPARE_DIR = "prepare"  # under the work dir: the prepare step's outputs ($RESPAWN_PREPARE_DIR)
PREPARE_RESULT = "prepare-result.json"  # under the work dir: how the step went (respawn.agent.prepare)
RESUME_VERDICTS = {  # the control plane's word on the resume checkpoint, as the log says it
    protocol.ValidationResult.VALID: "validated",
    protocol.ValidationResult.SKIPPED: "not validated: the job names no validation factories",
    protocol.ValidationResult.PENDING: "not validated yet: it is validated before the trainer loads it",
    protocol.ValidationResult.INVALID: "found invalid: the trainer falls back to an earlier one",
}


def put_source_in_place(agent: Agent) -> protocol.ExitReport | None:
    """The job's code into working_dir (respawn.agent.source), in a thread while this one
    heartbeats (a long download must not look like a lost VM) and handles notices. A
    setup failure saying why when it cannot be done; an exit report when a notice or a
    stop came first."""
    job = agent.state.job
    assert job is not None
    agent.agent_line(f"putting the job's code in place: {source.describe(job)}")
    done: dict[str, str] = {}

    def put() -> None:
        try:
            done["dir"] = source.put_in_place(job, agent.client, agent.config.work_dir, backoff=agent.backoff(),
                                              give_up_s=agent.config.register_timeout_s)
        except source.SourceFailed as exc:
            done["failed"] = str(exc)

    worker = threading.Thread(target=put, name="source", daemon=True)
    worker.start()
    next_heartbeat = time.monotonic()
    while worker.is_alive() and not (agent.state.notice or agent.state.stopped_by_control_plane):
        if time.monotonic() >= next_heartbeat:
            agent.reporter.report(protocol.PATH_HEARTBEAT, heartbeat_answers.heartbeat(agent))
            next_heartbeat = time.monotonic() + agent.state.heartbeat_interval_s
        try:
            dispatch.handle(agent, agent.events.get(timeout=agent.config.tick_s))
        except queue.Empty:
            continue
    if worker.is_alive():  # a notice or a stop came first; the thread dies with the agent
        if agent.state.notice is not None:
            notice_handling.report_outcome(agent)
        return ending.exit_report(agent, None)
    if "dir" not in done:
        return ending.setup_failed(agent, f"setup failed: {done.get('failed', 'the source step ended without a word')}")
    job.working_dir = done["dir"]
    registration.save_session(agent)  # a restarted agent runs the trainer there too
    agent.agent_line(f"the job's code is in {job.working_dir}")
    return None


def run_prepare(agent: Agent, env: dict[str, str]) -> protocol.ExitReport | None:
    """Run the job's prepare step (respawn.agent.prepare) under the same watch as the
    trainer; on success `env` tells the trainer where its outputs are. An exit report
    when the job cannot go on here (the step failed, a notice or a stop came first)."""
    job = agent.state.job
    assert job is not None
    out_dir, result_path = os.path.join(agent.config.work_dir, PREPARE_DIR), os.path.join(agent.config.work_dir, PREPARE_RESULT)
    if os.path.exists(result_path):
        os.remove(result_path)
    env[protocol.ENV_PREPARE_DIR] = out_dir
    command = prepare.runner_command(job, out_dir=out_dir, result=result_path, store=job.rank == 0)
    agent.state.preparing = True
    try:
        agent.state.trainer = TrainerProcess(command, env=env, cwd=None, log_path=agent.log_path)
        agent.state.trainer.start()
        code = agent.watch()
    except OSError as exc:
        return ending.setup_failure(agent, f"could not start the prepare step: {exc}", str(exc))
    finally:
        agent.state.preparing = False
    if agent.state.notice is not None or agent.state.stopped_by_control_plane:
        return ending.exit_report(agent, code)
    result = prepare.read_result(result_path)
    agent.reporter.report(protocol.PATH_PREPARE, protocol.PrepareReport(
        outcome=result.outcome, key=result.key, uri=result.uri, seconds=result.seconds, message=result.message))
    if code != 0:
        shipping.ship_logs(agent, final=True)
        return protocol.ExitReport(reason=protocol.ExitReason.SETUP, exit_code=code, output_tail=output_tail(agent.log_path),
                                   last_exception=f"prepare step failed: {result.message}"[:ending.MAX_EXCEPTION_CHARS])
    env[protocol.ENV_PREPARE_URI] = result.uri
    agent.state.trainer = None
    return None


def container_trainer(agent: Agent, env: dict[str, str]) -> tuple[TrainerProcess, protocol.ExitReport | None]:
    """The trainer in the job's container image (respawn.agent.container), once the image
    is on the VM: pulled under the same watch as the trainer (heartbeats, notices), an
    image that cannot be pulled being the job's setup failure."""
    job = agent.state.job
    runtime = container.find_runtime(env.get("PATH"))
    pull = TrainerProcess(container.pull_argv(runtime, job.container_image), env=env, cwd=None,
                          log_path=agent.log_path)
    agent.state.trainer, agent.state.preparing = pull, True  # nothing to checkpoint while pulling; SIGTERM stops it
    try:
        pull.start()
        code = agent.watch()
    finally:
        agent.state.preparing = False
    if agent.state.notice is not None or agent.state.stopped_by_control_plane:
        return pull, ending.exit_report(agent, code)
    if code != 0:
        shipping.ship_logs(agent, final=True)
        return pull, ending.setup_failure(agent, output_tail(agent.log_path), f"container image {job.container_image} "
                                          f"could not be pulled with {runtime} (exit {code})")
    checkpoints = container.local_dir(job.checkpoint_uri)
    if checkpoints:
        os.makedirs(checkpoints, exist_ok=True)  # a bind mount needs its source
    name = container.container_name(job.instance_id)
    argv = container.run_argv(runtime=runtime, image=job.container_image, name=name, command=job.command,
                              env=env, cwd=job.working_dir or None,
                              mounts=[job.working_dir, agent.config.work_dir, checkpoints])
    return container.ContainerTrainer(argv, runtime=runtime, name=name, env=env, log_path=agent.log_path), None


def start_validator(agent: Agent, env: dict[str, str]) -> None:
    """Warm from now (torch imported, the device's context made) for the first checkpoint,
    which then validates at once: a spare is warm before it is promoted."""
    job, config = agent.state.job, agent.config
    if config.validate and job.validation.enabled and job.validation.model_factory and job.validation.batch_factory:
        agent.state.validator = Validator(command=config.validate_command, serve_command=config.validate_serve_command,
                                          timeout_s=config.validate_timeout_s, spec=job.validation, env=dict(env),
                                          cwd=job.working_dir or None, on_result=functools.partial(shipping.report_validation, agent))


def validate_resume_checkpoint(agent: Agent) -> None:
    """A resume checkpoint not judged yet (a notice save, just committed) checked now, while
    the trainer starts: its recorded verdict spares the trainer the check it would make
    before loading it (respawn.checkpoint.resume)."""
    job = agent.state.job
    if agent.state.validator is not None and job.resume_from and job.resume_validation not in (
            protocol.ValidationResult.VALID, protocol.ValidationResult.INVALID):
        agent.state.validator.submit(protocol.CheckpointReport(checkpoint_id="", step=job.resume_step or 0,
                                                               uri=job.resume_from, bytes=0, manifest_digest=""))


def say_where_it_resumes(agent: Agent) -> None:
    """Whoever reads the log learns where this VM's training picks up and whether
    that checkpoint was found sound."""
    job = agent.state.job
    if not job.resume_from or job.purpose != protocol.Purpose.TRAIN:
        return
    verdict = RESUME_VERDICTS.get(job.resume_validation, job.resume_validation or "validation unknown")
    newer = (" unless the gang's memory tier holds a newer step whole (the trainer's log says which)"
             if agent.state.buddy_store is not None and job.world_size > 1 else "")
    agent.agent_line(f"resumed from step {job.resume_step} (checkpoint {job.resume_from}, {verdict}){newer}")
