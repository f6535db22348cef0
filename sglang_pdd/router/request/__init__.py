"""One request's life: dispatch over the pipeline the policy picks, the stitched stream, stop
strings, deadlines, failures and migration (`migration/`)."""
