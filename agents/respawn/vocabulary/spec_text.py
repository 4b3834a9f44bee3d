"""What text a job may carry to its VM. The CLI's job-file check and the people's
API refuse the same (standard library only, like respawn.vocabulary.names).

A NUL cannot cross execve (it ends a C string, so the word or variable would be
cut there) nor be stored in PostgreSQL's jsonb. An environment variable's name
cannot be empty or hold '=': the first '=' ends the name, so `A=B` set to `C`
would reach the program as `A` set to `B=C`."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from respawn import protocol

# What each cloud takes as a boot image: an AMI id; a Compute image path or URL
# (an image or an image family); a Marketplace image URN.
MACHINE_IMAGE_SHAPES = {
    "aws": (re.compile(r"ami-[0-9a-f]{8,17}"), "an AMI id like ami-0123456789abcdef0"),
    "gcp": (re.compile(r"(https://www\.googleapis\.com/compute/v1/)?(projects/[a-z0-9-]+/)?global/images/"
                       r"(family/)?[a-z][a-z0-9-]{0,62}"),
            "an image like projects/debian-cloud/global/images/family/debian-12"),
    "azure": (re.compile(r"[^:\s]+:[^:\s]+:[^:\s]+:[^:\s]+"),
              "an image URN like Canonical:ubuntu-24_04-lts:server:latest"),
}
# A container image reference, in the grammar of distribution/reference (what podman and
# docker parse): [domain[:port]/]path[:tag][@sha256:digest]. Every part begins with a letter
# or digit, so a reference never begins with '-' and no runtime can read it as an option.
_DOMAIN_PART = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_PATH_PART = r"[a-z0-9]+(?:(?:[_.]|__|-+)[a-z0-9]+)*"
CONTAINER_IMAGE = re.compile(rf"(?:(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?/)?"
                             rf"{_PATH_PART}(?:/{_PATH_PART})*(?::\w[\w.-]{{0,127}})?(?:@sha256:[0-9a-f]{{64}})?",
                             re.ASCII)


def nul_problem(texts: Iterable[str]) -> str | None:
    for text in texts:
        if "\x00" in text:
            return f"{text!r} contains a NUL character"
    return None


# The variables by which a job chooses Respawn's own behaviour on its VMs: a value the agent
# would not understand is refused at submit, where on the VM it would be silently ignored.
JOB_SETTINGS = {
    protocol.ENV_MEMORY_TIER: (re.compile(r"on|off"), "on or off"),
    protocol.ENV_REPLICA_EVERY_STEPS: (re.compile(r"[1-9][0-9]{0,8}"), "a whole number of steps, 1 or more"),
}


def env_problem(env: Mapping[str, str]) -> str | None:
    for name, value in env.items():
        if not name:
            return "an environment variable's name must not be empty"
        if "=" in name:
            return f"environment variable name {name!r} must not contain '='"
        if "\x00" in name or "\x00" in value:
            return f"environment variable {name!r} contains a NUL character"
        if name in JOB_SETTINGS and not JOB_SETTINGS[name][0].fullmatch(value):
            return f"{name} must be {JOB_SETTINGS[name][1]}, not {value!r}"
    return None


def machine_image_problem(images: Mapping[str, str]) -> str | None:
    """Why a per-cloud boot image mapping cannot launch, or None."""
    for cloud, image in images.items():
        if cloud not in MACHINE_IMAGE_SHAPES:
            return f"{cloud!r}: a boot image is set per cloud, one of {', '.join(MACHINE_IMAGE_SHAPES)}"
        shape, example = MACHINE_IMAGE_SHAPES[cloud]
        if not isinstance(image, str) or not shape.fullmatch(image):
            return f"{cloud}: {image!r} is not {example}"
    return None


def container_image_problem(image: str) -> str | None:
    if image and not CONTAINER_IMAGE.fullmatch(image):
        return f"{image!r} is not an image reference like ghcr.io/example/train:1.0"
    return None
