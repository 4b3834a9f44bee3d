"""What a job went through, as the control plane and its VMs recorded it: the text
a whole-system test prints when it times out, so a failure seen once in CI can be
understood without rerunning it."""

from respawn_server.jobs.models import Checkpoint, Instance, Job, JobEvent


def job_story(job_id: int, local_vms=None, log_tail_chars: int = 1500) -> str:
    """`local_vms`: the LocalProvider whose VMs' agent logs to include."""
    job = Job.objects.get(pk=job_id)
    lines = [f"job {job.pk}: {job.status} ({job.status_reason or 'no reason'}), step {job.last_step}, "
             f"preemptions {job.preemptions}, failure restarts {job.failure_restarts}"]
    lines += [f"  {e.created_at:%H:%M:%S.%f} job {e.from_status or '-'} -> {e.to_status or '-'}: {e.message}"
              for e in JobEvent.objects.filter(job_id=job_id)]
    lines += [f"  checkpoint {c.pk} step {c.step} {c.kind} by instance {c.instance_id}, committed "
              f"{c.committed_at:%H:%M:%S.%f}, {c.validation}" for c in Checkpoint.objects.filter(job_id=job_id)]
    for instance in Instance.objects.filter(job_id=job_id).order_by("pk").prefetch_related("events"):
        lines.append(f"instance {instance.pk} rank {instance.rank} {instance.provider_instance_id or '(no VM)'}: "
                     f"{instance.state} {instance.end_reason or ''} rendezvous {instance.rendezvous_addr or '-'} "
                     f"step {instance.last_step}, resumed from checkpoint {instance.resume_checkpoint_id}, "
                     f"heartbeat deadline {instance.heartbeat_deadline}")
        lines += [f"  {e.created_at:%H:%M:%S.%f} {e.from_state} -> {e.to_state}: {e.message}"
                  for e in instance.events.all()]
        if local_vms is not None and instance.provider_instance_id:
            vm = local_vms.vm_dir(instance.provider_instance_id)
            for log in (vm.supervisor_log, vm.agent_log):
                if log.exists():
                    lines.append(f"  {log.name} tail:\n{log.read_text(errors='replace')[-log_tail_chars:]}")
    return "\n".join(lines)
