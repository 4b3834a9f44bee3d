"""A fault-injecting proxy in front of moto's EC2, for the errors moto never makes.

moto always has capacity and quota. This proxy forwards every EC2 call to moto
unchanged, except a RunInstances the test has told to fail: that one gets EC2's
real XML error answer (code, message, HTTP status), optionally only for one
availability zone, so "no capacity in zone a, launched in zone b" can be shown
end to end with the real boto3 client.

    with Ec2FaultProxy(moto_url) as ec2:
        ec2.fail_run_instances("InsufficientInstanceCapacity", status=500, zone="us-east-1a")
        boto3.client("ec2", endpoint_url=ec2.endpoint, ...)
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from xml.sax.saxutils import escape

from tests.emulators.moto_proxy import MotoProxy


@dataclass
class RunInstancesFault:
    code: str
    status: int
    message: str
    zone: str | None  # None: whichever zone is asked for
    times: int | None  # None: until cleared


class Ec2FaultProxy(MotoProxy):
    def __init__(self, moto_url: str):
        super().__init__(moto_url)
        self.faults: list[RunInstancesFault] = []
        self.refused: list[dict[str, str]] = []  # the RunInstances calls answered with a fault
        self._lock = threading.Lock()

    def fail_run_instances(self, code: str, *, status: int = 400, message: str = "", zone: str | None = None, times: int | None = 1) -> None:
        """Answer the next `times` RunInstances (in `zone`, if given) with this EC2 error."""
        with self._lock:
            self.faults.append(RunInstancesFault(code, status, message or f"emulated {code}", zone, times))

    def clear(self) -> None:
        with self._lock:
            self.faults.clear()

    def _fault_for(self, params: dict[str, str]) -> RunInstancesFault | None:
        if params.get("Action") != "RunInstances":
            return None
        with self._lock:
            for fault in self.faults:
                if fault.zone in (None, params.get("Placement.AvailabilityZone")):
                    if fault.times is not None:
                        fault.times -= 1
                        if fault.times == 0:
                            self.faults.remove(fault)
                    self.refused.append(params)
                    return fault
        return None

    def handle(self, path, params, body, headers):
        fault = self._fault_for(params)
        if fault:
            return fault.status, {"Content-Type": "text/xml"}, _error_xml(fault).encode()
        return super().handle(path, params, body, headers)


def _error_xml(fault: RunInstancesFault) -> str:
    # EC2's error envelope, as botocore's ec2 parser reads it.
    return (
        f"<Response><Errors><Error><Code>{escape(fault.code)}</Code><Message>{escape(fault.message)}</Message></Error></Errors>"
        "<RequestID>00000000-0000-0000-0000-000000000000</RequestID></Response>"
    )
