"""The server side of the service: what runs in the process that owns the table (the learner's).

In about the order an Append request meets them: `server` (`serve`, `ReplayServer`),
`servicer` (the RPCs, on the loop of `eventloop`), `admission`, `staging`, `ingest` (exactly
once per (actor, seq)), `ledger`, `journal` (durable acks; `journal_files`,
`durable`), and `loop`, a served learner's training loop. Re-exports nothing."""
