"""The job's code on the VM (DESIGN §11), put in place before the prepare step and training:

    archive: GET source ──► its SHA-256 the one the job spec pins? ──► unpack (respawn.sourcetree)
    git:     git init; fetch URL COMMIT ──► checkout --detach COMMIT ──► HEAD is COMMIT?
             ──► either, built in a scratch directory beside working_dir, renamed onto it

working_dir must be missing or empty; a job with no working_dir gets `<work dir>/source`.
A failure is the job's setup failure with its reason (SourceFailed), and final: a digest
that does not match, or an archive that does not unpack, will not on the next VM either.
Only an unreachable control plane is asked again, until `give_up_s`. An agent restarted
on the same VM finds what it put in place in `source.json` and does not fetch it again."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time

from respawn import protocol
from respawn.agent.client import DELIVERED, REFUSED, ControlPlaneClient
from respawn.agent.reporter import Backoff
from respawn.sourcetree import BadArchive, unpack

MARKER = "source.json"  # under the agent's work dir
ARCHIVE = "source.tar.gz"  # under the agent's work dir, while it is checked and unpacked
GIT_TIMEOUT_S = 1800.0  # one git command; a big repository over a slow link takes minutes
# Transports git may use for the job's URL (and its submodules): never ext::, which runs a command.
GIT_PROTOCOLS = "https:http:ssh:git:file"


class SourceFailed(Exception):
    """The job's code cannot be put in place; the message is the reason the job page shows."""


def wanted(job: protocol.JobSpec) -> bool:
    return bool(job.source_sha256 or job.source_git_url)


def describe(job: protocol.JobSpec) -> str:
    if job.source_sha256:
        return f"source archive sha256:{job.source_sha256}"
    return f"git commit {job.source_git_commit} of {job.source_git_url}"


def put_in_place(job: protocol.JobSpec, client: ControlPlaneClient, work_dir: str, *, give_up_s: float,
                 backoff: Backoff) -> str:
    """The directory now holding the job's code (SourceFailed when it cannot)."""
    target = os.path.abspath(job.working_dir or os.path.join(work_dir, "source"))
    marker = os.path.join(work_dir, MARKER)
    if _done(marker, describe(job), target):
        return target
    try:
        _must_be_free(target)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        scratch = tempfile.mkdtemp(prefix=".respawn-source-", dir=os.path.dirname(target))
        try:
            tree = os.path.join(scratch, "tree")
            if job.source_sha256:
                archive = os.path.join(work_dir, ARCHIVE)
                try:
                    _fetch(client, job.source_sha256, archive, give_up_s=give_up_s, backoff=backoff)
                    unpack(archive, tree, max_unpacked_bytes=job.source_max_unpacked_bytes)
                except BadArchive as exc:
                    raise SourceFailed(f"the source archive sha256:{job.source_sha256} cannot be unpacked: {exc}") from None
                finally:
                    if os.path.exists(archive):
                        os.remove(archive)
            else:
                _checkout(job.source_git_url, job.source_git_commit, tree)
            os.rename(tree, target)  # onto a missing or empty directory: whole, or not there
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        with open(marker, "w") as f:
            json.dump({"source": describe(job), "dir": target}, f)
    except OSError as exc:
        raise SourceFailed(f"could not put the job's code into {target}: {exc}") from None
    return target


def _done(marker: str, source: str, target: str) -> bool:
    try:
        with open(marker) as f:
            return json.load(f) == {"source": source, "dir": target} and os.path.isdir(target)
    except (OSError, ValueError):
        return False


def _must_be_free(target: str) -> None:
    if os.path.lexists(target) and not (os.path.isdir(target) and not os.path.islink(target) and not os.listdir(target)):
        raise SourceFailed(f"working_dir {target} already exists and is not an empty directory: the job's code is "
                           "put only into a missing or empty one (leave working_dir empty to use the agent's)")


def _fetch(client: ControlPlaneClient, sha256: str, dest: str, *, give_up_s: float, backoff: Backoff) -> None:
    give_up = time.monotonic() + give_up_s
    while True:
        outcome, got = client.download(protocol.PATH_SOURCE, dest)
        if outcome.kind == DELIVERED:
            if got != sha256:
                raise SourceFailed(f"source archive digest mismatch: the job pins sha256:{sha256}, the control plane "
                                   f"served sha256:{got} ({outcome.detail}); not unpacked")
            return
        if outcome.kind == REFUSED:
            raise SourceFailed(f"the control plane refused the source archive (HTTP {outcome.status}): "
                               f"{outcome.detail[:300]}")
        if time.monotonic() >= give_up:
            raise SourceFailed(f"could not fetch the source archive within {give_up_s:g}s: {outcome.detail[:300]}")
        time.sleep(backoff.next_wait())


def _checkout(url: str, commit: str, tree: str) -> None:
    _git("init", "init", "-q", tree)
    try:
        _git("fetch", "-C", tree, "fetch", "-q", "--depth=1", "--", url, commit)
    except SourceFailed:
        # Servers that serve only branch and tag tips: the whole repository, then the commit in it.
        _git("fetch", "-C", tree, "fetch", "-q", "--", url, "+refs/heads/*:refs/remotes/origin/*",
             "+refs/tags/*:refs/tags/*")
    _git("checkout", "-C", tree, "-c", "advice.detachedHead=false", "checkout", "-q", "--detach", commit)
    head = _git("rev-parse", "-C", tree, "rev-parse", "HEAD").strip()
    if head != commit:
        raise SourceFailed(f"git checked out {head}, not the job's commit {commit}")


def _git(what: str, *args: str) -> str:
    """git's output, or SourceFailed naming the step `what` with the last line git said."""
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ALLOW_PROTOCOL": GIT_PROTOCOLS}
    try:
        done = subprocess.run(["git", *args], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S)
    except FileNotFoundError:
        raise SourceFailed("git is not installed on this VM: a job whose code is a git commit needs it in the "
                           "machine image") from None
    except subprocess.TimeoutExpired:
        raise SourceFailed(f"git {what} took longer than {GIT_TIMEOUT_S:g}s") from None
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
        raise SourceFailed(f"git {what} failed (exit {done.returncode}): {said[:300]}")
    return done.stdout
