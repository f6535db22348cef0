"""Test stand-ins, one module per seam the plugin meets, each named after what it stands in for.

* `kv_pool`: sglang's MHA token pool (`MHATokenToKVPool`, accepted by class name) and its req_to_token
  pool (`ReqToTokenPool`); torch only, so the kernel tests use them on a GPU box without sglang.
* `attention`: sglang's `RadixAttention` layer, a forward batch and its forward mode, and an attention
  backend recording what reached sglang's own `forward` (MD's handoff attention hook); torch only.
* `kv_manager`: Mooncake's KV manager (rooms, registrations, status messages, registered KV buffers) and
  its transfer engine (registered memory).
* `fanout`: the fan-out sender's collaborators: child senders (`CommonKVSender`), metadata slots, rooms.
* `clock`: a clock the test sets (`time.monotonic` / `time.time` and `time.sleep`).
* `handoff`: the token channel and sglang's request as RLD's and MD's handoff state machines see them.
* `decode_role`: a decode runtime (`DecodeRole`) recording what the decode hooks or sglang's decode
  scheduler extension ask of it, and the decode scheduler it hangs on.
* `kv_events`: sglang's KV event frames as MD's ZMQ publisher sends them.

Only `kv_pool` and `attention` may be imported where sglang_pdd's dependencies are missing.
"""
