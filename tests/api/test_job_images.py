"""A job's two images (issue 17 item 3): what each cloud's VM boots (`machine_image`,
per cloud) and what the training runs in (`container_image`), checked at submit with
a 400 naming the field; and migration 0014, which split the old `image` by its shape."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from tests.api.clients import client_for
from tests.factories import make_team_with_members

IMAGES = {"aws": "ami-0123456789abcdef0", "gcp": "projects/debian-cloud/global/images/family/debian-12",
          "azure": "Canonical:ubuntu-24_04-lts:server:latest"}


@pytest.fixture
def setup(db):
    return make_team_with_members()


def submit(setup, **fields):
    return client_for(setup.people["member"]).post("/api/v1/jobs/", {
        "team": setup.team.pk, "name": "resnet", "command": ["python", "train.py"], **fields}, format="json")


def test_a_job_keeps_a_boot_image_per_cloud_and_a_container_image_apart(setup):
    answer = submit(setup, machine_image=IMAGES, container_image="ghcr.io/example/resnet:2.3")
    assert answer.status_code == 201, answer.content
    assert answer.json()["machine_image"] == IMAGES
    assert answer.json()["container_image"] == "ghcr.io/example/resnet:2.3"


@pytest.mark.parametrize("field, value, says", [
    ("machine_image", {"aws": "ghcr.io/example/resnet:2.3"}, "not an AMI id"),
    ("machine_image", {"gcp": "ami-0123456789abcdef0"}, "not an image like projects/"),
    ("machine_image", {"azure": "ubuntu"}, "not an image URN"),
    ("machine_image", {"local": "anything"}, "a boot image is set per cloud"),
    ("machine_image", "ami-0123456789abcdef0", "object of cloud to image"),
    ("machine_image", {"aws": 5}, "not an AMI id"),
    ("container_image", "Not An Image", "not an image reference"),
    # Each would be read by `podman run` as an option, and the command's first word as the image.
    ("container_image", "-v/etc", "not an image reference"),
    ("container_image", "--privileged", "not an image reference"),
    ("container_image", "-registry.example.com/x:1", "not an image reference"),
    ("container_image", "registry-.example.com/x:1", "not an image reference"),
    ("container_image", "ghcr.io/x:ta\u0261", "not an image reference"),
    ("container_image", "ghcr.io/x\x00y", ""),
])
def test_an_image_no_cloud_or_runtime_would_take_is_refused_naming_the_field(setup, field, value, says):
    answer = submit(setup, **{field: value})
    assert answer.status_code == 400, answer.content
    assert field in answer.json()["errors"]
    assert says in str(answer.json()["errors"][field])


@pytest.mark.django_db(transaction=True)
def test_migration_0014_moves_an_old_image_to_the_field_its_shape_says():
    executor = MigrationExecutor(connection)
    before, after = [("jobs", "0011_login_limit_ceilings_invitations")], [("jobs", "0014_machine_and_container_image")]
    executor.migrate(before)
    old = executor.loader.project_state(before).apps
    team = old.get_model("jobs", "Team").objects.create(name="t")
    owner = old.get_model("auth", "User").objects.create(username="u")
    Job = old.get_model("jobs", "Job")
    made = {image: Job.objects.create(team=team, owner=owner, name=image or "none", command=["x"], image=image).pk
            for image in ("ghcr.io/example/resnet:2.3", IMAGES["aws"], IMAGES["gcp"], IMAGES["azure"], "")}

    executor = MigrationExecutor(connection)
    executor.migrate(after)
    Job = executor.loader.project_state(after).apps.get_model("jobs", "Job")
    moved = {image: Job.objects.values("machine_image", "container_image").get(pk=pk) for image, pk in made.items()}
    assert moved["ghcr.io/example/resnet:2.3"] == {"machine_image": {}, "container_image": "ghcr.io/example/resnet:2.3"}
    assert moved[IMAGES["aws"]] == {"machine_image": {"aws": IMAGES["aws"]}, "container_image": ""}
    assert moved[IMAGES["gcp"]] == {"machine_image": {"gcp": IMAGES["gcp"]}, "container_image": ""}
    assert moved[IMAGES["azure"]] == {"machine_image": {"azure": IMAGES["azure"]}, "container_image": ""}
    assert moved[""] == {"machine_image": {}, "container_image": ""}
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
