"""`python -m respawn.checkpoint.validate <checkpoint-uri>`: validate in a separate process.

Prints one JSON object (protocol.ValidationReport fields: result, loss,
reference_loss, message) and exits 0 when valid, 1 when invalid (the loss differs
from the reference, or the checkpoint is corrupt: then `unreadable` is true too, as
it is for one rotated away meanwhile), 2 when the check itself failed (`error`: a
factory or eval_fn that cannot be used, raises or returns a non-finite number, a
checkpoint of another model).

`python -m respawn.checkpoint.validate --serve [--preload MODULE ...]`: the same check,
warm. PyTorch (and the job's factory modules) imported once, the training device
initialised once, then one check per line of standard input (a JSON list of the
arguments above) and one JSON line per check on standard output: `{"code": the exit
status above, "output": what the check printed}`. A first line `{"ready": true,
"device": ...}` says it is warm. Each check starts from the random state a fresh
process has, so its verdict is the one-shot command's.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import sys
import traceback

from respawn.checkpoint import CheckpointError, CorruptCheckpointError, ValidationSettings


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:
        return serve(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m respawn.checkpoint.validate", description=__doc__.splitlines()[0])
    parser.add_argument("uri", help="checkpoint URI, <root>/step-NNNNNNNN")
    parser.add_argument("--model-factory", help="module:function (default: the one stored in the checkpoint)")
    parser.add_argument("--batch-factory", help="module:function (default: the one stored in the checkpoint)")
    parser.add_argument("--eval-fn", default="", help="module:function, eval_fn(model, batch) -> float "
                        "(default: the one stored in the checkpoint, else the default loss)")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--device", default="auto", help="torch device of the check; auto: the GPU when there is one")
    parser.add_argument("--no-record", action="store_true", help="do not write VALIDATION.json")
    args = parser.parse_args(argv)
    if not args.no_record:
        claim(args.uri)  # before torch's import: a starved validator's seconds count
    from respawn.checkpoint.reader import load, ref_from_uri
    from respawn.checkpoint.validation import judge, mark, training_device

    try:
        settings = None
        if args.model_factory or args.batch_factory:
            settings = ValidationSettings(args.model_factory or "", args.batch_factory or "", args.tolerance, args.eval_fn)
        ref = ref_from_uri(args.uri)
        framework = written_by(ref)
        if framework == "jax":
            # Orbax's files, read through Orbax: jax is imported for JAX checkpoints only.
            from respawn.integrations import jax as jax_integration

            load, judge = jax_integration.load_checkpoint, jax_integration.judge
        elif framework == "accelerate":
            # Accelerate's own files: the model's weights are its model.safetensors (or .bin).
            from respawn.integrations.accelerate import load_checkpoint as load
        elif framework == "torch-dcp":
            # DCP's files of every rank, read in this one process into the full (unsharded) weights.
            from respawn.checkpoint.sharded import load_checkpoint as load
        loaded = load(ref)
    except CorruptCheckpointError as exc:
        print(json.dumps({"result": "invalid", "message": str(exc), "unreadable": True}))
        return 1
    except CheckpointError as exc:
        print(json.dumps({"result": "error", "message": str(exc)}))
        return 2
    try:
        verdict = judge(loaded, settings, training_device() if args.device == "auto" else args.device)
    except CheckpointError as exc:  # a checkpoint of another model: the check cannot run, nothing is condemned
        print(json.dumps({"result": "error", "message": str(exc)}))
        return 2
    if not args.no_record:
        mark(ref, verdict)
    # The checkpoint's id: a verdict on a checkpoint the agent knows only by its URI (the one it
    # resumes from) is reported under it.
    print(json.dumps(verdict.to_json() | {"checkpoint_id": loaded.meta.get("checkpoint_id", "")}))
    return 0 if verdict.valid else 2 if verdict.error else 1


def serve(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m respawn.checkpoint.validate --serve")
    parser.add_argument("--preload", action="append", default=[], help="a module to import before the first check")
    args = parser.parse_args(argv)
    import torch

    from respawn.checkpoint.validation import training_device

    fresh_rng = torch.random.get_rng_state()
    device = training_device()
    torch.zeros(1, device=device)  # the device's context, created now rather than in the first check
    for module in args.preload:
        try:
            importlib.import_module(module)
        except Exception as exc:  # the check that needs it says so, in its verdict
            print(f"could not preload {module}: {exc!r}", file=sys.stderr)
    answer({"ready": True, "device": str(device)})
    for line in sys.stdin:
        torch.random.set_rng_state(fresh_rng)
        if device.type == "cuda":
            torch.cuda.manual_seed_all(torch.initial_seed())
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            try:
                code = main(json.loads(line))
            except SystemExit as exc:  # argparse's refusal
                code = exc.code if isinstance(exc.code, int) else 2
            except Exception:  # a check that blew up: the one-shot command's traceback and exit status
                print(traceback.format_exc(), file=sys.stderr)
                code = 1
        answer({"code": code, "output": printed.getvalue()})
        if device.type == "cuda":
            torch.cuda.empty_cache()  # between checks the memory is training's
    return 0


def answer(doc: dict) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def claim(uri: str) -> None:
    """Tell rotation this checkpoint is being read (rotation.being_validated). Best
    effort: one that cannot be written leaves validation as it was without it."""
    from datetime import datetime, timezone

    from respawn.checkpoint import layout
    from respawn.checkpoint.storage import StorageError, open_storage, rewrite_beside

    parts = layout.split_uri(uri)
    if parts is None:
        return  # not a checkpoint's URI: the reader says so
    root, name = parts
    body = {"started_at": datetime.now(timezone.utc).isoformat()}
    try:
        rewrite_beside(open_storage(root), f"{name}/{layout.VALIDATING}", json.dumps(body).encode())
    except (StorageError, OSError) as exc:
        print(f"could not claim {uri} for validation (rotation may delete it meanwhile): {exc}", file=sys.stderr)


def written_by(ref) -> str | None:
    """The framework a checkpoint's state.json names (None when there is none to read:
    the reader then says what is missing)."""
    from respawn.checkpoint import layout
    from respawn.checkpoint.storage import StorageError

    try:
        return json.loads(ref.storage.read(ref.key(layout.STATE))).get("framework")
    except (StorageError, OSError, ValueError, AttributeError):
        return None


if __name__ == "__main__":
    sys.exit(main())
