"""Names and text the CLI and the control plane share: notification kinds and channels
(notify), money as people read it (money), a misspelt field's suggestion (names) and
what text a job may carry (spec_text). Standard library only: the CLI installs without
the server, and the server imports these from here."""
