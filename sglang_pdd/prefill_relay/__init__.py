"""A prefill that relays (`--pdd-role prefill --pdd-relay local`): P decodes the requests the router relays
to it in its own batches and hands them to MainDecode by token IDs (docs/local-relay.md)."""
