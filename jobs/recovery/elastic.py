"""An elastic gang that loses a node goes on with the rest (docs/elastic.md): the
regroup, and a node's word that its trainer exited."""

from __future__ import annotations

from django.db import transaction
from django.db.models import F, Max
from django.db.models.functions import Greatest
from django.utils import timezone

from respawn.protocol import Action
from respawn_server.jobs.core import nudges
from respawn_server.jobs.core.choices import InstanceState, JobStatus
from respawn_server.jobs.core.services import usable_checkpoint
from respawn_server.jobs.core.transitions import log_job_event
from respawn_server.jobs.models import Instance, InterruptionEvent, Job, JobEvent, StepPoint, WorldSize, resume_step_of
from respawn_server.jobs.recovery.counting import counts_as_preemption
from respawn_server.jobs.recovery.gangs import (GANG_PORT, free_local_address, running_once_all_registered,
                                                training_nodes)


def go_on_with_survivors(job: Job, end_reason: str, instance_id: int | None) -> bool:
    """A node of an elastic gang was lost (preempted, lost, or refused for capacity
    while the gang was placed): with at least nodes_min nodes left, they go on without
    it (regroup), and no gang is relaunched. Whether they did."""
    if not job.elastic or job.status not in (JobStatus.RUNNING, JobStatus.PROVISIONING):
        return False
    survivors = list(training_nodes(job.pk).select_related("resume_checkpoint").order_by("rank"))
    what = f"instance {instance_id} {end_reason}" if instance_id is not None else f"a node {end_reason}"
    if len(survivors) < job.nodes_min:
        log_job_event(job.pk, f"{what}: {len(survivors)} node(s) left, fewer than the {job.nodes_min} the job "
                              "trains on at least; the gang is relaunched whole")
        return False
    regroup(job, survivors, f"{what}: the gang goes on with {len(survivors)} of {job.nodes} nodes", after=instance_id)
    if counts_as_preemption(end_reason, instance_id):
        # The job's row last, after the instances': the order a heartbeat locks them in.
        Job.objects.filter(pk=job.pk).update(preemptions=F("preemptions") + 1)
    return True


def regroup(job: Job, nodes: list[Instance], why: str, *, after: int | None = None) -> None:
    """Make `nodes` (in rank order) the job's gang: ranks 0..n-1 of world size n, a fresh
    rendezvous, the newest usable checkpoint to resume from (resharded by the trainer's
    checkpointer), and a new generation, which their heartbeat answers carry: each agent
    then restarts its trainer (respawn.agent.lifecycle). A node not yet registered learns
    it all from its register answer. Ranks only move down, so taking the rows in rank
    order keeps one live instance per slot at every statement, and the job's row is
    written only after them (a survivor's heartbeat locks its instance, then the job:
    the other order deadlocks with it). Each node's run until now
    is kept in its earlier_runs, for the money (the work each run kept); `after`: the
    instance whose loss caused it."""
    resume = usable_checkpoint(job)
    now = timezone.now()
    generation = max(node.gang_generation for node in nodes) + 1
    first = nodes[0]
    if first.provider == "local":
        addr = free_local_address()
    else:  # rank 0's host, known once it registered (register_instance sets it then)
        addr = f"{first.hostname}:{GANG_PORT}" if first.hostname else ""
    for rank, node in enumerate(nodes):
        from_storage = node.resume_checkpoint if node.memory_resume_step is None else None
        ran = {"rank": node.rank, "resume_step": resume_step_of(node) or 0, "last_step": node.last_step,
               "resume_from": from_storage.instance_id if from_storage else None,
               "kept_until": resume.step if resume else 0, "until": now.isoformat(), "regroup": generation}
        Instance.objects.filter(pk=node.pk).update(
            rank=rank, world_size=len(nodes), rendezvous_addr=addr, gang_generation=generation,
            trainer_exited_at=None, resume_checkpoint=resume, memory_resume_step=None,
            last_step=resume.step if resume else 0, joining=False,
            earlier_runs=[*node.earlier_runs, ran] if node.registered_at and not node.joining else [])
    # A checkpoint asked of a trainer that now restarts is void (a joiner's readiness asks one).
    Instance.objects.filter(pk__in=[node.pk for node in nodes], requested_action=Action.CHECKPOINT).update(
        requested_action="")
    WorldSize.objects.create(job=job, at=now, world_size=len(nodes), reason=why, after_instance_id=after,
                             resume_checkpoint=resume, gang_generation=generation)
    log_job_event(job.pk, f"{why}, from " + (f"step {resume.step}" if resume else "the start")
                  + f" (elastic gang, generation {generation})")
    running_once_all_registered(Job.objects.get(pk=job.pk))


