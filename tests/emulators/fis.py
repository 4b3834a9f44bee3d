"""An emulator of the few AWS Fault Injection Service calls a drill makes (moto has no FIS):
CreateExperimentTemplate and StartExperiment over FIS's REST-JSON wire shapes, so the
real boto3 `fis` client talks to it. Starting an experiment does what FIS would to our
one target: with moto's EC2 given (`ec2`), the instance is terminated there (the
interruption; FIS's two-minute notice is the IMDS emulator's business, not this one's).

From the test's side: `deny("StartExperiment")` answers that call 403
AccessDeniedException as FIS does for a caller without the permission; `templates` and
`experiments` show what was asked.

    with FisEmulator(ec2=boto3_ec2_client) as fis:
        AwsConfig(..., fis_endpoint_url=fis.endpoint, fis_role_arn="arn:aws:iam::123456789012:role/fis")
"""

from __future__ import annotations

import itertools

from tests.emulators.json_http import JsonHttpEmulator


class FisEmulator(JsonHttpEmulator):
    def __init__(self, *, ec2=None):
        super().__init__()
        self.ec2 = ec2
        self.templates: dict[str, dict] = {}
        self.experiments: list[dict] = []
        self.interrupted: list[tuple[str, str]] = []  # (action id, instance id)
        self._denied: set[str] = set()
        self._ids = itertools.count(1)
        self.route("POST", r"/experimentTemplates", self._create_template)
        self.route("POST", r"/experiments", self._start)

    def deny(self, operation: str) -> None:
        """Answer `operation` (e.g. "StartExperiment") 403, as for a caller lacking fis:<operation>."""
        self._denied.add(operation)

    def _refused(self, operation: str):
        if operation not in self._denied:
            return None
        message = (f"User: arn:aws:sts::123456789012:assumed-role/respawn-worker/i-0 is not authorized to perform: "
                   f"fis:{operation}")
        return 403, {"message": message}, {"x-amzn-ErrorType": "AccessDeniedException"}

    def _create_template(self, m, query, body):
        refused = self._refused("CreateExperimentTemplate")
        if refused:
            return refused
        for field in ("clientToken", "roleArn", "targets", "actions", "stopConditions"):
            if field not in body:
                return 400, {"message": f"{field} is required"}, {"x-amzn-ErrorType": "ValidationException"}
        template_id = f"EXT{next(self._ids):08d}"
        self.templates[template_id] = {**body, "id": template_id}
        return 200, {"experimentTemplate": {"id": template_id, "description": body.get("description", "")}}, {}

    def _start(self, m, query, body):
        refused = self._refused("StartExperiment")
        if refused:
            return refused
        template = self.templates.get(body.get("experimentTemplateId"))
        if template is None:
            return 404, {"message": "experiment template not found"}, {"x-amzn-ErrorType": "ResourceNotFoundException"}
        experiment_id = f"EXP{next(self._ids):08d}"
        self.experiments.append({"id": experiment_id, "templateId": template["id"]})
        for action in template["actions"].values():
            for target_name in action["targets"].values():
                for arn in template["targets"][target_name]["resourceArns"]:
                    self._interrupt(action["actionId"], arn.rpartition("/")[2])
        return 200, {"experiment": {"id": experiment_id, "experimentTemplateId": template["id"],
                                    "state": {"status": "initiating"}}}, {}

    def _interrupt(self, action_id: str, instance_id: str) -> None:
        self.interrupted.append((action_id, instance_id))
        if self.ec2 is not None:
            self.ec2.terminate_instances(InstanceIds=[instance_id])
