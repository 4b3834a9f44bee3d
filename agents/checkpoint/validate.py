"""`python -m agents.checkpoint.validate <checkpoint-uri>`: validate in a separate process.

Prints one JSON object (protocol.ValidationReport fields: result, loss,
reference_loss, message) and exits 0 when valid, 1 when invalid, 2 when the
checkpoint cannot be read or its factories cannot be used.
"""

from __future__ import annotations

import argparse
import json
import sys

from agents.checkpoint import CheckpointError, ValidationSettings, validate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agents.checkpoint.validate", description=__doc__.splitlines()[0])
    parser.add_argument("uri", help="checkpoint URI, <root>/step-NNNNNNNN")
    parser.add_argument("--model-factory", help="module:function (default: the one stored in the checkpoint)")
    parser.add_argument("--batch-factory", help="module:function (default: the one stored in the checkpoint)")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--no-record", action="store_true", help="do not write VALIDATION.json")
    args = parser.parse_args(argv)
    settings = None
    try:
        if args.model_factory or args.batch_factory:
            settings = ValidationSettings(args.model_factory or "", args.batch_factory or "", args.tolerance)
        verdict = validate(args.uri, settings, record=not args.no_record)
    except CheckpointError as exc:
        print(json.dumps({"result": "error", "message": str(exc)}))
        return 2
    print(json.dumps(verdict.to_json()))
    return 0 if verdict.valid else 1


if __name__ == "__main__":
    sys.exit(main())
