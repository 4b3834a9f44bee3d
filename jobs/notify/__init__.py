"""Notifications (DESIGN §11): who is told of what happened, and the sending of it.

- `events`: a happening becomes one Notification row and one Delivery row per matching
  subscription, in the transaction of the happening (signal receivers, and the
  periodic sweep for conditions that arise with time alone).
- `addresses`: which webhook URLs may be called (never the metadata service).
- `sending`: one delivery attempt: the message per channel, the signature, the record.
- `subscriptions`: creating one (its secret shown once), who may manage which, test messages.

Imports the core, the models and the fleet's placement (the deadline's slack); nothing
imports it but the API, tasks, the dashboard and JobsConfig (which connects the receivers)."""
