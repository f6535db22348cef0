"""One role's sglang server process, as the plugin shapes it: which role it is and what it is proven with
(`roles`, `supported`: anything else is refused at start-up), the requests it refuses before its scheduler
sees them (`input_guard`), how its scheduler waits when idle (`idle_wait`), samples a seeded request
(`seeded_sampling`), counts (`metrics`: every role's Prometheus series) and names its threads
(`thread_names`). Where the plugin hooks sglang is `hooks/`; RelayDecode and MainDecode are `decode/`."""
