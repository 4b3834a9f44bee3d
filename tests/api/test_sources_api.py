"""Source archives on the people's API (ask, upload) and the agent API (`GET source`), and a
job naming its code: one of its team's archives, or a git URL and commit."""

import hashlib
import tracemalloc

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from respawn import protocol
from respawn_server.jobs.models import Job, SourceArchive
from respawn.cli import workdir
from tests.agent.archives import header_bomb, hostile_tar, user_workdir
from tests.agent_api.helpers import AgentClient
from tests.api.clients import client_for
from tests.factories import make_instance, make_job, make_team_with_members

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def setup(db, settings, tmp_path):
    settings.RESPAWN = {**settings.RESPAWN, "SOURCE_DIR": str(tmp_path / "sources"), "SOURCE_MAX_BYTES": 100_000}
    return make_team_with_members()


@pytest.fixture
def archive(tmp_path):
    return workdir.build(user_workdir(tmp_path / "w"), 100_000)


def put(client, digest: str, body: bytes, team, **headers):
    return client.put(f"/api/v1/sources/{digest}/?team={team}", body, content_type="application/gzip", **headers)


def stored_files(tmp_path) -> list:
    return sorted((tmp_path / "sources" / "sha256").rglob("*.tar.gz"))


def test_an_upload_is_asked_for_stored_once_and_reused_by_every_team_that_sends_it(setup, archive, tmp_path):
    member, outsider = client_for(setup.people["member"]), client_for(setup.people["outsider"])
    asked = member.get(f"/api/v1/sources/{archive.digest}/?team={setup.team.pk}").json()
    assert asked == {"digest": archive.digest, "stored": False, "bytes": None, "files": None, "unpacked_bytes": None,
                     "max_bytes": 100_000}
    body = archive.path.read_bytes()
    first = put(member, archive.digest, body, setup.team.pk)
    assert first.status_code == 201, first.content
    assert first.json() | {"max_bytes": 0} == {"digest": archive.digest, "stored": True, "bytes": len(body),
                                               "files": 4, "unpacked_bytes": archive.unpacked_bytes, "max_bytes": 0}
    assert put(member, archive.digest, b"", setup.team.pk).status_code == 200  # had it: the body is not read
    # Another team holds it only once it has sent the bytes itself, which land in the same file.
    assert outsider.get(f"/api/v1/sources/{archive.digest}/?team={setup.other_team.pk}").json()["stored"] is False
    assert put(outsider, archive.digest, body, setup.other_team.pk).status_code == 201
    assert SourceArchive.objects.filter(sha256=archive.sha256).count() == 2
    assert [p.name for p in stored_files(tmp_path)] == [f"{archive.sha256}.tar.gz"]
    assert stored_files(tmp_path)[0].read_bytes() == body


def test_an_upload_whose_bytes_are_not_its_digest_or_not_a_safe_archive_is_refused_naming_why(setup, archive, tmp_path):
    member = client_for(setup.people["member"])
    other = "sha256:" + hashlib.sha256(b"something else").hexdigest()
    refused = put(member, other, archive.path.read_bytes(), setup.team.pk)
    assert refused.status_code == 400 and "the body's SHA-256 is" in refused.json()["errors"]["digest"][0]
    evil = tmp_path / "evil.tar.gz"
    sha256 = hostile_tar(evil, ("train.py", "file", b"print(1)"), ("../../home/.bashrc", "file", b"curl x | sh"))
    refused = put(member, f"sha256:{sha256}", evil.read_bytes(), setup.team.pk)
    assert refused.status_code == 400 and "'..'" in refused.json()["errors"]["archive"][0]
    junk = b"not an archive at all"
    refused = put(member, "sha256:" + hashlib.sha256(junk).hexdigest(), junk, setup.team.pk)
    assert refused.status_code == 400 and "not a gzip'd tar" in refused.json()["errors"]["archive"][0]
    assert not SourceArchive.objects.exists() and stored_files(tmp_path) == []


def test_an_upload_over_the_limit_is_refused_before_it_is_read(setup, settings, archive, tmp_path):
    settings.RESPAWN = {**settings.RESPAWN, "SOURCE_MAX_BYTES": archive.bytes - 1}
    refused = put(client_for(setup.people["member"]), archive.digest, archive.path.read_bytes(), setup.team.pk)
    assert refused.status_code == 413 and f"over this control plane's limit of {archive.bytes - 1}" in refused.json()["detail"]
    assert not SourceArchive.objects.exists() and not (tmp_path / "sources" / "sha256").exists()


def test_an_upload_whose_header_would_take_gigabytes_is_refused_holding_kilobytes(setup, tmp_path):
    # 65 KB whose tar carries a 64 MiB pax comment (issue 35): it was stored, after the web
    # process had peaked at ~200 MiB; at the 100 MiB upload limit, ~100 GiB per request.
    bomb = tmp_path / "bomb.tar.gz"
    sha256 = header_bomb(bomb, 64 << 20)
    body, member = bomb.read_bytes(), client_for(setup.people["member"])
    tracemalloc.start()
    try:
        refused = put(member, f"sha256:{sha256}", body, setup.team.pk)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert refused.status_code == 400, refused.content
    assert "a header of 67108864 bytes" in refused.json()["errors"]["archive"][0]
    assert peak < 10 * 100_000  # ten times this control plane's limit, whatever the header claims
    assert not SourceArchive.objects.exists() and stored_files(tmp_path) == []