def resumed_from_memory(instance: Instance, *, step: int, generation: int) -> None:
    """A node's trainer says (a heartbeat's memory_resume_step) that its gang, regrouped,
    resumed at `step` from the memory tier, newer than the checkpoint the regroup named:
    the regroup, its nodes' runs now and their runs before it are recorded as going on
    from that step, so the money counts the work kept up to it. The first node of the
    generation to tell is recorded (every node resumed at the one step, or none did); it
    is believed only between that checkpoint and the furthest step the gang was seen to
    reach before the regroup (its heartbeats and reported steps): nothing a VM says
    counts for more than the control plane saw."""
    # Generations count again from a gang relaunched whole: the regroup is the newest of this
    # generation, and one this node was in (it happened after the node registered).
    regroup = WorldSize.objects.filter(job_id=instance.job_id, gang_generation=generation, after_instance__isnull=False,
                                       at__gte=instance.registered_at).select_related("resume_checkpoint") \
        .order_by("-at", "-id").first() if instance.registered_at else None
    if regroup is None or regroup.memory_resume_step is not None or instance.gang_generation != generation:
        return  # recorded already, no regroup's, or about a gang this node is no longer in
    nodes = list(Instance.objects.filter(job_id=instance.job_id, gang_generation=generation, state__in=InstanceState.LIVE))
    before = {node.pk: node.earlier_runs[-1] for node in nodes
              if node.earlier_runs and node.earlier_runs[-1].get("regroup") == generation}
    reached = max([run["last_step"] for run in before.values()] + [StepPoint.objects.filter(
        job_id=instance.job_id, time__lte=regroup.at).aggregate(top=Max("step"))["top"] or 0])
    named = regroup.resume_checkpoint.step if regroup.resume_checkpoint else 0
    if not memory_claim_believed(instance.job_id, f"instance {instance.pk} says its gang resumed at step {step} from "
                                 "the memory tier", step, named, reached, "the gang"):
        return
    with transaction.atomic():
        if not WorldSize.objects.filter(pk=regroup.pk, memory_resume_step__isnull=True).update(memory_resume_step=step):
            return  # another node told first
        for node in nodes:
            runs = node.earlier_runs
            if node.pk in before:
                runs = [*runs[:-1], {**before[node.pk], "kept_until": step}]
            Instance.objects.filter(pk=node.pk, gang_generation=generation).update(memory_resume_step=step,
                                                                                  earlier_runs=runs)
        corrected = kept_in_memory(regroup.after_instance_id, step - named)
    log_job_event(instance.job_id, f"the gang (generation {generation}) resumed at step {step} from the memory tier, "
                                   f"{step - named} step(s) newer than the checkpoint in storage (step {named}){corrected}")


def memory_claim_believed(job_id: int, claim: str, step: int, named: int, reached: int, who: str) -> bool:
    """Whether a VM's word that training went on from `step` in the memory tier holds: past
    `named`, the checkpoint in storage, and no further than `reached`, the furthest step
    `who` was seen to reach. Nothing a VM says counts for more than the control plane saw;
    a claim that does not hold is logged once (heartbeats repeat it)."""
    if named < step <= reached:
        return True
    if not JobEvent.objects.filter(job_id=job_id, message__startswith=claim).exists():
        log_job_event(job_id, f"{claim}, not between the checkpoint in storage (step {named}) and the furthest step "
                              f"{who} was seen to reach ({reached}): not believed; its work counts to step {named}")
    return False


def kept_in_memory(instance_id: int | None, kept: int) -> str:
    """The interruption of `instance_id` (the VM lost or noticed) lost `kept` steps fewer
    than counted when it ended, against the checkpoint in storage: the memory tier kept them.
    Returns the words that correct the job's events, which said at the end that those steps
    would be trained again ('' when nothing was counted)."""
    counted = InterruptionEvent.objects.filter(instance_id=instance_id, steps_lost__isnull=False)
    before = counted.aggregate(top=Max("steps_lost"))["top"]
    if not before or kept <= 0:
        return ""  # nothing was said lost: nothing to correct
    counted.update(steps_lost=Greatest(F("steps_lost") - kept, 0))
    return (f"; instance {instance_id}'s interruption now counts {max(before - kept, 0)} step(s) lost, not the {before} "
            "said when it ended: the rest are kept, not trained again")


def trainer_exited(instance: Instance, *, exit_code: int, generation: int) -> None:
    """An elastic gang's node says its trainer exited (a heartbeat's trainer_exit_code)
    and waits for the gang's word. Said about the gang it trains in now, the first time
    only, a worker asks the cloud about its peers (respawn_server.jobs.fleet.reconciler.check_elastic_gang);
    a word about an older generation is a node that has not yet seen the regroup, and
    one from a job that is not elastic is no word at all."""
    if Instance.objects.filter(pk=instance.pk, state__in=InstanceState.LIVE, gang_generation=generation,
                               job__nodes_min__lt=F("job__nodes"), trainer_exited_at__isnull=True).update(
            trainer_exited_at=timezone.now()):
        log_job_event(instance.job_id, f"instance {instance.pk}: its trainer exited (code {exit_code}); the gang's "
                                       "peers are put to the cloud before the code is blamed")
        nudges.send_on_commit(nudges.CHECK_ELASTIC_GANG, instance.job_id)
