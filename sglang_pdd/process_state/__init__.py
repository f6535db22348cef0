"""One server process's long-lived objects, one concept per module; the hooks import them from here.

    transfer_ledger  LEDGER: what each Mooncake write moved, by kind and path
    fanout           P's fan-out registry, its main lanes and the fan-out builder
    packed_wan       P's packed sender and MD's packed receiver (`--pdd-packed-wan`)
    capabilities     the plugin's choice at load per capability of patches/ (hook or extension point)

Nothing here imports a hook module.
"""