@pytest.mark.parametrize("path, field", [
    ("sources/sha256:abc/?team={team}", "digest"),
    ("sources/md5:" + "0" * 32 + "/?team={team}", "digest"),
    ("sources/sha256:" + "0" * 64 + "/", "team"),
    ("sources/sha256:" + "0" * 64 + "/?team=99999999", "team"),
    ("sources/sha256:" + "0" * 64 + "/?team={other}", "team"),
    ("sources/sha256:" + "0" * 64 + "/?team=-1", "team"),
])
def test_a_malformed_digest_or_a_team_not_yours_is_a_400_naming_it(setup, path, field):
    url = "/api/v1/" + path.format(team=setup.team.pk, other=setup.other_team.pk)
    member = client_for(setup.people["member"])
    for response in (member.get(url), member.put(url, b"x", content_type="application/gzip")):
        assert response.status_code == 400 and field in response.json()["errors"], response.content


def test_a_viewer_may_not_upload_nor_an_anonymous_caller_ask(setup, archive):
    assert put(client_for(setup.people["viewer"]), archive.digest, archive.path.read_bytes(),
               setup.team.pk).status_code == 403
    assert APIClient().get(f"/api/v1/sources/{archive.digest}/?team={setup.team.pk}").status_code == 401


def submit(client, team, **fields):
    return client.post("/api/v1/jobs/", {"team": team.pk, "name": "from-source", "command": ["python", "train.py"],
                                         **fields}, format="json")


def test_a_job_names_its_teams_archive_and_its_vm_gets_those_bytes_pinned_by_digest(setup, archive):
    member = client_for(setup.people["member"])
    assert put(member, archive.digest, archive.path.read_bytes(), setup.team.pk).status_code == 201
    answer = submit(member, setup.team, source_archive=archive.digest)
    assert answer.status_code == 201, answer.content
    assert answer.json()["source_archive"] == archive.digest
    job = Job.objects.get(pk=answer.json()["id"])
    instance = make_instance(job)
    agent = AgentClient()
    spec = agent.register(instance.bootstrap_token).json()["job"]
    assert (spec["source_sha256"], spec["source_git_url"], spec["source_git_commit"]) == (archive.sha256, "", "")
    assert spec["source_max_unpacked_bytes"] == 100_000  # the VM unpacks under the limit it was checked against
    served = agent.client.get(protocol.API_PREFIX + protocol.PATH_SOURCE)
    assert served.status_code == 200 and served["Content-Type"] == "application/gzip"
    assert hashlib.sha256(b"".join(served.streaming_content)).hexdigest() == archive.sha256


def test_source_get_is_a_404_for_a_job_without_an_archive_and_a_401_without_a_token(setup):
    job = make_job(setup.team, setup.people["member"].user, source_git_url="https://example.com/r.git",
                   source_git_commit=COMMIT)
    agent = AgentClient()
    spec = agent.register(make_instance(job).bootstrap_token).json()["job"]
    assert (spec["source_sha256"], spec["source_git_url"], spec["source_git_commit"]) == (
        "", "https://example.com/r.git", COMMIT)
    assert agent.client.get(protocol.API_PREFIX + protocol.PATH_SOURCE).status_code == 404
    assert AgentClient("rsp_agent_wrong").client.get(protocol.API_PREFIX + protocol.PATH_SOURCE).status_code == 401


@pytest.mark.parametrize("fields, field, says", [
    ({"source_archive": "sha256:" + "a" * 64}, "source_archive", "has no archive"),
    ({"source_archive": "a" * 64}, "source_archive", '"sha256:"'),
    ({"source_archive": "sha256:" + "a" * 64, "source_git_url": "https://example.com/r.git",
      "source_git_commit": COMMIT}, "source_archive", "not both"),
    ({"source_git_url": "https://example.com/r.git"}, "source_git_commit", "is needed too"),
    ({"source_git_commit": COMMIT}, "source_git_url", "is needed too"),
    ({"source_git_url": "https://example.com/r.git", "source_git_commit": "main"}, "source_git_commit", "full commit"),
    ({"source_git_url": "ext::sh -c touch% /tmp/pwned", "source_git_commit": COMMIT}, "source_git_url", "URL"),
    ({"source_git_url": "-uhttps://example.com", "source_git_commit": COMMIT}, "source_git_url", "URL"),
    ({"source_git_url": "https://example.com/a b.git", "source_git_commit": COMMIT}, "source_git_url", "URL"),
    ({"source_git_url": "https://bot:ghp_secret@github.com/org/r.git", "source_git_commit": COMMIT}, "source_git_url",
     "no password"),
])
def test_a_job_naming_code_it_cannot_have_is_a_400_naming_the_field(setup, fields, field, says):
    answer = submit(client_for(setup.people["member"]), setup.team, **fields)
    assert answer.status_code == 400 and says in answer.json()["errors"][field][0], answer.content
    assert not Job.objects.exists()


def test_another_teams_archive_cannot_be_named(setup, archive):
    outsider = client_for(setup.people["outsider"])
    assert put(outsider, archive.digest, archive.path.read_bytes(), setup.other_team.pk).status_code == 201
    answer = submit(client_for(setup.people["member"]), setup.team, source_archive=archive.digest)
    assert answer.status_code == 400 and "has no archive" in answer.json()["errors"]["source_archive"][0]


def test_listing_jobs_that_name_archives_costs_no_query_per_job(setup, archive):
    member = client_for(setup.people["member"])
    assert put(member, archive.digest, archive.path.read_bytes(), setup.team.pk).status_code == 201
    stored = SourceArchive.objects.get()

    def count():
        with CaptureQueriesContext(connection) as queries:
            listed = member.get("/api/v1/jobs/")
        assert {job["source_archive"] for job in listed.json()["results"]} == {archive.digest}
        return len(queries)

    make_job(setup.team, setup.people["member"].user, source_archive=stored)
    count()  # the first call also stamps the token's last use
    few = count()
    for _ in range(5):
        make_job(setup.team, setup.people["member"].user, source_archive=stored)
    assert count() == few
