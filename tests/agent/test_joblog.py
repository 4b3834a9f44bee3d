"""The agent's own lines in the job's output: marked as the agent's, what it says and
what it logs, a warning named as one, and a message it repeats at every retry once."""

import logging

from respawn.agent.joblog import JobLog


def test_the_agents_lines_are_marked_and_a_repeated_retry_is_shipped_once(tmp_path):
    path = tmp_path / "trainer.log"
    path.write_text("the trainer's own line\n")
    log = logging.getLogger("respawn.agent.somewhere")
    with JobLog(str(path)) as job_log:
        job_log.say(log, "resumed from step 100")
        log.info("trainer started, pid %d", 42)
        for attempt in range(5):
            log.info("metadata service unreachable (%s); retrying", f"attempt {attempt}")
        log.warning("the save took %d s", 90)
        logging.getLogger("elsewhere").warning("not the agent's")
    log.info("after the agent's run")
    lines = path.read_text().splitlines()
    assert lines[0] == "the trainer's own line"
    assert all(line.startswith("[respawn-agent] ") for line in lines[1:])
    assert [line.split(" ", 2)[2] for line in lines[1:]] == [
        "resumed from step 100", "trainer started, pid 42", "metadata service unreachable (attempt 0); retrying",
        "warning: the save took 90 s"]
