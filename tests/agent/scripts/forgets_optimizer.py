"""The plain PyTorch example with a classic bug: its checkpoints leave out the
optimizer state, so a resumed run restarts Adam's moments from zero."""

import respawn.examples.plain_pytorch as example

saved_with_optimizer = example.checkpoint_payload


def checkpoint_payload(model, optimizer, step):
    payload = saved_with_optimizer(model, optimizer, step)
    del payload["optimizer"]
    return payload


example.checkpoint_payload = checkpoint_payload

if __name__ == "__main__":
    raise SystemExit(example.main())
