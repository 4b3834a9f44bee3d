"""The job page links to the job's experiment-tracker run when the job's env names a tracker
that a browser can open, and says nothing of trackers otherwise."""

import pytest
from django.test import Client
from django.utils.html import escape

from respawn_server.jobs.core import trackers
from tests.factories import make_job, make_team_with_members


def page_of(env: dict) -> tuple[str, object]:
    setup = make_team_with_members()
    job = make_job(setup.team, setup.people["member"].user, env=env)
    browser = Client()
    browser.force_login(setup.people["viewer"].user)
    return browser.get(f"/jobs/{job.pk}/").content.decode(), job


@pytest.mark.django_db
def test_a_wandb_project_and_entity_link_to_the_run_page():
    page, job = page_of({"WANDB_ENTITY": "acme", "WANDB_PROJECT": "llm pretrain"})
    assert f'href="https://wandb.ai/acme/llm%20pretrain/runs/{trackers.run_id(job)}"' in page


@pytest.mark.django_db
def test_a_self_hosted_wandb_and_a_pinned_run_id_are_followed():
    page, _ = page_of({"WANDB_BASE_URL": "https://wandb.example.com/", "WANDB_ENTITY": "acme", "WANDB_PROJECT": "p", "WANDB_RUN_ID": "mine"})
    assert 'href="https://wandb.example.com/acme/p/runs/mine"' in page


@pytest.mark.django_db
def test_an_mlflow_server_links_to_the_experiments_runs_tagged_with_the_job():
    page, job = page_of({"MLFLOW_TRACKING_URI": "http://mlflow.internal:5000", "MLFLOW_EXPERIMENT_ID": "12"})
    search = "tags.respawn_run_id%20%3D%20%27" + trackers.run_id(job) + "%27"
    assert escape(f"http://mlflow.internal:5000/#/experiments/12?searchFilter={search}") in page


@pytest.mark.django_db
@pytest.mark.parametrize("env", [{}, {"MLFLOW_TRACKING_URI": "file:///data/mlruns"}, {"MLFLOW_TRACKING_URI": "databricks"},
                                 {"WANDB_BASE_URL": "javascript:alert(1)", "WANDB_PROJECT": "p"}])
def test_no_link_where_there_is_nothing_a_browser_can_open(env):
    page, _ = page_of(env)
    assert 'data-field="tracker"' not in page
